"""The base of the errors a stage reports to its user in one line (no traceback): a partition
another attempt is writing, a spill without room, input the store could not deliver, a custom
filter that failed, counts that do not add up. ``python -m stages`` prints them as ``error: ...``;
the in-process Dagster step raises them as a ``Failure`` with that line."""

from __future__ import annotations


class StageError(RuntimeError):
    """An error whose message is the whole story, on one line."""


class DamagedFile(StageError):
    """A file of the data root or a config that cannot be read as what it should be (truncated,
    not JSON/YAML, missing fields, a tag that would build an object): the message names the file."""

    def __init__(self, path: str, what: str, reason: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{path}: {what}: {' '.join(reason.split())}")
