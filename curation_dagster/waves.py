"""``curate run``'s wave runs: one Dagster run per wave of the crawl, its partitions side by side.

A wave (``stages.catalog.waves``) is a run of programs of one level whose inputs are
materialized by then. ``curate run`` makes one Dagster run per wave, with one step per program
(named after it, in the wave's order). A step runs every stale partition of its program on a
pool of worker processes (``PartitionPool``: as many as the execution settings' workers, each
partition's kernels on its share of the cores), and records each partition as it finishes as
its own materialization (the asset's metadata, ``overhead_s`` included) and its own check
evaluations, so the UI shows every partition materialized and checked as a run per partition
would. A run per partition costs ~0.4-0.7 s of Dagster's own (run storage, compute-log capture,
the input data versions of every upstream partition), paid one after another; a crawl of many
small sources spent most of its time there.

A step fails after its other partitions finish and are recorded (a resumed crawl does not redo
them), with the first failed partition's error on one line; a blocking check that failed fails
the step too, as an asset step's does, and the wave's later steps do not run. Programs that
want a GPU, and the Ray executor (its cluster is the parallelism), run their partitions one at a
time in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetMaterialization,
    Failure,
    In,
    JobDefinition,
    Nothing,
    OpDefinition,
    Out,
    Output,
    job,
    op,
)

from curation_dagster.assets import asset_metadata
from curation_dagster.checks import CHECK_KINDS, Verdict, evaluation, evaluator
from curation_dagster.partitions import partition_key
from curation_dagster.resources import CurationResource
from stages.catalog import PROGRAMS
from stages.execute import Outcome, execute, metadata
from stages.parallel import die_with_parent
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import Store

WAVE_JOB = "curate_wave"
# The materialization tags Dagster reads an asset partition's data version from: what it writes
# for a step's MaterializeResult(data_version=...) (no public names in 1.13;
# tests/curation_dagster/test_runner.py checks both kinds of materialization carry them).
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_IS_USER_PROVIDED_TAG = "dagster/data_version_is_user_provided"


@dataclass(frozen=True)
class Done:
    """One partition's end: its outcome, or its error on one line; ``started`` is the wall-clock
    time (``time.time()``) its work began, in whichever process ran it."""

    program: str
    source: str | None
    outcome: Outcome | None
    error: str | None
    started: float


def one_line(exc: BaseException) -> str:
    """An exception as the one line ``curate run`` prints: its message's last line, else its class."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


# A worker's store and crawl, set by the pool's initializer.
_WORKER: dict[str, Any] = {}
# What a worker has imported when the pool's fork server forks it: the executor and the programs.
PRELOAD = ["curation_dagster.waves", *(f"stages.programs.{name}" for name in PROGRAMS)]


def _init_worker(resource_fields: dict[str, Any], spec: CrawlSpec) -> None:
    die_with_parent(os.getppid())  # the fork server: it exits when the process that started it does
    _WORKER["store"] = CurationResource(**resource_fields).store()
    _WORKER["spec"] = spec


def _work(program: str, source: str | None, execution: ExecutionParams, force: bool) -> Done:
    started = time.time()
    try:
        outcome = execute(_WORKER["store"], _WORKER["spec"], program, source, execution, force=force)
    except Exception as exc:
        return Done(program, source, None, one_line(exc), started)
    return Done(program, source, outcome, None, started)


