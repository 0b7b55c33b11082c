"""The Dagster code locations. ``defs``: the local one, ``curate ui --workdir DIR``, or in the
repository root plain ``dagster dev`` / ``dg dev`` / ``dg check defs`` (``[tool.dagster]`` and
``[tool.dg]`` in pyproject.toml name this module). :func:`k8s_definitions`: the one on Kubernetes
(k8s/values.yaml). ``curation_dagster.ops.deploy.definitions``: ``curate deploy``'s. They differ only
in their ``curation`` resource, built by ``resources.resource_for`` from the environment.

The workdir: ``CURATE_WORKDIR`` (``curate ui`` and ``curate run`` set it); else, when
``DAGSTER_HOME`` is a workdir's instance (``<workdir>/dagster``, written by curate), that workdir;
else ``./workdir`` (``make run``'s). Its ``curate.yaml`` (docs/operations.md) sets the recrawl
schedule and sensor and the automation. The crawls are the instance's dynamic partitions, so
``dagster dev`` without ``DAGSTER_HOME`` (a temporary, empty instance) shows none: the code
location says so in the log.
"""

from __future__ import annotations

import os
import warnings

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    BetaWarning,
    DefaultSensorStatus,
    Definitions,
    ExecutorDefinition,
    get_dagster_logger,
)

from curation_dagster.defs.assets import ASSETS, automated
from curation_dagster.defs.checks import CHECKS
from curation_dagster.defs.recrawl import REGISTER_JOB_DEF, build_recrawl_schedule, build_recrawl_sensor
from curation_dagster.defs.resources import resource_for
from curation_dagster.ops.config import load_config
from curation_dagster.ops.location import workdir_from
from curation_dagster.run.crawl_job import CRAWL_JOB_DEF


def default_workdir() -> str:
    """``CURATE_WORKDIR``, else the workdir whose instance ``DAGSTER_HOME`` is, else ``workdir``."""
    return workdir_from(os.environ)


def _hint_instance() -> None:
    """One log line when ``dagster dev`` runs on its temporary instance (no ``DAGSTER_HOME``)."""
    if os.environ.get("DAGSTER_IS_DEV_CLI") and not os.environ.get("DAGSTER_HOME"):
        get_dagster_logger().warning(
            "DAGSTER_HOME is not set: this is a temporary, empty instance without the crawls of "
            "`curate run`; use `DAGSTER_HOME=$PWD/workdir/dagster dagster dev` or `curate ui --workdir workdir`")


def build_definitions(workdir: str | None = None, run_executor: ExecutorDefinition | None = None,
                      **resource_config: object) -> Definitions:
    """The code location: the assets and their checks, the crawl job (``curate_run``: a whole crawl,
    one run), the registration job (``curate_register``: a crawl and its sources, from the
    Launchpad), the recrawl sensor, the automation sensor and, where curate.yaml sets
    ``recrawl.cron``, the recrawl schedule. ``run_executor`` runs an asset run's steps
    (default: Dagster's, a process per step; the crawl job runs its steps in its run's process).
    ``resource_config``: fields of the ``curation`` resource, over those of the environment
    (``resource_for``); ``workdir``: default ``default_workdir()``."""
    curation = resource_for(os.environ, **({"workdir": workdir} if workdir else {}), **resource_config)
    cfg = load_config(curation.workdir)
    with warnings.catch_warnings():  # use_user_code_server is beta in dagster 1.13 (pinned)
        warnings.simplefilter("ignore", BetaWarning)
        automation = AutomationConditionSensorDefinition(
            "curation_automation",
            target=AssetSelection.all(),
            minimum_interval_seconds=cfg.automation.interval_seconds,
            default_status=DefaultSensorStatus.RUNNING if cfg.automation.enabled else DefaultSensorStatus.STOPPED,
            description="Eagerly materializes what a new crawl, a new source or an updated parent leaves "
                        "missing or outdated (automation.enabled in curate.yaml), only partitions of their crawl.",
            # The assets' condition reads the crawls' sources from the data root (assets.InCrawl), so
            # the code server evaluates it, not the daemon.
            use_user_code_server=True,
        )
    schedule = build_recrawl_schedule(cfg.recrawl)  # None until curate.yaml sets recrawl.cron
    return Definitions(
        assets=automated(ASSETS, curation),
        asset_checks=CHECKS,
        schedules=[schedule] if schedule else [],
        sensors=[build_recrawl_sensor(cfg.recrawl), automation],
        jobs=[CRAWL_JOB_DEF, REGISTER_JOB_DEF],
        resources={"curation": curation},
        executor=run_executor,
    )


def k8s_definitions() -> Definitions:
    """The code location on Kubernetes (``dagster api grpc -m curation_dagster.defs.definitions -a
    k8s_definitions``, k8s/values.yaml): the same assets and crawl job, every partition in its own
    pod (``launchers.k8s``: a crawl step runs up to ``fan_out`` pods at once); outputs under
    ``CURATE_DATA_ROOT``, the workdir ``/workdir`` by default."""
    return build_definitions(mode="k8s")


_hint_instance()
defs = build_definitions()
