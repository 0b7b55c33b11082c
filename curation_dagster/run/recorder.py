"""The recorder: the only code that turns a finished partition into Dagster events.

A partition's end (``Done``: its outcome, its materialization metadata, its check verdicts and the
seconds it spent outside its program) becomes an ``AssetMaterialization`` with our data version in
the tags Dagster reads it from, and one ``AssetCheckEvaluation`` per check; an asset step (one
partition launched from the UI, or a backfill's) gets the same metadata and data version as a
``MaterializeResult``, and an asset check step its verdict as an ``AssetCheckResult``. Whichever
launcher ran the partition (the warm pool, a Pipes subprocess, a pod) and whichever step records
it, the events are built here, ``overhead_s`` included; ``recorded_overhead`` reads that figure
back from an instance (``curate profile``). A current partition, not rerun, gets a new evaluation
only where its check's verdict now differs from the one the instance last recorded (``rejudged``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DataVersion,
    EventRecordsFilter,
    MaterializeResult,
    MetadataValue,
)

# What an evaluation judged, as Dagster's check state reads it (no public name in 1.13, pinned;
# tests/curation_dagster/defs/test_checks.py reads the check state it makes).
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from curation_dagster.defs.partitions import partition_key
from curation_dagster.ops.event_log import latest_target, target_of
from curation_dagster.run.done import TIMINGS, Done
from stages.checks import Verdict

# The materialization tags Dagster reads an asset partition's data version from: what it writes
# for a step's MaterializeResult(data_version=...) (no public names in 1.13;
# tests/curation_dagster/run/test_in_process.py checks both kinds of materialization carry them).
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_IS_USER_PROVIDED_TAG = "dagster/data_version_is_user_provided"


def overhead_s(done: Done, received: float) -> float | None:
    """The profile's overhead of a partition: its time outside the program up to now (``received``:
    ``time.perf_counter()`` when the recorder got it). None for a partition with no timing."""
    if "wall_s" not in done.meta:
        return None
    return round(done.busy + time.perf_counter() - received, 4)


def _table(values: dict[str, Any], left: str) -> MetadataValue:
    """A flat mapping as a two-column Markdown table (not a JSON string)."""
    lines = [f"| {left} | value |", "|---|---|"]
    lines += [f"| `{k}` | {v if not isinstance(v, (dict, list)) else f'`{v}`'} |" for k, v in values.items()]
    return MetadataValue.md("\n".join(lines))


def present(meta: dict[str, Any]) -> dict[str, Any]:
    """A partition's metadata as the UI shows it: counts first, then the parameters (a table of
    their values, or the plain fact that the program takes none) and the rows of each table
    (``rows/<table>``: numbers, each one series in the Plots tab, for a crawl partition; a source
    partition's are in its ``counts`` table, ``curation_dagster.run.metadata.per_source_counts``),
    the timings last."""
    # A mapping of counts (quarantine_reasons, removed_per_reason, ...) is a table, not JSON; the
    # report stays whole, as JSON, for tools that read it back.
    out = {k: _table(v, k) if isinstance(v, dict) and k != "report" else v
           for k, v in meta.items() if k not in TIMINGS and k not in ("params", "rows")}
    if "params" in meta:
        params = meta["params"]
        out["params"] = _table(params, "parameter") if params else \
            MetadataValue.text("none: the program takes no parameters")
    if isinstance(meta.get("rows"), dict):
        out.update({f"rows/{table}": int(n) for table, n in meta["rows"].items()})
    out.update({k: meta[k] for k in TIMINGS if k in meta})
    return out


def _metadata(done: Done, received: float) -> dict[str, Any]:
    meta = dict(done.meta)
    over = overhead_s(done, received)
    if over is not None:
        meta["overhead_s"] = over
    return present(meta)


def materialization(done: Done, partition: str, received: float) -> AssetMaterialization:
    """The partition's materialization, as a crawl step records it. No provenance tags (code
    version, input data versions): Dagster would take a partial provenance for changed inputs;
    the data version is ours (params and input versions)."""
    assert done.outcome is not None
    return AssetMaterialization(
        asset_key=done.program, partition=partition, metadata=_metadata(done, received),
        tags={DATA_VERSION_TAG: done.outcome.manifest.data_version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
    )


def materialize_result(done: Done, received: float) -> MaterializeResult:
    """The partition's materialization, as its own asset step returns it (same metadata, same data
    version; Dagster writes the tags)."""
    assert done.outcome is not None
    return MaterializeResult(metadata=_metadata(done, received),
                             data_version=DataVersion(done.outcome.manifest.data_version))


@contextmanager
def together(instance: DagsterInstance) -> Iterator[bool]:
    """The events this thread has the instance store meanwhile (a partition's materialization and
    check evaluations, yielded by its step: Dagster hands each to the storage before the step
    resumes; a step's planned materializations) stored as one batch at the end, in one
    transaction: one commit, and a partition recorded whole or not at all (a run worker killed
    between its events leaves none, and the retry records it once); a run's check evaluation
    with no target then targets the materialization of its partition stored by the same batch
    (``EventBatches.targeted``). Where the instance's event log is not one of ours
    (``curation_dagster.ops.event_log.EventBatches``), each as it comes. Yields whether it batches."""
    batch = getattr(instance.event_log_storage, "batch", None)
    if batch is None:
        yield False
        return
    with batch():
        yield True


def severity(verdict: Verdict) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if verdict.severity == "ERROR" else AssetCheckSeverity.WARN


def check_metadata(verdict: Verdict) -> dict[str, Any]:
    meta: dict[str, Any] = {"details": MetadataValue.md(verdict.description)}
    if verdict.table:
        meta["per_source"] = MetadataValue.md(verdict.table)
    for k, v in verdict.metadata.items():
        meta[k] = MetadataValue.json(v) if isinstance(v, (dict, list)) else v
    return meta


def evaluation(program: str, check: str, blocking: bool, verdict: Verdict, partition: str,
               target: AssetCheckEvaluationTargetMaterializationData | None = None) -> AssetCheckEvaluation:
    """One check's evaluation of a partition, as a crawl step (or a runless report) records it;
    ``target``: the materialization it judged."""
    return AssetCheckEvaluation(
        asset_key=AssetKey(program), check_name=check, passed=verdict.passed, severity=severity(verdict),
        description=verdict.description, metadata=check_metadata(verdict), blocking=blocking, partition=partition,
        target_materialization_data=target,
    )


def evaluations(done: Done, partition: str, target: AssetCheckEvaluationTargetMaterializationData | None
                ) -> list[AssetCheckEvaluation]:
    """Every check evaluation of a finished partition; ``target``: its materialization, which they
    judged (``recorded``)."""
    return [evaluation(done.program, name, blocking, v, partition, target) for name, blocking, v in done.verdicts]


def recorded(instance: DagsterInstance, program: str, partition: str, run_id: str | None = None
             ) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The partition's latest materialization, as the evaluations that judged it target it (as
    Dagster's own check steps do): the check state the UI's partition statuses and the
    automation's ``check_failed`` read counts an evaluation only for the materialization whose
    storage id it names. ``run_id``: the run that just stored it; None where the instance's latest
    is not that run's (not stored yet), or where there is none."""
    target: AssetCheckEvaluationTargetMaterializationData | None = latest_target(instance, AssetKey(program), partition)
    return None if target is None or (run_id is not None and target.run_id != run_id) else target


def _failures(instance: DagsterInstance, storage_ids: list[int]) -> dict[int, str]:
    """What the UI shows of each of these stored failed evaluations (its severity), by storage id."""
    records = instance.get_event_records(
        EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION, storage_ids=storage_ids), limit=len(storage_ids))
    return {r.storage_id: r.event_log_entry.dagster_event.event_specific_data.severity.value  # type: ignore[union-attr]
            for r in records}


