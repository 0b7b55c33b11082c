"""Recrawls: a sensor that registers new crawl snapshots found under a URL prefix, and a schedule
that registers a new crawl of the configured sources on a cron.

Registering a crawl = saving its spec in the data root (``<data root>/_crawls/<crawl>.json``:
sources and every stage's parameters, copied from a template; ``stages.dataroot``), adding the
``crawl`` partition and any new ``source`` partitions, and requesting one run per source of the
per-source programs at the root of the graph (``ROOT_PROGRAMS``). Declarative automation
(``AutomationCondition.eager``, see ``assets.py``) carries the crawl on through the fan-in dedup
stages to the curated output and the ledger, each partition once all of its parents are
materialized and their blocking checks passed. Both are configured in ``<workdir>/curate.yaml``
(``recrawl:``; docs/operations.md).
"""

from typing import Any

import fsspec
from dagster import (
    AssetKey,
    AssetSelection,
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Failure,
    JobDefinition,
    MultiPartitionKey,
    OpExecutionContext,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    op,
    schedule,
    sensor,
)
from pydantic import Field

from curation_dagster.defs.partitions import CRAWL, SOURCE, crawl_partitions, source_partitions
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.config import RecrawlConfig, load_config
from curation_dagster.ops.instance import add_partitions
from curation_dagster.tools.crawls import crawl_spec, spec_from_options
from stages.catalog import waves
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec
from stages.store import UnsafeNameError, check_name

