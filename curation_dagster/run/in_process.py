"""Drive one crawl through the asset graph on a real Dagster instance, with a progress display.

``curate run`` plans the crawl first (``curation_dagster.run.planner``): a crawl that is current makes
no run, unless a check's verdict on a current partition changed since it was recorded (a bound
moved), which the run's steps record. Otherwise it runs the code location's crawl job
(``curation_dagster.run.crawl_job``, the job ``curate submit`` launches on a deployment and the
Launchpad shows) in this process, on a warm
pool of worker processes that every step shares: one Dagster run, a step per program in
dependency order, each planning its own stale partitions as it starts and recording every
partition as its own materialization and check evaluations as it finishes. A switched-off
stage's (``--stages``) programs have no partition in the crawl: their steps run nothing and record
nothing, and the programs after them read without them.

A crawl's first run (or a forced one) has a head start: ``curate run`` starts the first
program's partitions on the pool before it imports Dagster and opens the instance
(``PartitionPool.ahead_of_run``, 1-1.5 s of its start; a one-source crawl's on one worker forked
from the command's process, where it has no other thread yet, and the later steps' partitions on
that worker too, down the chain), and the run's first step records them as they finish: what
they committed is not recorded yet, so the planner finds it stale. Where the run is never made
(the instance cannot be opened), what they committed is not recorded until the next run, whose
step finds it committed and unrecorded: it records it without computing it again.

The run's materializations carry no ``dagster/code_version`` and no input provenance tags (a
partial provenance would show every partition as having changed inputs); each step logs a planned
materialization of the partitions it is about to run, so the UI shows them in progress.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from dagster import DagsterEventType, DagsterInstance
from rich.markup import escape

from curation_dagster.defs.checks import record_stale_dependents
from curation_dagster.defs.partitions import CRAWL, SOURCE
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.instance import add_partitions, open_instance
from curation_dagster.ops.location import run_origin
from curation_dagster.run.crawl_job import CRAWL_JOB_DEF, CRAWL_TAG, attached
from curation_dagster.run.done import Done
from curation_dagster.run.planner import Planner
from curation_dagster.run.pool import PartitionPool
from stages.catalog import PROGRAMS, partition_name
from stages.checks import Verdict
from stages.dataroot import DataRoot
from stages.reports import RemovalLedgerReport, Report, SourceCounts, read, read_as
from stages.spec import CrawlSpec
from stages.store import Manifest


class RunFailed(RuntimeError):
    """A Dagster run of the crawl failed; the message is the step's error, on one line."""


def _failure(result: Any) -> tuple[str | None, str]:
    """The failed step's asset and its error on one line."""
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_FAILURE:
            err = event.event_specific_data.error
            cause = err.cause if err.cause is not None and "Failure" not in err.cls_name else None
            info = cause or err
            msg = info.message.strip().splitlines()
            if not msg:
                return event.step_key, info.cls_name
            # The message is "module.ClassName: text"; the text alone reads as one line.
            head, sep, rest = msg[-1].partition(": ")
            return event.step_key, rest if sep and head.split(".")[-1] == info.cls_name else msg[-1]
    return None, "run failed"


