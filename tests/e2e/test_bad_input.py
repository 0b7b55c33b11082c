"""Bad input: a generated corpus of nasty files through ``curate run`` (Dagster), new quarantine
reasons (duplicate record ids, overlong texts and lines), empty files, and a giant LSH bucket in
bounded memory.

Line-level reasons (invalid JSON/UTF-8, NUL, text null/number/list/empty, not an object), damaged
gzip/zstd/Parquet files and a URL matching nothing are covered one by one in ``test_ingest.py``;
here they come all at once, with everything else in the same source still processed and every
source adding up: ``input = kept + quarantined + removed``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from curation_dagster import cli
from curation_dagster.defs.resources import load_spec
from stages.dataroot import CRAWLS_DIR, DataRoot
from stages.execute import execute
from stages.params import ExecutionParams, RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store
from tests.support.peak_rss import PEAK
from tests.support.tiny_corpus import TINY, fast_tmp

FAKE_KEY_ID = "AKIAFAKEFAKE7Q3ZEXAMPLE"
FAKE_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzFAKESECRET"  # planted; must never be written anywhere


def good_texts() -> list[str]:
    """Real prose that passes every default heuristic rule: the tiny corpus's kept news records."""
    outcomes = json.loads((TINY / "expected.json").read_text())["default"]["outcomes"]["news"]
    texts = []
    for line in (TINY / "news" / "news-2024-05.jsonl").read_bytes().splitlines():
        with contextlib.suppress(ValueError):  # the file plants bad lines too
            rec = json.loads(line)
            if isinstance(rec, dict) and outcomes.get(rec.get("id")) == "kept":
                texts.append(rec["text"])
    return texts


