"""The workdir's Dagster instance: ``<workdir>/dagster/dagster.yaml``, written for a new workdir.

The embedded default is SQLite in that folder with runs in-process, and one event-log database
for all runs (``ConsolidatedSqliteEventLogStorage``): Dagster's default opens a new database per
run, ~0.4 s each, and a crawl is dozens of short runs (one per wave of assets and partition
key). That storage takes an absolute path, so a workdir that was copied or moved gets its file
pointed at its own folder again (only a file this module wrote; an edited one is left alone).

That storage is named by its private module path, ``dagster._core.storage.event_log``: Dagster
exports no public name for it, and its own docstring configures it so. dagster is pinned
(pyproject.toml), and tests/curation_dagster/test_dagster_tools.py fails if the class moves or stops loading.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HEADER = "# The embedded default: SQLite storage in this folder, runs in-process (written by curate)."
DAGSTER_YAML = HEADER + """
telemetry:
  enabled: false
# One event-log database for all runs: the default opens a new database per run, which costs
# ~0.4 s per run, and a crawl is dozens of short runs (one per asset partition).
event_log_storage:
  module: dagster._core.storage.event_log
  class: ConsolidatedSqliteEventLogStorage
  config:
    base_dir: {history}
"""
_BASE_DIR = re.compile(r"^    base_dir: (.*)$", re.MULTILINE)


def _render(home: Path) -> str:
    return DAGSTER_YAML.format(history=json.dumps(str(home / "history")))  # a YAML double-quoted string


def ensure_instance_config(home: Path) -> Path:
    """Create ``home`` and its ``dagster.yaml`` if missing, or re-point a copied one; returns home."""
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    want = _render(home)
    if not path.exists():
        path.write_text(want)
        return home
    text = path.read_text()
    found = _BASE_DIR.search(text)
    if text != want and found and text == DAGSTER_YAML.format(history=found.group(1)):
        path.write_text(want)  # ours, written for another folder: this workdir was copied or moved
    return home


def workdir_of(home: str | Path) -> Path | None:
    """The workdir whose instance ``home`` is (``<workdir>/dagster`` with a ``dagster.yaml`` that
    ``ensure_instance_config`` wrote), else None."""
    path = Path(home) / "dagster.yaml"
    try:
        written = path.read_text().startswith(HEADER)
    except OSError:
        return None
    return Path(home).resolve().parent if written and Path(home).name == "dagster" else None
