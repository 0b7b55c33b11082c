"""One asset per program, built from the registry: the asset only names its partition
and hands it to the ``curation`` resource; the work is in ``stages/programs/<name>.py``.

Everything the UI shows about an asset comes from its ``Program`` entry and its params class:
description, group, kinds (``cpu``/``gpu``), owners, tags, code version (the params version,
bumped whenever a program's output changes) and the resources one partition needs. Every asset
is materialized eagerly by declarative automation once its parents are and their blocking
checks passed, so a crawl registered by the recrawl sensor flows through the programs of its
stages (a switched-off stage's have no partition in it: refused like a source it does not have).

The source dimension is shared by every crawl, so source x crawl holds pairs that are no partition
of their crawl (a source only later crawls have). Dagster 1.13 cannot leave them out of a
``MultiPartitionsDefinition``, so the UI offers them; launched, such a pair fails at once, naming
the crawl's sources, and records nothing, and the automation (``automation``) neither requests
one nor waits on one.
"""

import inspect
from datetime import datetime

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AutomationCondition,
    AutomationContext,
    AutomationResult,
    MaterializeResult,
    MetadataValue,
    asset,
)

from curation_dagster.defs.partitions import by_crawl, partitions_for, refuse_outside, split_key
from curation_dagster.defs.resources import CurationResource
from stages.catalog import PROGRAMS, Program
from stages.spec import CrawlSpec

OWNERS = ["team:curation"]

# Eager: a partition is requested when it becomes missing (a new crawl or source) or a parent
# updates, once no parent is missing or in progress and no parent partition's blocking check
# (over_deletion) failed, so a failed guard holds the crawl back. Not Dagster's
# all_deps_blocking_checks_passed(): across a fan-in mapping (crawl <- source x crawl) a dep
# counts as matching when *one* of its partitions does, so one passing source would let the
# crawl-level stage run past a failed one.
PARENT_BLOCKING_CHECK_FAILED = AutomationCondition.any_deps_match(
    AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True)
).with_label("any_parent_blocking_check_failed")
AUTOMATION = AutomationCondition.eager() & ~PARENT_BLOCKING_CHECK_FAILED


class InCrawl(AutomationCondition[AssetKey]):
    """True for the partitions that are partitions of their crawl: a crawl partition of a crawl
    registered in the data root, a source x crawl pair whose source that crawl has, of a program
    whose stage the crawl did not switch off. The registry is read once a tick (every asset's
    evaluation in a tick shares it)."""

    def __init__(self, curation: CurationResource) -> None:
        self.curation = curation
        self._read: tuple[datetime, dict[str, CrawlSpec]] | None = None

    @property
    def name(self) -> str:
        return "in_crawl"

    @property
    def description(self) -> str:
        return "a partition of its crawl (source x crawl: a source the crawl has; its stage not switched off)"

    @property
    def requires_cursor(self) -> bool:
        return False

    def _specs(self, tick: datetime) -> dict[str, CrawlSpec]:
        """Each registered crawl's spec, as of this tick."""
        if self._read is None or self._read[0] != tick:
            self._read = (tick, {r.spec.crawl: r.spec for r in self.curation.dataroot().records()})
        return self._read[1]

    def evaluate(self, context: AutomationContext[AssetKey]) -> AutomationResult[AssetKey]:
        subset = context.candidate_subset
        program = subset.key.to_user_string()
        specs = self._specs(context.evaluation_time)
        members = set()
        for key in subset.expensively_compute_partition_keys():
            crawl, source = split_key(key, PROGRAMS[program].level)
            spec = specs.get(crawl)
            if spec is not None and not spec.switched_off(program) and (source is None or source in spec.sources):
                members.add(key)
        return AutomationResult(context, true_subset=subset.compute_intersection_with_partition_keys(members))


