"""Crash and resume: a crawl SIGKILLed at random points, mid-write included, reruns to the output
of an uninterrupted run; no reader ever sees a partial part; Dagster re-executes from failure.

The crashing runs are subprocesses (``tests/support/crash_points.py``) that kill themselves at a chosen
point of the write protocol (a part opened, half a part on disk, a manifest not yet published, a
manifest published before cleanup) or that the test kills after a random delay.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Manifest, Store
from tests.support.crash_points import install
from tests.support.tiny_corpus import SOURCES, fast_tmp, read, spec

HERE = Path(__file__).resolve().parent
STAGES = ("heuristic", "exact", "fuzzy")
CHILD_EXECUTION = ExecutionParams(batch_rows=7, ingest_task_bytes=4096, workers=2)  # as crash_points.py runs
RESUME_EXECUTION = ExecutionParams(batch_rows=1000, workers=1)  # execution settings may differ on rerun
VOLATILE = ("seconds", "tasks", "timing")  # report entries that describe the run (timings, task count), not the data


def crawl_spec() -> CrawlSpec:
    return spec(stages=STAGES)


def outputs(store: Store, crawl: CrawlSpec) -> dict[str, Any]:
    """What a crawl produced: curated documents per source, the ledger, every removal list, the
    rows of every partition and the reports of ingestion and output."""
    out: dict[str, Any] = {f"curated/{s}": read(store, crawl, "curated_documents", "documents", s) for s in SOURCES}
    out["ledger"] = read(store, crawl, "removal_ledger", "ledger")
    for program in PROGRAMS:
        for source in crawl.partitions(program):
            m = DataRoot(store).manifest(crawl, program, source)
            assert m is not None, (program, source)
            out[f"rows/{program}/{source}"] = m.rows
            if program in ("raw_documents", "curated_documents", "removal_ledger"):  # others report timings
                out[f"report/{program}/{source}"] = {k: v for k, v in m.report.items() if not k.endswith(VOLATILE)}
            if PROGRAMS[program].stage:
                out[f"removed/{program}/{source}"] = read(store, crawl, program, "removed", source)
    return out


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, pa.Table):
            assert got[name].equals(value), name
        else:
            assert got[name] == value, name


def committed_parts_are_whole(root: Path) -> tuple[int, set[Path]]:
    """Every manifest under ``root`` names only complete, readable parts with the rows it counts
    (what ``Store.read_table`` reads); returns (manifests, files no manifest names)."""
    named: set[Path] = set()
    manifests = 0
    for mpath in root.rglob(MANIFEST):
        manifests += 1
        m = Manifest.from_json(mpath.read_text())
        for table, names in m.tables.items():
            rows = 0
            for name in names:
                part = mpath.parent / name
                named.add(part)
                rows += pq.read_table(part).num_rows
            assert rows == m.rows[table], (mpath, table)
        store = Store(str(root))
        for table in m.tables:
            assert store.read_table(str(mpath.parent), table).num_rows == m.rows[table]
    unnamed = {p for p in root.rglob("*.parquet") if p not in named}
    return manifests, unnamed


def readable(path: Path) -> bool:
    try:
        pq.read_table(path)
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The uninterrupted run (with the crashing runs' execution settings) and its crash points."""
    root = tmp_path_factory.mktemp("reference")
    points: list[tuple[str, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pq, "write_table", pq.write_table)  # restored afterwards
        mp.setattr(os, "replace", os.replace)
        install(None, points)
        store = Store(str(root / "data"))
        execute_crawl(store, crawl_spec(), CHILD_EXECUTION)
    return outputs(store, crawl_spec()), points


def crash(data: Path, kill_at: int | None, delay: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run the crawl in a subprocess that dies at point ``kill_at`` or is SIGKILLed after
    ``delay`` seconds. Its process-pool workers outlive a SIGKILLed parent (blocked on their
    task queue, as on any machine), so the run gets its own session and the test ends them."""
    cmd = [sys.executable, str(HERE.parent / "support" / "crash_points.py"), str(kill_at or 0), str(data)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if delay is not None:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.kill()  # SIGKILL
        proc.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned pool workers of this run only
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def trials(points: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, int]]:
    """One random point of every kind, and one anywhere."""
    chosen = []
    for kind in ("part", "mid", "manifest", "cleanup"):
        chosen.append((kind, rng.choice([i + 1 for i, (k, _) in enumerate(points) if k == kind])))
    chosen.append(("anywhere", rng.randint(1, len(points))))
    return chosen


@pytest.mark.slow  # six crashed subprocess runs, each resumed
def test_sigkill_at_random_points_then_rerun_gives_the_uninterrupted_output(
    reference: tuple[dict[str, Any], list[tuple[str, str]]], tmp_path: Path
) -> None:
    want, points = reference
    assert len(points) > 100
    rng = random.Random(int(os.environ.get("CRASH_SEED", "20240531")))
    runs: list[tuple[str, int | None, float | None]] = [(k, n, None) for k, n in trials(points, rng)]
    runs.append(("timed", None, rng.uniform(1.0, 3.5)))  # a kill after a random delay
    saw_partial = False
    with fast_tmp(tmp_path / "trials") as root:
        for i, (kind, kill_at, delay) in enumerate(runs):
            data = root / f"t{i}"
            proc = crash(data, kill_at, delay)
            label = f"{kind} #{kill_at} delay {delay}"
            if kill_at is not None:
                assert proc.returncode == -9, (label, proc.stderr[-2000:])
                assert f"KILLED {points[kill_at - 1][0]} " in proc.stderr, label
            if data.exists():
                _, unnamed = committed_parts_are_whole(data)
                partial = [p for p in unnamed if not readable(p)]
                saw_partial |= bool(partial)
                if kind == "mid":
                    assert partial, label  # a half-written part exists on disk, and nothing names it
            store = Store(str(data))
            execute_crawl(store, crawl_spec(), RESUME_EXECUTION)
            assert_same(outputs(store, crawl_spec()), want)
            committed_parts_are_whole(data)
    assert saw_partial


def test_a_rerun_after_a_crash_recomputes_only_what_was_not_committed(tmp_path: Path) -> None:
    """Preemption without losing work: partitions committed before the kill are not recomputed."""
    data = tmp_path / "data"
    proc = crash(data, 60)  # well into the crawl
    assert proc.returncode == -9, proc.stderr[-2000:]
    store = Store(str(data))
    crawl = crawl_spec()
    before = {p: p.stat().st_mtime_ns for p in data.rglob(MANIFEST)}
    assert before
    outcomes = execute_crawl(store, crawl, RESUME_EXECUTION)
    committed = {(o.manifest.program, o.manifest.source) for o in outcomes.values() if o.skipped}
    assert len(committed) == len(before) - sum(1 for p in before if "heuristic_scores" in str(p))
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # untouched


# --- Dagster: re-execute from failure -------------------------------------------------------------


def source_chain_job() -> Any:
    """raw_documents -> document_languages -> filtered_documents of one source partition, in process
    (reconstructable)."""
    from dagster import Definitions, define_asset_job, in_process_executor

    from curation_dagster.defs.assets import ASSETS
    from curation_dagster.defs.resources import CurationResource

    defs = Definitions(
        assets=ASSETS,
        jobs=[define_asset_job("source_chain",
                               selection=["raw_documents", "document_languages", "filtered_documents"])],
        resources={"curation": CurationResource(workdir=os.environ["CURATE_WORKDIR"], workers=1)},
        executor=in_process_executor,
    )
    return defs.resolve_job_def("source_chain")


def test_dagster_reexecutes_a_failed_run_from_the_failed_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster import (
        DagsterEventType,
        DagsterInstance,
        ReexecutionOptions,
        execute_job,
        reconstructable,
    )

    import stages.programs.filtered_documents as filtered
    from curation_dagster.defs.partitions import CRAWL, SOURCE, partition_key
    from curation_dagster.defs.resources import save_spec

    work = tmp_path / "w"
    crawl = spec(sources=("news",), stages=("language", "heuristic"))  # the job's three programs run
    save_spec(work, crawl)
    monkeypatch.setenv("CURATE_WORKDIR", str(work))
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    instance.add_dynamic_partitions(CRAWL, [crawl.crawl])
    instance.add_dynamic_partitions(SOURCE, ["news"])
    tags = {"dagster/partition": str(partition_key(crawl.crawl, "news"))}

    real_run = filtered.run
    calls = []

    def preempted(params: Any, inputs: Any, output: Any, partition: Any, execution: Any) -> dict[str, Any]:
        calls.append(1)
        output.write("decisions", pa.table({"doc_id": ["half-written"]}))
        raise ConnectionResetError("node preempted while writing")

    monkeypatch.setattr(filtered, "run", preempted)
    job = reconstructable(source_chain_job)
    first = execute_job(job, instance, tags=tags)
    assert not first.success and calls == [1]
    steps = {e.step_key: e.event_type for e in first.all_events if e.step_key and e.event_type in (
        DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE)}
    assert steps == {"raw_documents": DagsterEventType.STEP_SUCCESS,
                     "document_languages": DagsterEventType.STEP_SUCCESS,
                     "filtered_documents": DagsterEventType.STEP_FAILURE}
    store = Store(str(work / "data"))
    fdir = DataRoot(store).output_dir(crawl, "filtered_documents", "news")
    assert store.read_manifest(fdir) is None  # the failed attempt published nothing
    raw_manifest = DataRoot(store).manifest(crawl, "raw_documents", "news")
    assert raw_manifest is not None

    monkeypatch.setattr(filtered, "run", real_run)
    # As the UI's "Re-execute from failure" does: the parent's steps that succeeded are reused,
    # and its partition tag is passed on (execute_job does not copy tags by itself).
    again = execute_job(job, instance, tags=tags,
                        reexecution_options=ReexecutionOptions.from_failure(first.run_id, instance))
    assert again.success
    ran = {e.step_key for e in again.all_events if e.event_type == DagsterEventType.STEP_START}
    assert ran == {"filtered_documents"}  # the succeeded step is not rerun
    run = instance.get_run_by_id(again.run_id)
    assert run is not None and run.parent_run_id == first.run_id and run.tags["dagster/partition"] == tags[
        "dagster/partition"]
    m = store.read_manifest(fdir)
    assert m is not None
    # Same output as an uninterrupted run; the dead attempt's part is gone.
    clean = Store(str(tmp_path / "clean"))
    execute_crawl(clean, crawl, ExecutionParams(workers=1))
    for table in ("decisions", "removed"):
        assert store.read_table(fdir, table).equals(
            clean.read_table(DataRoot(clean).output_dir(crawl, "filtered_documents", "news"), table)), table
    assert {p.name for p in Path(fdir).iterdir()} == {MANIFEST, *(n for names in m.tables.values() for n in names)}
    raw_again = DataRoot(store).manifest(crawl, "raw_documents", "news")
    assert raw_again is not None and raw_again.report == raw_manifest.report
    assert json.dumps(raw_again.tables) == json.dumps(raw_manifest.tables)  # not rewritten
