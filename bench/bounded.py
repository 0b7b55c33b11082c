"""Peak memory of the per-crawl bookkeeping on a large crawl of tiny documents.

    python bench/bounded.py --docs 1000000 --dir /tmp/bounded

Builds (once, in ``--dir``) a crawl of ``--docs`` tiny JSONL records in two sources, every text
twice (so exact dedup removes half), runs it with stage ``exact`` only, then measures, each in
a fresh process, the peak RSS (``VmHWM``) and time of: the removal ledger (rerun), the
``doc_id_unique`` check of ``raw_documents`` and of the ledger, ``curate explain`` of one removed
document, and the keep rule (``pick_survivors``) over every document's group, priority and id.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.support
from tests.support.peak_rss import PEAK

SETUP = """
import sys, time
from stages.dataroot import DataRoot
from stages.params import ExecutionParams
from stages.execute import execute
root = DataRoot.open(sys.argv[1])
spec = root.spec("big")
store = root.store
execution = ExecutionParams(workers=1)
ledger_dir = DataRoot(store).output_dir(spec, "removal_ledger", None)
base = peak_kib()
t0 = time.perf_counter()
"""

JOBS = {
    "ledger": 'execute(store, spec, "removal_ledger", None, execution, force=True)',
    "doc_id_unique(raw_documents)": (
        "from stages.checks import ChecksConfig, evaluate_doc_id_unique\n"
        "base = peak_kib(); t0 = time.perf_counter()\n"
        'v = evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig()); assert v.passed, v'),
    "doc_id_unique(removal_ledger)": (
        "from stages.checks import ChecksConfig, evaluate_doc_id_unique\n"
        "base = peak_kib(); t0 = time.perf_counter()\n"
        'v = evaluate_doc_id_unique(store, spec, "removal_ledger", None, ChecksConfig()); assert v.passed, v'),
    "explain": (
        "from curation_dagster.tools.explain import explain\n"
        'doc = next(store.iter_batches(ledger_dir, "ledger", ["doc_id"], 10)).column(0)[5].as_py()\n'
        "base = peak_kib(); t0 = time.perf_counter()\n"
        "text, found = explain(store, spec, ledger_dir, doc); assert found and 'removed by' in text, text"),
    "keep rule": (
        "import numpy as np, pyarrow as pa\n"
        "from stages.keep import pick_survivors\n"
        'ids = pa.chunked_array([store.read_table(DataRoot(store).output_dir(spec, "raw_documents", s), "documents", '
        '["doc_id"])["doc_id"] for s in ("a", "b")]).combine_chunks()\n'
        "n = len(ids); group = np.arange(n, dtype=np.int64) // 2; priority = np.zeros(n, np.int64)\n"
        "ids_np = np.asarray(ids.to_numpy(zero_copy_only=False), dtype='S32')\n"
        "del ids\n"
        "base = peak_kib(); t0 = time.perf_counter()\n"
        "s = pick_survivors(group, priority, ids_np); assert len(s) == n"),
}


def prepare(folder: Path, docs: int) -> None:
    from stages.dataroot import DataRoot
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams, RawDocumentsParams
    from stages.spec import CrawlSpec

    if (folder / "ready").exists():
        return
    sources = {}
    for name, part in (("a", 0), ("b", 1)):
        src = folder / "in" / name
        src.mkdir(parents=True, exist_ok=True)
        with open(src / "part.jsonl", "w") as fh:
            for i in range(part, docs, 2):
                fh.write(json.dumps({"id": f"r{i}", "text": f"tiny document number {i // 2}"}) + "\n")
        sources[name] = RawDocumentsParams(url=str(src))
    root = DataRoot.open(str(folder / "data"))
    spec = CrawlSpec(crawl="big", sources=sources, stages=("exact",))
    root.register(spec)
    t0 = time.perf_counter()
    execute_crawl(root.store, spec, ExecutionParams(workers=1))
    print(f"crawl of {docs:,} documents in {time.perf_counter() - t0:.0f}s", flush=True)
    (folder / "ready").write_text("")


def measure(folder: Path, job: str) -> tuple[float, float, float]:
    """(seconds, peak MiB, peak MiB over the set-up) of ``job`` in a fresh process."""
    code = PEAK + SETUP + JOBS[job] + (
        "\nprint(time.perf_counter() - t0, peak_kib() / 1024, (peak_kib() - base) / 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(folder / "data")], capture_output=True, text=True,
                         check=True, timeout=3600).stdout.split()
    return float(out[-3]), float(out[-2]), float(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bounded"))
    ap.add_argument("--only", nargs="*", default=list(JOBS))
    args = ap.parse_args()
    prepare(args.dir, args.docs)
    print(f"{'job':<32} {'time':>8} {'peak RSS':>10} {'over set-up':>12}")
    for job in args.only:
        seconds, peak, over = measure(args.dir, job)
        print(f"{job:<32} {seconds:>7.2f}s {peak:>7.0f} MiB {over:>8.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
