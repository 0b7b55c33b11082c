"""Where outputs live and how they are committed: ``<root>/<program>/<params_key>/<crawl>[/<source>]``.

A partition directory holds Parquet parts and a ``_manifest.json`` written last. Readers look
only at the manifest and the files it names, so a killed writer never exposes a half-written
partition, on a local disk or on object storage (which has no atomic rename): parts are written
under fresh attempt-unique names first, and the manifest (one small object, replaced whole) is
the commit. Parts of failed or superseded attempts are deleted after the commit.

On object storage, the manifest's read and write are retried on transient errors (s3fs retries
each request too), and every manifest read bypasses fsspec's listing cache, so another process's
newer commit is never read with a stale size. Storage options (credentials, ``endpoint_url``) are
kept by the filesystem object only: never in a manifest, a path or a log line.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec
import fsspec.config
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from stages.errors import DamagedFile, StageError
from stages.lease import Lease, LeaseBusy, LeaseLost, checks_preconditions, supports_leases
from stages.parallel import arrow_threads
from stages.timing import helper_thread, timed, timed_iter

MANIFEST = "_manifest.json"
# Parquet codecs, measured on raw_documents' parts here (docs/profile.md, "Intermediate parts
# uncompressed on a local disk, ..."): lz4 compresses text at 230-290 MB per CPU-second (0.24-0.26 s for
# 70 MB; 1.2 ms of a 0.35 MB partition's ~7), where writing the parts uncompressed and fsyncing
# their 2.5-3.2x bytes takes 0.10-0.14 s, and they read as fast. So intermediates (written once,
# read by the programs after) are uncompressed on a local data root, lz4 on object storage (bytes
# cross the network); ``ExecutionParams.intermediate_compression`` overrides. A crawl's output
# (curated_documents) is kept and shipped: zstd.
FINAL_COMPRESSION = "zstd"
# Columns with a value per row, or nearly (a record's own id, URL and place in its file): no
# dictionary, no statistics (a dictionary of distinct values is the plain column plus an index
# each, built by hashing every value; no reader filters on them).
UNIQUE_COLUMNS = frozenset({"doc_id", "record_id", "url", "locator"})
# fullmatch, never match with "$": in Python "$" also matches before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


T = TypeVar("T")
# Errors that retrying cannot fix; any other OSError (connection reset, timeout, throttling as
# s3fs reports it after its own retries) is retried by ``retry``.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_TRANSIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests")


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: a non-permanent OSError, or a network error of the HTTP stack."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError):
        return True
    return type(exc).__module__.split(".")[0] in _TRANSIENT_MODULES and any(
        word in type(exc).__name__ for word in ("Connection", "Timeout", "ReadError", "Throttl")
    )


def retry(fn: Callable[[], T], attempts: int = 5, delay: float = 0.2) -> T:
    """``fn()``, retried with exponential back-off (``delay``, 2x, 4x, ...) on transient errors."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            time.sleep(delay * 2**attempt)
    raise AssertionError("unreachable")


def protocols(fs: fsspec.AbstractFileSystem | type[fsspec.AbstractFileSystem]) -> tuple[str, ...]:
    """The protocols an fsspec filesystem (or its class) answers to: ``("file", "local")``, ``("s3", "s3a")``."""
    return tuple(fs.protocol) if isinstance(fs.protocol, tuple | list) else (fs.protocol,)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether fsspec filesystem ``fs`` is this machine's own: its paths are the OS's."""
    return bool({"file", "local"} & set(protocols(fs)))


def use_storage_options(url: str, options: dict[str, Any] | None) -> None:
    """Make ``options`` this process's fsspec defaults for ``url``'s protocol (``s3``, ``gcs``,
    ...), so every URL of that protocol (source URLs included) opens with them; explicit
    options still win. Ray tasks of ``stages.parallel`` receive the same defaults."""
    if not options:
        return
    cls = fsspec.get_filesystem_class(fsspec.core.split_protocol(url)[0] or "file")
    for protocol in protocols(cls):
        fsspec.config.conf.setdefault(protocol, {}).update(options)


class UnsafeNameError(ValueError):
    """A source or crawl name that could escape the data root or is not portable."""


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a safe path segment (letters, digits, ``._-``; no ``..``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise UnsafeNameError(
            f"invalid {kind} name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


# The manifests read within ``manifests_held`` (``Store.read_manifest``), by URL; None where none
# is committed. One partition's run and description read its inputs' manifests many times over (a
# source stage's partition 6-22 reads, removal_ledger 2,766 at 200 sources; 40 us each), and its
# inputs' committed manifests do not change under it. Read again: one whose partition this
# process takes or gives back (a ``PartitionWriter``, which commits it, or a score cache other
# attempts save while it runs).
_MANIFESTS: ContextVar[dict[str, Manifest | None] | None] = ContextVar("manifests_held", default=None)


@contextmanager
def held_within(var: ContextVar[Any]) -> Iterator[None]:
    """Within: ``var`` holds a dict, a memo for the block (``manifests_held``,
    ``stages.spec.keys_held``): a fresh one, or in a block within another the outer one's.
    Nothing is held beyond the outermost block."""
    if var.get() is not None:
        yield
        return
    token = var.set({})
    try:
        yield
    finally:
        var.reset(token)


def manifests_held() -> AbstractContextManager[None]:
    """Within: each manifest is read once (``Store.read_manifest``); nothing is held beyond the
    block (another process may commit a partition between two blocks). A block within another
    holds the outer one's."""
    return held_within(_MANIFESTS)


class PublishFailed(StageError):
    """Publishing a ``commits_together`` block's commits failed: ``unpublished``, the manifests
    of the partitions not published, those not renamed (each keeps what was committed before),
    or all of them where the folders' sync after the renames failed."""

    def __init__(self, message: str, unpublished: list[Manifest]) -> None:
        super().__init__(message)
        self.unpublished = unpublished