def run_crawl(
    workdir: Path, home: Path, spec: CrawlSpec, *, quiet: bool = False, force: bool = False,
    resource: CurationResource | None = None, pool: PartitionPool | None = None,
) -> RemovalLedgerReport:
    """Register ``spec`` in the resource's data root, materialize every partition of its crawl
    and return the report of its ledger. ``force``: recompute every partition, up to date or not.
    ``pool``: the run's pool, made for the resource's settings with partitions started ahead
    (``PartitionPool.ahead_of_run``; the caller closes it); else one is made for the run."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    resource = resource or CurationResource(workdir=str(workdir))
    if pool is not None and (pool.resource != resource.place() or pool.execution != resource.execution()
                             or pool.spec != spec or pool.force != force):
        raise RuntimeError(f"the run's pool was made for {pool.resource}, {pool.execution!r}, crawl "
                           f"{pool.spec.crawl} (force {pool.force}); the run is of {resource.place()}, "
                           f"{resource.execution()!r}, crawl {spec.crawl} (force {force})")
    resource.dataroot().register(spec)
    instance = open_instance(home)  # created once, whatever runs at the same time
    add_partitions(instance, {CRAWL: [spec.crawl], SOURCE: sorted(spec.sources)})
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), disable=quiet, transient=False,
    ) as progress:
        bar = progress.add_task(f"crawl {spec.crawl}", total=sum(len(spec.partitions(p)) for p in PROGRAMS))
        planner = Planner(instance, resource, spec, force)
        plans, blocked = planner.crawl()
        # A current partition whose check's verdict changed since the instance recorded it (a bound
        # moved) makes a run too, whose step records the new verdict (``Planner.rejudged``): the UI
        # shows what curate run acts on. Not a runless evaluation: Dagster 1.13 keeps one runless
        # evaluation per check and partition (a unique index), so a bound moved back would fail to
        # record and leave the old verdict shown.
        if any(plan.stale for plan in plans.values()) or \
                any(planner.rejudged(plan.program, plan.current) for plan in plans.values()):
            _crawl_run(instance, resource, spec, force, _Display(progress, bar, spec, quiet), pool)
        else:  # current, every verdict as recorded: no run, but a failed blocking check still holds the crawl back
            display = _Display(progress, bar, spec, quiet)
            for plan in plans.values():
                for source in plan.current:
                    display.current(plan.program, source)
            if blocked:
                raise RunFailed(blocked)
    # Later crawls deduplicated against this crawl's old outputs: their check fails in the UI now.
    record_stale_dependents(instance, resource, spec.crawl)
    return read_as(_manifest(resource, spec, "removal_ledger", None), RemovalLedgerReport)


class _Display:
    """What ``curate run`` prints of its run's partitions, as the steps tell it. ``quiet``: only
    what went wrong (a failed partition, a failed check), no line per partition."""

    def __init__(self, progress: Any, bar: Any, spec: CrawlSpec, quiet: bool = False) -> None:
        self.progress, self.bar, self.spec, self.quiet = progress, bar, spec, quiet

    def current(self, program: str, source: str | None) -> None:
        if not self.quiet:
            self.progress.console.print(f"  = {_label(self.spec, program, source)} up to date")
        self.progress.advance(self.bar)

    def finished(self, done: Done) -> None:
        if done.outcome is None:
            self.progress.console.print(f"  ! {_label(self.spec, done.program, done.source)} failed: "
                                        f"{escape(str(done.error))}")
        else:
            for check, _, verdict in done.verdicts:
                if not verdict.passed:
                    _print_check(self.progress, self.spec, done.program, done.source, check, verdict)
            if not self.quiet:
                _print(self.progress, self.spec, done)
        self.progress.advance(self.bar)


def _crawl_run(instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, force: bool,
               display: _Display, pool: PartitionPool | None = None) -> None:
    """The crawl's one Dagster run: the code location's crawl job, in this process, on one warm
    pool (``pool``, else one made now)."""
    with (nullcontext(pool) if pool is not None else PartitionPool(resource, spec, force, warm=True)) as pool, \
            attached(spec.crawl, display, pool), _from_code_location(instance, CRAWL_JOB_DEF.name):
        result = CRAWL_JOB_DEF.execute_in_process(
            run_config={"crawl": spec.crawl, "force": force}, instance=instance, raise_on_error=False,
            resources={"curation": resource}, tags={CRAWL_TAG: spec.crawl},
        )
    if not result.success:
        _, msg = _failure(result)
        raise RunFailed(msg)


@contextmanager
def _from_code_location(instance: DagsterInstance, job_name: str) -> Iterator[None]:
    """Runs this process creates on ``instance`` carry the embedded code location's origin of
    ``job_name`` (``curation_dagster.ops.location.run_origin``), as a run launched from the UI would:
    ``execute_in_process`` records none, and the UI then shows the run's job as not in the
    definitions, with re-execution off. Only this instance object, only for the block."""
    create = instance.create_run_for_job
    origin = run_origin(job_name)

    def with_origin(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("remote_job_origin", origin)
        return create(*args, **kwargs)

    instance.create_run_for_job = with_origin  # type: ignore[method-assign]
    try:
        yield
    finally:
        del instance.create_run_for_job  # the class's method again


def _print_check(progress: Any, spec: CrawlSpec, program: str, source: str | None, check: str,
                 verdict: Verdict) -> None:
    progress.console.print(f"  ! {_label(spec, program, source)} check {check} ({verdict.severity}): "
                           f"{escape(verdict.description or '')}")


def _print(progress: Any, spec: CrawlSpec, done: Done, note: str | None = None) -> None:
    """A partition's line: ``= name up to date`` or ``+ name counts (seconds)``."""
    assert done.outcome is not None
    label = _label(spec, done.program, done.source)
    if done.outcome.skipped and note is None:
        progress.console.print(f"  = {label} up to date")
        return
    tail = note or f"({done.outcome.seconds:.1f}s)"
    progress.console.print(f"  + {label} {_summary(read(done.outcome.manifest))} {tail}")


def _label(spec: CrawlSpec, program: str, source: str | None) -> str:
    return escape(partition_name(program, spec.crawl, source))


def _manifest(resource: CurationResource, spec: CrawlSpec, program: str, source: str | None) -> Manifest:
    """The partition's committed manifest, which the run just made or found current; one line if it
    is gone (deleted from outside meanwhile), not an assertion that ``python -O`` would drop."""
    manifest = DataRoot(resource.store()).manifest(spec, program, source)
    if manifest is None:
        raise RunFailed(f"{partition_name(program, spec.crawl, source)}: its committed output is gone "
                        "(deleted while the run finished?); run again to recompute it")
    return manifest


def _summary(report: Report) -> str:
    """The headline counts a report has, e.g. ``input=20 kept=14 removed=6``."""
    counts = report.metadata()
    parts = [f"{key}={counts[key]}" for key in ("input", "embedded", "documents", "quarantined", "kept", "removed")
             if key in counts]
    if isinstance(report, SourceCounts) and report.removed_per_stage:
        parts.append("(" + ",".join(f"{k}:{v}" for k, v in report.removed_per_stage.items()) + ")")
    return " ".join(parts)
