"""The Dagster code location: ``dagster dev -m curation_dagster.definitions``.

The workdir comes from ``CURATE_WORKDIR`` (``curate ui`` and ``curate run`` set it).
"""

from __future__ import annotations

import os

from dagster import Definitions

from curation_dagster.assets import ASSETS
from curation_dagster.resources import CurationResource


def build_definitions(workdir: str | None = None, **resource_config: object) -> Definitions:
    workdir = workdir or os.environ.get("CURATE_WORKDIR", "workdir")
    return Definitions(
        assets=ASSETS,
        resources={"curation": CurationResource(workdir=os.path.abspath(workdir), **resource_config)},  # type: ignore[arg-type]
    )


defs = build_definitions()