def automation(curation: CurationResource) -> AutomationCondition:
    """``AUTOMATION`` that knows the crawls' sources (``InCrawl``): it requests only partitions of
    their crawl, and a dependency that is no partition of its crawl is never waited on as missing
    (a crawl's fan-in would otherwise wait forever on the sources only other crawls have). Custom,
    so the automation sensor evaluates it in the code server (``use_user_code_server``)."""
    in_crawl = InCrawl(curation)
    deps_missing = AutomationCondition.any_deps_match(
        AutomationCondition.missing() & ~AutomationCondition.will_be_requested() & in_crawl
    ).with_label("any_deps_missing")
    # A parent's failed blocking check holds a partition back only where the parent is a partition
    # of its crawl: one recorded while the crawl ran a stage it has since switched off stays
    # current (no run judges that partition again) and would hold the crawl back for good.
    parent_failed = AutomationCondition.any_deps_match(
        AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True) & in_crawl
    ).with_label("any_parent_blocking_check_failed")
    return in_crawl & AutomationCondition.eager().replace("any_deps_missing", deps_missing) & ~parent_failed


def automated(assets: list[AssetsDefinition], curation: CurationResource) -> list[AssetsDefinition]:
    """The assets with ``automation(curation)`` as their automation condition."""
    condition = automation(curation)
    return [a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=condition)) for a in assets]


def _deps(program: Program) -> list[AssetDep]:
    deps = []
    for name in program.deps:
        same = PROGRAMS[name].level == program.level
        deps.append(AssetDep(name) if same else AssetDep(name, partition_mapping=by_crawl))
    return deps


def describe(program: Program) -> str:
    """The description: what the program makes, its partitioning, stage, resources, params.

    Plain sentences, no Markdown emphasis: the UI renders a description as Markdown on the asset
    page but shows it as plain text in the catalog and the graph, where ``**`` would be raw. Path
    placeholders are in braces: Markdown takes ``<crawl>`` or ``<source>`` for an HTML tag and
    drops it (the page showed ``/curated_documents/<params_key>///``)."""
    res = program.resources
    level = "source × crawl" if program.level == "source" else "crawl (fans in over every source)"
    part_of = getattr(program, "part_of", None)
    facts = [f"Partitions: {level}."]
    if program.stage:
        facts.append(f"Removal stage: {program.stage}.")
    elif part_of:
        facts.append(f"Part of stage: {part_of}.")
    gpu = f", {res.gpu} GPU" if res.gpu else ""
    facts.append(f"One partition needs {res.cpu:g} CPU, {res.memory_gib:g} GiB{gpu}.")
    params_doc = inspect.cleandoc(program.params.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    segs = "{crawl}/{source}" if program.level == "source" else "{crawl}"
    return "\n\n".join([
        program.description,
        " ".join(facts),
        f"Parameters: {program.params.__name__} v{program.params.version}: {params_doc}",
        f"Output: {{data root}}/{program.name}/{{params_key}}/{segs}/ (manifest written last).",
    ])


def build_asset(program: Program) -> AssetsDefinition:
    res = program.resources
    part_of = getattr(program, "part_of", None)
    tags: dict[str, str] = {"level": program.level}
    if program.stage or part_of:
        tags["stage"] = str(program.stage or part_of)

    @asset(
        name=program.name,
        partitions_def=partitions_for(program.level),
        deps=_deps(program),
        group_name=program.group,
        description=describe(program),
        kinds={"python", "parquet", "gpu" if res.gpu else "cpu"},
        code_version=str(program.params.version),
        owners=OWNERS,
        tags=tags,
        metadata={
            "level": program.level, "cpu": res.cpu, "memory_gib": res.memory_gib, "gpu": res.gpu,
            "image": res.image, "params_class": MetadataValue.text(program.params.__name__),
        },
        automation_condition=AUTOMATION,
    )
    def _asset(context: AssetExecutionContext, curation: CurationResource) -> MaterializeResult:
        from curation_dagster.run.crawl_job import materialize_partition  # the crawl job's launchers and recorder

        crawl, source = split_key(context.partition_key, program.level)
        refuse_outside(crawl, source, curation.spec(crawl), program.name)
        return materialize_partition(context, curation, program.name, crawl, source)

    return _asset


ASSETS: list[AssetsDefinition] = [build_asset(p) for p in PROGRAMS.values()]
