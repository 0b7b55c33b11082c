"""The base of the errors a stage reports to its user in one line (no traceback): a partition
another attempt is writing, a spill without room, input the store could not deliver, a custom
filter that failed, counts that do not add up. ``python -m stages`` prints them as ``error: ...``;
the in-process Dagster step raises them as a ``Failure`` with that line."""

from __future__ import annotations


class StageError(RuntimeError):
    """An error whose message is the whole story, on one line."""
