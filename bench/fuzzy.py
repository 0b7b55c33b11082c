"""Fuzzy dedup end to end: this project against datasketch, rensa and datatrove on the same corpus, same run.

Corpus: ``curate sample`` real text (stdlib docstrings, license files, package descriptions)
with ``--copies`` lightly varied copies of every document (near-duplicates by construction).
Each contender runs in its own subprocess so its peak RSS is its own:

- ``ours``: the real stage programs (ingest JSONL -> Parquet, MinHash, LSH band by band, exact
  Jaccard verification, components, removal list) via ``stages.execute.execute_crawl`` with
  only stage ``fuzzy`` enabled; the signature kernel's own MB/s comes from its report.
- ``ours+dagster``: the same through ``curate run`` on a SQLite Dagster instance.
- ``rensa``: RMinHash (char-24 shingles, 260 perms) + RMinHashLSH (threshold 0.8, 20 bands).
- ``datasketch``: MinHash + MinHashLSH (same settings) on a subset (``--peer-mb``); it runs at
  ~1 MB/s, so its MB/s is measured on fewer documents.
- ``datatrove``: HuggingFace datatrove's four-stage MinHash pipeline (MinhashDedupSignature ->
  MinhashDedupBuckets -> MinhashDedupCluster -> MinhashDedupFilter + JsonlWriter), each stage a
  ``LocalPipelineExecutor`` with 2 workers (its default forkserver pool), reading the same JSONL
  files with its ``JsonlReader`` (one task per input file; 14 bucket tasks; one cluster task).
  **Its settings are its defaults, not ours**: ``MinhashConfig()`` = word 5-grams of simplified
  text (lowercased, punctuation and numbers normalised, spaCy ``en`` tokens), 14 bands x 8
  hashes, no verification; ours is char-24 shingles, 26 x 10 bands and exact Jaccard
  verification. Its removed count therefore differs by design. datatrove's default hash
  (xxhash64) passes ``str`` to ``xxhash``, which xxhash >= 4 (this project's) rejects; the bench
  gives its signature step the same hash over the UTF-8 bytes, as xxhash < 4 did.

Peers rensa and datasketch get the texts already in memory (their time starts at shingling);
ours and datatrove include reading the JSONL and writing their files (all four datatrove stages:
signatures, buckets, clusters, filtered output). MB/s per core = text megabytes / CPU seconds of
the process tree.

    python bench/fuzzy.py [--copies 20] [--max-docs 1500] [--peer-mb 3] [--skip-datasketch]
    python bench/fuzzy.py --copies 480 --contenders ours   # ~1M documents, 2.3 GB: the memory target

Peak RSS is the largest of the contender process's own high-water mark and its largest child's
(RUSAGE_CHILDREN, which covers grandchildren once reaped: datatrove's pool workers are children of
its forkserver, so the bench stops the forkserver before reading it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import CURATE, char_shingles, components, peak_self_kib, sample_texts

SHINGLE, NUM_PERM, BANDS, THRESHOLD = 24, 260, 20, 0.8


def _removed_from_pairs(n: int, pairs: list[tuple[int, int]]) -> int:
    """Documents a dedup over these pairs removes: all but one per connected component."""
    return n - len(set(components(n, pairs)))


def run_rensa(texts: list[str]) -> dict[str, Any]:
    from rensa import RMinHash, RMinHashLSH

    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=BANDS)
    hashes = []
    for i, text in enumerate(texts):
        m = RMinHash(num_perm=NUM_PERM, seed=42)
        m.update(char_shingles(text))
        hashes.append(m)
        lsh.insert(i, m)
    pairs = [(i, j) for i, m in enumerate(hashes) for j in lsh.query(m) if j != i]
    return {"removed": _removed_from_pairs(len(texts), pairs)}


def run_datasketch(texts: list[str]) -> dict[str, Any]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=(BANDS, NUM_PERM // BANDS))
    hashes = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=NUM_PERM, seed=42)
        m.update_batch([s.encode("utf-8", "surrogatepass") for s in char_shingles(text)])
        hashes.append(m)
        lsh.insert(i, m)
    pairs = [(i, j) for i, m in enumerate(hashes) for j in lsh.query(m) if j != i]
    return {"removed": _removed_from_pairs(len(texts), pairs)}


def _xxh64_utf8(data: str | bytes) -> int:
    """datatrove's default shingle hash (xxh64) over UTF-8 bytes: xxhash >= 4 no longer takes str."""
    import xxhash

    return xxhash.xxh64_intdigest(data.encode("utf-8") if isinstance(data, str) else data)


