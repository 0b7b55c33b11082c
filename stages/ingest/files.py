"""The input files of a source: which files, in which format and compression, and their identity.

Every file under a source URL is read or refused: a file whose name says JSONL or Parquet (with
any compression fsspec can stream: ``.gz``, ``.bz2``, ``.xz``, ``.lz4``, ``.zst``) is an input;
any other file is a one-line ``UnsupportedFileError`` naming it. Only hidden and bookkeeping
files (a path segment starting with ``.`` or ``_``: ``_SUCCESS``, ``.crc`` checksums, Spark's
``_temporary/``) are passed over, and the report names them.

A file's identity (``stamp``) sees every change: on a local disk its size, mtime and ctime in
nanoseconds and its inode (a rewrite with the same size and mtime, as ``cp -p`` or ``rsync -a``
make, changes ctime or inode); on object storage the version id, ETag, generation or checksum
the store reports (s3fs ``ETag``/``VersionId``, gcsfs ``generation``/``md5Hash``, adlfs ``etag``,
HTTP ``ETag``/``Content-MD5``/``Digest``); where a store reports none of these, a hash of the
content.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import orjson
import xxhash

from stages.ingest.streams import READ_BLOCK, open_tracked, retrying, store_call
from stages.params import RawDocumentsParams
from stages.store import held_within, is_local

Format = Literal["jsonl", "parquet"]
# suffix -> fsspec compression name; zstd is read by stages.ingest.streams (every frame)
COMPRESSIONS: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".lz4": "lz4", ".zst": "zstd",
                                ".zstd": "zstd"}
FORMATS: dict[str, Format] = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                              ".pq": "parquet"}
# Keys of fsspec ``info()`` that change whenever an object's content changes, across stores.
_CONTENT_KEYS = ("VersionId", "version_id", "generation", "ETag", "etag", "md5Hash", "crc32c", "Content-MD5",
                 "content_md5", "Digest")


class NoInputError(FileNotFoundError):
    """The source URL matches no input file."""


class UnsupportedFileError(ValueError):
    """A file under a source URL that is neither JSONL nor Parquet (or compressed in a way that
    cannot be streamed): refused in one line, never skipped in silence."""


@dataclass(frozen=True)
class InputFile:
    """One input file. ``name``: its path relative to the source URL (what locators and messages
    show); ``compression``: an fsspec compression name or None."""

    path: str
    name: str
    size: int
    format: Format
    compression: str | None
    info: tuple[tuple[str, str], ...] = ()  # the store's content-identity fields (see stamp())


def classify(name: str, declared: str = "auto") -> tuple[Format, str | None]:
    """(format, compression) of a file name; ``declared`` (jsonl/parquet) overrides the format
    suffix. Raises UnsupportedFileError for anything else."""
    lower = name.lower()
    stem, dot, suffix = lower.rpartition(".")
    compression = COMPRESSIONS.get(f".{suffix}") if dot else None
    base = stem if compression else lower
    fmt: Format | None = FORMATS.get("." + base.rpartition(".")[2]) if "." in base else None
    if declared != "auto":
        fmt = "jsonl" if declared == "jsonl" else "parquet"
    if fmt is None:
        known = ", ".join(sorted(FORMATS)) + " (optionally + " + ", ".join(sorted(COMPRESSIONS)) + ")"
        raise UnsupportedFileError(f"{name}: neither JSONL nor Parquet by its name (known: {known}); "
                                   "move it out of the source, or narrow the source URL with a glob")
    if fmt == "parquet" and compression:
        raise UnsupportedFileError(f"{name}: a compressed Parquet file cannot be read in place "
                                   "(Parquet compresses inside); decompress it")
    if compression == "lz4":
        try:
            import lz4.frame  # noqa: F401  fsspec registers its lz4 codec only when this imports
        except ImportError as exc:
            raise UnsupportedFileError(f"{name}: .lz4 needs the package lz4 (pip install lz4)") from exc
    return fmt, compression


def _hidden(rel: str) -> bool:
    return any(seg.startswith((".", "_")) for seg in rel.split("/") if seg)


def _base_of(path: str) -> str:
    """The folder a glob's matches are named relative to: its part before the first wildcard."""
    head = path
    for ch in "*?[":
        head = head.split(ch, 1)[0]
    return head.rsplit("/", 1)[0] if "/" in head else ""


