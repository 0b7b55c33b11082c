"""The workdir's operating config, ``<workdir>/curate.yaml``: recrawls, automation, check bounds.

Every section is optional; a missing file means the defaults below. The file is read when the
code location loads (schedule cron, sensor interval, which instigators start running) and again
whenever a check or a recrawl tick evaluates (bounds, template), so editing a bound takes effect
without a restart. The whole format is in docs/operations.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stages.checks import ChecksConfig
from stages.configfile import InvalidConfig, load_mapping
from stages.credentials import check_url
from stages.params import ExecutionTuning

CONFIG_FILE = "curate.yaml"


class _Section(BaseModel):
    # a rejected value (a URL with a credential in it) is never echoed in the error
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class RecrawlConfig(_Section):
    """Where new crawl snapshots appear, and what a new crawl's spec is made of.

    The sensor lists ``<prefix>/<crawl>/<source>/`` (any fsspec URL); a ``<crawl>`` folder that
    is not yet a ``crawl`` partition becomes one, with one source per sub-folder. The schedule
    registers, on every tick of ``cron``, a crawl named ``strftime(crawl_name)`` whose sources are
    ``sources`` (their ``url`` may contain ``{crawl}`` and ``{prefix}``).
    """

    prefix: str | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)
    sensor_interval_seconds: int = Field(default=300, ge=5)
    ready_marker: str | None = None  # e.g. "_SUCCESS": a crawl folder counts only once it holds this file
    cron: str | None = None
    timezone: str = "UTC"
    crawl_name: str = "%Y-%m-%d"
    template: str | None = None  # a registered crawl whose spec (sources' fields, params, stages, keep) is copied
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-source RawDocumentsParams fields
    source_defaults: dict[str, Any] = Field(default_factory=dict)  # fields for a source found in no template
    new_sources: Literal["include", "skip"] = "include"
    params: dict[str, dict[str, Any]] | None = None
    stages: list[str] | None = None
    keep: dict[str, Any] | None = None

    @field_validator("prefix")
    @classmethod
    def _no_credentials(cls, prefix: str | None) -> str | None:
        return None if prefix is None else check_url("recrawl prefix", prefix)

    @field_validator("sources", "source_defaults")
    @classmethod
    def _no_credentials_in_urls(cls, value: dict[str, Any]) -> dict[str, Any]:
        # a source's url is checked again where it becomes a RawDocumentsParams; here, so that
        # curate.yaml fails when it is read, in one line
        for entry in [value, *value.values()]:
            if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                check_url("recrawl source URL", entry["url"])
        return value


class AutomationConfig(_Section):
    """Declarative automation: eager materialization of whatever a new partition makes missing."""

    enabled: bool = True
    interval_seconds: int = Field(default=30, ge=5)


class WorkdirConfig(_Section):
    execution: ExecutionTuning = Field(default_factory=lambda: ExecutionTuning())
    recrawl: RecrawlConfig = Field(default_factory=lambda: RecrawlConfig())
    automation: AutomationConfig = Field(default_factory=lambda: AutomationConfig())
    checks: ChecksConfig = Field(default_factory=lambda: ChecksConfig())


def config_path(workdir: str | Path) -> Path:
    return Path(workdir) / CONFIG_FILE


def load_config(workdir: str | Path) -> WorkdirConfig:
    """``<workdir>/curate.yaml`` validated (unknown keys are errors), or the defaults."""
    path = config_path(workdir)
    if not path.exists():
        return WorkdirConfig()
    data = load_mapping(path)
    try:
        return WorkdirConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidConfig(str(path), "invalid config", " ".join(str(exc).split())) from None