def run_datatrove(folder: Path, work: Path, workers: int = 2) -> dict[str, Any]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    # The same files ours ingests; a paths file because scraps/ sits in the same folder.
    files = sorted(str(p.relative_to(folder)) for p in folder.glob("*/part-*")
                   if p.parent.name not in ("scraps", "benchmarks"))
    (work / "paths.txt").write_text("\n".join(files) + "\n")
    config = MinhashConfig()  # word 5-grams, 14 x 8: datatrove's defaults, deliberately not ours

    def reader() -> JsonlReader:
        return JsonlReader(str(folder), paths_file=str(work / "paths.txt"), text_key="text", id_key="id")

    def executor(pipeline: list[Any], tasks: int, name: str) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(pipeline, tasks=tasks, workers=min(workers, tasks),
                                     logging_dir=str(work / "logs" / name))

    signature = MinhashDedupSignature(output_folder=str(work / "signatures"), config=config)
    signature._hash_func = _xxh64_utf8
    executor([reader(), signature], len(files), "signatures").run()
    executor([MinhashDedupBuckets(input_folder=str(work / "signatures"), output_folder=str(work / "buckets"),
                                  config=config)], config.num_buckets, "buckets").run()
    executor([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"),
                                  config=config)], 1, "clusters").run()
    stats = executor([reader(), MinhashDedupFilter(input_folder=str(work / "remove_ids")),
                      JsonlWriter(str(work / "deduplicated"))], len(files), "filter").run()
    dropped = next(int(step.stats["dropped"].total) for step in stats.stats if "MinHash stage 4" in step.name)
    return {"removed": dropped, "settings": f"word {config.n_grams}-grams, {config.num_buckets} x "
                                            f"{config.hashes_per_bucket}, no verification"}


def _reap_forkserver() -> None:
    """Stop multiprocess's forkserver so its children's CPU time and peak RSS reach RUSAGE_CHILDREN."""
    import multiprocess.forkserver

    multiprocess.forkserver._forkserver._stop()


def run_ours(folder: Path, work: Path) -> dict[str, Any]:
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams
    from stages.spec import CrawlSpec
    from stages.store import Store

    sources = {p.name: {"url": str(p), "id_field": "id"} for p in sorted(folder.iterdir())
               if p.is_dir() and p.name not in ("scraps", "benchmarks")}
    spec = CrawlSpec(crawl="bench", sources=sources, stages=("fuzzy",))
    outcomes = execute_crawl(Store(str(work / "data")), spec, ExecutionParams())
    sig = [o.manifest.report for (name, _), o in outcomes.items() if name == "minhash_signatures"]
    kernel_s = sum(r.get("kernel_seconds", 0.0) for r in sig)
    nbytes = sum(r.get("bytes", 0) for r in sig)
    fuzzy = outcomes[("fuzzy_duplicates", None)].manifest.report
    comps = outcomes[("duplicate_components", None)].manifest.report
    seconds = {name: round(o.seconds, 2) for (name, src), o in outcomes.items() if src is None}
    kernel = round(nbytes / 1e6 / kernel_s, 1) if kernel_s else None
    return {"removed": fuzzy["removed"], "kernel_mb_per_s_wall": kernel,
            "candidate_pairs": comps.get("candidate_pairs"), "verified_edges": comps.get("edges"),
            "crawl_level_seconds": seconds}


def run_ours_dagster(folder: Path, work: Path) -> dict[str, Any]:
    cfg = json.loads((folder / "curate.json").read_text())
    cfg["sources"] = {k: v for k, v in cfg["sources"].items() if k != "scraps"}
    cfg.pop("params", None)
    (work / "cfg.json").write_text(json.dumps(cfg))
    # The corpus is copies of copies by construction: lift the over-deletion guard for it.
    (work / "wd").mkdir()
    (work / "wd" / "curate.yaml").write_text("checks:\n  over_deletion:\n    max_removed_fraction: 1.0\n")
    subprocess.run([*CURATE, "run", "--workdir", str(work / "wd"),
                    "--crawl", "bench", "--config", str(work / "cfg.json"), "--stages", "fuzzy", "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    report = json.loads(subprocess.run(
        [*CURATE, "report", "--workdir", str(work / "wd"), "--crawl", "bench",
         "--json"], check=True, capture_output=True, text=True).stdout)
    return {"removed": sum(r["removed"].get("fuzzy", 0) for r in report["sources"].values())}


