"""Entries of a source folder that are not files (issue 30): a symbolic link loop is named a loop,
a dangling link a link to nothing, a linked folder and a FIFO as what they are, each in one line;
a link to a file is read as the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stages.ingest.files import UnsupportedFileError
from stages.params import RawDocumentsParams
from stages.programs.raw_documents import list_files
from tests.support.tiny_corpus import TINY


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "news.jsonl").write_bytes((TINY / "news" / "news-2024-05.jsonl").read_bytes())
    return folder


@pytest.mark.parametrize("make, words", [
    (lambda f: os.symlink("..", f / "sub" / "up"), ["sub/up", "symbolic link loop"]),
    (lambda f: os.symlink(f, f / "self"), ["self", "symbolic link loop"]),
    (lambda f: (os.symlink("b", f / "a"), os.symlink("a", f / "b")), ["symbolic link loop", "leads back"]),
    (lambda f: os.symlink("nowhere", f / "gone.jsonl"), ["gone.jsonl", "link to nothing"]),
    (lambda f: os.symlink(TINY / "news", f / "linked"), ["linked", "link to the folder", "does not follow"]),
    (lambda f: os.mkfifo(f / "pipe.jsonl"), ["pipe.jsonl", "FIFO"]),
])
def test_an_entry_that_is_not_a_file_is_named_for_what_it_is(src: Path, make, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    make(src)
    with pytest.raises(UnsupportedFileError) as err:
        list_files(RawDocumentsParams(url=str(src)))
    message = str(err.value)
    assert "\n" not in message and "neither JSONL nor Parquet" not in message
    for word in words:
        assert word in message, message


def test_a_link_to_a_file_is_read_as_the_file(src: Path) -> None:
    os.symlink(src / "news.jsonl", src / "again.jsonl")
    _, files, _ = list_files(RawDocumentsParams(url=str(src)))
    assert [f.name for f in files] == ["again.jsonl", "news.jsonl"]
    assert files[0].size == files[1].size > 0
