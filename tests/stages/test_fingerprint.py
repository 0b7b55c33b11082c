"""Content fingerprints of model and benchmark files (``stages.fingerprint``): which files a path
names, in which order, and that any change of content or name re-keys, while the value for the
same files stays the one every earlier version computed (outputs already written are keyed by it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stages.fingerprint import expand, fingerprint

FILES = {"a/b": b"1", "a-c": b"2", "a/.hidden": b"3", ".h/x": b"4", "z.bin": b"5" * 100,
         "sub/deeper/w.json": b"{}", "sub/\u00e9.txt": "\u00e9".encode(), "B": b"upper", "a0": b"",
         "sub/x.jsonl": b"x", "sub/x.jsonl.gz": b"gz"}


def _tree(root: Path) -> Path:
    """A model folder with nested, hidden and non-ASCII names, a symlinked file and folder (outside
    it) and a broken symlink."""
    model = root / "model"
    for rel, data in FILES.items():
        (model / rel).parent.mkdir(parents=True, exist_ok=True)
        (model / rel).write_bytes(data)
    (root / "outside").mkdir()
    (root / "outside" / "o.txt").write_bytes(b"o")
    os.symlink(root / "outside", model / "linkdir")
    os.symlink(root / "outside" / "o.txt", model / "linkfile")
    os.symlink(root / "nowhere", model / "broken")
    return model


def test_the_files_a_folder_names_and_their_order(tmp_path: Path) -> None:
    model = _tree(tmp_path)
    # hidden entries and everything under a hidden folder left out, a symlinked file in, a
    # symlinked folder not entered, a broken link out; ordered by path parts ("a/b" before "a-c")
    assert [p.relative_to(model).as_posix() for p in expand(str(model))] == [
        "B", "a/b", "a-c", "a0", "linkfile", "sub/deeper/w.json", "sub/x.jsonl", "sub/x.jsonl.gz", "sub/\u00e9.txt",
        "z.bin"]
    assert [p.name for p in expand(str(model), (".jsonl", ".json"))] == ["w.json", "x.jsonl"]
    assert [p.name for p in expand(str(model / "sub") + "/*")] == ["x.jsonl", "x.jsonl.gz", "\u00e9.txt"]


def test_the_fingerprints_are_the_values_keys_were_made_with(tmp_path: Path) -> None:
    # Computed by the pathlib version before this one was made faster: a different value would
    # re-key every output computed with a model or benchmark file.
    model = _tree(tmp_path)
    assert fingerprint(str(model)) == "75b17a5fe5d4c987"
    assert fingerprint(str(model), (".jsonl", ".json")) == "6b97796bf8d9d3d9"
    assert fingerprint(str(model / "sub") + "/*") == "96e4051271c1f567"
    assert fingerprint(str(model / "linkfile")) == "2a825337e59b6a73"
    moved = tmp_path / "elsewhere"
    (model / "broken").unlink()  # relative to nothing once moved; the tree is otherwise the same
    before = fingerprint(str(model))
    model.rename(moved)
    assert fingerprint(str(moved)) == before  # names relative to the folder given


def test_every_change_of_content_or_name_changes_it(tmp_path: Path) -> None:
    model = _tree(tmp_path)
    seen = [fingerprint(str(model))]
    target = model / "sub" / "x.jsonl"
    st = target.stat()
    target.write_bytes(b"y")  # same size, and the mtime set back: the ctime moved, the bytes are hashed
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen.append(fingerprint(str(model)))
    (model / "sub" / "deeper" / "new.bin").write_bytes(b"")  # a file added two levels down
    seen.append(fingerprint(str(model)))
    (model / "a" / "b").rename(model / "a" / "b2")  # a file renamed
    seen.append(fingerprint(str(model)))
    (tmp_path / "outside" / "o.txt").write_bytes(b"p")  # the target of a symlinked file
    seen.append(fingerprint(str(model)))
    assert len(set(seen)) == 5  # each change a new value
    (model / "a" / ".hidden").write_bytes(b"ignored")  # hidden: no change
    assert fingerprint(str(model)) == seen[-1]


def test_nothing_to_fingerprint_is_an_error(tmp_path: Path) -> None:
    for path in (str(tmp_path / "none"), str(tmp_path) + "/*.nomatch"):
        with pytest.raises(FileNotFoundError, match="no such file, directory or matching files"):
            fingerprint(path)


def test_links_that_loop_or_pass_through_a_file_are_no_files(tmp_path: Path) -> None:
    # as pathlib's is_file says (the walk's DirEntry.is_file raises for these two)
    model = tmp_path / "m"
    model.mkdir()
    (model / "f").write_bytes(b"f")
    before = fingerprint(str(model))
    os.symlink("loop", model / "loop")
    os.symlink("b", model / "a")
    os.symlink("a", model / "b")
    os.symlink(model / "f" / "sub", model / "through")
    assert [p.name for p in expand(str(model))] == ["f"] and fingerprint(str(model)) == before