class PartitionPool:
    """Worker processes that run partitions of one crawl side by side, started once per
    ``curate run`` and reused by every wave: ``workers`` processes at most; a step of k partitions
    gives each ``workers // min(k, workers)`` cores (its ``ExecutionParams.workers``: its process
    pools and numba threads)."""

    def __init__(self, resource: CurationResource, spec: CrawlSpec, force: bool = False) -> None:
        self.resource = resource
        self.spec = spec
        self.force = force
        self.store: Store = resource.store()
        self.execution = resource.execution()
        self.workers = min(self.execution.resolved_workers(), len(spec.sources))
        self._pool: ProcessPoolExecutor | None = None
        if self.workers >= 2 and self.execution.executor == "local" and resource.mode == "in_process":
            # Workers are forked from a fork server, a fresh process with the programs imported: not
            # from this one, whose kernels may have started OpenMP threads (fork is unsafe then).
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            fields = {name: getattr(resource, name) for name in type(resource).model_fields}
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                             initargs=(fields, spec))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> PartitionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def side_by_side(self, program: str, partitions: int) -> bool:
        """Whether ``partitions`` partitions of ``program`` run on the pool (else here, in turn)."""
        wants_gpu = PROGRAMS[program].resources.gpu > 0 and self.execution.backend != "cpu"
        return self._pool is not None and partitions >= 2 and not wants_gpu

    def run(self, program: str, sources: list[str | None]) -> Iterator[Done]:
        """Every partition of ``program`` in ``sources``, each yielded as it finishes."""
        if not self.side_by_side(program, len(sources)):
            for source in sources:
                started = time.time()
                try:
                    outcome = execute(self.store, self.spec, program, source, self.execution, force=self.force)
                except Exception as exc:
                    yield Done(program, source, None, one_line(exc), started)
                    continue
                yield Done(program, source, outcome, None, started)
            return
        assert self._pool is not None
        share = max(1, self.execution.resolved_workers() // min(len(sources), self.workers))
        execution = self.execution.model_copy(update={"workers": share})
        futures: list[Future[Done]] = [self._pool.submit(_work, program, s, execution, self.force) for s in sources]
        for future in as_completed(futures):
            yield future.result()


# What ``curate run`` is told of each partition a wave run records: (done, its failed checks).
OnDone = Callable[[Done, list[tuple[str, Verdict]]], None]


def _step(program: str, sources: list[str | None], pool: PartitionPool, on_done: OnDone, first: bool) -> OpDefinition:
    spec, resource = pool.spec, pool.resource

    @op(name=program, ins={} if first else {"after": In(Nothing)}, out=Out(Nothing),
        description=f"{program}: {len(sources)} partition(s) of crawl {spec.crawl}, side by side")
    def _op() -> Iterator[Any]:
        errors: dict[str | None, str] = {}
        judge = evaluator(resource, spec.crawl)  # the bounds and the spec, read once per step
        for done in pool.run(program, sources):
            if done.outcome is None:
                errors[done.source] = str(done.error)
                on_done(done, [])
                continue
            key = str(partition_key(spec.crawl, done.source))
            meta = metadata(done.outcome)
            if "wall_s" in meta:  # the profile's overhead: its time outside the program, to its record
                meta["overhead_s"] = round(max(time.time() - done.started - float(meta["wall_s"]), 0.0), 4)
            yield AssetMaterialization(
                asset_key=program, partition=key,
                metadata=asset_metadata(resource, program, spec.crawl, done.source, meta),
                tags={DATA_VERSION_TAG: done.outcome.manifest.data_version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
            )
            failed = []
            for kind in CHECK_KINDS:
                if kind.applies(PROGRAMS[program]):
                    verdict = judge(kind, program, done.source)
                    yield evaluation(program, kind, verdict, key)
                    if not verdict.passed:
                        failed.append((kind.name, verdict))
            on_done(done, failed)
        if errors:
            first_failed = min(errors, key=lambda s: sources.index(s))
            raise Failure(description=f"{_name(spec, program, first_failed)}: {errors[first_failed]}")
        yield Output(None)  # the wave's next step waits on it

    return _op


def wave_job(work: list[tuple[str, list[str | None]]], pool: PartitionPool, on_done: OnDone) -> JobDefinition:
    """The job of one wave run: a step per (program, its stale partitions), in the wave's order."""
    steps = [_step(program, sources, pool, on_done, i == 0) for i, (program, sources) in enumerate(work)]

    @job(name=WAVE_JOB, description="curate run: one wave of a crawl, its partitions side by side")
    def _job() -> None:
        after = None
        for step in steps:
            after = step() if after is None else step(after)

    return _job


def _name(spec: CrawlSpec, program: str, source: str | None) -> str:
    """``program[source]``, or ``program[crawl]`` for a crawl-level partition."""
    return f"{program}[{source}]" if source else f"{program}[{spec.crawl}]"

