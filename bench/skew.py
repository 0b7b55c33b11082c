"""Skew: one big JSONL file through ingestion (``raw_documents``) in bounded memory.

Generates a JSONL file of ~2 KB web-page-like records in ``--dir`` (2 GB by default; never in the
repository), then ingests it in a fresh subprocess per measurement and prints wall time,
throughput and peak RSS of the ingesting process and of its worker processes:

- ``split``: byte-range tasks of ``--task-mb`` over ``--workers`` processes (the default path);
- ``one task``: the same code with one task per file, on a ``--one-task-mb`` prefix of the file
  (what a file that cannot be split costs: memory grows with the file);
- ``fixed``: a 1 MB file, the memory every ingestion pays (lazy imports, Arrow pools).

Peak RSS is the process's own high-water mark (``VmHWM``; ru_maxrss would include the parent's
across fork + exec), reset between programs. The workers' figure (``RUSAGE_CHILDREN``, the largest
worker, heuristic scoring included) counts the pages a forked worker shares with the driver.

With ``--heuristic`` the split run also scores the documents (``filtered_documents``, streamed in
~4 MB chunks). The split and one-task runs on the prefix are checked to give identical doc_ids.

    python bench/skew.py [--gb 2] [--workers N] [--task-mb 8] [--one-task-mb 256] [--heuristic] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

# VmHWM, not ru_maxrss: ru_maxrss is carried over from the parent across fork + exec.
RUN = """
import json, resource, sys, time
def peak_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from stages.dataroot import DataRoot
from stages.params import ExecutionParams, RawDocumentsParams
from stages.store import Store
from stages.execute import execute
from stages.spec import CrawlSpec
import stages.programs.raw_documents, stages.programs.filtered_documents

src, data, execution, programs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4].split(",")
spec = CrawlSpec(crawl="bench", sources={"s": RawDocumentsParams(url=src, id_field="id")}, stages=("heuristic",))
store = Store(data)
baseline = peak_kib()
out = {"baseline_kib": baseline, "programs": {}}
for program in programs:
    t0 = time.perf_counter()
    m = execute(store, spec, program, "s", ExecutionParams(**execution)).manifest
    out["programs"][program] = {"seconds": time.perf_counter() - t0, "report": m.report, "peak_kib": peak_kib()}
    try:  # the next program's peak on its own: reset the high-water mark (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
out["peak_kib"] = out["programs"][programs[0]]["peak_kib"]
out["workers_peak_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
if programs == ["raw_documents"]:
    import xxhash
    h = xxhash.xxh3_128()
    for batch in store.iter_batches(DataRoot(store).output_dir(spec, "raw_documents", "s"), "documents", ["doc_id"]):
        h.update("".join(batch.column(0).to_pylist()).encode())
    out["ids_digest"] = h.hexdigest()
print(json.dumps(out))
"""


def generate(path: Path, target_bytes: int, seed: int = 0) -> int:
    """~2 KB records of four paragraphs out of 400; every 97th is the same newsletter banner."""
    rng = random.Random(seed)
    words = [f"{w}{i}" for i, w in enumerate(["data", "page", "river", "market", "city", "music"] * 300)]
    paragraphs = [" ".join(rng.choice(words) for _ in range(60)) + "." for _ in range(400)]
    written = n = 0
    with path.open("wb", buffering=8 << 20) as fh:
        while written < target_bytes:
            if n % 97 == 0:
                rec: dict[str, Any] = {"id": "banner", "text": "Subscribe to our newsletter."}
            else:
                rec = {"id": f"r{n}", "text": "\n\n".join(rng.sample(paragraphs, 4)), "n": n}
            line = json.dumps(rec).encode() + b"\n"
            fh.write(line)
            written += len(line)
            n += 1
    return n


def prefix(src: Path, dest: Path, nbytes: int) -> None:
    """The first ``nbytes`` of ``src``, cut after a whole line."""
    with src.open("rb") as fh:
        data = fh.read(nbytes)
    dest.write_bytes(data[: data.rfind(b"\n") + 1])


def measure(src: Path, data: Path, programs: str, **execution: Any) -> dict[str, Any]:
    shutil.rmtree(data, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN), str(src), str(data), json.dumps(execution),
                           programs], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall"] = time.perf_counter() - t0
    shutil.rmtree(data, ignore_errors=True)
    return out


def line(label: str, size: int, r: dict[str, Any], program: str = "raw_documents") -> str:
    p = r["programs"][program]
    mib = 1 << 20
    extra = (p["peak_kib"] - r["baseline_kib"]) / 1024
    workers = f", workers {r['workers_peak_kib'] / 1024:.0f} MiB" if program == "raw_documents" else ""
    return (f"{label:<34} {size / mib:8.0f} MiB  {p['report'].get('tasks', '-'):>5} tasks  {p['seconds']:7.1f} s  "
            f"{size / mib / p['seconds']:6.1f} MiB/s  peak RSS {p['peak_kib'] / 1024:6.0f} MiB "
            f"(+{extra:.0f} over imports){workers}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/curate-skew-bench")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--task-mb", type=float, default=8)
    ap.add_argument("--one-task-mb", type=float, default=256)
    ap.add_argument("--heuristic", action="store_true", help="also score the split run (filtered_documents)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    big = root / "big.jsonl"
    target = int(args.gb * (1 << 30))
    if not big.exists() or abs(big.stat().st_size - target) > 1 << 20:
        t0 = time.perf_counter()
        records = generate(big, target)
        print(f"generated {big} ({big.stat().st_size / (1 << 20):.0f} MiB, {records} records) "
              f"in {time.perf_counter() - t0:.0f} s")
    size = big.stat().st_size
    task = int(args.task_mb * (1 << 20))
    print(f"cores {os.cpu_count()}, workers {args.workers}, task {args.task_mb:g} MiB, python {sys.version.split()[0]}")
    small = root / "small.jsonl"
    prefix(big, small, 1 << 20)
    print(line("fixed cost (1 MiB file)", small.stat().st_size,
               measure(small, root / "d0", "raw_documents", workers=1)))
    if args.one_task_mb:
        part = root / "prefix.jsonl"
        prefix(big, part, int(args.one_task_mb * (1 << 20)))
        psize = part.stat().st_size
        one = measure(part, root / "d1", "raw_documents", workers=1, ingest_task_bytes=1 << 50)
        cut = measure(part, root / "d2", "raw_documents", workers=args.workers, ingest_task_bytes=task)
        print(line("one task (prefix)", psize, one))
        print(line("split (prefix)", psize, cut))
        print(f"{'':34} doc_ids identical split vs one task: {one['ids_digest'] == cut['ids_digest']}")
        part.unlink()
    programs = "raw_documents,filtered_documents" if args.heuristic else "raw_documents"
    r = measure(big, root / "d3", programs, workers=args.workers, ingest_task_bytes=task)
    print(line("split (whole file)", size, r))
    if args.heuristic:
        print(line("  + heuristic scores", size, r, "filtered_documents"))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
