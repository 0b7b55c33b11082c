"""The crawl job: one Dagster run per crawl, a step per program, every partition recorded as it
finishes.

``curate_run`` is a static job of the code location (it shows in the Launchpad, its config is
the crawl: ``{crawl: NAME, force: false}``, the spec itself is the data root's). Its steps are the
programs in dependency order (``stages.catalog.steps``: ``waves`` flattened). A step plans its program's
partitions when it starts (``curation_dagster.run.planner``: the steps before it have committed their
outputs), logs a planned materialization for each stale one not done yet (the UI shows it in
progress), fans
the stale ones out to a launcher and records each as it finishes (``curation_dagster.run.recorder``):
its own materialization and check evaluations; a current partition's check evaluation only where
its verdict changed (``recorder.rejudged``). "Re-execute from failure", a run retry, or the same
crawl launched again reruns only what is not current.

The launchers differ only in where a partition's ``stages.execute.execute`` runs:

- the warm pool (``curation_dagster.run.pool.PartitionPool``, ``mode="in_process"``: ``curate
  run``, ``dagster dev``): worker processes forked from a fork server, each partition's kernels on
  its share of the cores;
- warm ``python -m stages serve`` workers speaking Dagster Pipes (``mode="pipes"``: ``curate
  deploy``), the stage pod's entry point, each serving partitions one after another for the whole
  run, or a Kubernetes pod through ``PipesK8sClient`` per partition or pack (``mode="k8s"``): at
  most ``CurationResource.fan_out_now()`` partitions of a step at once.

A partition's checks are evaluated where it is described (``curation_dagster.run.partition``: the
pool worker, else the run worker).
A step fails after its other partitions finish and are recorded, with the first failed
partition's error on one line; a blocking check that failed, on a partition the step ran or on a
current one, fails the step too, and the later steps do not run. An asset launched on its own
from the UI (one partition, or a backfill's) runs through the same launchers and recorder
(``materialize_partition``).
"""

import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import suppress
from typing import Any, Protocol

from dagster import (
    AssetExecutionContext,
    AssetKey,
    Config,
    DagsterInstance,
    Failure,
    In,
    InitLoggerContext,
    JobDefinition,
    MaterializeResult,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    Output,
    config_mapping,
    in_process_executor,
    job,
    logger,
    op,
)
from pydantic import Field

from curation_dagster.defs.launchers.pipes import Workers
from curation_dagster.defs.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.instance import add_partitions
from curation_dagster.run import recorder
from curation_dagster.run.done import Done
from curation_dagster.run.judge import evaluator
from curation_dagster.run.partition import describe, finish, one_line, told
from curation_dagster.run.planner import Planner
from curation_dagster.run.pool import PartitionPool
from stages.catalog import PROGRAMS, partition_name, step_after, steps
from stages.dataroot import DataRoot
from stages.execute import Outcome
from stages.spec import CrawlSpec

CRAWL_JOB = "curate_run"
CRAWL_TAG = "curate/crawl"  # on every run of a crawl (``curate run``, ``curate submit``)
STEPS = steps()


class CrawlConfig(Config):
    """The run config of the crawl job: which registered crawl, and whether to recompute it all."""

    crawl: str = Field(description="a crawl registered in the data root (curate run / curate submit register it)")
    force: bool = Field(default=False, description="recompute every partition, current or not")


class Launcher(Protocol):
    """Runs partitions of one program and yields them as they finish, in lists the step records
    together (at least one partition each): those finished since the last list was taken (the
    pool, warm workers), or a pod's pack (Kubernetes). ``started`` is called once, before the
    first list: where the partitions run elsewhere, once they are handed over, so what the step
    does then (its planned materializations' events) runs beside them; with those of ``sources``
    that had ended already (started ahead of the step: ``PartitionPool.run_ahead``)."""

    def run(self, program: str, sources: list[str | None], emit: Callable[[str], None] | None = None,
            started: Callable[[set[str | None]], None] | None = None) -> Iterator[list[Done]]: ...


