"""Drive one crawl through the asset graph on a real Dagster instance, with a progress display.

``curate run`` plans the crawl first: a partition is stale when its committed output is not up to
date (other parameters, other input data), when the instance has no materialization of it, or
when a partition it reads is stale. Then it makes one Dagster run of the stale partitions
(``curation_dagster.crawl_run``): a step per program in dependency order (``stages.catalog.waves``),
each running its stale partitions side by side on a pool of worker processes and recording every
partition as its own materialization and check evaluations as it finishes. A crawl that is up to
date makes no run. Switched-off stages (``--stages``) are steps of the run like the others: they
write empty outputs, so every partition stays materialized and checked.

The run's materializations carry no ``dagster/code_version`` and no input provenance tags (a
partial provenance would show every partition as having changed inputs), and the run logs no
planned materializations: while ``curate run`` runs, the UI shows a partition as materialized
when it is, not as in progress before.

A resource that runs partitions in a Pipes subprocess or a pod (``mode``) gets a run per wave (the
assets of one level whose inputs are materialized by then) and partition instead, each step the
asset's own, as the deployment's sensors launch them; a wave of switched-off stages there is
recorded without a run (``AssetMaterialization`` and ``AssetCheckEvaluation`` events).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    materialize,
)
from rich.markup import escape

from curation_dagster.assets import ASSETS
from curation_dagster.checks import (
    CHECKS,
    Judge,
    Verdict,
    blocking_failures,
    evaluator,
    record_checks,
    report_stale_dependents,
)
from curation_dagster.crawl_run import (
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    KINDS,
    Done,
    PartitionPool,
    crawl_job,
    partition_label,
)
from curation_dagster.instance import add_partitions, open_instance
from curation_dagster.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.resources import CurationResource
from stages.catalog import PROGRAMS, waves
from stages.execute import Outcome, execute, metadata
from stages.plan import data_version, plan_task
from stages.reports import RemovalLedgerReport, Report, SourceCounts, read, read_as
from stages.spec import CrawlSpec
from stages.store import Manifest

# CRITICAL: a failed step is reported once, as RunFailed's one line, not as Dagster's ERROR
# log with a stack trace on stderr (the instance's event log still records it for the UI).
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class RunFailed(RuntimeError):
    """A Dagster run of the crawl failed; the message is the step's error, on one line."""


def _up_to_date(instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec,
                program: str, source: str | None, recorded: dict[str, set[str]]) -> bool:
    """The partition's committed output is current and the instance recorded its materialization
    (``recorded``: each program's materialized partitions, one query per program and crawl run)."""
    store = resource.store()
    try:
        task = plan_task(store, spec, program, source)
        if store.current_manifest(task.output_dir, data_version(store, task)) is None:
            return False
    except FileNotFoundError:
        return False
    if program not in recorded:
        recorded[program] = instance.get_materialized_partitions(AssetKey(program))
    return str(partition_key(spec.crawl, source)) in recorded[program]


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


def _step_seconds(result: Any) -> dict[str, float]:
    """Seconds each successful step of a run took, by step key (= asset name)."""
    return {e.step_key: e.event_specific_data.duration_ms / 1000 for e in result.all_events
            if e.event_type == DagsterEventType.STEP_SUCCESS and e.step_key}


def _cached(result: Any, program: str) -> bool:
    """The run's step for ``program`` found its output up to date (metadata ``cached``)."""
    for mat in result.asset_materializations_for_node(program):
        entry = mat.metadata.get("cached")
        if entry is not None and entry.value is True:
            return True
    return False