def _not_a_file(path: str, rel: str, info: dict[str, Any]) -> str | None:
    """Why the entry ``path`` (listed as neither file nor directory) is not an input file, in one
    line: a symbolic link loop, a link to nothing, a link to a folder (not followed), a FIFO...;
    None for a link to a regular file (read as that file)."""
    import stat

    if info.get("islink"):
        try:
            target = os.path.realpath(path, strict=True)
        except OSError as exc:  # ELOOP: links that point at each other; ENOENT: at nothing
            if getattr(exc, "errno", None) == errno.ELOOP:
                return f"{rel}: a symbolic link loop ({os.readlink(path)!r} leads back to itself); remove the link"
            return f"{rel}: a symbolic link to nothing ({os.readlink(path)!r}); remove the link"
        if os.path.isdir(target):
            here = os.path.realpath(os.path.dirname(path))
            if here == target or here.startswith(target.rstrip("/") + "/"):
                return (f"{rel}: a symbolic link loop (a link to {target}, a folder that contains the link); "
                        "remove the link")
            return (f"{rel}: a symbolic link to the folder {target}, which a listing does not follow; give "
                    "that folder as a source of its own, or copy it in")
        if os.path.isfile(target):
            return None
        return f"{rel}: a symbolic link to {target}, not a regular file"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return f"{rel}: not a regular file"
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
    return f"{rel}: {kind}, not an input file; move it out of the source"


Listing = tuple[fsspec.AbstractFileSystem, list[InputFile], list[str]]
# The listings made within ``listings_held``, by (source URL, format).
_LISTINGS: ContextVar[dict[tuple[str, str], Listing] | None] = ContextVar("listings_held", default=None)


def listings_held() -> AbstractContextManager[None]:
    """Within: each source is listed once (``list_files``). A partition's data version
    (``fingerprint``) and its run then name the same files, and ``execute`` makes one listing
    (its requests, on object storage) instead of two. Nothing is held beyond the block."""
    return held_within(_LISTINGS)


def list_files(params: RawDocumentsParams) -> Listing:
    """(filesystem, input files sorted by path, ignored hidden/bookkeeping names) of a source:
    a file, a directory (recursively) or a glob. Within ``listings_held``, listed once: callers
    share the lists, and do not change them."""
    held = _LISTINGS.get()
    key = (params.url, params.format)
    if held is not None and key in held:
        return held[key]
    listing = _list_files(params)
    if held is not None:
        held[key] = listing
    return listing


def _list_files(params: RawDocumentsParams) -> Listing:
    fs, path = fsspec.core.url_to_fs(params.url)
    fs.invalidate_cache()  # s3fs caches listings (sizes, ETags) per instance: a changed file must show
    path = path.rstrip("/") or path
    expanded = True  # a directory or glob: hidden and bookkeeping files are passed over
    if any(ch in path for ch in "*?["):
        found: dict[str, Any] = store_call(lambda: fs.glob(path, detail=True), "source URL")
        base = _base_of(path)
    elif store_call(lambda: fs.isdir(path), "source URL"):
        found = store_call(lambda: fs.find(path, detail=True), "source URL")
        base = path
    elif store_call(lambda: fs.exists(path), "source URL"):
        found = {path: store_call(lambda: fs.info(path), "source URL")}
        base, expanded = path.rsplit("/", 1)[0] if "/" in path else "", False
    else:
        found = {}
        base = ""
    files: list[InputFile] = []
    ignored: list[str] = []
    for p in sorted(found):
        info = found[p]
        if info.get("type") == "directory":
            continue
        rel = p[len(base):].lstrip("/") if base and p.startswith(base) else p.rsplit("/", 1)[-1]
        if expanded and _hidden(rel):
            ignored.append(rel)
            continue
        if info.get("type") not in ("file", None):  # "other": a link listings do not follow, a FIFO, ...
            reason = _not_a_file(p, rel, info)
            if reason is not None:
                raise UnsupportedFileError(reason)
            info = store_call(functools.partial(fs.info, p), "source URL")  # a link to a file: its target's
        fmt, compression = classify(rel, params.format)
        ident = tuple((k, str(info[k])) for k in _CONTENT_KEYS if info.get(k) not in (None, ""))
        files.append(InputFile(p, rel, int(info.get("size") or 0), fmt, compression, ident))
    if not files:
        what = f" (only hidden or bookkeeping files: {', '.join(ignored[:5])})" if ignored else ""
        raise NoInputError(f"source URL {params.url!r} matches no JSONL or Parquet file{what}")
    return fs, files, ignored


def stamp(fs: fsspec.AbstractFileSystem, f: InputFile) -> list[Any]:
    """What identifies the content of ``f``: see the module docstring."""
    if is_local(fs):
        st = os.stat(f.path)
        return [f.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    if f.info:
        return [f.name, f.size, [list(kv) for kv in f.info]]
    return [f.name, f.size, "xxh3:" + content_hash(fs, f.path, f.name)]


def content_hash(fs: fsspec.AbstractFileSystem, path: str, name: str) -> str:
    """xxh3-128 of a file's bytes, read in blocks (for stores that report no content identity)."""
    def read() -> str:
        h = xxhash.xxh3_128()
        with open_tracked(fs, path) as fh:
            while block := fh.read(READ_BLOCK):
                h.update(block)
        return h.hexdigest()

    return retrying(read, name)


def fingerprint(params: RawDocumentsParams) -> str:
    """Identity of a source's input: every file's name and content identity (``stamp``)."""
    fs, files, _ = list_files(params)
    entries = [stamp(fs, f) for f in files]
    return hashlib.sha256(orjson.dumps(entries)).hexdigest()[:16]
