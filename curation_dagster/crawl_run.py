"""``curate run``'s Dagster run: one run for the crawl, its partitions side by side.

``curate run`` plans which partitions of the crawl are stale (``curation_dagster.runner``) and
makes one Dagster run of them, with one step per program (named after it, in dependency order:
``stages.catalog.waves`` flattened). A step runs its program's stale partitions on a pool of
worker processes (``PartitionPool``: as many as the execution settings' workers, each partition's
kernels on its share of the cores; a partition's checks are evaluated where it ran) and records
each partition as it finishes as its own materialization (the asset's metadata, ``overhead_s``
included) and its own check evaluations, so the UI shows every partition materialized and
checked as a run per partition would. A run per partition cost ~0.4-0.7 s of Dagster's own (run
storage, compute-log capture, the input data versions of every upstream partition), paid one
after another: a crawl of many small sources spent most of its time there.

A step fails after its other partitions finish and are recorded (a resumed crawl does not redo
them), with the first failed partition's error on one line; a blocking check that failed fails
the step too, as an asset step's does, and the later steps do not run. Programs that want a GPU,
and the Ray executor (its cluster is the parallelism), run their partitions one at a time in
this process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
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
from stages.parallel import adopt_environment, die_with_parent, limit_threads
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import Store

CRAWL_JOB = "curate_run"
# The materialization tags Dagster reads an asset partition's data version from: what it writes
# for a step's MaterializeResult(data_version=...) (no public names in 1.13;
# tests/curation_dagster/test_runner.py checks both kinds of materialization carry them).
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_IS_USER_PROVIDED_TAG = "dagster/data_version_is_user_provided"


@dataclass(frozen=True)
class Done:
    """One partition's end: its outcome, its materialization metadata and check verdicts (each
    check that applies: name, verdict), or its error on one line and its traceback. ``busy``: the
    seconds its work took outside the program (planning, commit, metadata, checks), wherever it ran."""

    program: str
    source: str | None
    outcome: Outcome | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)
    busy: float = 0.0
    trace: str = ""


def finish(resource: CurationResource, store: Store, spec: CrawlSpec, program: str, source: str | None,
           execution: ExecutionParams, force: bool, emit: Callable[[str], None] | None = None) -> Done:
    """Run one partition and describe it: what a pool worker or this process does for each."""
    t0 = time.perf_counter()
    try:
        outcome = execute(store, spec, program, source, execution, force=force, emit=emit)
        meta = asset_metadata(resource, program, spec.crawl, source, metadata(outcome))
        judge = evaluator(resource, spec.crawl)
        kinds = [kind for kind in CHECK_KINDS if kind.applies(PROGRAMS[program])]
        verdicts = [(kind.name, judge(kind, program, source)) for kind in kinds]
    except Exception as exc:
        return Done(program, source, error=one_line(exc), trace=traceback.format_exc())
    wall = meta.get("wall_s")
    busy = time.perf_counter() - t0 - (float(wall) if isinstance(wall, int | float) else outcome.seconds)
    return Done(program, source, outcome, None, meta, verdicts, max(busy, 0.0))


def one_line(exc: BaseException) -> str:
    """An exception as the one line ``curate run`` prints: its message's last line, else its class."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


DIED = "its worker process died (out of memory?)"
# A worker's resource, store and crawl, set by the pool's initializer.
_WORKER: dict[str, Any] = {}
# What a worker has imported when the pool's fork server forks it: the executor and the programs.
PRELOAD = ["curation_dagster.crawl_run", *(f"stages.programs.{name}" for name in PROGRAMS)]


def _init_worker(resource_fields: dict[str, Any], spec: CrawlSpec, environ: dict[str, str]) -> None:
    die_with_parent(os.getppid())  # the fork server: it exits when the process that started it does
    try:
        # The fork server's environment is that of the first pool of this process: take this one's.
        adopt_environment(environ)
        resource = CurationResource(**resource_fields)
        _WORKER.update(resource=resource, store=resource.store(), spec=spec)
    except Exception as exc:
        _WORKER["error"] = f"the worker process could not start: {one_line(exc)}"


def _work(program: str, source: str | None, execution: ExecutionParams, force: bool) -> Done:
    if "error" in _WORKER:
        return Done(program, source, error=_WORKER["error"])
    cores = execution.resolved_workers()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # libraries not loaded yet
        os.environ[name] = str(cores)
    limit_threads(cores)
    return finish(_WORKER["resource"], _WORKER["store"], _WORKER["spec"], program, source, execution, force)


