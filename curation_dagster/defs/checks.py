"""The asset checks: ``stages.checks``' verdicts as Dagster asset checks, one per program and
check kind that applies to it (``CHECK_KINDS``), partitioned like the asset. The checks' bounds
come from ``<workdir>/curate.yaml`` (``checks:``), read at every evaluation; specs from the data
root's crawl registry (``stages.dataroot``). A check step refuses a pair ``(crawl, source)`` whose
source is not part of the crawl, or a partition of a program whose stage the crawl switched off, as
the asset does (``partitions.refuse_outside``), recording nothing;
judged directly (``evaluate``), such a pair passes with ``in_crawl: false``. A failed
``over_deletion`` carries what the stopped stage would remove (``curation_dagster.tools.pending``),
as metadata.
"""

import warnings

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetKey,
    DagsterInstance,
    PreviewWarning,
    asset_check,
)

from curation_dagster.defs.partitions import CRAWL, partitions_for, refuse_outside, split_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.run.judge import Judge, evaluator
from curation_dagster.run.recorder import AssetCheckEvaluationTargetMaterializationData, check_result, recorded
from curation_dagster.run.recorder import evaluation as recorded_evaluation
from stages.catalog import PROGRAMS, Program
from stages.checks import CHECK_KINDS, CheckKind, Verdict


def evaluate(curation: CurationResource, kind: CheckKind, program: str, crawl: str, source: str | None) -> Verdict:
    """One check on one partition, with the workdir's current bounds."""
    return evaluator(curation, crawl)(kind, program, source)


def build_check(program: Program, kind: CheckKind) -> AssetChecksDefinition:
    def _check(context: AssetCheckExecutionContext, curation: CurationResource) -> AssetCheckResult:
        crawl, source = split_key(context.partition_key, program.level)
        refuse_outside(crawl, source, curation.spec(crawl), program.name)
        return check_result(evaluate(curation, kind, program.name, crawl, source))

    with warnings.catch_warnings():  # partitioned checks are "preview" in dagster 1.13 (pinned)
        warnings.simplefilter("ignore", PreviewWarning)
        return asset_check(
            asset=AssetKey(program.name),
            name=kind.name,
            description=kind.description,
            blocking=kind.blocking,
            partitions_def=partitions_for(program.level),
        )(_check)


def build_checks() -> list[AssetChecksDefinition]:
    return [build_check(p, kind) for p in PROGRAMS.values() for kind in CHECK_KINDS if kind.applies(p)]


CHECKS: list[AssetChecksDefinition] = build_checks()


def blocking_failures(
    curation: CurationResource, program: str, crawl: str, source: str | None, judge: Judge | None = None,
) -> list[tuple[str, Verdict]]:
    """The blocking checks of one partition that fail now (evaluated directly, no Dagster run;
    ``judge``: an ``evaluator`` of the crawl that many partitions share)."""
    judge = judge or evaluator(curation, crawl)
    out = []
    for kind in CHECK_KINDS:
        if kind.blocking and kind.applies(PROGRAMS[program]):
            verdict = judge(kind, program, source)
            if not verdict.passed and verdict.severity == "ERROR":
                out.append((kind.name, verdict))
    return out


def record_runless_check(
    instance: DagsterInstance, program: str, kind: CheckKind, verdict: Verdict, partition: str
) -> None:
    """Record one check evaluation of a partition on ``instance`` without a run.

    Dagster 1.13 indexes a partitioned check's runless evaluations by (asset, check, run id "",
    partition) with a unique constraint, so a second runless evaluation of the same partition is
    stored in the event log but cannot replace the first in the index (IntegrityError). The first
    stays the partition's shown evaluation then; callers act on ``verdict`` itself, never on the
    index, so a blocking failure still stops ``curate run``.
    """
    from sqlalchemy.exc import IntegrityError  # a dagster dependency, used by its storages

    try:
        # It judged the partition's latest materialization: the UI's check state counts it only so.
        instance.report_runless_asset_event(evaluation(program, kind, verdict, partition, recorded(
            instance, program, partition)))
    except IntegrityError:
        pass


def evaluation(program: str, kind: CheckKind, verdict: Verdict, partition: str,
               target: AssetCheckEvaluationTargetMaterializationData | None = None) -> AssetCheckEvaluation:
    """One check's evaluation of a partition (``curation_dagster.run.recorder.evaluation``)."""
    return recorded_evaluation(program, kind.name, kind.blocking, verdict, partition, target)


def record_stale_dependents(instance: DagsterInstance, curation: CurationResource, crawl: str) -> list[str]:
    """After ``crawl`` was rerun with new parameters: the later crawls deduplicated against its
    old outputs, whose ``prior_crawls_current`` evaluations (failed) are recorded on ``instance``
    without a run, so the UI and the automation hold them back before anyone reruns them (on the
    programs they run: a switched-off one has no partition, which no run would judge again)."""
    kind = next(k for k in CHECK_KINDS if k.name == "prior_crawls_current")
    later = curation.dataroot().stale_dependents(crawl)
    for name in later:
        if not instance.has_dynamic_partition(CRAWL, name):  # a crawl this instance never ran
            continue
        spec = curation.spec(name)
        for program in (p.name for p in PROGRAMS.values() if kind.applies(p) and not spec.switched_off(p.name)):
            record_runless_check(instance, program, kind, evaluate(curation, kind, program, name, None), name)
    return later
