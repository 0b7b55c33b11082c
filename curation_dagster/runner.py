"""Drive one crawl through the asset graph on a real Dagster instance, with a progress display.

Per-source and crawl-level assets have different partitions, so a crawl is materialized as a
sequence of Dagster runs in dependency order: one per (asset, partition). Each shows in the UI
like a run launched there. A partition whose committed output is already up to date (same
parameters, same input data) and whose materialization the instance has recorded is skipped
without launching a run.
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
from curation_dagster.checks import CHECKS, blocking_failures
from curation_dagster.instance import ensure_instance_config
from curation_dagster.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.resources import CurationResource, save_spec
from stages.registry import PROGRAMS, CrawlSpec, data_version, plan_task

# CRITICAL: a failed step is reported once, as RunFailed's one line, not as Dagster's ERROR
# log with a stack trace on stderr (the instance's event log still records it for the UI).
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class RunFailed(RuntimeError):
    """A Dagster run of the crawl failed; the message is the step's error, on one line."""


def plan(spec: CrawlSpec) -> list[tuple[str, str | None]]:
    """(program, source) partitions of a crawl in dependency order."""
    return [(name, source) for name in PROGRAMS for source in spec.partitions(name)]


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


def _failure(result: Any) -> str:
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_FAILURE:
            err = event.event_specific_data.error
            cause = err.cause if err.cause is not None and "Failure" not in err.cls_name else None
            info = cause or err
            msg = info.message.strip().splitlines()
            if not msg:
                return info.cls_name
            # The message is "module.ClassName: text"; the text alone reads as one line.
            head, sep, rest = msg[-1].partition(": ")
            return rest if sep and head.split(".")[-1] == info.cls_name else msg[-1]
    return "run failed"


def run_crawl(
    workdir: Path, home: Path, spec: CrawlSpec, *, quiet: bool = False, force: bool = False,
    resource: CurationResource | None = None,
) -> dict[str, Any]:
    """Materialize every partition of ``spec``'s crawl and return the report of its ledger."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    save_spec(workdir, spec)
    resource = resource or CurationResource(workdir=str(workdir))
    instance = DagsterInstance.from_config(str(ensure_instance_config(home)))
    instance.add_dynamic_partitions(CRAWL, [spec.crawl])
    instance.add_dynamic_partitions(SOURCE, sorted(spec.sources))
    steps = plan(spec)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), disable=quiet, transient=False,
    ) as progress:
        bar = progress.add_task(f"crawl {spec.crawl}", total=len(steps))
        for program, source in steps:
            name = f"{program}[{source}]" if source else f"{program}[{spec.crawl}]"
            label = escape(name)
            progress.update(bar, description=f"{label:<40}")
            if not force and _up_to_date(instance, resource, spec, program, source):
                # An up-to-date partition is not rerun, but its blocking checks still hold the
                # crawl back until their bound is raised or the stage fixed.
                for check, verdict in blocking_failures(resource, program, spec.crawl, source):
                    raise RunFailed(f"{name}: check {check} failed: {verdict.description}")
                progress.console.print(f"  = {label} up to date")
                progress.advance(bar)
                continue
            t0 = time.perf_counter()
            result = materialize(
                [*ASSETS, *CHECKS], selection=[program], partition_key=partition_key(spec.crawl, source),
                instance=instance, resources={"curation": resource}, raise_on_error=False,
                run_config=QUIET_LOGS, tags={"curate/crawl": spec.crawl},
            )
            failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
            for failed in failed_checks:
                if failed.severity == AssetCheckSeverity.ERROR and failed.blocking:
                    raise RunFailed(f"{name}: check {failed.check_name} failed: {failed.description}")
            if not result.success:
                msg = _failure(result)
                raise RunFailed(msg if msg.startswith(name) else f"{name}: {msg}")
            for failed in failed_checks:
                progress.console.print(f"  ! {label} check {failed.check_name} ({failed.severity.value}): "
                                       f"{escape(failed.description or '')}")
            report = _manifest_report(resource, spec, program, source)
            progress.console.print(f"  + {label} {_summary(report)} ({time.perf_counter() - t0:.1f}s)")
            progress.advance(bar)
    return _manifest_report(resource, spec, "removal_ledger", None)


def _manifest_report(resource: CurationResource, spec: CrawlSpec, program: str, source: str | None) -> dict[str, Any]:
    store = resource.store()
    manifest = store.read_manifest(plan_task(store, spec, program, source).output_dir)
    assert manifest is not None
    return manifest.report


def _summary(report: dict[str, Any]) -> str:
    parts = []
    for key in ("input", "documents", "quarantined", "kept", "removed"):
        value = report.get(key)
        if isinstance(value, int):
            parts.append(f"{key}={value}")
        elif isinstance(value, dict) and value:
            parts.append(f"{key}=" + ",".join(f"{k}:{v}" for k, v in value.items()))
    return " ".join(parts)
