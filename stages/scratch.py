"""Scratch folders under TMPDIR, for what a process spills or hands over on this machine.

Each is named ``curate-<kind>-<pid>-<random>`` after the process that made it, which removes it
when its use ends (``scratch``). A process killed before that (the OOM killer, a pod's eviction)
leaves its folders behind: every new one first sweeps those whose process is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_PREFIX = "curate-"


def scratch_folder(kind: str) -> Path:
    """A new folder under TMPDIR for ``kind`` of this process (the caller removes it), after the
    folders of dead processes are swept."""
    sweep()
    return Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{kind}-{os.getpid()}-"))


@contextmanager
def scratch(kind: str) -> Iterator[Path]:
    """``scratch_folder(kind)``, removed with whatever is in it when the block ends or fails."""
    folder = scratch_folder(kind)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sweep() -> None:
    """Remove the scratch folders in TMPDIR whose process is gone (its pid in the name)."""
    try:
        entries = [e for e in os.scandir(tempfile.gettempdir()) if e.name.startswith(_PREFIX) and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(_PREFIX):].split("-")[-2]  # the kind may hold dashes, the random part none
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