class _Group:
    """Partition commits of this process staged for one durability point (``commits_together``):
    each staged commit's parts and manifest temporary written, not yet synced or renamed; its
    writer still holds the partition. ``fd``: the data root, opened before anything was staged,
    for ``syncfs`` (None: an fsync each; ``_syncfs_root``)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.staged: list[tuple[PartitionWriter, str, Manifest]] = []  # a writer, its temporary, its manifest
        self.manifests: dict[str, Manifest] = {}  # by URL: what this process reads until published

    def publish(self) -> None:
        """Every staged commit, in the order ``PartitionWriter.commit`` keeps: the parts, their
        names and the manifest temporaries durable, then each manifest renamed into place, then
        the renames durable; then, all of it done, each partition's unnamed parts removed (best
        effort, as on object storage: its next commit removes what is left) and every partition
        given back. A partition not renamed (``PublishFailed``, a killed process) keeps what was
        committed before: its temporary and parts are leftovers its next attempt removes."""
        staged, self.staged = self.staged, []
        renamed = 0
        whole = False
        try:
            if staged:
                folders = sorted({w.pdir for w, _, _ in staged})
                parts = [f"{w.pdir}/{n}" for w, _, _ in staged for names in w.tables.values() for n in names]
                _sync([*parts, *folders, *(tmp for _, tmp, _ in staged)], self.fd)
                for writer, tmp, _ in staged:
                    os.replace(tmp, f"{writer.pdir}/{MANIFEST}")
                    renamed += 1
                _sync(folders, self.fd)
            whole = True
        except OSError as exc:
            # Renamed but not made durable (the folders' sync failed): not published either, as a
            # single commit whose folder's fsync fails.
            raise PublishFailed(f"publishing {len(staged)} partitions' commits: {exc}",
                                [m for _, _, m in (staged if renamed == len(staged) else staged[renamed:])]
                                ) from exc
        finally:
            self.manifests.clear()
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            for writer, _, _ in staged:
                writer._staged = False
                try:
                    if whole:
                        with suppress(OSError):
                            writer._remove_unnamed()
                finally:
                    with suppress(OSError):  # every writer gives its partition back
                        writer.close()


# Filesystems whose syncfs writes back and commits everything an fsync of each file would, and
# reports a write error since the descriptor was opened (Linux 5.8 and later): ext4, XFS, Btrfs,
# F2FS, tmpfs (nothing to write back). Not FUSE (the server may not get it), overlayfs (the
# upper layer's errors), network filesystems: an fsync each there.
_SYNCFS_FILESYSTEMS = {0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994}


@functools.cache
def _libc() -> Any:
    """The C library, with ``syncfs`` and ``fstatfs``; None where it has none, or where the kernel
    is older than 5.8 (before, ``syncfs`` reported no write error; an fsync of each file does)."""
    import ctypes

    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if os.uname().sysname != "Linux" or release is None or (int(release[1]), int(release[2])) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "syncfs") and hasattr(libc, "fstatfs") else None
    except OSError:
        return None


def _syncfs_root(path: str) -> int | None:
    """``path`` opened for ``syncfs`` where its filesystem syncs as an fsync of each file would
    (``_libc``, ``_SYNCFS_FILESYSTEMS``), else None (an fsync each)."""
    import ctypes

    libc = _libc()
    if libc is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no data root yet
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type first, a C long
    if libc.fstatfs(fd, buf) == 0 and ctypes.c_long.from_buffer(buf).value in _SYNCFS_FILESYSTEMS:
        return fd
    os.close(fd)
    return None


def _sync(paths: list[str], fd: int | None) -> None:
    """Local ``paths`` (files, folders) durable: those on the filesystem of ``fd`` (``_syncfs_root``)
    with one ``syncfs`` (one journal commit for them all, where an fsync costs one each: ~1 ms here
    when the workers write side by side; it reports a write error of that filesystem since ``fd``
    was opened), any other with an fsync each, as all of them where ``fd`` is None."""
    import ctypes

    rest = paths
    if fd is not None:
        if _libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}")
        dev = os.fstat(fd).st_dev
        rest = [path for path in paths if os.stat(path).st_dev != dev]
    for path in rest:
        _fsync_path(path)


_GROUP: ContextVar[_Group | None] = ContextVar("commits_together", default=None)


@contextmanager
def commits_together(store: Store) -> Iterator[_Group | None]:
    """Within: the commits of a local data root's partitions that ask for it
    (``PartitionWriter.commit(together=True)``, as ``stages.execute`` does) are published together
    at the block's end, so a pack of small partitions pays for one durability point, not one per
    partition (a part's and a manifest's fsync is ~1 ms each here, most of a small partition's
    commit). Until then each partition stays held by its writer and its manifest is read here as
    staged; elsewhere, the committed state before the block. Published even when the block
    raises (its error is raised, not one publishing); an error publishing raises
    ``PublishFailed`` at its end. Object storage, and a block within another: each commit as it
    comes (yields None)."""
    if not store.is_local or _GROUP.get() is not None:
        yield None
        return
    # The data root opened before anything is staged: its syncfs reports any write error since.
    group = _Group(_syncfs_root(store.root))
    token = _GROUP.set(group)
    try:
        yield group
    except BaseException:
        _GROUP.reset(token)
        with suppress(PublishFailed):  # the block's own error is the one told
            group.publish()
        raise
    _GROUP.reset(token)
    group.publish()


@dataclass
class Manifest:
    """What a committed partition holds. ``tables`` maps a table name to its part files."""

    program: str
    params_key: str
    data_version: str
    crawl: str
    source: str | None
    params: dict[str, Any]
    tables: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    # Bytes of each part file at commit (part name -> size): ``Store.is_whole`` compares them with
    # one listing of the partition, so a deleted or truncated part is recomputed, never served.
    # Empty in manifests written before sizes were recorded (then only presence is checked).
    sizes: dict[str, int] = field(default_factory=dict)
    # The schema of each table with no rows (Arrow IPC, base64): such a table has no part file
    # (``PartitionWriter.write``). Most removal lists are empty: at 200 sources, 1,405 of a
    # fuzzy-only crawl's 2,237 parts were (switched-off stages ran then), each a Parquet write
    # and an fsync. Empty in manifests written before: their empty tables have a part.
    schemas: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        # No ``schemas`` where no table is empty: earlier versions refuse a field they do not know
        # (a damaged manifest), so only manifests that need it carry it.
        fields = {k: v for k, v in self.__dict__.items() if k != "schemas" or v}
        # orjson: the json module indents in Python (0.1 ms a manifest, every partition's commit).
        # Where orjson would not write the same values (a NaN or an infinity, written as null;
        # keys that are not strings, refused), the json module writes them.
        try:
            blob = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
            if orjson.loads(blob) == fields:
                return blob.decode()
        except TypeError:
            pass
        return json.dumps(fields, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, blob: str, path: str = MANIFEST) -> Manifest:
        """The manifest in ``blob``; anything else (truncated, not JSON, fields missing or of
        another type) is a ``DamagedFile`` naming ``path``."""
        try:
            data = json.loads(blob)
        except ValueError as exc:
            raise DamagedFile(path, "manifest", f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise DamagedFile(path, "manifest", f"a JSON {type(data).__name__}, not an object")
        missing = [f for f in _MANIFEST_FIELDS if f not in data]
        unknown = sorted(set(data) - set(_MANIFEST_TYPES))
        if missing or unknown:
            raise DamagedFile(path, "manifest", f"fields missing: {', '.join(missing) or '-'}; unknown: "
                                                 f"{', '.join(unknown) or '-'}")
        wrong = [k for k, v in data.items() if not isinstance(v, _MANIFEST_TYPES[k])]
        tables, sizes = data.get("tables", {}), data.get("sizes", {})
        if not wrong and not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in tables.values()):
            wrong.append("tables")
        if not wrong and not all(isinstance(v, int) for v in (*data.get("rows", {}).values(), *sizes.values())):
            wrong.append("rows/sizes")
        if not wrong and not all(isinstance(v, str) for v in data.get("schemas", {}).values()):
            wrong.append("schemas")
        if wrong:
            raise DamagedFile(path, "manifest", f"fields of the wrong type: {', '.join(wrong)}")
        manifest = cls(**data)
        for table in manifest.schemas:
            try:
                manifest.schema(table)
            except (ValueError, binascii.Error, pa.ArrowException) as exc:
                raise DamagedFile(path, "manifest", f"the schema of table {table!r} is not an Arrow schema "
                                                     f"({exc})") from None
        return manifest

    def parts(self) -> list[str]:
        """Every part file the manifest names, in table order."""
        return [name for names in self.tables.values() for name in names]

    def schema(self, table: str) -> pa.Schema | None:
        """The schema of ``table`` where it has no part (no rows), else None."""
        text = self.schemas.get(table)
        return None if text is None else _decoded_schema(text)


@functools.lru_cache(maxsize=256)
def _decoded_schema(text: str) -> pa.Schema:
    """A manifest's schema text decoded (immutable; a crawl's manifests hold a few distinct
    ones, and each manifest read checks its own: 0.4 ms a partition at 200 sources otherwise)."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))


