"""Functions a test runs in another process (a pool worker) by reference: this module imports
nothing, so unpickling one there loads nothing the process had not."""

from __future__ import annotations

import os
import sys
import time


def dagster_modules(wait_s: float = 0.0) -> tuple[int, list[str]]:
    """(this process's id, the Dagster modules and SQLAlchemy's, which only Dagster brings, it has
    imported), after ``wait_s`` (so that calls submitted together land on different workers)."""
    time.sleep(wait_s)
    return os.getpid(), sorted(m for m in sys.modules if m.split(".")[0] in ("dagster", "dagster_shared", "sqlalchemy"))
