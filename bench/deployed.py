"""A deployed crawl against ``curate run``: ``curate deploy`` + ``curate submit --wait`` (whole
processes: PostgreSQL, daemon, webserver, code server; partitions on warm ``python -m stages
serve`` workers, the stage pod's entry point) beside ``curate run`` (SQLite instance, warm pool)
on the same sources.

The corpus is ``curate sample``'s real text dealt round-robin into each shape's sources, as in
``bench/orchestration.py``. Per shape, both sides on a local data root of their own:

- ``run_s``: ``curate run --stages STAGES`` in a fresh workdir; its Dagster runs (SQLite) and
  per-partition ``overhead_s`` (``curate profile --json``).
- ``submit_s``: ``curate submit --wait`` of the same crawl to a ``curate deploy`` started before
  (its start is not counted: ``deploy_start_s``); the runs of the crawl (GraphQL, tag
  ``curate/crawl``) and the ``overhead_s`` every partition's materialization carries: its time
  outside the program from its launch to its record (a worker's start and imports included in
  the first partition it serves).
- The two reports must be equal (``curate report --json``).

Usage (needs PostgreSQL: ``make postgres``)::

    python bench/deployed.py                                   # shapes 3:6,200:20
    python bench/deployed.py --shapes 200:20 --fan-out 8   # 8 warm workers (default: one per core)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import sample_texts
from orchestration import deal

ROOT = Path(__file__).resolve().parents[1]
CURATE = [sys.executable, "-m", "curation_dagster.cli"]
MATERIALIZATIONS = """query($id: ID!, $cursor: String) { logsForRun(runId: $id, afterCursor: $cursor, limit: 10000) {
    ... on EventConnection { cursor hasMore events { __typename ... on MaterializationEvent { stepKey partition
      metadataEntries { label ... on FloatMetadataEntry { floatValue } } } } } } }"""
RUNS = """query($crawl: String!) { runsOrError(filter: {tags: [{key: "curate/crawl", value: $crawl}]}) {
    ... on Runs { results { runId status } } } }"""


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:6])}...: failed: {(proc.stdout + proc.stderr).strip()[-3000:]}")
    return wall, proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stats(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, median, worst) in milliseconds."""
    if not values:
        return None, None, None
    ordered = sorted(values)
    return (round(1000 * sum(values) / len(values), 1), round(1000 * ordered[len(ordered) // 2], 1),
            round(1000 * ordered[-1], 1))


def deployed(work: Path, config: Path, stages: str, env: dict[str, str]) -> dict[str, Any]:
    from curation_dagster.ops.deploy import graphql_post

    wd = work / "deploy-wd"
    wd.mkdir()
    wd.chmod(0o755)
    (wd / "curate.yaml").write_text("automation:\n  enabled: false\n"
                                    "checks:\n  over_deletion:\n    max_removed_fraction: 1.0\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / "deploy.out", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([*CURATE, "deploy", "--workdir", str(wd), "--data-root", str(work / "deploy-data"),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        while "deployment ready" not in (work / "deploy.out").read_text():
            if proc.poll() is not None or time.perf_counter() - t0 > 600:
                raise SystemExit(f"curate deploy did not start: {(work / 'deploy.out').read_text()[-2000:]}")
            time.sleep(0.5)
        started = time.perf_counter() - t0
        submit_s, _ = _timed([*CURATE, "submit", "--dagster", url, "--crawl", "bench", "--config", str(config),
                              "--stages", stages, "--wait"], env)
        runs = graphql_post(url, RUNS, {"crawl": "bench"})["runsOrError"]["results"]
        overhead: list[float] = []
        worst = ("", 0.0)
        for run in runs:
            cursor = None
            while True:
                page = graphql_post(url, MATERIALIZATIONS, {"id": run["runId"], "cursor": cursor})["logsForRun"]
                for e in page["events"]:
                    if e["__typename"] != "MaterializationEvent":
                        continue
                    for entry in e["metadataEntries"]:
                        if entry["label"] == "overhead_s" and entry.get("floatValue") is not None:
                            overhead.append(entry["floatValue"])
                            if entry["floatValue"] > worst[1]:
                                worst = (f"{e['stepKey']}[{e['partition']}]", entry["floatValue"])
                if not page["hasMore"]:
                    break
                cursor = page["cursor"]
        _, report = _timed([*CURATE, "report", "--json", "--data-root", str(work / "deploy-data"), "--crawl", "bench"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    return {"deploy_start_s": round(started, 1), "submit_s": round(submit_s, 2), "submit_runs": len(runs),
            "submit_overhead_ms": _stats(overhead), "submit_worst": worst[0], "submit_partitions": len(overhead),
            "report": json.loads(report)}


def local(work: Path, config: Path, stages: str, env: dict[str, str]) -> dict[str, Any]:
    wd = work / "run-wd"
    wd.mkdir()
    (wd / "curate.yaml").write_text("checks:\n  over_deletion:\n    max_removed_fraction: 1.0\n")
    run_s, _ = _timed([*CURATE, "run", "--workdir", str(wd), "--crawl", "bench", "--config", str(config),
                       "--stages", stages, "--quiet"], env)
    _, out = _timed([*CURATE, "profile", "--workdir", str(wd), "--crawl", "bench", "--json"], env)
    rows = [p for parts in json.loads(out)["programs"].values() for p in parts.values()]
    with sqlite3.connect(wd / "dagster" / "history" / "runs.db") as db:
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    _, report = _timed([*CURATE, "report", "--json", "--workdir", str(wd), "--crawl", "bench"], env)
    return {"run_s": round(run_s, 2), "run_runs": runs,
            "run_overhead_ms": _stats([p["overhead_s"] for p in rows if p.get("overhead_s") is not None]),
            "report": json.loads(report)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="3:6,200:20", help="comma-separated SOURCES:MB")
    ap.add_argument("--stages", default="heuristic,exact,fuzzy")
    ap.add_argument("--copies", type=int, default=8, help="varied copies per sample document")
    ap.add_argument("--max-docs", type=int, default=400)
    ap.add_argument("--fan-out", type=int, default=0,
                    help="the deployment's partitions at once per step (0: its default, a warm worker per core)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CURATE_FAN_OUT": str(args.fan_out)}
    shapes = [(int(s), float(m)) for s, m in (x.split(":") for x in args.shapes.split(","))]
    rows = []
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # the PostgreSQL user must reach it
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        from curation_dagster.tools.sample import build_sample

        build_sample(root / "corpus", max_docs_per_source=args.max_docs, copies=args.copies)
        for i, (sources, mb) in enumerate(shapes):
            work = root / f"shape{i}"
            work.mkdir()
            work.chmod(0o755)
            texts = ((f"doc{j}", t) for j, t in enumerate(sample_texts(root / "corpus")))
            docs, written = deal(texts, work / "data", sources, mb, "jsonl")
            cfg = {"sources": {p.name: {"url": str(p), "id_field": "id"} for p in sorted((work / "data").iterdir())}}
            (work / "crawl.json").write_text(json.dumps(cfg))
            ran = local(work, work / "crawl.json", args.stages, env)
            dep = deployed(work, work / "crawl.json", args.stages, env)
            assert ran.pop("report") == dep.pop("report"), "the deployed crawl's report differs from curate run's"
            rows.append({"sources": sources, "docs": docs, "mb": round(written, 1), **ran, **dep,
                         "ratio": round(dep["submit_s"] / ran["run_s"], 2)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"fan_out {args.fan_out or 'default (a warm worker per core)'}, stages {args.stages}")
    print(f"{'sources':>7} {'docs':>6} {'curate run s':>12} {'runs':>4} {'submit --wait s':>15} {'runs':>4} "
          f"{'ratio':>6} {'overhead ms run (mean, median, worst)':>38} {'deployed (mean, median, worst)':>32}"
          "  worst deployed")
    for r in rows:
        print(f"{r['sources']:>7} {r['docs']:>6} {r['run_s']:>12} {r['run_runs']:>4} {r['submit_s']:>15} "
              f"{r['submit_runs']:>4} {r['ratio']:>6} {r['run_overhead_ms']!s:>38} "
              f"{r['submit_overhead_ms']!s:>32}  {r['submit_worst']}")


if __name__ == "__main__":
    main()