def rejudged(instance: DagsterInstance, program: str, judged: list[tuple[str, str, bool, Verdict]]
             ) -> list[AssetCheckEvaluation]:
    """The evaluations to record of current partitions judged again (``judged``: partition key,
    check, blocking, verdict): where the verdict (passed; else its severity) differs from the one
    the instance last recorded for the partition's latest materialization, or none was (the UI
    shows a verdict only for that one); an unchanged verdict is not stored again.
    Each targets the partition's latest materialization, which it judged: the check state the UI
    and the automation read counts a verdict only for the materialization it targets. A few
    queries per check, however many partitions."""
    asset = AssetKey(program)
    by_check: dict[str, list[tuple[str, bool, Verdict]]] = {}
    for key, check, blocking, verdict in judged:
        by_check.setdefault(check, []).append((key, blocking, verdict))
    changed: list[tuple[str, str, bool, Verdict, int]] = []  # ..., the partition's materialization
    for check, items in by_check.items():
        infos = {info.partition_key: info for info in instance.event_log_storage.get_asset_check_partition_info(
            [AssetCheckKey(asset, check)], partition_keys=[key for key, _, _ in items])}
        failed = [i.latest_check_event_storage_id for i in infos.values()
                  if i.latest_execution_status.value == "FAILED"]
        failures = _failures(instance, failed) if failed else {}
        unrecorded = {key for key, _, _ in items if key not in infos}
        materialized = instance.event_log_storage.get_latest_storage_id_by_partition(
            asset, DagsterEventType.ASSET_MATERIALIZATION, unrecorded) if unrecorded else {}
        for key, blocking, verdict in items:
            info = infos.get(key)
            recorded, target = None, materialized.get(key)  # never recorded, or planned but never evaluated
            if info is not None:
                target = info.latest_materialization_storage_id
                # A last verdict that judged an earlier materialization, or none (recorded before
                # evaluations targeted theirs), is not shown by the UI: as if never recorded.
                if info.is_current and info.latest_execution_status.value == "SUCCEEDED":
                    recorded = "passed"
                elif info.is_current and info.latest_execution_status.value == "FAILED":
                    recorded = failures.get(info.latest_check_event_storage_id)
            # what the UI shows: passed, or failed with its severity
            if target is not None and recorded != ("passed" if verdict.passed else severity(verdict).value):
                changed.append((key, check, blocking, verdict, target))
    if not changed:
        return []
    ids = sorted({storage_id for *_, storage_id in changed})
    found = instance.fetch_materializations(AssetRecordsFilter(asset_key=asset, storage_ids=ids), limit=len(ids))
    targets = {r.storage_id: target_of(r) for r in found.records}
    return [evaluation(program, check, blocking, verdict, key, targets.get(storage_id))
            for key, check, blocking, verdict, storage_id in changed]


