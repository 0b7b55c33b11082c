"""Ray on this machine: the speed-up from 1 to 2 Ray workers, and what Ray adds on a small crawl.

Corpus: ``curate sample`` (real text from this Python installation) with ``--copies`` varied
copies of every document, so fuzzy dedup has work; the crawl runs heuristic, exact and fuzzy
dedup (``execute_crawl``, no Dagster). Every configuration runs in a fresh process:

- scaling: a local Ray instance with 1, then 2 CPUs ("workers"); a warm-up crawl first (in
  batches of 10 rows, so every Ray worker starts, imports the stages and loads numba's cached
  kernels), then the timed crawl, best of ``--repeat``. The fanned-out programs are heuristic
  scoring (``filtered_documents``), ``minhash_signatures`` and ``lsh_buckets`` (band groups);
  speed-up = seconds with 1 worker / seconds with 2. The same with the local process pool (1,
  then 2 processes) is the control: on a shared, busy machine neither scales. Every process
  runs numba on as many threads as it has workers (``NUMBA_NUM_THREADS``).
- overhead: a small crawl (``--small-docs`` per source) with the local executor (process pool of
  2) and with Ray (2 CPUs), cold (first crawl of the process, Ray's start included) and warm.

    python bench/ray_scaling.py [--max-docs 1500] [--copies 10] [--batch-rows 1000] [--repeat 3] [--small-docs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FANNED_OUT = ("filtered_documents", "minhash_signatures", "lsh_buckets")
STAGES = ("heuristic", "exact", "fuzzy")


def crawl(corpus: Path, data: Path, executor: str, workers: int, batch_rows: int) -> dict[str, Any]:
    """One crawl of ``corpus`` into a fresh ``data`` root: wall seconds, seconds per program."""
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams
    from stages.spec import CrawlSpec
    from stages.store import Store

    config = json.loads((corpus / "curate.json").read_text())
    spec = CrawlSpec(crawl="bench", sources=config["sources"], stages=STAGES)
    t0 = time.perf_counter()
    execution = ExecutionParams.model_validate({"executor": executor, "workers": workers, "batch_rows": batch_rows})
    outcomes = execute_crawl(Store(str(data)), spec, execution)
    wall = time.perf_counter() - t0
    per_program: dict[str, float] = {}
    for (program, _), outcome in outcomes.items():
        per_program[program] = per_program.get(program, 0.0) + outcome.seconds
    docs = sum(o.manifest.report.get("documents", 0) for (p, _), o in outcomes.items() if p == "raw_documents")
    return {"wall": wall, "programs": per_program, "documents": docs}


def child(args: argparse.Namespace) -> None:
    """One configuration in this (fresh) process; prints one JSON line."""
    out: dict[str, Any] = {}
    if args.executor == "ray":
        from stages.parallel import ray_init
        from stages.params import ExecutionParams

        t0 = time.perf_counter()
        ray_init(ExecutionParams.model_validate({"executor": "ray", "workers": args.workers}))
        out["ray_init"] = time.perf_counter() - t0
    tmp = Path(args.tmp)
    runs = []
    for i, corpus in enumerate(args.corpus):
        # --warm: the first crawl in batches of 10 rows, so that every Ray worker has run every
        # kernel once (numba loads its cached machine code per process: ~0.5 s on first call).
        rows = 10 if args.warm and i == 0 else args.batch_rows
        repeat = args.repeat if args.warm and i > 0 else 1
        tries = [crawl(Path(corpus), tmp / f"data-{os.getpid()}-{i}-{r}", args.executor, args.workers, rows)
                 for r in range(repeat)]
        # Best of the repeats, per program: this machine may be shared.
        best = min(tries, key=lambda t: t["wall"])
        best["programs"] = {p: min(t["programs"][p] for t in tries) for p in best["programs"]}
        runs.append(best)
    out["runs"] = runs
    print(json.dumps(out))


def run_child(
    tmp: Path, executor: str, workers: int, corpora: list[Path], batch_rows: int, warm: bool = False,
    repeat: int = 1,
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--executor", executor, "--workers", str(workers),
           "--batch-rows", str(batch_rows), "--tmp", str(tmp), "--corpus", *map(str, corpora)]
    cmd += ["--warm", "--repeat", str(repeat)] if warm else []
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONWARNINGS": "ignore", "NUMBA_NUM_THREADS": str(workers)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{executor} x{workers} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def sample(out: Path, max_docs: int, copies: int) -> Path:
    from curation_dagster.tools.sample import build_sample

    folders = build_sample(out, max_docs_per_source=max_docs, copies=copies)
    sources = {name: {"url": str(path), "id_field": "id", "url_field": "url"} for name, path in folders.items()}
    (out / "curate.json").write_text(json.dumps({"sources": sources}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-docs", type=int, default=1500, help="documents per source of the scaling crawl")
    parser.add_argument("--copies", type=int, default=10, help="varied copies of every document (scaling crawl)")
    parser.add_argument("--batch-rows", type=int, default=1000,
                        help="rows per batch: per-source work splits into this many documents per task")
    parser.add_argument("--small-docs", type=int, default=100, help="documents per source of the small crawl")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--executor", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3, help="timed scaling crawls per configuration (best kept)")
    parser.add_argument("--corpus", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as name:
        tmp = Path(name)
        big = sample(tmp / "big", args.max_docs, args.copies)
        small = sample(tmp / "small", args.small_docs, 1)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; ray {_ray_version()}")

        scaling = {k: run_child(tmp, "ray", k, [small, big], args.batch_rows, True, args.repeat) for k in (1, 2)}
        # The control: the process pool with 1 and 2 workers on the same crawl. On a busy machine
        # neither scales, and that is the machine, not Ray.
        control = {k: run_child(tmp, "local", k, [small, big], args.batch_rows, True, args.repeat) for k in (1, 2)}
        docs = scaling[1]["runs"][1]["documents"]
        print(f"\nscaling crawl: {docs} documents, stages {','.join(STAGES)}, batches of {args.batch_rows} rows "
              f"(warm: after a warm-up crawl; best of {args.repeat}; load average now {os.getloadavg()[0]:.1f})")
        print(f"{'program':<22}{'Ray 1 worker s':>15}{'2 workers s':>13}{'speed-up':>10}"
              f"{'| pool 1 s':>11}{'pool 2 s':>10}{'speed-up':>10}")
        one, two = scaling[1]["runs"][1], scaling[2]["runs"][1]
        pool1, pool2 = control[1]["runs"][1], control[2]["runs"][1]
        for program in (*FANNED_OUT, "fanned-out total", "whole crawl"):
            a, b, c, d = (_seconds(r, program) for r in (one, two, pool1, pool2))
            print(f"{program:<22}{a:>15.2f}{b:>13.2f}{a / b:>9.2f}x{'| ':>3}{c:>8.2f}{d:>10.2f}{c / d:>9.2f}x")

        local = run_child(tmp, "local", 2, [small, small], args.batch_rows)
        ray = run_child(tmp, "ray", 2, [small, small], args.batch_rows)
        n = local["runs"][0]["documents"]
        print(f"\nsmall crawl: {n} documents, stages {','.join(STAGES)}; local = process pool of 2, Ray = 2 CPUs")
        print(f"{'':<34}{'local s':>9}{'ray s':>9}{'ray adds':>10}")
        print(f"{'Ray start (ray.init)':<34}{0.0:>9.2f}{ray['ray_init']:>9.2f}{ray['ray_init']:>9.2f}s")
        for i, label in enumerate(("first crawl (cold workers)", "second crawl (warm)")):
            a, b = local["runs"][i]["wall"], ray["runs"][i]["wall"]
            print(f"{label:<34}{a:>9.2f}{b:>9.2f}{b - a:>9.2f}s")
        for program in FANNED_OUT:
            a, b = local["runs"][1]["programs"][program], ray["runs"][1]["programs"][program]
            print(f"{'  warm ' + program:<34}{a:>9.2f}{b:>9.2f}{b - a:>9.2f}s")


def _seconds(run: dict[str, Any], program: str) -> float:
    if program == "fanned-out total":
        return sum(run["programs"][p] for p in FANNED_OUT)
    if program == "whole crawl":
        return float(run["wall"])
    return float(run["programs"][program])


def _ray_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("ray")


if __name__ == "__main__":
    main()
