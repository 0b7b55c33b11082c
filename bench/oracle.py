"""Exact and fuzzy dedup checked against exact oracles on a real corpus the tests never use.

Corpus (built from this machine, missing roots skipped; paths found via ``sysconfig``):

- ``code``: whole Python source files of the installed packages and of the standard library.
  Files that share a module path after a vendoring prefix (``pip/_vendor/urllib3/...`` vs
  ``urllib3/...``) form a group; every multi-member group is taken first (up to half the
  quota: real near- and exact duplicates), then single files at random.
- ``debian``: ``/usr/share/doc/*/{copyright,changelog*,NEWS*,README*}`` and
  ``/usr/share/common-licenses/*`` (gzip decompressed), at random.
- ``man``: man pages (``/usr/share/man/**``, every language), grouped by page name, at random.

A file that is not UTF-8 is decoded with ``surrogateescape`` and written with ``\\udcXX``
escapes (the lone surrogates make the record invalid for the ingester: it must quarantine it).
Files over ``--max-file-bytes`` (but ``--long-docs`` per source, up to 4 MiB) and symlinked
duplicates of the same file are skipped.

Then ``curate run --stages exact,fuzzy`` and ``curate ledger``, and two oracles written without
the project's kernels:

- exact: texts grouped by ``" ".join(NFKC(text).split())`` (Python's whitespace, as the kernel's
  ``\\s+``); each group must keep exactly its lowest doc_id (all sources have priority 0) and
  remove the others, naming that survivor.
- fuzzy: on the oracle's exact survivors, every pair with exact Jaccard >= 0.8 of the sets of
  code-point 24-grams (a shorter text is one shingle), found by an exact all-pairs join (size
  ratio, prefix and positional filters, all necessary conditions; 64-bit hashes of the shingle
  strings, pairs near the threshold recomputed on the strings), components by union-find;
  perfect removal = all but the lowest doc_id per component. Missed pairs are diagnosed with the
  project's kernels (shared LSH bands), which the oracles themselves never use.

    python bench/oracle.py [--max-docs 8000] [--seed 0] [--out DIR] [--skip-run]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import xxhash
from common import CURATE, char_shingles, components

K, THRESHOLD, CRAWL = 24, 0.8, "c1"
LONG_MAX_BYTES = 4 << 20
SOURCES = ("code", "debian", "man")
SHARE = {"code": 0.35, "debian": 0.2, "man": 0.45}
_VENDOR = re.compile(r"(?:^|/)(?:_vendor|_vendored|vendor|vendored|extern|_extern)/")


# ----------------------------------------------------------------------------- corpus


def _read(path: Path, max_bytes: int) -> bytes | None:
    """File bytes (gzip decompressed), None when unreadable or larger than ``max_bytes``."""
    try:
        if path.stat().st_size > max_bytes:
            return None
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            with gzip.open(path) as fh:
                data = fh.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except (OSError, EOFError, gzip.BadGzipFile):
        return None


def _unique_files(paths: Iterable[Path]) -> list[Path]:
    """Regular files, one per real path, sorted."""
    seen: dict[str, Path] = {}
    for p in sorted(paths):
        try:
            if p.is_file():
                seen.setdefault(os.path.realpath(p), p)
        except OSError:
            continue
    return sorted(seen.values())


def _code_groups() -> dict[str, list[tuple[str, Path]]]:
    """Module path (vendoring prefix stripped) -> [(record id, file)]."""
    roots: dict[str, Path] = {}
    for label, key in (("site-packages", "purelib"), ("site-packages", "platlib"), ("stdlib", "stdlib")):
        p = Path(sysconfig.get_paths()[key])
        if p.is_dir() and p not in roots.values():
            roots.setdefault(label if label not in roots else f"{label}-{key}", p)
    groups: dict[str, list[tuple[str, Path]]] = defaultdict(list)
    for label, root in roots.items():
        files = (p for p in root.rglob("*.py") if "__pycache__" not in p.parts
                 and (label != "stdlib" or "site-packages" not in p.parts))
        for p in _unique_files(files):
            rel = p.relative_to(root).as_posix()
            parts = _VENDOR.split(rel)
            groups[parts[-1]].append((f"{label}/{rel}", p))
    return groups


def _debian_files() -> list[tuple[str, Path]]:
    """[(record id, file)] of Debian copyright/changelog/NEWS/README files and common licenses."""
    doc, lic = Path("/usr/share/doc"), Path("/usr/share/common-licenses")
    pats = ("copyright", "changelog*", "NEWS*", "README*")
    files = [p for pat in pats for p in doc.glob(f"*/{pat}")] if doc.is_dir() else []
    files += list(lic.glob("*")) if lic.is_dir() else []
    return [(f"{p.parent.name}/{p.name}" if p.parent != lic else f"common-licenses/{p.name}", p)
            for p in _unique_files(files)]


def _man_groups() -> dict[str, list[tuple[str, Path]]]:
    """Man page name -> [(record id, file)] over all sections and languages."""
    root = Path("/usr/share/man")
    groups: dict[str, list[tuple[str, Path]]] = defaultdict(list)
    if root.is_dir():
        for p in _unique_files(root.rglob("*")):
            groups[p.name.removesuffix(".gz")].append((p.relative_to(root).as_posix(), p))
    return groups


def _take_groups(groups: list[list[tuple[str, Path]]], quota: int, rng: random.Random) -> list[tuple[str, Path]]:
    """Whole groups in random order until ``quota`` files (the last one cut)."""
    rng.shuffle(groups)
    out: list[tuple[str, Path]] = []
    for g in groups:
        if len(out) >= quota:
            break
        out.extend(g[: quota - len(out)])
    return out


def _record(rid: str, data: bytes) -> bytes:
    """One JSONL line; non-UTF-8 bytes become lone surrogates, written as JSON escapes."""
    try:
        text = data.decode("utf-8")
        return json.dumps({"id": rid, "text": text}, ensure_ascii=False).encode("utf-8") + b"\n"
    except UnicodeDecodeError:
        text = data.decode("utf-8", "surrogateescape")
        return json.dumps({"id": rid, "text": text}, ensure_ascii=True).encode("ascii") + b"\n"


def build_corpus(out: Path, max_docs: int, seed: int, max_file_bytes: int, long_docs: int) -> dict[str, Path]:
    """Write ``out/<source>/part-0.jsonl`` for each source; returns {source: folder}. At most
    ``long_docs`` files per source may exceed ``max_file_bytes`` (up to 4 MiB)."""
    rng = random.Random(seed)
    quota = {s: int(max_docs * SHARE[s]) for s in SOURCES}
    code = _code_groups()
    multi = [g for g in code.values() if len(g) > 1]
    chosen = {"code": _take_groups(multi, quota["code"] // 2, rng)}
    single = [g for g in code.values() if len(g) == 1]
    chosen["code"] += _take_groups(single, quota["code"] - len(chosen["code"]), rng)
    deb = _debian_files()
    rng.shuffle(deb)
    chosen["debian"] = deb[: quota["debian"]]
    chosen["man"] = _take_groups(list(_man_groups().values()), quota["man"], rng)
    folders: dict[str, Path] = {}
    for source in SOURCES:
        folder = out / source
        folder.mkdir(parents=True, exist_ok=True)
        long_left = long_docs
        with open(folder / "part-0.jsonl", "wb") as fh:
            for rid, path in sorted(chosen[source]):
                data = _read(path, LONG_MAX_BYTES)
                if data is not None and len(data) > max_file_bytes:
                    if long_left == 0:
                        continue
                    long_left -= 1
                if data is not None:
                    fh.write(_record(f"{source}:{rid}", data))
        folders[source] = folder
    return folders


def load_corpus(folders: dict[str, Path]) -> list[dict[str, Any]]:
    """Records as the oracles see them: source, record id, text, doc_id (README's rule)."""
    docs = []
    for source, folder in folders.items():
        for n, line in enumerate((folder / "part-0.jsonl").read_bytes().splitlines(), 1):
            rec = json.loads(line)
            docs.append({"source": source, "id": rec["id"], "text": rec["text"], "doc_id": _doc_id(source, rec),
                         "line": n})
    return docs


def _doc_id(source: str, rec: dict[str, Any]) -> str:
    """xxh3-128 of (crawl, source, canonical JSON, occurrence 0), as documented in
    stages/programs/raw_documents.py (record ids are unique here); "" for a record the ingester
    cannot parse."""
    try:
        canonical = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # lone surrogates: orjson refuses, the ingester quarantines the line
        return ""
    digest = xxhash.xxh3_128_digest(canonical)
    return xxhash.xxh3_128_digest(f"{CRAWL}\x00{source}\x00".encode() + digest + b"\x000").hex()


def _has_lone_surrogate(text: str) -> bool:
    """True when the text holds a surrogate code point (not encodable as UTF-8)."""
    return any("\ud800" <= c <= "\udfff" for c in text)


def expected_quarantine(doc: dict[str, Any]) -> str | None:
    """The ingester's documented quarantine reason for this record, None when it is valid."""
    text = doc["text"]
    if _has_lone_surrogate(text):
        return "invalid_json"
    if not text.strip():
        return "empty_text"
    if "\x00" in text:
        return "nul_byte"
    return None


# ----------------------------------------------------------------------------- oracles


def exact_oracle(docs: list[dict[str, Any]]) -> dict[str, str]:
    """removed doc_id -> survivor doc_id, by normalized text (NFKC, whitespace runs -> ' ', strip)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for d in docs:
        groups[" ".join(unicodedata.normalize("NFKC", d["text"]).split())].append(d["doc_id"])
    removed = {}
    for ids in groups.values():
        keep = min(ids)
        removed.update({i: keep for i in ids if i != keep})
    return removed


def shingle_hashes(text: str) -> np.ndarray:
    """Sorted unique int64 Python hashes of the shingles (64-bit; collisions negligible)."""
    return np.unique(np.fromiter(map(hash, char_shingles(text, K)), np.int64))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    at = np.minimum(np.searchsorted(large, small), len(large) - 1)
    inter = int(np.count_nonzero(large[at] == small))
    return inter / (len(a) + len(b) - inter)


def string_jaccard(s: str, t: str) -> float:
    """Exact Jaccard of the two texts' shingle-string sets."""
    a, b = set(char_shingles(s, K)), set(char_shingles(t, K))
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def _by_frequency(hashes: list[np.ndarray]) -> list[np.ndarray]:
    """The same sets with each shingle replaced by its rank in (document frequency, hash) order,
    each sorted: rare shingles first, so prefixes hold rare shingles (PPJoin's global order)."""
    if not hashes:
        return []
    uniq, inv, cnt = np.unique(np.concatenate(hashes), return_inverse=True, return_counts=True)
    rank = np.empty(len(uniq), np.int64)
    rank[np.lexsort((uniq, cnt))] = np.arange(len(uniq))
    cuts = np.cumsum([len(h) for h in hashes])[:-1]
    return [np.sort(r) for r in np.split(rank[inv.reshape(-1)], cuts)]


def true_pairs(hashes: list[np.ndarray]) -> tuple[list[tuple[int, int, float]], int]:
    """All pairs (i, j, J) with J >= THRESHOLD - 0.02 and the number of pairs verified.

    An exact all-pairs join (PPJoin's filters, each a necessary condition for J >= t): size ratio
    min/max >= t; J >= t needs an overlap o >= t (|A| + |B|) / (1 + t) >= t |A|, so with the
    shingles in one global order (rarest first) the first |A| - ceil(t |A|) + 1 of A meet those of
    B (prefix filter); at their smallest common shingle, at positions pa and pb, at most
    min(|A| - pa, |B| - pb) shingles can still be shared (positional filter)."""
    hashes = _by_frequency(hashes)
    size = np.array([len(h) for h in hashes])
    tok, own, at = [], [], []
    for i, h in enumerate(hashes):
        p = len(h) - math.ceil(THRESHOLD * len(h) - 1e-9) + 1 if len(h) else 0
        tok.append(h[:p])
        own.append(np.full(p, i))
        at.append(np.arange(p))
    t, o, pos = np.concatenate(tok), np.concatenate(own), np.concatenate(at)
    order = np.lexsort((size[o], t))  # by shingle ascending, then document size
    t, o, pos = t[order], o[order], pos[order]
    cuts = np.flatnonzero(np.diff(t)) + 1
    seen: set[tuple[int, int]] = set()
    out = []
    verified = 0
    for post, ppos in zip(np.split(o, cuts), np.split(pos, cuts), strict=True):
        if len(post) < 2:
            continue
        s = size[post]
        for a in range(len(post) - 1):
            hi = int(np.searchsorted(s, s[a] / THRESHOLD + 1e-9, side="right"))
            for b in range(a + 1, hi):
                i, j = int(post[a]), int(post[b])
                key = (i, j) if i < j else (j, i)
                if key in seen:
                    continue
                seen.add(key)  # first meeting = smallest common shingle: positional filter
                need = math.ceil(THRESHOLD * (size[i] + size[j]) / (1 + THRESHOLD) - 1e-9)
                if min(size[i] - ppos[a], size[j] - ppos[b]) < need:
                    continue
                verified += 1
                J = jaccard(hashes[i], hashes[j])
                if J >= THRESHOLD - 0.02:
                    out.append((key[0], key[1], J))
    return out, verified


# ----------------------------------------------------------------------------- run + compare


def run_pipeline(folders: dict[str, Path], work: Path) -> tuple[float, Path]:
    """Fresh ``curate run --stages exact,fuzzy``; returns (wall seconds, ledger path)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = work.parent / "oracle-crawl.json"  # --source NAME=URL has no id_field; the ledger needs record_id
    config.write_text(json.dumps({"sources": {s: {"url": str(f), "text_field": "text", "id_field": "id"}
                                              for s, f in folders.items()}}))
    cmd = [*CURATE, "run", "--workdir", str(work), "--crawl", CRAWL, "--config", str(config),
           "--stages", "exact,fuzzy", "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    ledger = work / "ledger.parquet"
    subprocess.run([*CURATE, "ledger", "--workdir", str(work), "--crawl", CRAWL, "--out", str(ledger)], check=True)
    return wall, ledger


def _hist(values: Iterable[float], edges: tuple[float, ...]) -> dict[str, int]:
    """Counts per [lo, hi) bin."""
    c: Counter[str] = Counter()
    for v in values:
        for lo, hi in itertools.pairwise(edges):
            if lo <= v < hi:
                c[f"[{lo:.2f},{hi:.2f})"] += 1
    return dict(sorted(c.items()))


def compare(docs: list[dict[str, Any]], ledger: Path) -> dict[str, Any]:
    """Quarantine, exact and fuzzy removals of the ledger against the oracles: a JSON-ready report."""
    rows = pq.read_table(ledger).to_pylist()
    by_id = {d["id"]: d for d in docs}
    rep: dict[str, Any] = {"documents": len(docs), "ledger_rows": len(rows),
                           "ledger_stages": dict(Counter(r["stage"] for r in rows))}
    # doc_ids: the documented rule must reproduce every ledger id
    # (a quarantined record's id comes from its position, not its content: not checked)
    bad_ids = [r["record_id"] for r in rows if r["stage"] != "quarantine"
               and by_id.get(r["record_id"], {}).get("doc_id") != r["doc_id"]]
    rep["doc_id_mismatches"] = len(bad_ids)
    # quarantine
    line_of = {(d["source"], d["line"]): d["id"] for d in docs}
    quarantined = {}
    for r in rows:
        if r["stage"] == "quarantine":  # an unparseable line has no record_id: its line is in detail
            rid = r["record_id"] or line_of.get((r["source"], int(r["detail"].split(":")[1])), r["detail"])
            quarantined[rid] = r["reason"]
    expected_q = {d["id"]: q for d in docs if (q := expected_quarantine(d))}
    rep["quarantine"] = {"expected": dict(Counter(expected_q.values())), "got": dict(Counter(quarantined.values())),
                         "mismatched": sorted(set(expected_q.items()) ^ set(quarantined.items()), key=str)[:20]}
    alive = [d for d in docs if d["id"] not in expected_q]
    did = {d["doc_id"]: d for d in alive}
    # exact
    exp = exact_oracle(alive)
    got = {r["doc_id"]: r["duplicate_of"] for r in rows if r["stage"] == "exact"}
    miss, extra = set(exp) - set(got), set(got) - set(exp)
    wrong = [k for k in set(exp) & set(got) if exp[k] != got[k]]
    tp = len(set(exp) & set(got))
    rep["exact"] = {"oracle_removed": len(exp), "ours_removed": len(got),
                    "groups": len(set(exp.values())), "missed": len(miss), "extra": len(extra),
                    "wrong_survivor": len(wrong),
                    "precision": tp / len(got) if got else 1.0, "recall": tp / len(exp) if exp else 1.0,
                    "examples": [by_id_rec(did, x) for x in sorted(miss | extra | set(wrong))[:10]]}
    # fuzzy, on the oracle's exact survivors
    surv = sorted((d for d in alive if d["doc_id"] not in exp), key=lambda d: d["doc_id"])
    t0 = time.perf_counter()
    hashes = [shingle_hashes(d["text"]) for d in surv]
    pairs, ncand = true_pairs(hashes)
    # recompute pairs near the threshold on the shingle strings
    exact_pairs = []
    for i, j, J in pairs:
        if abs(J - THRESHOLD) < 0.02:
            J = string_jaccard(surv[i]["text"], surv[j]["text"])
        if J >= THRESHOLD:
            exact_pairs.append((i, j, J))
    comp = components(len(surv), ((i, j) for i, j, _ in exact_pairs))
    oracle_s = time.perf_counter() - t0
    csize = Counter(comp)
    perfect = {surv[i]["doc_id"] for i in range(len(surv)) if comp[i] != i}  # root = lowest doc_id
    pos = {d["doc_id"]: i for i, d in enumerate(surv)}
    fz = {r["doc_id"]: r for r in rows if r["stage"] == "fuzzy"}
    ours = set(fz)
    in_true = {x for x in ours if x in pos and csize[comp[pos[x]]] >= 2}
    # ours' components: survivor -> members
    ours_comp = {x: r["duplicate_of"] for x, r in fz.items()}
    label = {d["doc_id"]: ours_comp.get(d["doc_id"], d["doc_id"]) for d in surv}
    missed_pairs = [(i, j, J) for i, j, J in exact_pairs if label[surv[i]["doc_id"]] != label[surv[j]["doc_id"]]]
    partner_j, below, outside, score_diff = [], [], [], 0
    for x, r in fz.items():
        if x not in pos or r["duplicate_of"] not in pos:
            outside.append(x)
            continue
        a, b = pos[x], pos[r["duplicate_of"]]
        J = string_jaccard(surv[a]["text"], surv[b]["text"])
        partner_j.append(J)
        if r["score"] is None or abs(r["score"] - J) > 1e-5:
            score_diff += 1
        if J < THRESHOLD:
            below.append({"doc": surv[a]["id"], "partner": surv[b]["id"], "jaccard": round(J, 4),
                          "same_true_component": comp[a] == comp[b]})
    missed_docs = perfect - ours
    in_comp = {label[x] for x in ours} | ours  # documents in one of ours' components of size >= 2
    missed_info = []
    for i, j, J in missed_pairs:
        a, b = surv[i], surv[j]
        missed_info.append({"a": a["id"], "b": b["id"], "jaccard": round(J, 4),
                            "shingles": (len(hashes[i]), len(hashes[j])),
                            "shared_lsh_bands": _shared_bands(a["text"], b["text"]),
                            "a_b_in_ours_components": (a["doc_id"] in in_comp, b["doc_id"] in in_comp)})
    short = [d["doc_id"] for d in surv if len(d["text"]) < K]
    nonascii = {d["doc_id"] for d in surv if not d["text"].isascii()}
    rep["fuzzy"] = {
        "input": len(surv), "pairs_verified_by_oracle": ncand, "true_pairs": len(exact_pairs),
        "true_components": sum(1 for c in csize.values() if c >= 2),
        "largest_component": max(csize.values()) if csize else 0,
        "oracle_removed": len(perfect), "ours_removed": len(ours),
        "ours_removed_in_true_component": len(in_true),
        "ours_removed_not_in_perfect": len(ours - perfect),
        "precision": len(in_true) / len(ours) if ours else 1.0,
        "recall": len(ours & perfect) / len(perfect) if perfect else 1.0,
        "removed_outside_input": outside[:10],
        "partner_below_threshold": len(below), "partner_below_examples": below[:10],
        "partner_below_not_same_component": sum(1 for b in below if not b["same_true_component"]),
        "score_differs_from_true_jaccard": score_diff,
        "missed_pairs": len(missed_pairs),
        "missed_pair_jaccard": _hist((J for *_, J in missed_pairs), (0.8, 0.82, 0.85, 0.9, 0.95, 1.0, 1.01)),
        "missed_docs": len(missed_docs),
        "missed_examples": missed_info[:30],
        "missed_pairs_sharing_an_lsh_band": sum(1 for m in missed_info if m["shared_lsh_bands"]),
        "expected_lsh_missed_pairs": round(_expected_lsh_misses(J for *_, J in exact_pairs), 2),
        "short_docs": {"input": len(short), "oracle_removed": len(perfect.intersection(short)),
                       "ours_removed": len(ours.intersection(short))},
        "non_ascii_docs": {"input": len(nonascii), "oracle_removed": len(perfect & nonascii),
                           "ours_removed": len(ours & nonascii)},
        "oracle_seconds": round(oracle_s, 1),
    }
    return rep


def _shared_bands(a: str, b: str) -> int:
    """Diagnosis only (the project's kernels): LSH bands (default 26 x 10) where a and b share a
    bucket. 0: an LSH miss; > 0: a candidate pair that verification never compared."""
    from stages.kernels.lsh import band_keys
    from stages.kernels.minhash import signatures
    from stages.params import LshBucketsParams

    p = LshBucketsParams()
    keys = band_keys(signatures([a, b]), p.bands, p.rows)
    return int((keys[0] == keys[1]).sum())


def _expected_lsh_misses(js: Iterable[float]) -> float:
    """Sum over true pairs of P(no shared band) = (1 - J^rows)^bands at the default banding."""
    from stages.params import LshBucketsParams

    p = LshBucketsParams()
    return sum((1 - j ** p.rows) ** p.bands for j in js)


def by_id_rec(did: dict[str, dict[str, Any]], doc_id: str) -> str:
    """The record id of a doc_id (the doc_id itself when unknown)."""
    d = did.get(doc_id)
    return d["id"] if d else doc_id


def describe(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Corpus counts: per source, size, short, non-ASCII and surrogate-holding texts."""
    lens = sorted(len(d["text"]) for d in docs)
    return {
        "documents": len(docs),
        "per_source": dict(Counter(d["source"] for d in docs)),
        "megabytes_utf8": round(sum(len(d["text"].encode("utf-8", "surrogatepass")) for d in docs) / 1e6, 1),
        "shorter_than_24": sum(1 for n in lens if n < K),
        "non_ascii": sum(1 for d in docs if not d["text"].isascii()),
        "lone_surrogates": sum(1 for d in docs if _has_lone_surrogate(d["text"])),
        "chars_median_max": (lens[len(lens) // 2], lens[-1]) if lens else (0, 0),
    }


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, run the pipeline, compare; writes OUT/report.json and prints it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-docs", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "curate-oracle")
    ap.add_argument("--max-file-bytes", type=int, default=128 << 10)
    ap.add_argument("--long-docs", type=int, default=5, help="files per source allowed over --max-file-bytes")
    ap.add_argument("--skip-run", action="store_true", help="reuse OUT/work's ledger")
    args = ap.parse_args(argv)
    corpus = args.out / "corpus"
    if not args.skip_run:
        shutil.rmtree(corpus, ignore_errors=True)
        folders = build_corpus(corpus, args.max_docs, args.seed, args.max_file_bytes, args.long_docs)
    else:
        folders = {s: corpus / s for s in SOURCES}
    docs = load_corpus(folders)
    report: dict[str, Any] = {"corpus": describe(docs)}
    if args.skip_run:
        ledger = args.out / "work" / "ledger.parquet"
    else:
        wall, ledger = run_pipeline(folders, args.out / "work")
        report["curate_run_seconds"] = round(wall, 1)
    report.update(compare(docs, ledger))
    text = json.dumps(report, indent=1, ensure_ascii=False)
    (args.out / "report.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
