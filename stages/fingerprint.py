"""Content fingerprints of local files that a stage's output depends on (models, benchmark sets).

A model or benchmark file is an input like a parameter: if its content changes, every output
computed from it must be re-keyed, or a rerun would read scores of the old model. The
fingerprint is xxh3-128 over the file names (relative to the path given) and their bytes, so
it changes whenever any byte changes, whatever the mtime says (copies that keep mtimes,
reproducible builds that reset them, same-size retrained checkpoints).

Hashing reads every byte (about 4 GB/s from the page cache, so a 4 GB fastText model costs
about a second the first time). The result is memoised per process on each file's
``(path, size, mtime_ns, ctime_ns, inode)``: the ctime cannot be set by hand and moves on any
write, so an unchanged stat means unchanged bytes, and resolving a crawl repeatedly costs a
``stat`` per file.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import xxhash

_CHUNK = 8 << 20
_memo: dict[tuple[str, int, int, int, int], str] = {}


def expand(path: str, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """The files a path names: the file itself, every file under a directory (recursively,
    sorted, hidden entries skipped) or the matches of a glob. ``suffixes`` keeps only names
    ending in one of them. Raises FileNotFoundError when nothing matches."""
    p = Path(path).expanduser()
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(
            f for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
    else:
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    if suffixes is not None:
        files = [f for f in files if f.name.endswith(suffixes)]
    if not files:
        raise FileNotFoundError(f"{path}: no such file, directory or matching files")
    return files


def file_hash(path: Path) -> str:
    """xxh3-128 hex digest of one file's bytes, memoised on its stat (see module docstring)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    hit = _memo.get(key)
    if hit is not None:
        return hit
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    _memo[key] = digest
    return digest


def fingerprint(path: str, suffixes: tuple[str, ...] | None = None) -> str:
    """16 hex chars identifying the content of everything ``path`` names (see ``expand``).

    Names are taken relative to the directory given (or the file name alone), so moving a
    model folder elsewhere keeps its fingerprint; renaming a file inside it does not.
    """
    files = expand(path, suffixes)
    p = Path(path).expanduser()
    base = p if p.is_dir() else None
    h = xxhash.xxh3_128()
    for f in files:
        name = f.relative_to(base).as_posix() if base is not None else f.name
        h.update(f"{name}\0{os.path.getsize(f)}\0{file_hash(f)}\n".encode())
    return h.hexdigest()[:16]
