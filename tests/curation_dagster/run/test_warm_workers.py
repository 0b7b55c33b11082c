"""The deployment's launcher (``mode="pipes"``): warm ``python -m stages serve`` workers, each
serving many partitions of the run one after another in a Pipes session per step. Every partition
is recorded once, as it finishes (not when its worker's session ends), its progress lines in the
run's compute log (not its events); a worker killed while it
holds a partition has that partition launched again on another, and the outputs are those of the
executor alone. Real processes, a real Dagster instance: no mocks (a wrapper counts the workers
started and, in the fault test, SIGKILLs one as it is handed a partition)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, ExecuteInProcessResult

from curation_dagster.defs.launchers import pipes
from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.instance import ensure_instance_config
from curation_dagster.run.crawl_job import CRAWL_JOB_DEF
from curation_dagster.run.recorder import DATA_VERSION_TAG
from stages.catalog import PROGRAMS, partition_name, waves
from stages.dataroot import DataRoot
from stages.store import MANIFEST, Store
from tests.support.tiny_corpus import CRAWL, SOURCES, fast_tmp, read, run_all, spec


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[pipes.Worker]]:
    """Every warm worker started while the test runs (the real ``Worker``, counted)."""
    workers: list[pipes.Worker] = []
    real = pipes.Worker.__init__

    def counted(self: pipes.Worker, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        workers.append(self)

    monkeypatch.setattr(pipes.Worker, "__init__", counted)
    yield workers
    for worker in workers:
        worker.close()


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("doc_id", "ascending"), ("source", "ascending")])


def _execute(work: Path, fan_out: int) -> tuple[DagsterInstance, ExecuteInProcessResult, CurationResource]:
    """The tiny crawl (fuzzy) registered in ``work`` and run by the crawl job on warm workers."""
    resource = CurationResource(workdir=str(work), mode="pipes", fan_out=fan_out)
    resource.dataroot().register(spec(stages=["fuzzy"]))
    instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
    result = CRAWL_JOB_DEF.execute_in_process(run_config={"crawl": CRAWL}, instance=instance,
                                              resources={"curation": resource}, raise_on_error=False)
    return instance, result, resource


def _run(work: Path, fan_out: int) -> tuple[DagsterInstance, str, CurationResource]:
    instance, result, resource = _execute(work, fan_out)
    assert result.success
    return instance, result.run_id, resource


def _materialized(instance: DagsterInstance, run_id: str) -> list[tuple[str, str, float]]:
    """(asset, partition, when recorded) of the run's materializations, in the order recorded."""
    out = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        mat = entry.asset_materialization
        assert mat is not None
        out.append((mat.asset_key.to_user_string(), str(mat.partition), entry.timestamp))
    return out


def _expected() -> list[tuple[str, str]]:
    crawl = spec(stages=["fuzzy"])
    return sorted((p, str(partition_key(CRAWL, s))) for p in PROGRAMS for s in crawl.partitions(p))