def check_result(verdict: Verdict) -> AssetCheckResult:
    """A verdict as an asset check step returns it."""
    return AssetCheckResult(passed=verdict.passed, severity=severity(verdict), metadata=check_metadata(verdict),
                            description=verdict.description)


def recorded_overhead(instance: DagsterInstance) -> Callable[[str, str, str | None, str, float], float | None]:
    """``(program, crawl, source, data_version, wall_s) -> step_overhead(instance, ...)``, the
    per-run step starts cached across calls (``curation_dagster.tools.profile.Overhead``)."""
    cache: dict[str, dict[str, float]] = {}

    def overhead(program: str, crawl: str, source: str | None, data_version: str, wall_s: float) -> float | None:
        return step_overhead(instance, program, crawl, source, data_version, wall_s, cache)

    return overhead


def _step_starts(instance: DagsterInstance, run_id: str, cache: dict[str, dict[str, float]]) -> dict[str, float]:
    """Timestamp of each step's start in one run, by step key (cached per run)."""
    if run_id not in cache:
        cache[run_id] = {e.step_key: e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
                         if e.step_key}
    return cache[run_id]


def step_overhead(instance: DagsterInstance, program: str, crawl: str, source: str | None, data_version: str,
                  wall_s: float, cache: dict[str, dict[str, float]] | None = None) -> float | None:
    """The orchestration overhead of the partition's newest materialization of its data version
    that was not up to date already: the ``overhead_s`` it recorded (its time outside the program,
    up to the materialization), else the seconds between its step's start and it, minus the
    program's wall time; None when the event log has neither."""
    cache = {} if cache is None else cache
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(program), asset_partitions=[str(partition_key(crawl, source))]),
        limit=50,
    ).records
    for record in records:  # newest first
        mat = record.asset_materialization
        if mat is None:
            continue
        meta = mat.metadata
        version, cached = meta.get("data_version"), meta.get("cached")
        if version is None or version.value != data_version or (cached is not None and cached.value is True):
            continue
        # What the step, the wave run or ``curate run`` measured for it (the partition's own time
        # outside the program, up to its materialization); a wave run's step runs many partitions.
        recorded = meta.get("overhead_s")
        if recorded is not None and isinstance(recorded.value, float):
            return recorded.value
        if not record.run_id:
            return None
        start = _step_starts(instance, record.run_id, cache).get(record.event_log_entry.step_key or program)
        return None if start is None else max(record.timestamp - start - wall_s, 0.0)
    return None
