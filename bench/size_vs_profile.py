"""``curate size`` against what a profiled fuzzy run measures, at a size given on the command line.

    python bench/size_vs_profile.py --docs 1000000 [--mean-chars 2000] [--dup-rate 0.1] [--sources 4]
                                    [--work DIR] [--workers N]

Writes a synthetic crawl (random words; a ``--dup-rate`` fraction of the documents are copies of
another with a few words replaced, planted at Jaccard ~``--dup-similarity``), runs the fuzzy stage
on it without Dagster (``stages.execute.execute_crawl``), profiles it (``curate profile``'s
figures) and prints each figure of ``curate size`` beside the measured one, with the ratio and
whether it is within 2x. The issue asks for this on the 1M-document scale run; the test suite does
it on the tiny corpus (tests/curation_dagster/tools/test_profile.py). Not run in tests.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from curation_dagster.tools.profile import measured_sizing, print_profile, profile
from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.sizing import Assumptions, Crawl, Setting, size
from stages.spec import CrawlSpec

CRAWL = "size-check"
SHINGLE = 24


def _words(rng: random.Random, vocab: list[str], chars: int) -> list[str]:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(vocab)
        out.append(word)
        size += len(word) + 1
    return out


def write_corpus(folder: Path, docs: int, mean_chars: int, dup_rate: float, dup_similarity: float,
                 sources: int, seed: int = 0) -> None:
    """``sources`` JSONL files of ``docs`` documents in all: originals, and ``dup_rate x docs``
    copies of distinct originals with words replaced so their shingle Jaccard is ~``dup_similarity``
    (an edit changes ~``SHINGLE`` + a word's shingles)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(20_000)]
    copies = int(docs * dup_rate)
    originals = docs - copies
    # Jaccard (S - x) / (S + x) for x changed shingles of S: x = S (1 - J) / (1 + J), ~30 per edit.
    edits = max(1, round(mean_chars * (1 - dup_similarity) / (1 + dup_similarity) / (SHINGLE + 6)))
    handles = []
    for i in range(sources):
        (folder / f"s{i}").mkdir(parents=True, exist_ok=True)
        handles.append((folder / f"s{i}" / "part.jsonl").open("w"))
    keep: list[list[str]] = []
    stride = max(originals // max(copies, 1), 1)
    for k in range(originals):
        words = _words(rng, vocab, rng.randint(mean_chars // 2, mean_chars * 3 // 2))
        handles[k % sources].write(json.dumps({"id": f"d{k}", "text": " ".join(words)}) + "\n")
        if k % stride == 0 and len(keep) < copies:
            keep.append(words)
    for j, words in enumerate(keep):
        words = list(words)
        for _ in range(edits):
            words[rng.randrange(len(words))] = rng.choice(vocab)
        handles[j % sources].write(json.dumps({"id": f"c{j}", "text": " ".join(words)}) + "\n")
    for h in handles:
        h.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--mean-chars", type=int, default=2000)
    ap.add_argument("--dup-rate", type=float, default=0.1)
    ap.add_argument("--dup-similarity", type=float, default=0.9)
    ap.add_argument("--sources", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="0 = every core")
    ap.add_argument("--work", type=Path, help="a folder for the corpus and the data root (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="size-vs-profile-"))
    t0 = time.perf_counter()
    write_corpus(work / "corpus", args.docs, args.mean_chars, args.dup_rate, args.dup_similarity, args.sources)
    print(f"corpus: {args.docs} documents in {time.perf_counter() - t0:.1f}s under {work}", file=sys.stderr)
    root = DataRoot.open(str(work / "data"))
    spec = CrawlSpec(crawl=CRAWL, stages=("fuzzy",), sources={
        f"s{i}": {"url": str(work / "corpus" / f"s{i}"), "id_field": "id"} for i in range(args.sources)})
    root.register(spec)
    t0 = time.perf_counter()
    execute_crawl(root.store, spec, ExecutionParams(workers=args.workers))
    print(f"fuzzy run: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print_profile(profile(root, CRAWL))

    got = measured_sizing(root, CRAWL)
    lsh = spec.program_params("lsh_buckets")
    want = size(Crawl(int(got["documents"]), got["mean_chars"]),
                Setting(bands=lsh.bands, rows=lsh.rows),  # type: ignore[attr-defined]
                Assumptions(dup_rate=args.dup_rate, dup_similarity=args.dup_similarity))
    rows = [
        ("signature table bytes", want.signatures["bytes"], got["signature_bytes"]),
        ("band keys", want.band_keys["keys"], got["band_keys"]),
        ("band-key bytes", want.band_keys["bytes"], got["band_key_bytes"]),
        ("band edges", want.candidates["band_edges"], got["band_edges"]),
        ("candidate pairs", want.candidates["candidate_pairs"], got["candidate_pairs"]),
        ("verification text bytes", want.verification["text_bytes"], got["verification_text_bytes"]),
    ]
    print(f"\nsize vs profile: {int(got['documents'])} documents signed, {got['mean_chars']:.0f} mean chars")
    print(f"{'figure':<26}{'size':>16}{'measured':>16}{'ratio':>8}  within 2x")
    ok = True
    for name, predicted, measured in rows:
        ratio = predicted / measured if measured else float("inf")
        within = 0.5 <= ratio <= 2.0
        ok &= within or name not in ("signature table bytes", "band keys", "band-key bytes")
        print(f"{name:<26}{predicted:>16.4g}{measured:>16.4g}{ratio:>8.3f}  {'yes' if within else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
