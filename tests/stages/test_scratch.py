"""Scratch folders under TMPDIR: named by their process, removed when their use ends, and those
of dead processes swept by the next one made."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from stages.scratch import scratch


def test_the_scratch_folders_of_dead_processes_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    gone = tmp_path / f"curate-pair-texts-{dead}-ab12"  # a kind with a dash in it
    kept = tmp_path / f"curate-ingest-{os.getpid()}-cd34"
    other = tmp_path / "someone-elses"
    for made in (gone, kept, other):
        made.mkdir()
        (made / "task.arrow").write_bytes(b"x")
    with pytest.raises(RuntimeError), scratch("ingest") as folder:
        assert folder.parent == tmp_path and folder.name.startswith(f"curate-ingest-{os.getpid()}-")
        assert not gone.exists() and kept.exists() and other.exists()
        (folder / "left.arrow").write_bytes(b"x")
        raise RuntimeError("a failed use")
    assert not folder.exists()  # removed with what was in it, on failure too