def jsonl(*records: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def complete_lines_before_damage(plain: bytes, damaged: bytes, kind: str) -> int:
    """How many whole lines a reader can recover from a truncated stream (computed with a raw
    decompressor that, unlike a file reader, returns partial output without raising)."""
    if kind == "gz":
        out = zlib.decompressobj(31).decompress(damaged)
    else:  # frame after frame; the last one is cut
        out, rest = b"", damaged
        while rest:
            dobj = zstandard.ZstdDecompressor().decompressobj()
            out += dobj.decompress(rest)
            rest = dobj.unused_data if dobj.eof else b""
    assert plain.startswith(out) and len(out) < len(plain)
    return out.count(b"\n")


def build_nasty(root: Path) -> dict[str, Any]:
    """Sources ``messy`` (every kind of damage next to good records) and ``cookies`` (100k
    identical near-empty pages); returns the counts the planting implies."""
    good = good_texts()
    assert len(good) >= 8
    messy = root / "messy"
    messy.mkdir(parents=True)
    near = good[0].replace(" council ", " committee ", 1)
    assert near != good[0]
    lines = [
        *({"id": f"g{i}", "text": t} for i, t in enumerate(good[:4])),
        {"id": "nd1", "text": near},  # a near-duplicate of g0: fuzzy
        {"id": "twin", "text": good[4]}, {"id": "twin", "text": good[4]},  # identical: exact, not an id clash
        {"id": "d1", "text": good[5]}, {"id": "d1", "text": good[6]}, {"id": "d1", "text": good[7]},  # id clash
        b'{"id": "bj1", "text": "unterminated}',
        b'{"id": "bj2", "text": "a raw \x00 NUL byte is not JSON"}',
        b"\x00\x00\x00\x00",
        b'{"id": "bu1", "text": "caf\xe9 latin-1"}',
        b'{"id": "bn1", "text": "an escaped \\u0000 NUL"}',
        {"id": "bt1", "text": None}, {"id": "bt2"},
        {"id": "bt3", "text": 42}, {"id": "bt4", "text": ["a", "list"]},
        {"id": "bt5", "text": " \n "}, [1, 2, 3],
    ]
    (messy / "records.jsonl").write_bytes(jsonl(*lines))
    # Empty in every way: no bytes, a gzip of nothing, blank lines only, a 0-byte Parquet file.
    (messy / "empty.jsonl").write_bytes(b"")
    (messy / "empty.jsonl.gz").write_bytes(b"")
    (messy / "hollow.jsonl.gz").write_bytes(gzip.compress(b"", mtime=0))
    (messy / "blank.jsonl").write_bytes(b"\n\n  \n")
    (messy / "empty.parquet").write_bytes(b"")
    # Truncated gzip and zstd: short records (removed by the heuristic min_words rule).
    rng = random.Random(0)
    short = [{"id": f"s{i}", "text": " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(8)) +
              f" {rng.random():.12f}."} for i in range(3000)]
    plain = jsonl(*short)
    gz = gzip.compress(plain, mtime=0)
    zst = zstandard.ZstdCompressor().compress(plain[: len(plain) // 2]) + zstandard.ZstdCompressor().compress(
        plain[len(plain) // 2:])
    (messy / "cut.jsonl.gz").write_bytes(gz[: len(gz) * 2 // 3])
    (messy / "cut.jsonl.zst").write_bytes(zst[: len(zst) - 200])
    n_gz = complete_lines_before_damage(plain, gz[: len(gz) * 2 // 3], "gz")
    n_zst = complete_lines_before_damage(plain, zst[: len(zst) - 200], "zst")
    # Parquet with the wrong schema: an integer text column, and no text column at all.
    pq.write_table(pa.table({"id": ["p1", "p2", "p3", "p4"], "text": [1, 2, 3, 4]}), messy / "wrong.parquet")
    pq.write_table(pa.table({"id": ["p5", "p6"], "body": ["x", "y"]}), messy / "missing.parquet")
    # One 50 MB document (over the default max_chars of 10M): quarantined before any stage sees it.
    words = [f"w{i:04d}" for i in range(4000)]
    big = " ".join(rng.choice(words) for _ in range(50_000_000 // 6))
    (messy / "big.jsonl").write_text(json.dumps({"id": "huge", "text": big}) + "\n")
    (root / "cookies").mkdir()
    (root / "cookies" / "pages.jsonl").write_bytes(b'{"text": "Accept all cookies"}\n' * 100_000)

    reasons = {"invalid_json": 2 + 1, "invalid_utf8": 1, "nul_byte": 1, "missing_text": 2, "text_not_string": 2,
               "empty_text": 1, "not_an_object": 1, "duplicate_record_id": 2,
               "wrong_schema": 6, "text_too_long": 1}
    kept = 4 + 1 + 1  # g0-g3, the twin that survives exact, the d1 record with the lowest doc_id
    removed = {"heuristic": n_gz + n_zst, "exact": 1, "fuzzy": 1}
    quarantined = sum(reasons.values())
    return {
        "messy": {"input": kept + quarantined + sum(removed.values()), "kept": kept, "quarantined": quarantined,
                  "removed": removed, "reasons": reasons, "empty_files": 5,
                  "damaged": ["cut.jsonl.gz", "cut.jsonl.zst"]},
        "cookies": {"input": 100_000, "kept": 0, "quarantined": 0, "removed": {"heuristic": 100_000},
                    "reasons": {}, "empty_files": 0, "damaged": []},
    }


def curate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow  # ~50 MB of input and 100k records through every stage on a real Dagster instance
def test_nasty_corpus_through_dagster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", FAKE_SECRET + "TOKEN")
    with fast_tmp(tmp_path / "work") as root:
        want = build_nasty(root / "in")
        config = root / "curate.json"
        config.write_text(json.dumps({
            "sources": {"messy": {"url": str(root / "in" / "messy"), "id_field": "id"},
                        "cookies": {"url": str(root / "in" / "cookies")}},
            "stages": ["heuristic", "exact", "fuzzy"],
            "allow_damaged_files": True,  # the two cut files: reported, their records before the cut kept
        }))
        work = root / "w"
        work.mkdir()
        # 100k cookie banners are all junk: let the over-deletion guard pass them (it blocks at 90%)
        (work / "curate.yaml").write_text("checks:\n  over_deletion:\n    per_stage: {heuristic: 1.0}\n")
        code, out, err = curate("run", "--workdir", str(work), "--crawl", "c1", "--config", str(config), "--quiet")
        assert code == 0, err
        code, report_json, err2 = curate("report", "--workdir", str(work), "--crawl", "c1", "--json")
        assert code == 0, err2
        report = json.loads(report_json)["sources"]
        spec = load_spec(work, "c1")
        store = Store(str(work / "data"))
        code, _, err3 = curate("ledger", "--workdir", str(work), "--crawl", "c1", "--out", str(root / "ledger.parquet"))
        assert code == 0, err3
        ledger = pq.read_table(root / "ledger.parquet").to_pylist()
        for source, w in want.items():
            got = report[source]
            assert {k: got[k] for k in ("input", "kept", "quarantined")} == \
                {k: w[k] for k in ("input", "kept", "quarantined")}, source
            assert {k: v for k, v in got["removed"].items() if v} == w["removed"], source
            assert got["input"] == got["kept"] + got["quarantined"] + sum(got["removed"].values())
            raw = DataRoot(store).manifest(spec, "raw_documents", source)
            assert raw is not None
            assert raw.report["quarantine_reasons"] == w["reasons"], source
            assert raw.report["empty_files"] == w["empty_files"], source
            assert [d["file"] for d in raw.report["damaged_files"]] == w["damaged"], source
            rows = [r for r in ledger if r["source"] == source and r["stage"] == "quarantine"]
            assert Counter(r["reason"] for r in rows) == Counter(w["reasons"]), source
            assert all(r["detail"] and "\n" not in r["detail"] for r in rows)  # one clear line each
        # The clashing record id: one record kept, the lowest doc_id of the three.
        docs = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", "messy"), "documents")
        d1 = [d for d in docs.to_pylist() if d["record_id"] == "d1"]
        clash = [r for r in ledger if r["reason"] == "duplicate_record_id"]
        assert len(d1) == 1 and len(clash) == 2
        assert all(d1[0]["doc_id"] < r["doc_id"] and d1[0]["doc_id"] in r["detail"] for r in clash)
        assert {r["record_id"] for r in clash} == {"d1"}
        assert next(r for r in ledger if r["reason"] == "text_too_long")["record_id"] == "huge"
        # No credential reaches any file the run wrote (data, manifests, specs, the Dagster
        # instance's run and event storage, compute logs) or its output.
        for path in work.rglob("*"):
            if path.is_file():
                blob = path.read_bytes()
                for secret in (FAKE_SECRET, FAKE_KEY_ID):
                    assert secret.encode() not in blob, path
        for text in (out, err, report_json):
            assert FAKE_SECRET not in text and FAKE_KEY_ID not in text
        assert sum(1 for _ in (work / "data").rglob(MANIFEST)) > 10


def test_credentials_in_a_source_url_are_refused_without_echoing_them(tmp_path: Path) -> None:
    url = f"s3://{FAKE_KEY_ID}:{FAKE_SECRET}@bucket/crawl/*.jsonl"
    code, out, err = curate("run", "--workdir", str(tmp_path / "w"), "--crawl", "c1", "--source", f"news={url}")
    assert code == 1
    assert "carries credentials" in err and len(err.strip().splitlines()) == 1
    assert FAKE_SECRET not in err + out and FAKE_KEY_ID not in err + out
    assert not (tmp_path / "w" / "data" / CRAWLS_DIR).exists()
    with pytest.raises(ValueError, match="carries credentials") as exc:
        CrawlSpec(crawl="c1", sources={"news": RawDocumentsParams(url=url)})
    assert FAKE_SECRET not in str(exc.value)
    RawDocumentsParams(url=f"s3://bucket/{FAKE_KEY_ID}/x.jsonl")  # a user name-like path is no credential


# --- duplicate record ids -------------------------------------------------------------------------


def ingest(tmp_path: Path, url: Path, execution: ExecutionParams | None = None, **params: Any) -> dict[str, Any]:
    spec = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(url), **params)})
    store = Store(str(tmp_path / "data"))
    outcome = execute(store, spec, "raw_documents", "s", execution or ExecutionParams(batch_rows=3))
    pdir = DataRoot(store).output_dir(spec, "raw_documents", "s")
    return {"report": outcome.manifest.report, "docs": store.read_table(pdir, "documents").to_pylist(),
            "bad": store.read_table(pdir, "quarantine").to_pylist(), "manifest": outcome.manifest,
            "dir": pdir}


CLASH = [
    {"id": "a", "text": "first version of a"}, {"id": "b", "text": "only b"},
    {"id": "a", "text": "second version of a"}, {"id": "a", "text": "first version of a"},  # a twin of the first
    {"id": "c", "text": "c one"}, {"id": "c", "text": "c two", "lang": "en"}, {"text": "no id at all"},
    {"text": "no id at all"}, {"id": "a", "text": "third version of a"},
]


@pytest.mark.parametrize("layout", ["one file", "reversed and split", "split tasks"])
def test_a_record_id_naming_different_records_keeps_the_lowest_doc_id(tmp_path: Path, layout: str) -> None:
    reference = ingest(tmp_path / "ref", _write(tmp_path / "ref-in", {"all.jsonl": CLASH}), id_field="id")
    if layout == "one file":
        got = reference
    elif layout == "reversed and split":
        src = _write(tmp_path / "in", {"x/2.jsonl.gz": CLASH[::-1][:4], "1.jsonl": CLASH[::-1][4:]})
        got = ingest(tmp_path / "out", src, id_field="id")
    else:
        src = _write(tmp_path / "in", {"all.jsonl": CLASH})
        got = ingest(tmp_path / "out", src, ExecutionParams(batch_rows=2, ingest_task_bytes=40, workers=2),
                     id_field="id")
        assert got["report"]["tasks"] >= 5
    docs = {d["doc_id"]: d for d in got["docs"]}
    bad = {b["doc_id"]: b for b in got["bad"]}
    assert {b["reason"] for b in bad.values()} == {"duplicate_record_id"}
    for record_id, contents in (("a", 3), ("c", 2)):
        kept = [d for d in docs.values() if d["record_id"] == record_id]
        moved = [b for b in bad.values() if b["record_id"] == record_id]
        winner = min([d["doc_id"] for d in kept] + [b["doc_id"] for b in moved])
        # the lowest doc_id's record stays, with any identical copy of it; every other goes
        assert winner in docs and {d["text"] for d in kept} == {docs[winner]["text"]}
        assert len({b["raw"] for b in moved}) == contents - 1
        assert all(winner in b["detail"] and f"record_id {record_id!r}" in b["detail"] for b in moved)
        assert all(b["duplicate_of"] == winner for b in moved)  # the kept document, by name
        assert len(kept) + len(moved) == sum(1 for r in CLASH if r.get("id") == record_id)
    assert sum(1 for d in docs.values() if d["record_id"] is None) == 2  # no id: nothing to clash
    assert got["report"]["input"] == len(CLASH) and got["report"]["documents"] == len(CLASH) - len(bad)
    assert got["report"]["chars"] == sum(len(d["text"]) for d in docs.values())
    # Order-independent and stable: the same ids kept and quarantined in every layout.
    assert set(docs) == {d["doc_id"] for d in reference["docs"]}
    assert set(bad) == {b["doc_id"] for b in reference["bad"]}
    # The rewrite leaves no part of the first pass behind, and the manifest counts the final rows.
    manifest = got["manifest"]
    assert manifest.rows["documents"] == len(docs) and set(manifest.tables) == {"documents", "quarantine"}
    assert {p.name for p in Path(got["dir"]).iterdir()} == {MANIFEST, *manifest.tables["documents"],
                                                             *manifest.tables["quarantine"]}


def test_without_an_id_field_records_never_clash(tmp_path: Path) -> None:
    got = ingest(tmp_path, _write(tmp_path / "in", {"all.jsonl": CLASH}), id_field="")
    assert not got["bad"] and len(got["docs"]) == len(CLASH)


def _write(root: Path, files: dict[str, list[Any]]) -> Path:
    for name, records in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = jsonl(*records)
        path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return root


# --- sizes ---------------------------------------------------------------------------------------------


def test_overlong_texts_and_lines_are_quarantined_and_the_rest_read(tmp_path: Path) -> None:
    long_text = "x" * 5000
    lines = [{"id": "ok1", "text": "short"}, {"id": "long", "text": long_text},
             {"id": "meta", "text": "short text, huge metadata", "blob": "y" * (3 << 20)},
             {"id": "ok2", "text": "fine"}]
    src = _write(tmp_path / "in", {"a.jsonl": lines, "b.jsonl.gz": lines})
    got = ingest(tmp_path / "o1", src, ExecutionParams(batch_rows=3, ingest_task_bytes=1 << 16, workers=1),
                 id_field="id", max_chars=1000)
    assert sorted(d["record_id"] for d in got["docs"]) == ["ok1", "ok1", "ok2", "ok2"]
    assert Counter(b["reason"] for b in got["bad"]) == {"text_too_long": 2, "record_too_large": 2}
    too_large = [b for b in got["bad"] if b["reason"] == "record_too_large"]
    # the over-long line is never parsed: no record id, an excerpt, its size in the detail
    assert all(b["record_id"] is None and b["raw"].startswith('{"id": "meta"') for b in too_large)
    assert {b["detail"].split(":")[0] for b in too_large} == {"a.jsonl", "b.jsonl.gz"}
    assert all(f"{len(json.dumps(lines[2]))} bytes" in b["detail"] for b in too_large)
    assert got["report"]["input"] == 8
    unlimited = ingest(tmp_path / "o2", src, id_field="id", max_chars=None)
    assert len(unlimited["docs"]) == 8 and not unlimited["bad"]


def test_empty_files_are_counted_and_skipped(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b"")
    (src / "b.jsonl.gz").write_bytes(gzip.compress(b"", mtime=0))
    (src / "c.jsonl.zst").write_bytes(b"")
    (src / "d.parquet").write_bytes(b"")
    (src / "e.jsonl").write_bytes(b"\n \n")
    only_empty = ingest(tmp_path / "o1", src)
    assert only_empty["report"]["empty_files"] == 5 and only_empty["report"]["input"] == 0
    assert only_empty["docs"] == [] and only_empty["bad"] == []
    (src / "f.jsonl").write_bytes(jsonl({"text": "one record"}))
    got = ingest(tmp_path / "o2", src)
    assert got["report"]["empty_files"] == 5 and got["report"]["files"] == 6 and len(got["docs"]) == 1


# --- a giant bucket --------------------------------------------------------------------------------

GIANT = PEAK + """
import json, sys
from stages.params import ExecutionParams, RawDocumentsParams
from stages.store import Store
from stages.execute import execute
from stages.spec import CrawlSpec

spec = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=sys.argv[1])}, stages=("fuzzy",))
store = Store(sys.argv[2])
execution = ExecutionParams(workers=1)
for program in ("raw_documents", "document_languages", "filtered_documents", "exact_duplicates", "minhash_signatures"):
    execute(store, spec, program, "s" if program != "exact_duplicates" else None, execution)
before = peak_kib()
reports = {p: execute(store, spec, p, None, execution).manifest.report
           for p in ("lsh_buckets", "duplicate_components", "fuzzy_duplicates")}
print(json.dumps({"before_kib": before, "peak_kib": peak_kib(), "reports": reports}))
"""


@pytest.mark.slow  # 100k documents through MinHash, LSH and components in a subprocess
def test_a_giant_bucket_of_identical_near_empty_pages_stays_in_bounded_memory(tmp_path: Path) -> None:
    """100k identical pages (exact and heuristic off) share every LSH band key: one bucket of
    100k per band. Anchor edges keep it linear (n - 1 edges per band instead of n^2 / 2 = 5e9
    pairs); the peak RSS of the bucket, components and removal stages stays under a bound that
    a quadratic step would exceed by orders of magnitude."""
    n = 100_000
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "pages.jsonl").write_bytes(b'{"text": "Accept all cookies"}\n' * n)
    proc = subprocess.run([sys.executable, "-c", GIANT, str(tmp_path / "in"), str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    lsh, comps, fuzzy = (got["reports"][p] for p in ("lsh_buckets", "duplicate_components", "fuzzy_duplicates"))
    assert lsh["largest_buckets"][0]["size"] == n
    assert lsh["edges"] == lsh["bands"] * (n - 1)  # one anchor edge per member and band
    assert comps["candidate_pairs"] == n - 1 and comps["components"] == 1 and comps["largest_clusters"] == [n]
    assert fuzzy["removed"] == n - 1
    peak_mib = got["peak_kib"] / 1024
    assert peak_mib < 1536, f"peak RSS {peak_mib:.0f} MiB for one bucket of {n} documents"
