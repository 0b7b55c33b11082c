"""Drive one crawl through the asset graph on a real Dagster instance, with a progress display.

Per-source and crawl-level assets have different partitions, so a crawl is materialized as a
sequence of Dagster runs in dependency order: one per wave (``stages.catalog.waves``: the assets
of one level, per source or per crawl, whose inputs are materialized by then; the recrawl sensor's
first runs are the first wave) and partition. Each run shows in the UI like a run launched there,
with one step per asset. A partition whose committed output is already up to date (same
parameters, same input data) and whose materialization the instance has recorded is skipped
without a run; an up-to-date asset after a stale one of its wave goes into the run, where its
step finds the output up to date and records it without recomputing.

Why waves: a Dagster run costs ~0.4 s of its own (events written to the SQLite instance), which a
small crawl paid 6 x sources + 8 times with one run per asset partition; with waves it is
4 x (sources + 1). A wave whose programs all belong to switched-off stages (``--stages``) only
writes empty outputs: ``curate run`` writes them itself and records their materializations and
check evaluations on the instance without a run (``AssetMaterialization`` and
``AssetCheckEvaluation`` events, visible in the UI like any other), so a fuzzy-only crawl of N
sources makes 3 x N + 2 runs, not 5 x N + 5.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    materialize,
)

from curation_dagster.assets import ASSETS
from curation_dagster.checks import CHECKS, blocking_failures, record_checks, report_stale_dependents
from curation_dagster.instance import ensure_instance_config
from curation_dagster.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.resources import CurationResource
from stages.catalog import waves
from stages.execute import Outcome, execute, metadata
from stages.plan import data_version, plan_task
from stages.reports import RemovalLedgerReport, Report, SourceCounts, read, read_as
from stages.spec import CrawlSpec
from stages.store import Manifest

# CRITICAL: a failed step is reported once, as RunFailed's one line, not as Dagster's ERROR
# log with a stack trace on stderr (the instance's event log still records it for the UI).
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


# The materialization tag Dagster reads an asset partition's data version from: what it writes for
# a step's MaterializeResult(data_version=...), and what a runless materialization must carry
# (no public name in 1.13; tests/curation_dagster/test_runner.py checks both kinds carry it).
DATA_VERSION_TAG = "dagster/data_version"


class RunFailed(RuntimeError):
    """A Dagster run of the crawl failed; the message is the step's error, on one line."""


def plan(spec: CrawlSpec) -> list[tuple[list[str], str | None]]:
    """(programs, source) runs of a crawl in dependency order: each wave, once per partition."""
    return [(wave, source) for wave in waves() for source in spec.partitions(wave[0])]


def _up_to_date(instance: DagsterInstance, resource: CurationResource, spec: CrawlSpec,
                program: str, source: str | None) -> bool:
    store = resource.store()
    try:
        task = plan_task(store, spec, program, source)
        manifest = store.read_manifest(task.output_dir)
        if manifest is None or manifest.data_version != data_version(store, task):
            return False
    except FileNotFoundError:
        return False
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(program), asset_partitions=[str(partition_key(spec.crawl, source))]),
        limit=1,
    ).records
    return bool(records)


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
    and return the report of its ledger."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    resource = resource or CurationResource(workdir=str(workdir))
    resource.dataroot().register(spec)
    instance = DagsterInstance.from_config(str(ensure_instance_config(home)))
    instance.add_dynamic_partitions(CRAWL, [spec.crawl])
    instance.add_dynamic_partitions(SOURCE, sorted(spec.sources))
    steps = plan(spec)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), disable=quiet, transient=False,
    ) as progress:
        bar = progress.add_task(f"crawl {spec.crawl}", total=sum(len(wave) for wave, _ in steps))
        for wave, source in steps:
            todo: list[str] = []
            for program in wave:
                name = _name(spec, program, source)
                label = escape(name)
                progress.update(bar, description=f"{label:<40}")
                # Only a prefix of the wave is skipped: a program after a stale one may read its
                # new output, so it is judged by its step, after the stale one has run.
                if todo or force or not _up_to_date(instance, resource, spec, program, source):
                    todo.append(program)
                    continue
                # An up-to-date partition is not rerun, but its blocking checks still hold the
                # crawl back until their bound is raised or the stage fixed.
                for check, verdict in blocking_failures(resource, program, spec.crawl, source):
                    raise RunFailed(f"{name}: check {check} failed: {verdict.description}")
                progress.console.print(f"  = {label} up to date")
                progress.advance(bar)
            if not todo:
                continue
            if switched_off(spec, todo, source):
                # A wave of switched-off stages only writes empty outputs: recorded without a run.
                for program in todo:
                    label = escape(_name(spec, program, source))
                    outcome = _record_without_run(instance, resource, spec, program, source)
                    progress.console.print(f"  + {label} {_summary(read(outcome.manifest))} (stage off: no run)")
                    progress.advance(bar)
                continue
            t0 = time.perf_counter()
            result = materialize(
                [*ASSETS, *CHECKS], selection=todo, partition_key=partition_key(spec.crawl, source),
                instance=instance, resources={"curation": resource}, raise_on_error=False,
                run_config=QUIET_LOGS, tags={"curate/crawl": spec.crawl},
            )
            failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
            for failed in failed_checks:
                if failed.severity == AssetCheckSeverity.ERROR and failed.blocking:
                    raise RunFailed(f"{_name(spec, failed.asset_key.to_user_string(), source)}: "
                                    f"check {failed.check_name} failed: {failed.description}")
            if not result.success:
                step, msg = _failure(result)
                name = _name(spec, step, source) if step else ", ".join(_name(spec, p, source) for p in todo)
                raise RunFailed(msg if msg.startswith(name) else f"{name}: {msg}")
            seconds = _step_seconds(result)
            for program in todo:
                label = escape(_name(spec, program, source))
                for failed in failed_checks:
                    if failed.asset_key.to_user_string() == program:
                        progress.console.print(f"  ! {label} check {failed.check_name} ({failed.severity.value}): "
                                               f"{escape(failed.description or '')}")
                if _cached(result, program):
                    progress.console.print(f"  = {label} up to date")
                else:
                    report = read(_manifest(resource, spec, program, source))
                    took = seconds.get(program, time.perf_counter() - t0)
                    progress.console.print(f"  + {label} {_summary(report)} ({took:.1f}s)")
                progress.advance(bar)
    # Later crawls deduplicated against this crawl's old outputs: their check fails in the UI now.
    report_stale_dependents(instance, resource, spec.crawl)
    return read_as(_manifest(resource, spec, "removal_ledger", None), RemovalLedgerReport)


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
        asset_key=program, partition=key, metadata=meta, tags={DATA_VERSION_TAG: outcome.manifest.data_version},
    ))
    for check, verdict in record_checks(instance, resource, program, spec.crawl, source, key):
        raise RunFailed(f"{_name(spec, program, source)}: check {check} failed: {verdict.description}")
    return outcome


def _name(spec: CrawlSpec, program: str, source: str | None) -> str:
    """``program[source]``, or ``program[crawl]`` for a crawl-level partition."""
    return f"{program}[{source}]" if source else f"{program}[{spec.crawl}]"


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