def run_crawl(
    workdir: Path, home: Path, spec: CrawlSpec, *, quiet: bool = False, force: bool = False,
    resource: CurationResource | None = None,
) -> RemovalLedgerReport:
    """Register ``spec`` in the resource's data root, materialize every partition of its crawl
    and return the report of its ledger. ``force``: recompute every partition, up to date or not."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    resource = resource or CurationResource(workdir=str(workdir))
    resource.dataroot().register(spec)
    instance = open_instance(home)  # created once, whatever runs at the same time
    add_partitions(instance, {CRAWL: [spec.crawl], SOURCE: sorted(spec.sources)})
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), disable=quiet, transient=False,
    ) as progress:
        bar = progress.add_task(f"crawl {spec.crawl}", total=sum(len(spec.partitions(p)) for p in PROGRAMS))
        if resource.mode == "in_process":
            _run_in_process(instance, resource, spec, force, progress, bar)
        else:
            _run_per_partition(instance, resource, spec, force, progress, bar)
    # Later crawls deduplicated against this crawl's old outputs: their check fails in the UI now.
    report_stale_dependents(instance, resource, spec.crawl)
    return read_as(_manifest(resource, spec, "removal_ledger", None), RemovalLedgerReport)


def _run_in_process(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, force: bool, progress: Any, bar: Any,
) -> None:
    """One Dagster run of the crawl's stale partitions (``curation_dagster.crawl_run``), none when
    all are up to date; then the blocking check that stopped the plan, if one did."""
    todo, blocked = _plan(instance, resource, spec, force, progress, bar)
    work = [(p, todo[p]) for wave in waves() for p in wave if p in todo]
    if work:  # (the removal ledger reads every stage: stale whenever anything is)
        with PartitionPool(resource, spec, force) as pool:
            _crawl_run(instance, resource, spec, work, pool, progress, bar)
    if blocked:
        raise RunFailed(blocked)


def _plan(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, force: bool, progress: Any, bar: Any,
) -> tuple[dict[str, list[str | None]], str | None]:
    """The stale partitions of the crawl, by program: a partition is stale when ``force``d, when
    one it reads is stale (its step finds it up to date if the new input is the same), or when its
    output or its recorded materialization is not current. The up-to-date ones are reported, and
    one whose blocking check fails stops the plan before its wave (the error, returned)."""
    stale: set[tuple[str, str | None]] = set()
    todo: dict[str, list[str | None]] = {}
    recorded: dict[str, set[str]] = {}
    judge = evaluator(resource, spec.crawl)  # the bounds and the crawl's record, read once
    for wave in waves():
        this: dict[str, list[str | None]] = {}
        for source in spec.partitions(wave[0]):
            for program in wave:
                if force or any(u in stale for u in spec.upstream(program, source)) \
                        or not _up_to_date(instance, resource, spec, program, source, recorded):
                    stale.add((program, source))
                    this.setdefault(program, []).append(source)
                    continue
                held = _held_back(resource, spec, program, source, progress, bar, judge)
                if held:
                    return todo, held
        todo.update(this)
    return todo, None


def _run_per_partition(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, force: bool, progress: Any, bar: Any,
) -> None:
    """A run per wave and partition, each step its asset's own (a Pipes subprocess or a pod)."""
    recorded: dict[str, set[str]] = {}
    for wave in waves():
        for source in spec.partitions(wave[0]):
            todo = _stale(instance, resource, spec, wave, source, force, recorded, progress, bar)
            if not todo:
                continue
            if switched_off(spec, todo, source):
                # A wave of switched-off stages only writes empty outputs: recorded without a run.
                for program in todo:
                    outcome = _record_without_run(instance, resource, spec, program, source)
                    _print(progress, spec, Done(program, source, outcome), "(stage off: no run)")
                    progress.advance(bar)
                continue
            _partition_run(instance, resource, spec, todo, source, progress, bar)


def _stale(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, wave: list[str], source: str | None,
    force: bool, recorded: dict[str, set[str]], progress: Any, bar: Any,
) -> list[str]:
    """The programs of ``wave`` to run for ``source``; the up-to-date ones before them are
    reported (and their blocking checks still hold the crawl back)."""
    todo: list[str] = []
    for program in wave:
        # Only a prefix of the wave is skipped: a program after a stale one may read its new
        # output, so it is judged by its step, after the stale one has run.
        if todo or force or not _up_to_date(instance, resource, spec, program, source, recorded):
            todo.append(program)
            continue
        held = _held_back(resource, spec, program, source, progress, bar)
        if held:
            raise RunFailed(held)
    return todo


def _held_back(
    resource: CurationResource, spec: CrawlSpec, program: str, source: str | None, progress: Any, bar: Any,
    judge: Judge | None = None,
) -> str | None:
    """An up-to-date partition is not rerun, but its blocking checks still hold the crawl back
    until their bound is raised or the stage fixed: the first failure's message, else None (and
    the partition is reported up to date)."""
    for check, verdict in blocking_failures(resource, program, spec.crawl, source, judge):
        return f"{partition_label(spec, program, source)}: check {check} failed: {verdict.description}"
    progress.console.print(f"  = {_label(spec, program, source)} up to date")
    progress.advance(bar)
    return None