class Fanout:
    """Partitions outside this process, at most ``CurationResource.fan_out_now()`` at once, each
    described here as it ends: on warm ``python -m stages serve`` workers (``mode="pipes"``:
    ``workers``, kept for the run, each serving partitions one after another in a Pipes session
    per step), or as pods through ``PipesK8sClient`` (``mode="k8s"``), small ones packed several to
    a pod (``pack_documents``). A partition whose process a signal killed before it reported is
    launched again (``partition_retries``) once that process is gone."""

    def __init__(self, context: OpExecutionContext | AssetExecutionContext, resource: CurationResource,
                 spec: CrawlSpec, force: bool = False, checks: bool = True, workers: Workers | None = None) -> None:
        self.context = context
        self.resource = resource
        self.spec = spec
        self.force = force
        self.checks = checks
        self.workers = workers
        self.store = resource.store()
        # One evaluator for the step (the checks' bounds and the crawl's record, read once).
        self.judge = evaluator(resource, spec.crawl) if checks else None

    def packs(self, program: str, sources: list[str | None]) -> list[list[str | None]]:
        """``sources`` in packs, in order: as many as fit ``pack_documents`` (a source's documents:
        its ingested ``raw_documents``, 0 before it is ingested), never more than an even share of
        ``fan_out_now()`` processes, so packing never leaves a process idle."""
        limit = self.resource.pack_documents
        if limit <= 0 or len(sources) < 2 or PROGRAMS[program].level != "source":
            return [[s] for s in sources]
        share = -(-len(sources) // max(self.resource.fan_out_now(), 1))
        packs: list[list[str | None]] = []
        size = 0
        for source in sources:
            docs = self._documents(source)
            if not packs or len(packs[-1]) >= share or size + docs > limit:
                packs.append([])
                size = 0
            packs[-1].append(source)
            size += docs
        return packs

    def _documents(self, source: str | None) -> int:

        try:
            manifest = DataRoot(self.store).manifest(self.spec, "raw_documents", source)
        except FileNotFoundError:
            return 0
        return int(manifest.report.get("documents", 0)) if manifest is not None else 0

    def _relaunch(self, program: str, source: str | None, error: str) -> None:
        self.context.log.warning(f"{partition_name(program, self.spec.crawl, source)}: {error}; launching it again")

    def _pack(self, program: str, pack: list[str | None]) -> list[Done]:
        t0 = time.perf_counter()
        try:
            reported = self.resource.launch(self.context, program, self.spec.crawl, pack, self.force)
            for _ in range(self.resource.partition_retries):
                again = [s for s in pack if reported[s].get("killed")]
                if not again:
                    break
                # Killed from outside (not its own error): launched once more; a lease it held on an
                # S3 data root is taken over once it expires (stages.lease), so no two overlap.
                for source in again:
                    self._relaunch(program, source, reported[source]["error"])
                reported.update(self.resource.launch(self.context, program, self.spec.crawl, again, self.force))
        except Exception as exc:
            return [Done(program, s, error=one_line(exc), trace=traceback.format_exc()) for s in pack]
        seconds = {s: float(reported[s].get("seconds", 0.0)) for s in pack}
        total = sum(seconds.values())
        return [self._describe(program, s, reported[s], t0, len(pack), total - seconds[s]) for s in pack]

    def _describe(self, program: str, source: str | None, reported: dict[str, Any], t0: float, packed: int = 1,
                  others_s: float = 0.0) -> Done:
        """One partition of a pack of ``packed`` launched at ``t0``; ``others_s``: the seconds the
        pack's other partitions' programs took (not this one's overhead)."""
        if "error" in reported:
            return Done(program, source, error=str(reported["error"]))
        try:

            manifest = DataRoot(self.store).manifest(self.spec, program, source)
            if manifest is None or manifest.data_version != reported.get("data_version"):
                return Done(program, source, error="its process ended without committing its output")
            outcome = Outcome(manifest, bool(reported["skipped"]), float(reported["seconds"]))
            done = describe(self.resource, self.spec, program, source, outcome, t0, self.checks, self.judge, self.store)
        except Exception as exc:
            return Done(program, source, error=one_line(exc), trace=traceback.format_exc())
        if packed > 1:  # the pack's process time outside its programs, shared by its partitions
            done = Done(done.program, done.source, done.outcome, None, done.meta, done.verdicts,
                        max(done.busy - others_s, 0.0) / packed, done.trace)
        return done

    def run(self, program: str, sources: list[str | None], emit: Callable[[str], None] | None = None,
            started: Callable[[set[str | None]], None] | None = None) -> Iterator[list[Done]]:
        if started is not None:  # before launching: a pod takes seconds to start
            started(set())
        if not sources:
            return
        if self.resource.mode == "pipes":
            yield from self._serve(program, sources)
            return
        packs = self.packs(program, sources)
        threads = ThreadPoolExecutor(max(1, min(self.resource.fan_out_now(), len(packs))),
                                     thread_name_prefix=f"{program}-launch")
        try:
            futures = [threads.submit(self._pack, program, pack) for pack in packs]
            for future in as_completed(futures):
                yield future.result()
        finally:  # stopped early (the run was stopped): the packs not started yet are not launched
            threads.shutdown(wait=True, cancel_futures=True)

    def _serve(self, program: str, sources: list[str | None]) -> Iterator[list[Done]]:
        """``sources`` on warm workers, ``fan_out`` at once: each launching thread takes a worker
        (idle, else a new one), opens the step's Pipes session in it and hands it one partition
        after another while any is left; yielded as they finish (``Launcher``)."""
        owned = self.workers is None
        workers = self.workers or Workers(*self.resource.serve_command(self.spec.crawl))
        todo: deque[tuple[str | None, int]] = deque((s, 0) for s in sources)  # (source, launches before)
        lock = threading.Lock()
        stopped = False  # the step stopped taking partitions (under ``lock``)
        finished: queue.Queue[Done | None] = queue.Queue()
        cores = self.resource.stage_workers(program)

        def next_partition() -> tuple[str | None, int] | None:
            with lock:
                return todo.popleft() if todo else None

        def fail_the_rest(error: str) -> None:
            with lock:
                left = list(todo)
                todo.clear()
            for source, _ in left:
                finished.put(Done(program, source, error=error))

        def slot() -> None:
            starts_failed = 0
            item: tuple[str | None, int] | None = None  # the partition in flight
            try:
                while todo:
                    worker = workers.take()
                    try:
                        with worker.session(self.context, self.spec) as session:
                            if session is None:  # ended before it opened: a broken command line or setup
                                starts_failed += 1
                                if starts_failed >= 2:
                                    fail_the_rest(f"its worker process exited with code {worker.proc.wait()} "
                                                  "before it served a partition")
                                continue
                            starts_failed = 0
                            while (item := next_partition()) is not None:
                                source, launched = item
                                t0 = time.perf_counter()
                                reported = worker.run(program, source, self.force, cores)
                                if reported.get("killed") and launched < self.resource.partition_retries:
                                    # Killed from outside (not its own error): on another worker once this
                                    # one is gone (Worker.run waited for it); a lease it held on an S3 data
                                    # root is taken over once it expires (stages.lease): no two overlap.
                                    self._relaunch(program, source, str(reported["error"]))
                                    with lock:
                                        if not stopped:
                                            todo.appendleft((source, launched + 1))
                                    item = None
                                    break
                                finished.put(self._describe(program, source, reported, t0))
                                item = None
                                if not worker.alive():
                                    break
                    finally:
                        workers.give(worker)
            except Exception as exc:  # the session itself: fail what this slot would have served
                if item is not None:
                    finished.put(Done(program, item[0], error=one_line(exc), trace=traceback.format_exc()))
                fail_the_rest(one_line(exc))
                if not isinstance(exc, OSError):
                    self.context.log.error(traceback.format_exc())
            finally:
                finished.put(None)

        slots = max(1, min(self.resource.fan_out_now(), len(sources)))
        threads = [threading.Thread(target=slot, name=f"{program}-slot-{i}", daemon=True) for i in range(slots)]
        try:
            for thread in threads:
                thread.start()
            ended = 0
            while ended < slots:
                ready = [finished.get()]
                with suppress(queue.Empty):  # and what else finished meanwhile
                    while True:
                        ready.append(finished.get_nowait())
                ended += ready.count(None)
                done = [d for d in ready if d is not None]
                if done:
                    yield done
        finally:  # stopped early (the run was stopped): no slot takes another partition
            with lock:
                stopped = True
                todo.clear()
            for thread in threads:
                thread.join()
            if owned:
                workers.close()


class Listener(Protocol):
    """What ``curate run`` is told of each partition of its run: one that finished (or failed),
    one that was current already."""

    def finished(self, done: Done) -> None: ...

    def current(self, program: str, source: str | None) -> None: ...


# ``curate run`` runs the crawl job in its own process: its display and its warm pool, by crawl.
_LISTENERS: dict[str, Listener] = {}
_POOLS: dict[str, PartitionPool] = {}
_LOCK = threading.Lock()
# The warm stage workers (``mode="pipes"``) of the run this process runs, by run id: a Dagster run
# worker runs one run; a process that runs several in turn keeps the latest's.
_WARM: dict[str, Workers] = {}


def run_workers(run_id: str, curation: CurationResource, crawl: str) -> Workers:
    """The warm workers of run ``run_id``, which its steps share (the others' are ended)."""
    with _LOCK:
        others = [_WARM.pop(r) for r in [r for r in _WARM if r != run_id]]
        if run_id not in _WARM:
            _WARM[run_id] = Workers(*curation.serve_command(crawl))
        workers = _WARM[run_id]
    for other in others:  # outside the lock: ending them waits for their processes (up to 10 s each)
        other.close()
    return workers


def retire_workers(run_id: str) -> None:
    """End run ``run_id``'s warm workers (its last step ran, or a step failed: no later one runs)."""
    with _LOCK:
        workers = _WARM.pop(run_id, None)
    if workers is not None:
        workers.close()


class attached:
    """While ``curate run`` runs the crawl job in-process: its listener and pool for ``crawl``."""

    def __init__(self, crawl: str, listener: Listener, pool: PartitionPool | None) -> None:
        self.crawl, self.listener, self.pool = crawl, listener, pool

    def __enter__(self) -> "attached":
        with _LOCK:
            _LISTENERS[self.crawl] = self.listener
            if self.pool is not None:
                _POOLS[self.crawl] = self.pool
        return self

    def __exit__(self, *exc: object) -> None:
        with _LOCK:
            _LISTENERS.pop(self.crawl, None)
            _POOLS.pop(self.crawl, None)


def _add_partitions(instance: DagsterInstance, spec: CrawlSpec) -> None:
    """The crawl's and its sources' dynamic partitions, where the instance lacks them (a crawl
    launched from the Launchpad: curate run and curate submit add them before), under the
    instance's lock as every other adder (``curation_dagster.ops.instance.add_partitions``)."""
    add_partitions(instance, {CRAWL: [spec.crawl], SOURCE: sorted(spec.sources)})


def _planned(context: OpExecutionContext, program: str, keys: list[str]) -> None:
    """Log a planned materialization of each partition about to run: the UI shows it in progress
    (what Dagster logs at the start of an asset run; an op's runtime materializations get none)."""
    try:  # dagster's own constructor (1.13, pinned); the run still records without it
        from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent
    except ImportError:
        return
    with recorder.together(context.instance):  # one commit for the step's, not one per partition
        for key in keys:
            event = DagsterEvent.build_asset_materialization_planned_event(
                context.job_name, program, AssetMaterializationPlannedData(AssetKey(program), partition=key))
            context.instance.report_dagster_event(event, context.run_id)


def run_step(context: OpExecutionContext, curation: CurationResource, config: CrawlConfig, program: str
             ) -> Iterator[Any]:
    """One step of the crawl job: plan ``program``'s partitions, run the stale ones, record each.
    A step that fails or is stopped, wherever (planning included), ends the run's warm workers
    and its pool's chain of steps started ahead (``PartitionPool.stop_ahead``): no later step of
    the run runs."""
    try:
        yield from _run_step(context, curation, config, program)
    except BaseException:
        pool = _POOLS.get(config.crawl) if curation.mode == "in_process" else None
        if pool is not None:
            pool.stop_ahead()
        retire_workers(context.run_id)
        raise


def _run_step(context: OpExecutionContext, curation: CurationResource, config: CrawlConfig, program: str
              ) -> Iterator[Any]:
    spec = curation.spec(config.crawl)
    if program == STEPS[0]:
        _add_partitions(context.instance, spec)
    if spec.switched_off(program):  # nothing to plan, run or record; the steps after it read without it
        context.log.info(f"{program}: {spec.switched_off_why(program)}: no partition")
        return
    pool = _POOLS.get(spec.crawl) if curation.mode == "in_process" else None
    planner = Planner(context.instance, curation, spec, config.force)
    plan = planner.step(program)
    listener = _LISTENERS.get(spec.crawl)
    order = spec.partitions(program)
    # The partitions to run, by key: what the UI's log shows before they start (and tests read).
    context.log.info(f"{program}: {len(plan.stale)} stale partition(s) to run "
                     f"[{', '.join(str(partition_key(spec.crawl, s)) for s in plan.stale)}], "
                     f"{len(plan.current)} current")
    for source in plan.current:
        if listener is not None:
            listener.current(program, source)
    held = planner.held_back(program, plan.current)
    # Not rerun, but judged with the bounds as they are now: a verdict that changed (a bound was
    # raised) is recorded, so the UI stops showing the old one.
    yield from planner.rejudged(program, plan.current)
    errors: dict[str | None, str] = {}
    blocked: dict[str | None, str] = {}
    owned: PartitionPool | None = None
    launcher: Launcher
    if curation.mode == "in_process":
        launcher = pool or PartitionPool(curation, spec, config.force)
        owned = None if launcher is pool else launcher  # type: ignore[assignment]
        if pool is not None and _next_step(program, plan.stale, plan.current) is not None:
            pool.then_ahead(program)
    else:
        warm = run_workers(context.run_id, curation, spec.crawl) if curation.mode == "pipes" else None
        launcher = Fanout(context, curation, spec, config.force, workers=warm)
    try:
        # The stale partitions' planned materializations, once they are handed over (before the
        # first is recorded): 23-32 ms a step at 200 sources, which the workers waited for. Not
        # for those that ended before the step began (run ahead of it): they are recorded done,
        # never in progress (at 200 sources most of a step's, once the workers go down the
        # steps ahead of the recording: a fifth of the events this process stores).
        def started(ended: set[str | None]) -> None:
            _planned(context, program, [str(partition_key(spec.crawl, s)) for s in plan.stale if s not in ended])

        for finished in launcher.run(program, plan.stale, emit=context.log.info, started=started):
            received = time.perf_counter()
            # The partitions that finished while the last were recorded: their events in one
            # commit (each partition whole or not at all), so the more this process lags behind
            # the workers, the less each partition costs it. (A partition's overhead runs to its
            # own materialization: the list's earlier ones recorded first are part of its wait.)
            with recorder.together(context.instance) as batched:
                for done in finished:
                    name = partition_name(program, spec.crawl, done.source)
                    if done.outcome is None:
                        errors[done.source] = str(done.error)
                        continue
                    key = str(partition_key(spec.crawl, done.source))
                    yield recorder.materialization(done, key, received)
                    # The evaluations target it (the UI's check state counts them only then): a
                    # batch fills that in as it stores them; else Dagster stored it already (~1 ms).
                    target = None if batched or not done.verdicts else recorder.recorded(
                        context.instance, program, key, context.run_id)
                    yield from recorder.evaluations(done, key, target)
                    for check, verdict in done.blocking_failures():
                        blocked.setdefault(done.source, f"{name}: check {check} failed: {verdict.description}")
            for done in finished:  # failures told after the batch: the log keeps the order they finished in
                if done.outcome is None:
                    name = partition_name(program, spec.crawl, done.source)
                    context.log.error(f"{name} failed: {done.error}\n{done.trace}".rstrip())
                if listener is not None:
                    listener.finished(done)
    finally:
        if owned is not None:
            owned.close()
    if errors or blocked or held or program == STEPS[-1]:  # no later step of this run runs
        retire_workers(context.run_id)
    if errors:
        failed = sorted(errors, key=order.index)  # the first in the crawl's order is the one told
        raise Failure(description=told(partition_name(program, spec.crawl, failed[0]), errors[failed[0]]),
                      metadata={"failed": {partition_name(program, spec.crawl, s): errors[s] for s in failed}})
    if blocked or held:
        first = [blocked[s] for s in sorted(blocked, key=order.index)]
        raise Failure(description=first[0] if first else str(held))


def _next_step(program: str, stale: list[str | None], current: list[str | None]) -> str | None:
    """The step after ``program``'s, where its partitions may start on the run's pool as soon as
    ``program``'s have all finished clean (``PartitionPool.then_ahead``), before this step has
    recorded them: where this step runs every partition of ``program`` (none current, so none held
    back by an earlier verdict). The pool then starts them where every partition of the next will
    run (a forced run, or none of them committed or begun for the crawl's keys, its first run),
    and so on down the steps. Their inputs are this step's partitions and those of earlier steps,
    committed."""
    return None if current or not stale else step_after(program)


def _step(program: str, first: bool) -> OpDefinition:
    # Named apart from the asset's own op (op names are unique in a code location); the step is
    # the program's name (``alias``).
    @op(name=f"crawl_{program}", ins={} if first else {"after": In(Nothing)}, out=Out(Nothing),
        description=f"{program}: the crawl's stale partitions of {program}, each recorded as it finishes",
        tags={"kind": "curation"})
    def _op(context: OpExecutionContext, config: CrawlConfig, curation: CurationResource) -> Iterator[Any]:
        yield from run_step(context, curation, config, program)
        yield Output(None)  # the next step waits on it

    return _op


@logger(config_schema=None, description="Dagster's console log of the crawl job's runs: INFO and above; quiet while "
                    "curate run (which prints its own lines) runs the job in its process.")
def console(init_context: InitLoggerContext) -> logging.Logger:
    log = logging.Logger("dagster", level=logging.CRITICAL if _LISTENERS else logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    log.addHandler(handler)
    return log


@config_mapping
def _crawl_config(config: CrawlConfig) -> dict[str, Any]:
    """The crawl's config, given once, to every step; and the job's own console logger, which
    Dagster instantiates only when the run config names it (else its DEBUG console log)."""
    step = {"config": {"crawl": config.crawl, "force": config.force}}
    return {"ops": {program: step for program in STEPS}, "loggers": {"console": {}}}


def build_crawl_job() -> JobDefinition:
    """The crawl job: a step per program in dependency order, one process for the run (the steps
    share the warm pool; the work is in the pool's processes, subprocesses or pods)."""
    steps = [_step(program, i == 0) for i, program in enumerate(STEPS)]

    @job(name=CRAWL_JOB, config=_crawl_config, executor_def=in_process_executor, logger_defs={"console": console},
         description="A whole crawl, one run: a step per program, each running its stale partitions side by "
                     "side and recording every partition as it finishes. Config: the crawl's name (registered "
                     "in the data root by curate run / curate submit) and force.")
    def _job() -> None:
        after = None
        for program, step in zip(STEPS, steps, strict=True):
            node = step.alias(program)
            after = node() if after is None else node(after)

    return _job


CRAWL_JOB_DEF = build_crawl_job()


def materialize_partition(context: AssetExecutionContext, curation: CurationResource, program: str, crawl: str,
                          source: str | None) -> MaterializeResult:
    """An asset step (one partition launched from the UI, a backfill's, the automation's): the
    partition on the resource's launcher, recorded by the recorder. Its checks are its check steps."""
    spec = curation.spec(crawl)
    launcher: Launcher
    if curation.mode == "in_process":
        done = finish(curation, curation.store(), spec, program, source, curation.execution(), False,
                      emit=context.log.info, checks=False)
    else:
        launcher = Fanout(context, curation, spec, checks=False)
        ((done,),) = launcher.run(program, [source])
    received = time.perf_counter()
    if done.outcome is None:
        raise Failure(told(partition_name(program, spec.crawl, source), str(done.error)))
    context.log.info(f"{partition_name(program, spec.crawl, source)} "
                     f"{'up to date' if done.outcome.skipped else 'materialized'} at "
                     f"{done.outcome.manifest.params_key} in {done.outcome.seconds:.2f}s")
    return recorder.materialize_result(done, received)
