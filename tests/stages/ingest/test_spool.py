"""A local pool's workers hand a task's documents over through a file (``stages.ingest.spool``):
the same tables as in one process, nothing left in TMPDIR, and the pipe where no file can be
written."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from stages.ingest.records import PARSED, Done
from stages.ingest.spool import Spooling, unspooled
from stages.params import ExecutionParams
from tests.support.tiny_corpus import ingest_each


def _docs(n: int) -> pa.Table:
    return pa.table({"record_id": [f"r{i}" for i in range(n)], "url": [None] * n,
                     "text": pa.array([f"text {i} " * 30 for i in range(n)], pa.large_string()),
                     "metadata": [None] * n}, schema=PARSED)


class _Found:
    """A task that finds ``docs`` (module level: picklable, as a pool's tasks must be)."""

    def __init__(self, docs: pa.Table) -> None:
        self.docs = docs

    def run(self) -> Done:
        return Done(self.docs, b"\x00" * 16 * self.docs.num_rows, pa.array(range(self.docs.num_rows)).to_numpy())


def test_a_spooled_table_is_read_back_whole_and_its_file_removed(tmp_path: Path) -> None:
    docs = _docs(500)
    sent = Spooling(str(tmp_path))(_Found(docs))  # type: ignore[arg-type]
    assert sent.spooled is not None and sent.docs.num_rows == 0 and Path(sent.spooled).exists()
    got = unspooled(sent)
    assert got.docs.equals(docs) and got.spooled is None and not list(tmp_path.iterdir())


def test_a_task_whose_file_cannot_be_written_sends_its_documents_through_the_pipe(tmp_path: Path) -> None:
    docs = _docs(20)
    sent = Spooling(str(tmp_path / "gone"))(_Found(docs))  # type: ignore[arg-type]
    assert sent.spooled is None and sent.docs.equals(docs) and unspooled(sent) is sent


@pytest.fixture
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_tasks_on_workers_give_the_one_process_tables_and_leave_nothing_in_tmpdir(
        tmp_path: Path, own_tmpdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stages.programs.raw_documents as raw_documents

    files: list[str] = []

    def counted(done: Done) -> Done:
        if done.spooled is not None:
            files.append(done.spooled)
        return unspooled(done)

    monkeypatch.setattr(raw_documents, "unspooled", counted)
    src = tmp_path / "in"
    src.mkdir()
    lines = [json.dumps({"id": f"r{i}", "text": f"record {i % 700} " * (1 + i % 40)}) for i in range(4000)]
    lines[1234] = '{"id": "broken", "text": '
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    got = ingest_each(tmp_path, src, {"one": ExecutionParams(workers=1, ingest_task_bytes=1 << 30),
                                      "pool": ExecutionParams(workers=2, ingest_task_bytes=20_000, batch_rows=700)})
    assert got["pool"][0]["tasks"] >= 20 and got["one"][0]["tasks"] == 1
    assert len(files) == got["pool"][0]["tasks"]  # every task's documents came through a file
    assert got["pool"][1].equals(got["one"][1]) and got["pool"][2].equals(got["one"][2])
    assert got["pool"][1].num_rows == 3999 and got["pool"][2]["reason"].to_pylist() == ["invalid_json"]
    assert not list(own_tmpdir.iterdir())  # each partition's spool folder is removed