# The per-source head of the graph (the first wave: per-source programs that need nothing but
# other per-source programs): one run per source materializes all of them, in dependency order.
ROOT_PROGRAMS: list[str] = waves()[0]
TARGET = AssetSelection.assets(*ROOT_PROGRAMS)


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def discover(cfg: RecrawlConfig) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Crawl snapshots under ``cfg.prefix``: ({crawl: {source: url}}, notes on skipped folders).

    A crawl is a folder ``<prefix>/<crawl>/`` with one sub-folder per source; with
    ``ready_marker`` set it counts only once ``<prefix>/<crawl>/<ready_marker>`` exists.
    """
    assert cfg.prefix, "recrawl.prefix is not set"
    fs, root = fsspec.core.url_to_fs(cfg.prefix, **cfg.storage_options)
    fs.invalidate_cache()
    root = root.rstrip("/")
    prefix = cfg.prefix.rstrip("/")
    found: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    for info in sorted(fs.ls(root, detail=True), key=lambda i: i["name"]):
        if info["type"] != "directory":
            continue
        crawl = _name(info["name"])
        try:
            check_name("crawl", crawl)
        except UnsafeNameError as exc:
            notes.append(str(exc))
            continue
        if cfg.ready_marker and not fs.exists(f"{root}/{crawl}/{cfg.ready_marker}"):
            notes.append(f"{crawl}: no {cfg.ready_marker} yet")
            continue
        sources: dict[str, str] = {}
        for sub in sorted(fs.ls(f"{root}/{crawl}", detail=True), key=lambda i: i["name"]):
            name = _name(sub["name"])
            if sub["type"] != "directory":
                continue
            try:
                sources[check_name("source", name)] = f"{prefix}/{crawl}/{name}"
            except UnsafeNameError as exc:
                notes.append(f"{crawl}: {exc}")
        if sources:
            found[crawl] = sources
    return found, notes


def spec_for(root: DataRoot, cfg: RecrawlConfig, crawl: str, urls: dict[str, str]) -> CrawlSpec | None:
    """The spec of a new crawl (``crawls.crawl_spec``): each source's fields from ``recrawl.sources``,
    else from the template crawl's spec, else ``source_defaults`` (or skipped, with ``new_sources:
    skip``); params, stages and keep from the recrawl section, else from the template. Deduplicated
    against the documents every crawl published before it kept (incremental dedup)."""
    base = root.spec(cfg.template) if cfg.template else None
    sources: dict[str, dict[str, Any]] = {}
    for name, url in sorted(urls.items()):
        if name in cfg.sources:
            fields = dict(cfg.sources[name])
        elif base is not None and name in base.sources:
            fields = base.sources[name].model_dump()
        elif cfg.new_sources == "include":
            fields = dict(cfg.source_defaults)
        else:
            continue
        sources[name] = {**fields, "url": url}
    if not sources:
        return None
    return crawl_spec(root, crawl, sources, base=base, params=cfg.params, stages=cfg.stages, keep=cfg.keep)


def run_requests(spec: CrawlSpec, trigger: str) -> list[RunRequest]:
    """One run per source of the crawl, materializing ``ROOT_PROGRAMS`` for that partition (those
    the crawl has: a switched-off stage's have no partition)."""
    roots = [AssetKey(p) for p in ROOT_PROGRAMS if not spec.switched_off(p)]
    return [
        RunRequest(
            run_key=f"{spec.crawl}|{source}",
            asset_selection=roots,
            partition_key=MultiPartitionKey({CRAWL: spec.crawl, SOURCE: source}),
            tags={"curate/crawl": spec.crawl, "curate/trigger": trigger},
        )
        for source in sorted(spec.sources)
    ]


def register(root: DataRoot, cfg: RecrawlConfig, crawl: str, urls: dict[str, str]) -> CrawlSpec | None:
    """Register a new crawl in the data root (a registered crawl's spec is kept as it is) and return its spec."""
    record = root.record(crawl)
    if record is not None:
        return record.spec
    spec = spec_for(root, cfg, crawl, urls)
    if spec is not None:
        root.register(spec)
    return spec


def build_recrawl_sensor(cfg: RecrawlConfig) -> SensorDefinition:
    @sensor(
        name="recrawl_sensor",
        description="Registers every new crawl snapshot under recrawl.prefix ({prefix}/{crawl}/{source}/): "
                    "saves its spec, adds the crawl and source partitions and requests its root runs. "
                    "Stopped while curate.yaml sets no recrawl.prefix. Crawls are also created by `curate run`, "
                    "`curate submit` and `curate register` (docs/operations.md), and by the recrawl schedule, "
                    "which is listed only once curate.yaml sets recrawl.cron.",
        minimum_interval_seconds=cfg.sensor_interval_seconds,
        target=TARGET,
        default_status=DefaultSensorStatus.RUNNING if cfg.prefix else DefaultSensorStatus.STOPPED,
    )
    def recrawl_sensor(context: SensorEvaluationContext, curation: CurationResource) -> SensorResult | SkipReason:
        rc = load_config(curation.workdir).recrawl
        if not rc.prefix:
            return SkipReason(f"no recrawl.prefix in {curation.workdir}/curate.yaml")
        found, notes = discover(rc)
        known = set(context.instance.get_dynamic_partitions(CRAWL))
        known_sources = set(context.instance.get_dynamic_partitions(SOURCE))
        specs = []
        root = curation.dataroot()
        for crawl, urls in found.items():
            if crawl in known:
                continue
            spec = register(root, rc, crawl, urls)
            if spec is None:
                notes.append(f"{crawl}: none of its sources is configured (recrawl.new_sources: skip)")
            else:
                specs.append(spec)
        for note in notes:
            context.log.info(note)
        if not specs:
            return SkipReason(f"no new crawl under {rc.prefix}" + (f" ({'; '.join(notes)})" if notes else ""))
        new_sources = sorted({s for spec in specs for s in spec.sources} - known_sources)
        requests = [crawl_partitions.build_add_request([spec.crawl for spec in specs])]
        if new_sources:
            requests.append(source_partitions.build_add_request(new_sources))
        return SensorResult(
            run_requests=[r for spec in specs for r in run_requests(spec, "recrawl_sensor")],
            dynamic_partitions_requests=requests,
        )

    return recrawl_sensor


def schedule_description(cfg: RecrawlConfig) -> str:
    """The schedule's description: what a tick does, and the curate.yaml setting that made it."""
    return (f"Configured: recrawl.cron {cfg.cron!r} ({cfg.timezone}) in curate.yaml. On every tick, registers "
            "crawl strftime(recrawl.crawl_name) of the recrawl sources (url may contain {crawl}) and requests "
            "its root runs.")


def build_recrawl_schedule(cfg: RecrawlConfig) -> ScheduleDefinition | None:
    """The recrawl schedule, or None (no schedule in the code location) while curate.yaml sets no
    ``recrawl.cron``: a listed schedule always shows a cron, and a placeholder one reads as a plan
    (the UI's Automation list showed "Scheduled At 03:00 AM UTC, only on Monday" for none)."""
    if not cfg.cron:
        return None

    @schedule(
        name="recrawl_schedule",
        description=schedule_description(cfg),
        cron_schedule=cfg.cron,
        execution_timezone=cfg.timezone,
        target=TARGET,
        default_status=DefaultScheduleStatus.RUNNING,
    )
    def recrawl_schedule(
        context: ScheduleEvaluationContext, curation: CurationResource
    ) -> list[RunRequest] | SkipReason:
        rc = load_config(curation.workdir).recrawl
        crawl = context.scheduled_execution_time.strftime(rc.crawl_name)
        check_name("crawl", crawl)
        instance = context.instance
        if instance.has_dynamic_partition(CRAWL, crawl):
            return SkipReason(f"crawl {crawl!r} is already registered")
        root = curation.dataroot()
        names = dict(rc.sources)
        if not names and rc.template:
            names = {s: p.model_dump() for s, p in root.spec(rc.template).sources.items()}
        urls = {s: str(f.get("url", "")).replace("{crawl}", crawl).replace("{prefix}", (rc.prefix or "").rstrip("/"))
                for s, f in names.items()}
        if not urls or not all(urls.values()):
            return SkipReason("recrawl.sources (or recrawl.template) must name every source with a url")
        spec = register(root, rc, crawl, urls)
        if spec is None:
            return SkipReason(f"crawl {crawl!r}: no source to register")
        # A schedule cannot return dynamic partition requests: add them before requesting runs.
        add_partitions(instance, {CRAWL: [crawl], SOURCE: sorted(spec.sources)})
        return run_requests(spec, "recrawl_schedule")

    return recrawl_schedule


class RegisterConfig(Config):
    """The launchpad form of ``curate_register``: a new crawl and its sources."""

    crawl: str = Field(description="the new crawl's name")
    sources: dict[str, dict[str, str]] = Field(
        default={}, description="per source name, its fields as in a crawl config: url (required), text_field, "
                                "id_field, format ...; empty: the template crawl's sources")
    template: str | None = Field(default=None, description="a registered crawl whose sources (unless given), "
                                                           "params, stages and keep are copied")


@op(name="register_crawl", description="Registers a new crawl: saves its spec (sources, params) in the data "
                                        "root and adds its crawl and source partitions, as `curate register` does.")
def register_op(context: OpExecutionContext, config: RegisterConfig, curation: CurationResource) -> None:
    root = curation.dataroot()
    try:  # what the form gets wrong (a name, the template, a source's fields) on one line, no traceback
        crawl = check_name("crawl", config.crawl)
        if root.record(crawl) is not None:
            raise Failure(f"crawl {crawl!r} is registered already: launch curate_run with crawl: {crawl}")
        base = root.spec(config.template) if config.template else None
        sources: dict[str, dict[str, Any]] = {n: dict(f) for n, f in config.sources.items()}
        if not sources and base is not None:
            sources = {n: p.model_dump() for n, p in base.sources.items()}
        if not sources:
            raise Failure("no source: give sources ({name: {url: ...}}) or a template crawl")
        template = {} if base is None else {"params": base.params, "stages": base.stages,
                                            "keep": base.keep.model_dump()}
        # As `curate register` builds it: its config file's mapping, here the template's and the form's.
        spec = spec_from_options(root, crawl, [], None, {**template, "sources": sources})
    except (ValueError, LookupError) as exc:  # UnsafeNameError, SpecError, UnknownCrawl, a pydantic error
        raise Failure(f"curate_register: {' '.join(str(exc).split())}") from None
    record = root.register(spec)
    add_partitions(context.instance, {CRAWL: [crawl], SOURCE: sorted(spec.sources)})
    context.log.info(f"crawl {crawl} registered (#{record.sequence}, sources {', '.join(sorted(spec.sources))}): "
                     f"launch curate_run with crawl: {crawl} to run it")


@job(name="curate_register", description="Registers a crawl from the UI (Launchpad: crawl, sources, template), "
                                         "as `curate register` does; then launch curate_run with its name. The "
                                         "launch dialog's 'Add a partition' registers nothing: do not create "
                                         "crawls that way.")
def register_job() -> None:
    register_op()


REGISTER_JOB_DEF: JobDefinition = register_job