def test_one_warm_worker_serves_the_whole_run_and_each_partition_is_recorded_as_it_finishes(
        tmp_path: Path, started: list[pipes.Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    last = ("raw_documents", SOURCES[-1])
    real = pipes.Worker.run

    def late(self: pipes.Worker, program: str, source: str | None, force: bool, workers: int) -> dict[str, Any]:
        if (program, source) == last:  # handed over a second late: the others are recorded meanwhile
            time.sleep(1.0)
        return real(self, program, source, force, workers)

    monkeypatch.setattr(pipes.Worker, "run", late)
    # Dagster captures the run's output by redirecting the descriptor of ``sys.stderr``, pytest's
    # capture file here: fd 2, as in a run worker, so that the workers inherit the capture.
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    with fast_tmp(tmp_path / "w") as work:
        instance, run_id, resource = _run(work, fan_out=1)
        # One process served every partition of every step (fan_out 1), and the run ended it.
        assert len(started) == 1
        assert started[0].served == len(_expected())
        assert started[0].proc.poll() == 0
        recorded = _materialized(instance, run_id)
        assert sorted((a, p) for a, p, _ in recorded) == _expected()  # each once
        # In the order the worker finished them (one after another), each recorded as it finished:
        # raw_documents' first partitions before its last one was even committed.
        store, crawl = resource.store(), spec(stages=["fuzzy"])
        for program in [p for wave in waves() for p in wave]:
            order = [str(partition_key(CRAWL, s)) for s in crawl.partitions(program)]
            assert [p for a, p, _ in recorded if a == program] == order, program
        committed = os.stat(Path(DataRoot(store).output_dir(crawl, *last)) / MANIFEST).st_mtime
        early = [t for a, p, t in recorded if a == "raw_documents" and p != str(partition_key(CRAWL, last[1]))]
        assert len(early) == len(SOURCES) - 1 and all(t < committed - 0.5 for t in early), (early, committed)
        # Each partition's closing progress line is in the run's compute log (the worker's
        # stderr: the UI's stdout/stderr tab), not among its events (a commit each); every
        # session (one per step) opened and closed.
        messages = [e.user_message for e in instance.all_logs(run_id)]
        captured = "".join(p.read_text() for p in (work / "dagster").rglob("*.err"))
        for program in PROGRAMS:
            for source in crawl.partitions(program):
                name = partition_name(program, CRAWL, source)
                assert f"{name}: done, " in captured, name
                assert not any(m.startswith(f"{name}: ") for m in messages), name
        # a session a step with partitions (a switched-off stage's has none: no session)
        steps = sum(bool(crawl.partitions(p)) for p in PROGRAMS)
        assert sum("external process successfully opened dagster pipes" in m for m in messages) == steps < len(PROGRAMS)
        assert not [m for m in messages if "[pipes] did not receive" in m]


def test_a_worker_killed_holding_a_partition_has_it_launched_again(
        tmp_path: Path, started: list[pipes.Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    target = ("raw_documents", SOURCES[0])
    killed: list[int] = []
    real = pipes.Worker.run

    def fault(self: pipes.Worker, program: str, source: str | None, force: bool, workers: int) -> dict[str, Any]:
        if (program, source) == target and not killed:  # the first attempt: its worker SIGKILLed as it is
            killed.append(self.pid)                      # handed over, so it never finishes it first
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait()
        return real(self, program, source, force, workers)

    monkeypatch.setattr(pipes.Worker, "run", fault)
    with fast_tmp(tmp_path / "w") as work:
        instance, run_id, resource = _run(work, fan_out=2)
        assert len(killed) == 1
        dead = next(w for w in started if w.pid == killed[0])
        assert dead.proc.returncode == -signal.SIGKILL
        assert 2 <= len(started) <= 3  # two slots, and a new worker where no other took what the killed one held
        warnings = [e.user_message for e in instance.all_logs(run_id) if e.level >= 30]
        label = partition_name("raw_documents", CRAWL, SOURCES[0])
        assert any(m.startswith(label) and "killed by signal 9" in m and "launching it again" in m
                   for m in warnings), warnings
        recorded = _materialized(instance, run_id)
        assert sorted((a, p) for a, p, _ in recorded) == _expected()  # each once, the killed one too
        crawl = spec(stages=["fuzzy"])
        alone = Store(str(tmp_path / "alone"))
        run_all(alone, crawl)
        assert _sorted(read(resource.store(), crawl, "removal_ledger", "ledger")).equals(
            _sorted(read(alone, crawl, "removal_ledger", "ledger")))
        for source in crawl.partitions("raw_documents"):
            assert read(resource.store(), crawl, "raw_documents", "documents", source).equals(
                read(alone, crawl, "raw_documents", "documents", source)), source


def test_a_crawl_registered_again_mid_run_is_run_by_later_steps_under_its_new_spec(
        tmp_path: Path, started: list[pipes.Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm worker runs each step under the spec the step read (sent with the step's session),
    not the one the worker read when it started: a new LSH setting registered after the MinHash
    step is what the LSH step plans, runs and records."""
    crawl = spec(stages=["fuzzy"])
    changed = crawl.model_copy(update={"params": {"lsh_buckets": {"bands": 13, "rows": 20}}})
    last = ("minhash_signatures", crawl.partitions("minhash_signatures")[-1])
    real = pipes.Worker.run

    def then_register(self: pipes.Worker, program: str, source: str | None, force: bool, workers: int
                      ) -> dict[str, Any]:
        reply = real(self, program, source, force, workers)
        if (program, source) == last:  # the MinHash step's last partition done: the crawl changes
            CurationResource(workdir=str(work)).dataroot().register(changed)
        return reply

    monkeypatch.setattr(pipes.Worker, "run", then_register)
    with fast_tmp(tmp_path / "w") as work:
        instance, result, resource = _execute(work, fan_out=1)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        assert len(started) == 1  # one worker, started under the first spec, ran every step
        root = DataRoot(resource.store())
        for program, source in [("lsh_buckets", None), ("removal_ledger", None), ("minhash_signatures", last[1])]:
            manifest = root.manifest(changed, program, source)
            assert manifest is not None, program
            assert manifest.params_key == changed.keys()[(program, source)], program
            (record,) = instance.fetch_materializations(AssetRecordsFilter(
                asset_key=AssetKey(program), asset_partitions=[str(partition_key(CRAWL, source))]), limit=5).records
            assert record.asset_materialization is not None
            assert record.asset_materialization.tags[DATA_VERSION_TAG] == manifest.data_version, program
        assert changed.keys()[("lsh_buckets", None)] != crawl.keys()[("lsh_buckets", None)]


class _SlowWorker:
    """A stand-in warm worker: each partition takes 50 ms and fails (nothing to read back)."""

    def __init__(self, ran: list[str | None]) -> None:
        self.ran = ran

    @contextlib.contextmanager
    def session(self, context: Any, spec: Any) -> Iterator[object]:
        yield object()

    def run(self, program: str, source: str | None, force: bool, workers: int) -> dict[str, Any]:
        time.sleep(0.05)
        self.ran.append(source)
        return {"error": "stand-in"}

    def alive(self) -> bool:
        return True


class _OneWorker:
    def __init__(self, worker: _SlowWorker) -> None:
        self.worker = worker

    def take(self) -> _SlowWorker:
        return self.worker

    def give(self, worker: _SlowWorker) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_step_stopped_early_runs_no_further_partition(tmp_path: Path) -> None:
    from curation_dagster.run.crawl_job import Fanout

    crawl = spec(stages=["fuzzy"])
    sources = [f"s{i}" for i in range(20)]
    ran: list[str | None] = []
    resource = CurationResource(workdir=str(tmp_path), mode="pipes", fan_out=1)
    fanout = Fanout(None, resource, crawl, checks=False, workers=_OneWorker(_SlowWorker(ran)))  # type: ignore[arg-type]
    step = fanout.run("raw_documents", sources)  # type: ignore[arg-type]
    assert isinstance(step, Generator)
    (first,) = next(step)
    assert first.source == "s0" and first.error == "stand-in"
    step.close()  # the run was stopped: the step's generator is closed
    assert len(ran) <= 2, ran  # the one in flight at most, not the 18 others


@pytest.mark.parametrize(("reply", "end", "error", "killed"), [
    ('{"skipped": fal', "os.kill(os.getpid(), 9)", "killed by signal 9", True),  # cut short, then killed
    ("not json\\n", "sys.exit(3)", "exited with code 3", False),  # a whole line, garbled
])
def test_a_garbled_reply_is_a_worker_that_died(reply: str, end: str, error: str, killed: bool) -> None:
    script = f"import os, sys; sys.stdin.readline(); sys.stdout.write('{reply}'); sys.stdout.flush(); {end}"
    worker = pipes.Worker([sys.executable, "-c", script], {})
    try:
        got = worker.run("raw_documents", "s0", False, 1)
    finally:
        worker.close()
    assert error in got["error"] and bool(got.get("killed")) == killed, got


def test_a_step_whose_planning_fails_ends_the_runs_warm_workers(
        tmp_path: Path, started: list[pipes.Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    from curation_dagster.run import crawl_job, planner

    real = planner.Planner.step

    def broken(self: planner.Planner, program: str) -> Any:
        if program == "minhash_signatures":
            raise RuntimeError("planning broke")
        return real(self, program)

    monkeypatch.setattr(planner.Planner, "step", broken)
    with fast_tmp(tmp_path / "w") as work:
        _, result, _ = _execute(work, fan_out=1)
        assert not result.success
        assert started and all(w.proc.poll() is not None for w in started)  # ended by the failed step
        assert result.run_id not in crawl_job._WARM