def child(name: str, folder: Path, work: Path, mb_limit: float | None) -> None:
    texts: list[str] = []
    mb = docs = 0.0
    for t in sample_texts(folder):  # ours and datatrove read the files themselves: only rensa/datasketch hold texts
        size = len(t.encode("utf-8", "surrogatepass")) / 1e6
        if mb_limit and mb + size > mb_limit:
            break
        mb, docs = mb + size, docs + 1
        if name in ("rensa", "datasketch"):
            texts.append(t)
    w0 = time.perf_counter()
    if name == "ours":
        out = run_ours(folder, work)
    elif name == "ours+dagster":
        out = run_ours_dagster(folder, work)
    elif name == "rensa":
        out = run_rensa(texts)
    elif name == "datatrove":
        out = run_datatrove(folder, work)
    else:
        out = run_datasketch(texts)
    wall = time.perf_counter() - w0
    if name == "datatrove":
        _reap_forkserver()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    out.update(name=name, docs=int(docs), mb=round(mb, 2), wall_s=round(wall, 2), cpu_s=round(cpu, 2),
               mb_per_s=round(mb / wall, 2), mb_per_s_per_core=round(mb / cpu, 2) if cpu else None,
               peak_rss_mb=round(max(peak_self_kib(), kids.ru_maxrss) / 1024, 1))
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--max-docs", type=int, default=1500)
    ap.add_argument("--peer-mb", type=float, default=3.0, help="text for datasketch (slow)")
    ap.add_argument("--skip-datasketch", action="store_true")
    ap.add_argument("--contenders", default="ours,ours+dagster,rensa,datasketch,datatrove",
                    help="comma-separated subset to run (e.g. 'ours' alone for a 1M-document memory run)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, folder, work, limit = args.child
        child(name, Path(folder), Path(work), float(limit) or None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from curation_dagster.tools.sample import build_sample

        build_sample(root / "corpus", max_docs_per_source=args.max_docs, copies=args.copies)
        (root / "corpus" / "curate.json").write_text(json.dumps({"sources": {
            p.name: {"url": str(p), "id_field": "id"} for p in (root / "corpus").iterdir() if p.is_dir()}}))
        results = []
        wanted = set(args.contenders.split(","))
        if args.skip_datasketch:
            wanted.discard("datasketch")
        plan = [(name, args.peer_mb if name == "datasketch" else 0.0)
                for name in ("ours", "ours+dagster", "rensa", "datasketch", "datatrove") if name in wanted]
        for name, limit in plan:
            work = root / f"work-{name}"
            work.mkdir()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                               os.environ.get("PYTHONPATH", "")])}
            proc = subprocess.run([sys.executable, __file__, "--child", name, str(root / "corpus"), str(work),
                                   str(limit)], capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'contender':<14} {'docs':>7} {'MB':>7} {'wall s':>8} {'MB/s':>7} {'MB/s/core':>10} "
          f"{'peak RSS MB':>12} {'removed':>8}")
    for r in results:
        print(f"{r['name']:<14} {r['docs']:>7} {r['mb']:>7} {r['wall_s']:>8} {r['mb_per_s']:>7} "
              f"{r['mb_per_s_per_core']:>10} {r['peak_rss_mb']:>12} {r['removed']:>8}")
    base = next((r for r in results if r["name"] == "ours"), None)
    if base:
        print(f"signature kernel inside the stage: {base.get('kernel_mb_per_s_wall')} MB/s (wall, all cores); "
              f"candidate pairs {base.get('candidate_pairs')}, verified edges {base.get('verified_edges')}")
        for r in results:
            if r is not base:
                print(f"ours vs {r['name']}: {r['wall_s'] / base['wall_s'] * base['mb'] / r['mb']:.1f}x faster "
                      f"(wall, per MB), {base['mb_per_s_per_core'] / r['mb_per_s_per_core']:.1f}x per core")
    if any(r["name"] == "datatrove" for r in results):
        print("datatrove runs its own defaults (word 5-grams, 14 x 8 bands, no verification), not ours "
              "(char-24, 26 x 10, exact Jaccard): its removed count differs by design")


if __name__ == "__main__":
    main()
