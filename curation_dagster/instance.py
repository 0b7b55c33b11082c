"""The workdir's Dagster instance: ``<workdir>/dagster/dagster.yaml``, written for a new workdir.

The embedded default is SQLite in that folder with runs in-process, and one event-log database
for all runs on pooled connections (``curation_dagster.event_log.PooledSqliteEventLogStorage``):
Dagster's default opens a new database per run (~0.4 s each), and its consolidated one a new
connection per statement (~12 ms per stored event). That storage takes an absolute path, so a
workdir that was copied or moved gets its file pointed at its own folder again, and a file an
earlier version wrote gets this version's storage (only a file this module wrote; an edited one
is left alone).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HEADER = "# The embedded default: SQLite storage in this folder, runs in-process (written by curate)."
DAGSTER_YAML = HEADER + """
telemetry:
  enabled: false
# One event-log database for all runs, on pooled connections: the default opens a new database
# per run (~0.4 s), Dagster's consolidated storage a new connection per statement (~12 ms an event).
event_log_storage:
  module: curation_dagster.event_log
  class: PooledSqliteEventLogStorage
  config:
    base_dir: {history}
"""
# What earlier versions wrote: recognized as ours, and rewritten with this version's storage.
EARLIER_YAML = (HEADER + """
telemetry:
  enabled: false
# One event-log database for all runs: the default opens a new database per run, which costs
# ~0.4 s per run, and a crawl is dozens of short runs (one per asset partition).
event_log_storage:
  module: dagster._core.storage.event_log
  class: ConsolidatedSqliteEventLogStorage
  config:
    base_dir: {history}
""",)
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
    ours = found is not None and any(text == t.format(history=found.group(1)) for t in (DAGSTER_YAML, *EARLIER_YAML))
    if text != want and ours:
        path.write_text(want)  # ours, for another folder (the workdir was copied or moved) or version
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