def _crawl_run(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec,
    work: list[tuple[str, list[str | None]]], pool: PartitionPool, progress: Any, bar: Any,
) -> None:
    """The crawl's one Dagster run: a step per program of ``work``, each on its stale partitions."""
    order = [p for p, _ in work]
    blocked: list[tuple[int, int, str]] = []  # (program's place, source's place, message)
    sources = spec.partitions("raw_documents")

    def on_done(done: Done) -> None:
        if done.outcome is None:
            progress.console.print(f"  ! {_label(spec, done.program, done.source)} failed: {escape(str(done.error))}")
        else:
            for check, verdict in done.verdicts:
                if verdict.passed:
                    continue
                _print_check(progress, spec, done.program, done.source, check, verdict)
                if verdict.severity == "ERROR" and KINDS[check].blocking:
                    place = sources.index(done.source) if done.source in sources else -1
                    blocked.append((order.index(done.program), place,
                                    f"{partition_label(spec, done.program, done.source)}: check {check} failed: "
                                    f"{verdict.description}"))
            _print(progress, spec, done)
        progress.advance(bar)

    result = crawl_job(work, pool, on_done).execute_in_process(
        instance=instance, raise_on_error=False, run_config=QUIET_LOGS, tags={"curate/crawl": spec.crawl},
    )
    if blocked:
        raise RunFailed(min(blocked)[2])
    if not result.success:
        _, msg = _failure(result)
        raise RunFailed(msg)


def _partition_run(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, todo: list[str], source: str | None,
    progress: Any, bar: Any,
) -> None:
    """One Dagster run of the assets ``todo`` for one partition, each step its asset's own."""
    t0 = time.perf_counter()
    result = materialize(
        [*ASSETS, *CHECKS], selection=todo, partition_key=partition_key(spec.crawl, source),
        instance=instance, resources={"curation": resource}, raise_on_error=False,
        run_config=QUIET_LOGS, tags={"curate/crawl": spec.crawl},
    )
    failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
    for failed in failed_checks:
        if failed.severity == AssetCheckSeverity.ERROR and failed.blocking:
            raise RunFailed(f"{partition_label(spec, failed.asset_key.to_user_string(), source)}: "
                            f"check {failed.check_name} failed: {failed.description}")
    if not result.success:
        step, msg = _failure(result)
        name = partition_label(spec, step, source) if step else \
            ", ".join(partition_label(spec, p, source) for p in todo)
        raise RunFailed(msg if msg.startswith(name) else f"{name}: {msg}")
    seconds = _step_seconds(result)
    for program in todo:
        for failed in failed_checks:
            if failed.asset_key.to_user_string() == program:
                progress.console.print(f"  ! {_label(spec, program, source)} check {failed.check_name} "
                                       f"({failed.severity.value}): {escape(failed.description or '')}")
        if _cached(result, program):
            progress.console.print(f"  = {_label(spec, program, source)} up to date")
        else:
            report = read(_manifest(resource, spec, program, source))
            took = seconds.get(program, time.perf_counter() - t0)
            progress.console.print(f"  + {_label(spec, program, source)} {_summary(report)} ({took:.1f}s)")
        progress.advance(bar)


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
    return escape(partition_label(spec, program, source))


def switched_off(spec: CrawlSpec, programs: list[str], source: str | None) -> bool:
    """Whether every one of ``programs`` belongs to a stage this crawl switched off (their
    partitions are recorded without a run); programs of no stage are always on."""
    return not any(getattr(spec.program_params(p, source), "enabled", True) for p in programs)


def _record_without_run(
    instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec, program: str, source: str | None,
) -> Outcome:
    """Write a switched-off program's (empty) output in this process and record its
    materialization and check evaluations on ``instance`` without a run: it stays one visible,
    checked partition in the UI, at the cost of a few events instead of a run."""
    from dagster import AssetMaterialization

    t0 = time.perf_counter()
    outcome = execute(resource.store(), spec, program, source, resource.execution())
    key = str(partition_key(spec.crawl, source))
    meta = metadata(outcome)
    if "wall_s" in meta:  # the profile's overhead: this process's time outside the program, to here
        meta["overhead_s"] = round(max(time.perf_counter() - t0 - float(meta["wall_s"]), 0.0), 4)
    instance.report_runless_asset_event(AssetMaterialization(
        asset_key=program, partition=key, metadata=meta, tags={DATA_VERSION_TAG: outcome.manifest.data_version,
                                                                 DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
    ))
    for check, verdict in record_checks(instance, resource, program, spec.crawl, source, key):
        raise RunFailed(f"{partition_label(spec, program, source)}: check {check} failed: {verdict.description}")
    return outcome


def _manifest(resource: CurationResource, spec: CrawlSpec, program: str, source: str | None) -> Manifest:
    store = resource.store()
    manifest = store.read_manifest(plan_task(store, spec, program, source).output_dir)
    assert manifest is not None
    return manifest


def _summary(report: Report) -> str:
    """The headline counts a report has, e.g. ``input=20 kept=14 removed=6``."""
    counts = report.metadata()
    parts = [f"{key}={counts[key]}" for key in ("input", "embedded", "documents", "quarantined", "kept", "removed")
             if key in counts]
    if isinstance(report, SourceCounts) and report.removed_per_stage:
        parts.append("(" + ",".join(f"{k}:{v}" for k, v in report.removed_per_stage.items()) + ")")
    return " ".join(parts)
