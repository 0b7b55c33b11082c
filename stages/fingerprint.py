"""Content fingerprints of local files that a stage's output depends on (models, benchmark sets).

A model or benchmark file is an input like a parameter: if its content changes, every output
computed from it must be re-keyed, or a rerun would read scores of the old model. The
fingerprint is xxh3-128 over the file names (relative to the path given) and their bytes, so
it changes whenever any byte changes, whatever the mtime says (copies that keep mtimes,
reproducible builds that reset them, same-size retrained checkpoints).

Hashing reads every byte (about 4 GB/s from the page cache, so a 4 GB fastText model costs
about a second the first time). The result is memoised per process on each file's
``(device, inode, size, mtime_ns, ctime_ns)``: the ctime cannot be set by hand and moves on any
write, so an unchanged stat means unchanged bytes, and resolving a crawl repeatedly costs a
listing of the folder and a ``stat`` per file. Every resolution of a partition validates its
crawl's params, so each pays this: a folder is walked with ``os.scandir`` (its entries' types
come with the listing) and each file stat'ed once, not through ``pathlib``'s ``rglob``,
``resolve`` and a second ``stat`` (16 files of the embedding model's package, two phases of the
machine: 3.07 -> 0.19-0.24 ms, 0.92-0.97 -> 0.074-0.076; the language model's one file 0.13-0.15
-> 0.037, 0.044 -> 0.010; a partition's keys with every stage on, 200 sources: 0.95-0.96 ->
0.21-0.23 ms).
"""

from __future__ import annotations

import errno
import glob
import os
from pathlib import Path

import xxhash

_CHUNK = 8 << 20
_memo: dict[tuple[int, int, int, int, int], str] = {}


def expand(path: str, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """The files a path names: the file itself, every file under a directory (recursively,
    sorted, hidden entries skipped) or the matches of a glob. ``suffixes`` keeps only names
    ending in one of them. Raises FileNotFoundError when nothing matches."""
    return [Path(f) for _, f in _named(path, suffixes)]


def _named(path: str, suffixes: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """``expand``'s files as (name in the fingerprint, path): relative to a directory given (its
    parts joined by ``/``, in ``Path`` order: by parts, so ``a/b`` before ``a-c``), else the file
    name."""
    p = Path(path).expanduser()
    files: list[tuple[str, str]]
    if p.is_file():
        files = [(p.name, str(p))]
    elif p.is_dir():
        found: list[tuple[tuple[str, ...], str]] = []
        _walk(str(p), (), found)
        files = [("/".join(parts), f) for parts, f in sorted(found)]
    else:
        files = [(f.name, str(f)) for f in sorted(Path(f) for f in glob.glob(str(p), recursive=True)
                                                  if Path(f).is_file())]
    if suffixes is not None:
        files = [(name, f) for name, f in files if os.path.basename(f).endswith(suffixes)]
    if not files:
        raise FileNotFoundError(f"{path}: no such file, directory or matching files")
    return files


def _walk(folder: str, parts: tuple[str, ...], out: list[tuple[tuple[str, ...], str]]) -> None:
    """(parts relative to the top folder, path) of every file under ``folder`` that
    ``Path.rglob("*")`` with ``is_file`` finds, into ``out``: a symlink to a file is one, a
    symlinked folder is not entered, a folder that cannot be read is skipped; hidden entries
    (a name starting with ``.``) are left out, and nothing under a hidden folder."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except PermissionError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            _walk(entry.path, (*parts, entry.name), out)
        elif _is_file(entry):
            out.append(((*parts, entry.name), entry.path))


def _is_file(entry: os.DirEntry[str]) -> bool:
    """``Path.is_file`` of an entry: a symlink that loops or passes through a file is no file,
    as a missing target is (``DirEntry.is_file`` raises for those two)."""
    try:
        return entry.is_file()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise


def _hashed(path: str) -> tuple[int, str]:
    """(size, xxh3-128 hex digest) of one file's bytes, memoised on one ``stat`` of it (see the
    module docstring)."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _memo.get(key)
    if hit is not None:
        return st.st_size, hit
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    _memo[key] = digest
    return st.st_size, digest


def fingerprint(path: str, suffixes: tuple[str, ...] | None = None) -> str:
    """16 hex chars identifying the content of everything ``path`` names (see ``expand``).

    Names are taken relative to the directory given (or the file name alone), so moving a
    model folder elsewhere keeps its fingerprint; renaming a file inside it does not.
    """
    h = xxhash.xxh3_128()
    for name, f in _named(path, suffixes):
        size, digest = _hashed(f)
        h.update(f"{name}\0{size}\0{digest}\n".encode())
    return h.hexdigest()[:16]
