"""The Dagster code location: ``dagster dev -m curation_dagster.definitions``.

The workdir comes from ``CURATE_WORKDIR`` (``curate ui`` and ``curate run`` set it); its
``curate.yaml`` (docs/operations.md) sets the recrawl schedule and sensor and the automation.
"""

from __future__ import annotations

import os

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    ExecutorDefinition,
)

from curation_dagster.assets import ASSETS
from curation_dagster.checks import CHECKS
from curation_dagster.config import load_config
from curation_dagster.recrawl import build_recrawl_schedule, build_recrawl_sensor
from curation_dagster.resources import CurationResource


def build_definitions(workdir: str | None = None, run_executor: ExecutorDefinition | None = None,
                      **resource_config: object) -> Definitions:
    """The code location; ``run_executor`` runs a run's steps (default: Dagster's, a process per step).
    ``resource_config``: fields of the ``curation`` resource."""
    workdir = os.path.abspath(workdir or os.environ.get("CURATE_WORKDIR", "workdir"))
    cfg = load_config(workdir)
    automation = AutomationConditionSensorDefinition(
        "curation_automation",
        target=AssetSelection.all(),
        minimum_interval_seconds=cfg.automation.interval_seconds,
        default_status=DefaultSensorStatus.RUNNING if cfg.automation.enabled else DefaultSensorStatus.STOPPED,
        description="Eagerly materializes what a new crawl, a new source or an updated parent leaves "
                    "missing or outdated (automation.enabled in curate.yaml).",
    )
    return Definitions(
        assets=ASSETS,
        asset_checks=CHECKS,
        schedules=[build_recrawl_schedule(cfg.recrawl)],
        sensors=[build_recrawl_sensor(cfg.recrawl), automation],
        resources={"curation": CurationResource(workdir=workdir, **resource_config)},  # type: ignore[arg-type]
        executor=run_executor,
    )


defs = build_definitions()