def _cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's CPU set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _memory_bytes() -> int | None:
    """Memory available now: Linux's ``MemAvailable``, at most what this process's cgroup (v2: a
    container's limit) has left; None where neither is known."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            found += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(min(found), 0) if found else None


class PartitionPool:
    """Worker processes that run partitions of one crawl side by side, started once per
    ``curate run`` and reused by every step: ``workers`` processes at most (the execution
    settings' workers, else the cores this process may use, at most one per source). A step of k
    partitions runs at most as many at once as the memory available when the pool started holds
    of its program's requested memory (``Program.resources.memory_gib``: one at a time, in this
    process, where that is under two), and gives each ``cores // (partitions at once)`` cores:
    its ``ExecutionParams.workers`` (its process pools), its numba, torch and OpenMP threads."""

    def __init__(self, resource: CurationResource, spec: CrawlSpec, force: bool = False) -> None:
        self.resource = resource
        self.spec = spec
        self.force = force
        self.store: Store = resource.store()
        self.execution = resource.execution()
        self.cores = self.execution.workers or _cores()
        self.workers = min(self.cores, len(spec.sources))
        self.memory = _memory_bytes()
        self._pool: ProcessPoolExecutor | None = None
        if self.workers >= 2 and self.execution.executor == "local" and resource.mode == "in_process":
            # Workers are forked from a fork server, a fresh process with the programs imported: not
            # from this one, whose kernels may have started OpenMP threads (fork is unsafe then).
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            # The data root and its options as resolved here, whatever the workers' environment.
            fields = {name: getattr(resource, name) for name in type(resource).model_fields}
            fields.update(data_root=resource.root(), storage_options=resource.options())
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                             initargs=(fields, spec, dict(os.environ)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> PartitionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def side_by_side(self, program: str, partitions: int) -> int:
        """How many partitions of ``program`` run at once on the pool (0: here, in turn)."""
        wants_gpu = PROGRAMS[program].resources.gpu > 0 and self.execution.backend != "cpu"
        if self._pool is None or partitions < 2 or wants_gpu:
            return 0
        fit = self.workers
        if self.memory is not None:
            fit = min(fit, int(self.memory // (max(PROGRAMS[program].resources.memory_gib, 0.25) * 2**30)))
        return 0 if fit < 2 else min(fit, partitions)

    def run(self, program: str, sources: list[str | None], emit: Callable[[str], None] | None = None
            ) -> Iterator[Done]:
        """Every partition of ``program`` in ``sources``, each yielded as it finishes. A worker
        process that dies (the OOM killer) breaks the pool: every partition of the step not done
        by then fails, and so do later steps' (a rerun resumes)."""
        at_once = self.side_by_side(program, len(sources))
        if not at_once:
            for source in sources:
                yield finish(self.resource, self.store, self.spec, program, source, self.execution, self.force, emit)
            return
        assert self._pool is not None
        execution = self.execution.model_copy(update={"workers": max(1, self.cores // at_once)})
        # All at once when the pool's size is the bound (its queue keeps every worker busy while
        # this process records), else ``at_once`` in flight.
        in_flight = len(sources) if at_once >= self.workers else at_once
        queue = list(sources)
        pending: dict[Future[Done], str | None] = {}
        while queue or pending:
            while queue and len(pending) < in_flight:
                source = queue.pop(0)
                try:
                    pending[self._pool.submit(_work, program, source, execution, self.force)] = source
                except BrokenProcessPool as exc:  # a worker died in an earlier step
                    yield Done(program, source, error=f"{DIED}: {one_line(exc)}")
            if not pending:
                continue
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                source = pending.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool as exc:
                    yield Done(program, source, error=f"{DIED}: {one_line(exc)}")


# What ``curate run`` is told of each partition its run recorded (or that failed).
OnDone = Callable[[Done], None]
KINDS = {kind.name: kind for kind in CHECK_KINDS}


def _step(program: str, sources: list[str | None], pool: PartitionPool, on_done: OnDone, first: bool) -> OpDefinition:
    spec = pool.spec

    @op(name=program, ins={} if first else {"after": In(Nothing)}, out=Out(Nothing),
        description=f"{program}: {len(sources)} partition(s) of crawl {spec.crawl}")
    def _op(context) -> Iterator[Any]:  # type: ignore[no-untyped-def]  # dagster rejects a string annotation
        errors: dict[str | None, str] = {}
        for done in pool.run(program, sources, emit=context.log.info):
            received = time.perf_counter()
            name = partition_label(spec, program, done.source)
            if done.outcome is None:
                errors[done.source] = str(done.error)
                context.log.error(f"{name} failed: {done.error}\n{done.trace}".rstrip())
                on_done(done)
                continue
            key = str(partition_key(spec.crawl, done.source))
            meta = dict(done.meta)
            if "wall_s" in meta:  # the profile's overhead: its time outside the program, to its record here
                meta["overhead_s"] = round(done.busy + time.perf_counter() - received, 4)
            # No provenance tags (code version, input data versions): Dagster would take a partial
            # provenance for changed inputs; the data version is ours (params and input versions).
            yield AssetMaterialization(
                asset_key=program, partition=key, metadata=meta,
                tags={DATA_VERSION_TAG: done.outcome.manifest.data_version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
            )
            for check, verdict in done.verdicts:
                yield evaluation(program, KINDS[check], verdict, key)
            on_done(done)
        if errors:
            failed = sorted(errors, key=sources.index)  # the first in the crawl's order is the one told
            raise Failure(description=f"{partition_label(spec, program, failed[0])}: {errors[failed[0]]}",
                          metadata={"failed": {partition_label(spec, program, s): errors[s] for s in failed}})
        yield Output(None)  # the next step waits on it

    return _op


def crawl_job(work: list[tuple[str, list[str | None]]], pool: PartitionPool, on_done: OnDone) -> JobDefinition:
    """The job of a crawl's run: a step per (program, its stale partitions), in dependency order."""
    steps = [_step(program, sources, pool, on_done, i == 0) for i, (program, sources) in enumerate(work)]

    @job(name=CRAWL_JOB, description="curate run: the stale partitions of a crawl, a step per program")
    def _job() -> None:
        after = None
        for step in steps:
            after = step() if after is None else step(after)

    return _job


def partition_label(spec: CrawlSpec, program: str, source: str | None) -> str:
    """``program[source]``, or ``program[crawl]`` for a crawl-level partition."""
    return f"{program}[{source}]" if source else f"{program}[{spec.crawl}]"