def encode_schema(schema: pa.Schema) -> str:
    """``schema`` as a manifest holds it (``Manifest.schemas``)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


# A manifest's fields and the JSON types they must have (source is null for a crawl-level output).
_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "program": str, "params_key": str, "data_version": str, "crawl": str, "source": (str, type(None)),
    "params": dict, "tables": dict, "rows": dict, "report": dict, "sizes": dict, "schemas": dict,
}
_MANIFEST_FIELDS = ("program", "params_key", "data_version", "crawl", "source", "params")


# A manifest's text, parsed once in this process (30 us a parse): a text read again, from the same
# URL, is the same object (read-only, as within ``manifests_held``). Outside that block too: a
# fuzzy-only crawl of 200 sources reads its 1,408 manifests 8,614 times to derive data versions,
# from partitions of every step. The text itself is always read (another process may have
# committed the partition since): a new text is parsed. 4,096 at most, some 27 MB at the 6.7 KB a
# manifest and its text take at 200 sources; past that the least recently read goes.
@functools.lru_cache(maxsize=4096)
def _parsed(blob: str, url: str) -> Manifest:
    """``Manifest.from_json(blob, url)``; a damaged one raises, and is not kept."""
    return Manifest.from_json(blob, url)


class Store:
    """The data root, on any fsspec filesystem (local folder, ``s3://bucket/prefix``, ...)."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        from stages.credentials import check_url

        self.fs, path = fsspec.core.url_to_fs(check_url("data root", root), **(storage_options or {}))
        self.root = path.rstrip("/")
        self.is_local = is_local(self.fs)

    def partition_dir(self, program: str, key: str, crawl: str, source: str | None = None) -> str:
        parts = [self.root, program, key, check_name("crawl", crawl)]
        if source is not None:
            parts.append(check_name("source", source))
        return "/".join(parts)

    def read_manifest(self, pdir: str) -> Manifest | None:
        """The partition's committed manifest, None when there is none; a damaged one is a
        ``DamagedFile`` naming it. Within ``manifests_held``, each is read once. The object is
        shared with every other reader of the same text in this process (``_parsed``): read-only
        (``dataclasses.replace`` makes another)."""
        path = f"{pdir}/{MANIFEST}"
        url = self.url(path)
        group = _GROUP.get()
        if group is not None and url in group.manifests:  # committed by this process, published soon
            return group.manifests[url]
        held = _MANIFESTS.get()
        if held is not None and url in held:
            return held[url]
        blob = self.read_text(path)
        manifest = None if blob is None else _parsed(blob, url)
        if held is not None:
            held[url] = manifest
        return manifest

    def forget_manifest(self, pdir: str) -> None:
        """Read the partition's manifest again when next asked (``manifests_held``)."""
        held = _MANIFESTS.get()
        if held is not None:
            held.pop(self.url(f"{pdir}/{MANIFEST}"), None)

    def url(self, path: str) -> str:
        """``path`` as its user knows it: the local path, else with its protocol (``s3://...``)."""
        return path if self.is_local else str(self.fs.unstrip_protocol(path))

    def damaged_parts(self, pdir: str, manifest: Manifest) -> list[str]:
        """The parts ``manifest`` names that are missing from ``pdir`` or not of the size recorded
        at commit, from one listing of the partition (a LIST request on object storage)."""
        names = manifest.parts()
        if not names:
            return []
        try:
            found = self.sizes(pdir)
        except FileNotFoundError:
            return names
        return [n for n in names if n not in found or (n in manifest.sizes and found[n] != manifest.sizes[n])]

    def sizes(self, folder: str) -> dict[str, int | None]:
        """Each entry of ``folder`` by name: its bytes (None for a folder, or an entry that cannot
        be read), from one listing, never a cached one (a LIST request on object storage; another
        process may have changed it since). ``FileNotFoundError`` where there is no such folder.
        Locally ``os.scandir``: fsspec's listing cost a partition's commit and its planner's
        check 0.1-0.2 ms each, at every partition."""
        if self.is_local:
            found: dict[str, int | None] = {}
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        found[entry.name] = None if entry.is_dir() else entry.stat().st_size
                    except OSError:  # gone since it was listed, a link to nothing
                        found[entry.name] = None
            return found
        self.fs.invalidate_cache(folder)
        listing = retry(lambda: self.fs.ls(folder, detail=True))
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: (None if e.get("type") == "directory" else e.get("size"))
                for e in listing}

    def is_whole(self, pdir: str, manifest: Manifest) -> bool:
        """Every part ``manifest`` names is in ``pdir`` at the size recorded at commit: what the
        planner asks before it serves a committed partition as current."""
        return not self.damaged_parts(pdir, manifest)

    def check_whole(self, pdir: str, manifest: Manifest) -> Manifest:
        """``manifest`` when every part it names is whole (``is_whole``), else ``DamagedFile``
        naming the first part that is not: what a command that shows a committed partition (its
        report included) asks first, so that a damaged one is never served as if it were whole."""
        damaged = self.damaged_parts(pdir, manifest)
        if damaged:
            raise DamagedFile(self.url(f"{pdir}/{damaged[0]}"), "part file",
                              f"missing or not the size it was committed at ({len(damaged)} of "
                              f"{len(manifest.parts())} parts); `curate run` recomputes its partition")
        return manifest

    def current_manifest(self, pdir: str, version: str | Callable[[], str]) -> Manifest | None:
        """The partition's manifest when it is committed for data version ``version`` and whole
        (``is_whole``), else None: the partition is to be computed (again). ``version`` may be
        the function that gives it, called only where a manifest is committed: a data version
        reads every input's manifest, and in a crawl's first run no partition has one."""
        manifest = self.read_manifest(pdir)
        if manifest is None:
            return None
        if callable(version):
            version = version()
        if manifest.data_version != version or not self.is_whole(pdir, manifest):
            return None
        return manifest

    def remove_entries(self, folder: str, keep: Callable[[str], bool]) -> list[str]:
        """Remove every entry of ``folder`` whose name ``keep`` refuses (a folder with what it
        holds; a link itself, not what it points to); the names removed, sorted. Locally by
        ``os.scandir`` (fsspec's listing and removal cost a commit 0.1-0.2 ms), an error raised. On
        object storage each removal is retried and one that keeps failing passed over (the next
        commit's clean-up removes it); a folder that is not there has nothing to remove."""
        removed: list[str] = []
        if self.is_local:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if not keep(entry.name):
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path)
                        else:
                            os.unlink(entry.path)
                        removed.append(entry.name)
            return sorted(removed)
        self.fs.invalidate_cache(folder)
        try:
            paths = self.fs.ls(folder, detail=False)
        except FileNotFoundError:  # object storage has no empty folders
            return []
        try:
            for path in paths:
                name = path.rstrip("/").rsplit("/", 1)[-1]
                if not keep(name):
                    try:
                        retry(lambda p=path: self.fs.rm(p, recursive=True))  # type: ignore[misc]
                    except OSError:
                        continue
                    removed.append(name)
        finally:
            self.fs.invalidate_cache(folder)
        return sorted(removed)

    def read_text(self, path: str) -> str | None:
        """A small object's text (a manifest, a crawl record), or None when it does not exist.
        On object storage: retried on transient errors, and never read at the size a cached
        listing holds (another process may have replaced it)."""
        def read() -> str | None:
            if not self.is_local:
                self.fs.invalidate_cache(path.rsplit("/", 1)[0])
            try:
                if self.is_local:  # the built-in open: fsspec's costs 2-3x more, paid per manifest
                    with open(path, encoding="utf-8") as fh:
                        return fh.read()
                with self.fs.open(path, "r", encoding="utf-8") as fh:
                    return str(fh.read())
            except FileNotFoundError:
                return None
            except UnicodeDecodeError as exc:  # not a file this project wrote (all of them are UTF-8)
                raise DamagedFile(self.url(path), "file", f"not UTF-8 text ({exc})") from None

        with timed("read"):  # a partition's profile counts its manifest reads (stages.timing)
            return read() if self.is_local else retry(read)

    def write_atomic(self, path: str, text: str) -> None:
        """Replace ``path`` whole, so a reader sees the old text or the new: locally a temporary
        ``.<name>.<random>`` beside it, fsynced, then renamed; on object storage one PUT (no rename
        there; one PUT replaces an object whole), retried: the same bytes again."""
        folder, name = path.rsplit("/", 1)
        if self.is_local:
            os.makedirs(folder, exist_ok=True)
            tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _fsync_dir(folder)  # the rename itself
            return

        def put() -> None:
            with self.fs.open(path, "w", encoding="utf-8") as fh:
                fh.write(text)

        retry(put)
        self.fs.invalidate_cache(folder)

    def read_table(self, pdir: str, table: str, columns: list[str] | None = None,
                   manifest: Manifest | None = None) -> pa.Table:
        """All rows of one committed table, an empty one with its schema (``manifest``: the
        partition's committed one, where the caller has read it; else read here)."""
        manifest = manifest if manifest is not None else self.read_manifest(pdir)
        if manifest is None:
            raise FileNotFoundError(f"no committed output at {pdir} (its upstream has not run)")
        return self.read_parts(pdir, manifest.tables.get(table, []), columns, manifest.schema(table))

    def iter_batches(
        self, pdir: str, table: str, columns: list[str] | None = None, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        """Stream one committed table in record batches: memory bounded by ``batch_rows``."""
        manifest = self.read_manifest(pdir)
        if manifest is None:
            raise FileNotFoundError(f"no committed output at {pdir}")
        for name in manifest.tables.get(table, []):
            yield from self.part_batches(f"{pdir}/{name}", columns, batch_rows)

    def part_batches(self, path: str, columns: list[str] | None = None,
                     batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
        """One part file's rows in record batches of at most ``batch_rows``."""
        with self._part(path), self.open_read(path) as fh:
            yield from timed_iter(self._batches(pq.ParquetFile(fh), columns, batch_rows))

    def iter_blocks(self, pdirs: Iterable[str], table: str, columns: list[str] | None = None,
                    batch_rows: int = 20_000) -> Iterator[pa.Table]:
        """One committed table of every partition in ``pdirs``, in their order, in blocks of at
        most ``batch_rows`` rows that span partitions (a longer batch alone; a block ends where
        the schema changes): a scan of many small sources processes a few blocks, not a batch
        per source, whose fixed cost was most of a crawl-wide gather's time at 200 sources.
        The next block is read on a helper thread while the caller works on this one
        (``read_ahead``). Memory: two blocks and one batch. The blocks' columns are chunked (no
        copy)."""

        def blocks() -> Iterator[pa.Table]:
            held: list[pa.RecordBatch] = []
            rows = 0
            for pdir in pdirs:
                for batch in self.iter_batches(pdir, table, columns, batch_rows):
                    if held and (rows + batch.num_rows > batch_rows or batch.schema != held[0].schema):
                        yield pa.Table.from_batches(held)
                        held, rows = [], 0
                    held.append(batch)
                    rows += batch.num_rows
            if held:
                yield pa.Table.from_batches(held)

        yield from read_ahead(blocks())

    @staticmethod
    def _batches(part: pq.ParquetFile, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """A part's rows in batches of at most ``batch_rows``; a part no longer than that read
        whole: the batch reader's set-up costs more than the read of a small part's columns (0.44
        against 0.37 ms a part at 200 sources of 79 documents, both through fsspec's ``open``),
        paid by every program for every source it reads."""
        if part.metadata.num_rows > batch_rows:
            yield from part.iter_batches(batch_size=batch_rows, columns=columns, use_threads=arrow_threads())
            return
        yield from part.read(columns=columns, use_threads=arrow_threads()).to_batches()

    def open_read(self, path: str) -> Any:
        """A part file opened for reading: locally with the built-in ``open`` (fsspec's cost 0.1
        ms more a file: 0.37 against 0.26 ms a small part's read, paid per part read)."""
        return open(path, "rb") if self.is_local else self.fs.open(path, "rb")

    @contextmanager
    def _part(self, path: str) -> Iterator[None]:
        """A part file that is gone or not Parquet (deleted, truncated, overwritten after its
        commit) is a ``DamagedFile`` naming it; the planner recomputes such a partition."""
        try:
            yield
        except FileNotFoundError:
            raise DamagedFile(self.url(path), "part file", "missing; `curate run` recomputes its partition") from None
        except pa.ArrowInvalid as exc:
            raise DamagedFile(self.url(path), "part file", f"not whole Parquet ({exc}); `curate run` recomputes "
                                                            "its partition") from None

    def read_parts(self, pdir: str, names: list[str], columns: list[str] | None = None,
                   schema: pa.Schema | None = None) -> pa.Table:
        """The rows of the part files ``names`` of ``pdir``, committed or not: for a writer's own
        parts (``PartitionWriter.read``, a task reading some of its attempt's parts); committed
        tables are read by name with ``read_table``. No names: ``schema``'s empty table (an empty
        table's, ``Manifest.schema``), else a table with no columns."""
        if not names and schema is not None:  # the columns it has, as a Parquet file's read gives them
            empty = schema.empty_table()
            return empty.select([c for c in columns if c in schema.names]) if columns is not None else empty
        tables = []
        with timed("read") as clock:
            for name in names:
                with self._part(f"{pdir}/{name}"), self.open_read(f"{pdir}/{name}") as fh:
                    # ParquetFile.read, not pq.read_table: read_table's dataset scanner drops its
                    # read-ahead state (holding buffers of this Python file) on an Arrow I/O thread
                    # after it returns; at interpreter exit that thread's wait for the GIL ends in
                    # std::terminate (exit 134: issue 30). Rarer this way, not gone: processes end
                    # through stages.parallel.exit_process, without the teardown.
                    tables.append(pq.ParquetFile(fh).read(columns=columns, use_threads=arrow_threads()))
            if clock is not None:
                clock.read_bytes += sum(t.nbytes for t in tables)
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def writer(self, pdir: str, compression: str = "auto") -> PartitionWriter:
        """A writer of partition ``pdir``, its parts in ``compression`` (``intermediate_compression``)."""
        return PartitionWriter(self, pdir, compression)


def read_ahead(items: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``items``, each made on a helper thread while the caller works on the one before (a
    crawl-wide scan of 200 sources: Arrow's reads and the caller's lookups, both mostly outside
    the GIL, on two cores); the caller's waits count as its reads (``stages.timing``)."""
    end = pa.table({})  # a sentinel no block is
    with helper_thread("read-ahead") as submit:
        pending = submit(next, items, end)
        while True:
            with timed("read") as clock:
                item = pending.result()
                if item is not end and clock is not None:
                    clock.read_bytes += item.nbytes
            if item is end:
                return
            pending = submit(next, items, end)
            yield item


def _fsync_dir(folder: str) -> None:
    """Make a local folder's entries (new names, a rename) durable."""
    _fsync_path(folder)


def _fsync_path(path: str) -> None:
    """fsync a local file or folder by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartitionBusy(StageError):
    """Another attempt is writing the same partition right now."""


# Partition-lock descriptors this process holds. A forked child (a pool worker) inherits them, and
# a flock is dropped only when every descriptor of it is closed, so a worker orphaned by a killed
# attempt would keep that partition locked for the retry. A child closes its copies at once.
_HELD_LOCKS: set[int] = set()


def _release_fd(fd: int) -> None:
    """Close a partition lock's descriptor of this process."""
    _HELD_LOCKS.discard(fd)
    os.close(fd)


def _close_inherited_locks() -> None:
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


class _Written:
    """What this process wrote to its latest part files, by path: each part's Arrow schema and its
    ``doc_id`` column as given to the writer. A partition described where it ran (a pool worker,
    ``curation_dagster.run.partition``) takes its main table's schema and its doc_ids from here,
    not back from the file it has just committed: at 200 sources that read was 0.2 ms a part for
    the footer and 0.35 ms for the ids, for each partition of three programs. Bounded: the latest
    ``PARTS`` parts, their ids within ``ID_BYTES`` of buffers (a slice holds its whole buffers;
    older ids are dropped first). Held only as a read would give it back: a schema of flat columns
    (``_round_trips``: Parquet names a list's item field otherwise); a part not held is read from
    its file, as any other process reads it. A part's name holds its attempt's id, so a path names
    one write: what is held for it is what was written there (``_unchanged``: still there)."""

    PARTS = 64
    ID_BYTES = 16 << 20

    def __init__(self) -> None:
        self.schemas: OrderedDict[str, pa.Schema | None] = OrderedDict()
        self.ids: OrderedDict[str, pa.ChunkedArray] = OrderedDict()
        self.id_bytes = 0
        self.lock = threading.Lock()  # a program's threads write parts side by side (lsh_buckets' groups)

    def forked(self) -> None:
        """In a forked child: a lock of its own (the parent's may have been held at the fork)."""
        self.lock = threading.Lock()

    def add(self, path: str, data: pa.Table) -> None:
        ids = data.column("doc_id") if "doc_id" in data.schema.names else None
        schema = data.schema if all(_round_trips(f.type) for f in data.schema) else None
        with self.lock:
            self.schemas[path] = schema
            while len(self.schemas) > self.PARTS:
                self._forget_ids(next(iter(self.schemas)))
                self.schemas.popitem(last=False)
            if ids is not None and ids.get_total_buffer_size() <= self.ID_BYTES:
                self.ids[path] = ids
                self.id_bytes += ids.get_total_buffer_size()
                while self.id_bytes > self.ID_BYTES:
                    self._forget_ids(next(iter(self.ids)))

    def _forget_ids(self, path: str) -> None:
        ids = self.ids.pop(path, None)
        if ids is not None:
            self.id_bytes -= ids.get_total_buffer_size()

    def get(self, held: OrderedDict[str, Any], store: Store, path: str, size: int | None) -> Any:
        """What ``held`` (``schemas`` or ``ids``) has for part file ``path`` (``size``: its bytes
        at commit), where the part is still as committed (``_unchanged``), else None."""
        with self.lock:
            value = held.get(path)
        return value if value is not None and _unchanged(store, path, size) else None


def _round_trips(kind: pa.DataType) -> bool:
    """Whether a Parquet file gives a column of ``kind`` back as ``kind``: strings, binaries,
    integers, float32/64 and booleans."""
    t = pa.types
    return bool(t.is_string(kind) or t.is_large_string(kind) or t.is_binary(kind) or t.is_large_binary(kind)
                or t.is_fixed_size_binary(kind) or t.is_integer(kind) or t.is_float32(kind)
                or t.is_float64(kind) or t.is_boolean(kind))


_WRITTEN = _Written()
os.register_at_fork(after_in_child=_WRITTEN.forked)


def _unchanged(store: Store, path: str, size: int | None) -> bool:
    """Whether a held part is still as it was committed, as far as a stat tells: a local part of
    ``size`` bytes (its manifest's; a part deleted or truncated since is read, and told damaged,
    as in any other process); on object storage taken as written (a request each would cost
    about what the read did)."""
    if not store.is_local:
        return True
    try:
        return size is not None and os.stat(path).st_size == size
    except OSError:
        return False


def written_schema(store: Store, path: str, size: int | None) -> pa.Schema | None:
    """The Arrow schema of part file ``path`` (``size``: its bytes at commit) where this process
    wrote it lately and a read would give it back (``_Written``), else None."""
    return _WRITTEN.get(_WRITTEN.schemas, store, path, size)


def written_ids(store: Store, path: str, size: int | None) -> pa.ChunkedArray | None:
    """The ``doc_id`` column this process wrote to part file ``path`` (``size``: its bytes at
    commit) lately (``_Written``), as the writer was given it: the column a read of the part
    gives; else None."""
    return _WRITTEN.get(_WRITTEN.ids, store, path, size)


def _numeric(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def intermediate_compression(store: Store, setting: str = "auto") -> str:
    """The Parquet codec of a program's intermediate parts in ``store``: ``setting``
    (``ExecutionParams.intermediate_compression``), where "auto": none on a local data root, lz4
    on object storage."""
    if setting != "auto":
        return setting
    return "none" if store.is_local else "lz4"


class PartitionWriter:
    """Writes the parts of one partition attempt; ``commit`` publishes them with the manifest.

    On a local data root an attempt holds an exclusive ``flock`` on
    ``<root>/.locks/<hash of the partition dir>`` from creation to ``close``: a second attempt on
    the same partition (a rerun launched while one is running) fails at once with
    ``PartitionBusy`` instead of having its parts deleted by the other's commit. The kernel drops
    the lock when the process dies (forked pool workers close their inherited copies, and die
    with their parent: ``stages.parallel``), so a crashed attempt never blocks its retry. The
    lock file is removed as the lock is released (``close``), so ``.locks`` holds the files of
    attempts running now and of those killed since their partition's last attempt, not one file
    per partition ever written. On S3
    an attempt holds a lease instead (``stages.lease``: conditional writes, renewed while it runs,
    checked before the manifest is published); other object stores have no lock, and two
    concurrent attempts on one partition there are the operator's to avoid (docs/operations.md).
    """

    def __init__(self, store: Store, pdir: str, compression: str = "auto") -> None:
        self.store = store
        self.pdir = pdir
        self.attempt = uuid.uuid4().hex[:12]
        self.tables: dict[str, list[str]] = {}
        self.rows: dict[str, int] = {}
        self.schemas: dict[str, pa.Schema] = {}
        self.compression = intermediate_compression(store, compression)  # a final output sets FINAL_COMPRESSION
        # fsyncs of this attempt's commit (parts, the folder, the manifest's temporary, the folder);
        # none where it is published with others (``commits_together``: their syncs are shared)
        self.fsyncs = 0
        self._lock: int | None = None  # set first: __del__ runs even when acquiring fails
        self._lock_path = ""  # the lock's file, removed as it is released
        self._lease: Lease | None = None
        self.leftovers: list[str] = []  # what killed attempts had left here, removed at start
        self._staged = False  # committed within ``commits_together``, not yet published
        self._pid = os.getpid()  # a forked child's copy of this writer must not close a descriptor
        if store.is_local:
            self._lock = self._acquire()
        elif supports_leases(store.fs) and checks_preconditions(store.fs, store.root):
            lease = Lease(store.fs, store.root, pdir)
            try:
                lease.acquire()
            except LeaseBusy as exc:
                raise PartitionBusy(str(exc)) from None
            self._lease = lease
        # Under the lock, what is committed now: another process may have committed since this
        # one read the manifest (a shared score cache, saved by attempts of other partitions).
        store.forget_manifest(pdir)
        try:
            made = False  # a folder made here holds nothing a killed attempt left
            if store.is_local:
                try:
                    os.makedirs(pdir)
                    made = True
                except FileExistsError:
                    os.makedirs(pdir, exist_ok=True)  # raises where it is not a folder
            else:
                store.fs.makedirs(pdir, exist_ok=True)
            if (self._lock is not None or self._lease is not None) and not made:
                self.leftovers = self._remove_leftovers()
        except BaseException:  # the partition is this attempt's: give it back at once, not at GC
            self.close()
            raise

    def _remove_leftovers(self) -> list[str]:
        """Remove what killed attempts left in the partition (parts, half-written parts, manifest
        temporaries: anything the committed manifest does not name), before this attempt writes,
        so a partition killed again and again never holds more than one attempt's parts. Only
        under the partition lock or lease: no other attempt can be writing. Returns the names removed."""
        manifest = self.store.read_manifest(self.pdir)
        keep = {MANIFEST} | {n for names in (manifest.tables.values() if manifest else []) for n in names}
        return self.store.remove_entries(self.pdir, lambda name: name in keep)

    def _acquire(self) -> int | None:
        import errno
        import fcntl
        import hashlib

        locks = os.path.join(self.store.root, ".locks")
        os.makedirs(locks, exist_ok=True)
        path = os.path.join(locks, hashlib.sha256(os.path.abspath(self.pdir).encode()).hexdigest()[:32])
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            _HELD_LOCKS.add(fd)  # from its open: a process forked meanwhile closes its copy
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _release_fd(fd)
                raise PartitionBusy(f"{self.pdir} is being written by another attempt right now; "
                                    "rerun once it has finished") from None
            except OSError as exc:
                _release_fd(fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    # a filesystem without locks (some network mounts): as on object storage, no file
                    with suppress(OSError):
                        os.unlink(path)
                    return None
                raise
            # The attempt before may have removed the file (``close``) between this open and this
            # lock: a lock on a removed file excludes nobody, as the next attempt makes a new one.
            # Held only where the name is still this file; else the name is opened again.
            try:
                named = os.stat(path)
            except FileNotFoundError:
                named = None
            held = os.fstat(fd)
            if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                self._lock_path = path
                return fd
            _release_fd(fd)

    def close(self) -> None:
        """Release the partition (after ``commit``, or when the attempt is abandoned): another
        process may commit it from now on, so its manifest is read again when asked. A commit
        staged in ``commits_together`` keeps it until published."""
        if self._staged:
            return
        self.store.forget_manifest(self.pdir)
        if self._lock is not None and os.getpid() == self._pid:
            with suppress(OSError):  # removed while held: an attempt that opened it meanwhile opens anew
                os.unlink(self._lock_path)
            _release_fd(self._lock)  # closing the last descriptor drops the flock
        self._lock = None
        if self._lease is not None and os.getpid() == self._pid:
            self._lease.release()
        self._lease = None

    def __del__(self) -> None:
        self.close()

    def write(self, table: str, data: pa.Table) -> None:
        """Append one part to ``table`` (call repeatedly to stream). Rows only: a table that gets
        none has no part, and the manifest holds its schema (``Manifest.schemas``)."""
        names = self.tables.setdefault(table, [])
        self.rows[table] = self.rows.get(table, 0) + data.num_rows
        self.schemas.setdefault(table, data.schema)
        if data.num_rows == 0:
            return
        name = f"{table}-{self.attempt}-{len(names):05d}.parquet"
        # Dictionaries and min/max statistics of long texts and unique ids cost time and help no
        # reader (none filters on them): only the other columns get them. Numbers get no
        # dictionary (node ids, band keys, hashes, offsets: mostly distinct, and where they repeat,
        # as the anchors of lsh_buckets' edges, hashing 1.9M of them cost 0.3 s of its 1 s here,
        # against writing 33 MB more).
        small = [f.name for f in data.schema if f.name not in UNIQUE_COLUMNS
                 and not (pa.types.is_large_string(f.type) or pa.types.is_large_binary(f.type))]
        labels = [name for name in small if not _numeric(data.schema.field(name).type)]
        path = f"{self.pdir}/{name}"
        with timed("write", data.nbytes, table), (open(path, "wb") if self.store.is_local else
                                                   self.store.fs.open(path, "wb")) as fh:
            pq.write_table(data, fh, compression=self.compression, use_dictionary=labels, write_statistics=small)
        _WRITTEN.add(path, data)
        names.append(name)

    def rename(self, table: str, new: str) -> None:
        """Publish the parts written to ``table`` as ``new``, replacing what ``new`` had (parts no
        table names any more are deleted at commit); for programs that rewrite a table."""
        self.tables[new] = self.tables.pop(table, [])
        self.rows[new] = self.rows.pop(table, 0)
        if table in self.schemas:
            self.schemas[new] = self.schemas.pop(table)

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """Rows this attempt has written to ``table`` so far (for multi-pass programs)."""
        return self.store.read_parts(self.pdir, self.tables.get(table, []), columns, self.schemas.get(table))

    def iter_batches(self, table: str, batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
        """Stream the rows this attempt has written to ``table`` so far, ``batch_rows`` at a time."""
        for name in list(self.tables.get(table, [])):
            with self.store.open_read(f"{self.pdir}/{name}") as fh:
                yield from timed_iter(pq.ParquetFile(fh).iter_batches(batch_size=batch_rows,
                                                                      use_threads=arrow_threads()))

    def _part_sizes(self) -> dict[str, int]:
        """Bytes of each part this attempt publishes, from one listing of the partition: what
        ``Store.is_whole`` checks them against."""
        names = {name for names in self.tables.values() for name in names}
        if not names:
            return {}
        sizes = self.store.sizes(self.pdir)
        return {name: size for name in sorted(names) if isinstance(size := sizes.get(name), int)}

    def commit(self, manifest: Manifest, together: bool = False) -> Manifest:
        """Write the manifest last (atomically), then remove parts no manifest names. ``together``:
        within ``commits_together`` on a local data root, staged and published at its end."""
        manifest.tables = self.tables
        manifest.rows = self.rows
        manifest.sizes = self._part_sizes()
        manifest.schemas = {table: encode_schema(self.schemas[table]) for table, names in self.tables.items()
                            if not names and table in self.schemas}
        group = _GROUP.get() if together and self.store.is_local else None
        if group is not None:
            tmp = f"{self.pdir}/.{MANIFEST}.{uuid.uuid4().hex[:12]}"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(manifest.to_json())
            group.manifests[self.store.url(f"{self.pdir}/{MANIFEST}")] = manifest
            group.staged.append((self, tmp, manifest))
            self._staged = True
            return manifest
        if self.store.is_local:
            # The parts the manifest names, on disk before it (a power cut keeps them whole): all
            # at commit, after the compute (the kernel writes back meanwhile), and never a part the
            # manifest does not name (a rewritten table's first parts, a failed attempt's).
            for name in (n for names in self.tables.values() for n in names):
                _fsync_path(f"{self.pdir}/{name}")
                self.fsyncs += 1
            if any(self.tables.values()):
                _fsync_dir(self.pdir)  # the parts' names too, before the manifest that names them
                self.fsyncs += 1
            self.fsyncs += 2  # the manifest's temporary and the folder (its rename)
        if self._lease is not None:  # on S3: publish only while this attempt holds the partition
            try:
                self._lease.check()
            except LeaseLost as exc:
                self.close()
                raise PartitionBusy(str(exc)) from None
        self.store.write_atomic(f"{self.pdir}/{MANIFEST}", manifest.to_json())
        if self._lease is not None:
            try:  # stalled past the lease during the PUT: a taker's parts are not ours to remove
                self._lease.check()
            except LeaseLost:
                self.close()
                return manifest
        try:
            self._remove_unnamed()
        finally:
            self.close()
        return manifest

    def _remove_unnamed(self) -> None:
        """After the manifest is published: remove the partition's parts it does not name."""
        keep = {name for names in self.tables.values() for name in names} | {MANIFEST}
        try:
            self.store.remove_entries(self.pdir, lambda name: name in keep or name.startswith(f".{MANIFEST}."))
        except OSError:
            if self.store.is_local:
                raise
            # On object storage: committed already; leftovers are unreferenced and the next commit removes them.
