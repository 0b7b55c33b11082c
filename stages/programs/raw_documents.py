"""raw_documents[source, crawl]: ingest JSONL (.gz/.zst) or Parquet records and assign doc_ids.

The ``doc_id`` is derived from the record's content, never from its position: 32 hex chars of
xxh3-128 over ``crawl, source, canonical JSON of the whole record, occurrence``. The canonical
JSON has sorted keys, so whitespace or key order in the input does not matter; ``occurrence``
numbers identical records within the source (identical records are interchangeable, so which
copy gets which number does not matter). Splitting, merging or reordering the input files
therefore leaves every id unchanged. A collision is an error, never an overwrite.

Bad records are quarantined with a reason and counted, never dropped: invalid UTF-8 or JSON,
a record that is not an object, a missing/null, non-string or empty text, a NUL byte in the
text, a text longer than ``max_chars`` (or a line so long that it cannot hold a valid record),
a Parquet file without a string text column, a truncated or corrupt file (one row for the
unreadable rest of that file), and a ``record_id`` that names two different records (every copy
but the lowest doc_id's, ``duplicate_record_id``; byte-identical repeats are exact duplicates,
left to the exact stage, which names the copy they duplicate).

Skew: the input is cut into tasks of about ``ExecutionParams.ingest_task_bytes`` that parse and
validate in parallel (``stages.parallel.map_ordered``): a plain JSONL file by byte ranges moved
to line starts, a Parquet file by row groups. A gzip or zstd stream cannot be entered in the
middle, so this process decompresses it and hands its lines out in pieces of the same size.
Results come back in input order and this process numbers occurrences and assigns the ids, so
ids, quarantine and the written tables are the same for any task size, worker count or
executor. Memory: the tasks in flight, ``batch_rows`` rows, and ~20 bytes per record (the
occurrence index) plus, with ``id_field``, the record ids.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash
import zstandard
from fsspec.utils import infer_compression

from stages.parallel import zip_results
from stages.params import ExecutionParams, RawDocumentsParams
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst",
                  ".ndjson.gz", ".ndjson.zst")
PARQUET_SUFFIXES = (".parquet", ".pq")
RAW_EXCERPT = 2000  # characters of a bad record kept in the quarantine table
READ_BLOCK = 1 << 20  # bytes per read of a file or of a decompressed stream

DOCUMENTS = pa.schema([
    ("doc_id", pa.string()),
    ("record_id", pa.string()),
    ("source", pa.string()),
    ("url", pa.string()),
    ("text", pa.large_string()),
    ("metadata", pa.string()),
])
QUARANTINE = pa.schema([
    ("doc_id", pa.string()),
    ("record_id", pa.string()),
    ("source", pa.string()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("raw", pa.string()),
])
_PARSED = pa.schema([  # what a task returns per good record; the doc_id is assigned afterwards
    ("record_id", pa.string()),
    ("url", pa.string()),
    ("text", pa.large_string()),
    ("metadata", pa.string()),
])


class NoInputError(FileNotFoundError):
    """The source URL matches no readable JSONL or Parquet file."""


def list_files(params: RawDocumentsParams) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The input files of a source, sorted: a file, a directory (recursively) or a glob."""
    fs, path = fsspec.core.url_to_fs(params.url)
    fs.invalidate_cache()  # s3fs caches listings (sizes, ETags) per instance: a changed file must show
    if any(ch in path for ch in "*?["):
        candidates = fs.glob(path)
    elif fs.isdir(path):
        candidates = fs.find(path)
    elif fs.exists(path):
        candidates = [path]
    else:
        candidates = []
    files = sorted(p for p in candidates if _format_of(p, params.format) is not None and not fs.isdir(p))
    if not files:
        raise NoInputError(f"source URL {params.url!r} matches no JSONL or Parquet file")
    return fs, files


def _format_of(path: str, declared: str) -> str | None:
    name = path.lower()
    if declared != "auto":
        return declared
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def fingerprint(params: RawDocumentsParams) -> str:
    """Identity of the input files: names, sizes and modification times or ETags."""
    fs, files = list_files(params)
    entries = []
    for path in files:
        info = fs.info(path)
        stamp = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("created")
        entries.append([path, info.get("size"), str(stamp)])
    return hashlib.sha256(orjson.dumps(entries)).hexdigest()[:16]


def max_line_bytes(params: RawDocumentsParams) -> int | None:
    """Longest JSONL line read whole: a valid record within ``max_chars`` fits (a character is at
    most 12 bytes of JSON, a surrogate pair of ``\\u`` escapes), plus 1 MiB for other fields."""
    return None if params.max_chars is None else 12 * params.max_chars + (1 << 20)


# --- occurrence numbers and ids -----------------------------------------------------------------


class _Counts:
    """How often each 16-byte digest has been seen: sorted runs of ("S16" key, int64 count),
    merged LSM-style (a run is merged into the one before when it grows to half its size), so
    numbering n digests costs O(n log n) time and ~24 bytes per distinct digest."""

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def number(self, digests: np.ndarray) -> np.ndarray:
        """int64 (n,): for each of ``digests`` ("S16", in input order) the number of earlier
        occurrences, this batch's earlier rows included; the batch is then counted."""
        n = len(digests)
        if n == 0:
            return np.zeros(0, np.int64)
        uniq, inverse, cnt = np.unique(digests, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")  # rows grouped by digest, in input order
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        base = np.zeros(len(uniq), np.int64)
        for keys, counts in self.runs:
            pos = np.searchsorted(keys, uniq)
            hit = pos < len(keys)
            hit[hit] = keys[pos[hit]] == uniq[hit]
            base[hit] += counts[pos[hit]]
        self.runs.append((uniq, cnt.astype(np.int64)))
        while len(self.runs) > 1 and 2 * len(self.runs[-1][0]) >= len(self.runs[-2][0]):
            (k2, c2), (k1, c1) = self.runs.pop(), self.runs.pop()
            keys, inv = np.unique(np.concatenate([k1, k2]), return_inverse=True)
            self.runs.append((keys, np.bincount(inv.reshape(-1), np.concatenate([c1, c2]), len(keys)).astype(np.int64)))
        return base[inverse] + rank


@dataclass
class _Ids:
    """Assigns content-derived doc_ids and detects collisions within one source."""

    crawl: str
    source: str
    seen: _Counts = field(default_factory=_Counts)
    issued: _Counts = field(default_factory=_Counts)

    def assign(self, digests: list[bytes]) -> list[bytes]:
        """doc_ids (16 raw bytes; the doc_id is their hex) of records with these content digests
        (16 bytes each), in order."""
        if not digests:
            return []
        ks = self.seen.number(np.array(digests, dtype="S16")).tolist()
        prefix = f"{self.crawl}\x00{self.source}\x00".encode()
        raw = [xxhash.xxh3_128_digest(prefix + d + b"\x00" + str(k).encode()) for d, k in zip(digests, ks, strict=True)]
        again = self.issued.number(np.array(raw, dtype="S16"))
        if again.any():
            raise RuntimeError(f"doc_id collision in source {self.source!r}: {raw[int(np.argmax(again))].hex()}")
        return raw


def _bad_digest(where: str, raw_digest: bytes) -> bytes:
    """Content digest of a quarantined record: from its file-relative position and bytes (not
    stable across re-sharding, which is fine: nothing downstream joins on it)."""
    return xxhash.xxh3_128_digest(b"\x01quarantine\x00" + where.encode() + b"\x00" + raw_digest)


# --- tasks ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Task:
    """One unit of parallel ingestion.

    kind: ``range`` (bytes [start, stop) of a plain JSONL file, both at line starts), ``lines``
    (lines of a decompressed stream, joined by newlines, in ``data``), ``parquet`` (row groups
    [start, stop) of a Parquet file, stop -1 = the whole file; ``first_row`` = rows before them),
    ``overlong`` (one line too long to read whole: ``stop`` bytes, ``data`` its head) or ``error``
    (the unreadable rest of a file; ``message``).
    """

    params: RawDocumentsParams
    path: str
    kind: str
    start: int = 0
    stop: int = 0
    first_row: int = 0
    data: bytes = b""
    message: str = ""

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class _Bad:
    """A quarantined record as a task sees it; ``pos`` is relative to the task (1-based line or
    row), the ingesting process turns it into a file position and an id."""

    pos: int
    reason: str
    message: str
    raw: str
    record_id: str | None
    raw_digest: bytes
    style: str = "record"  # record: "<file>:<line>: msg"; after: "<file> after line N: msg"; file: "<file>: msg"


@dataclass
class _Done:
    """What one task found: the good records (``_PARSED`` columns, digests concatenated), the bad
    ones, and the lines it read (to number lines across the tasks of one file)."""

    docs: pa.Table
    digests: bytes
    bad: list[_Bad]
    lines: int = 0
    blank: int = 0
    chars: int = 0


class _Collect:
    def __init__(self, params: RawDocumentsParams) -> None:
        self.params = params
        self.cols: dict[str, list[Any]] = {name: [] for name in _PARSED.names}
        self.digests: list[bytes] = []
        self.bad: list[_Bad] = []
        self.lines = 0
        self.blank = 0
        self.chars = 0

    def record(self, rec: Any, pos: int, canonical: bytes) -> None:
        row, reason, detail, record_id = _record_row(rec, self.params)
        if row is None:
            assert reason is not None
            self.bad.append(_Bad(pos, reason, detail, canonical[:4 * RAW_EXCERPT].decode(errors="backslashreplace"),
                                 record_id, xxhash.xxh3_128_digest(canonical)))
            return
        for name in _PARSED.names:
            self.cols[name].append(row[name])
        self.digests.append(xxhash.xxh3_128_digest(canonical))
        self.chars += len(row["text"])

    def line(self, line: bytes | _Overlong) -> None:
        self.lines += 1
        pos = self.lines
        if isinstance(line, _Overlong):
            self.bad.append(_Bad(pos, "record_too_large", f"a line of {line.size} bytes, more than the "
                                 f"{max_line_bytes(self.params)} bytes a record within max_chars can take",
                                 line.head.decode(errors="backslashreplace"), None,
                                 xxhash.xxh3_128_digest(line.head + str(line.size).encode())))
            return
        line = line.rstrip(b"\r\n")
        if not line.strip():
            self.blank += 1
            return
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            try:
                line.decode("utf-8")
                reason = "invalid_json"
            except UnicodeDecodeError:
                reason = "invalid_utf8"
            raw = line[:4 * RAW_EXCERPT].decode("utf-8", errors="backslashreplace")
            self.bad.append(_Bad(pos, reason, str(exc), raw, None, xxhash.xxh3_128_digest(line)))
            return
        self.record(rec, pos, orjson.dumps(rec, option=orjson.OPT_SORT_KEYS, default=str))

    def unreadable(self, exc: BaseException, style: str = "after") -> None:
        self.bad.append(_Bad(self.lines + 1, "unreadable_file", f"{type(exc).__name__}: {exc}", "", None,
                             b"truncated", style))

    def done(self) -> _Done:
        docs = pa.table({name: pa.array(self.cols[name], _PARSED.field(name).type) for name in _PARSED.names},
                        schema=_PARSED)
        return _Done(docs, b"".join(self.digests), self.bad, self.lines, self.blank, self.chars)


@dataclass(frozen=True)
class _Overlong:
    """A line longer than ``max_line_bytes``: its size and first bytes, never the whole line."""

    size: int
    head: bytes


def _split_lines(blocks: Iterable[bytes], max_line: int | None) -> Iterator[bytes | _Overlong]:
    """Lines (without ``\\n``) of a stream given as blocks; a line longer than ``max_line`` comes
    out as an ``_Overlong`` without ever being held whole. An exception of ``blocks`` propagates
    after the complete lines before it, never a partial one."""
    pending: list[bytes] = []
    size = 0
    head = b""
    over = False
    for block in blocks:
        parts = block.split(b"\n")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if over:
                size += len(part)
            else:
                pending.append(part)
                size += len(part)
                if max_line is not None and size > max_line:
                    head = b"".join(pending)[:RAW_EXCERPT]
                    pending, over = [], True
            if last:
                break
            if over:
                yield _Overlong(size, head)
            else:
                yield pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size, over = [], 0, False
    if over:
        yield _Overlong(size, head)
    elif size:
        yield b"".join(pending)


def _read_blocks(fh: Any, limit: int | None = None) -> Iterator[bytes]:
    """Blocks of ``fh`` from its position: ``limit`` bytes, or to the end. A decompressing
    stream is read with ``read1``, which hands over what was decompressed before damage that a
    later read raises for (``read`` would drop the whole block)."""
    read = getattr(fh, "read1", fh.read)
    left = limit
    while left is None or left > 0:
        block = read(READ_BLOCK if left is None else min(READ_BLOCK, left))
        if not block:
            return
        if left is not None:
            left -= len(block)
        yield block


def _zstd_blocks(fh: Any, name: str) -> Iterator[bytes]:
    """Decompressed blocks of a .zst stream, across every frame; a stream that ends inside a
    frame raises EOFError (after the blocks before it).

    Not fsspec's ``compression="infer"``: its zstandard fallback (Python < 3.14 without
    backports.zstd) returns a reader that stops after the first frame and ends a truncated file
    silently, with a partial last line.
    """
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    in_frame = False
    while data := fh.read(READ_BLOCK):
        while data:
            in_frame = True
            out = dobj.decompress(data)
            data = b""
            if dobj.eof:
                in_frame = False
                data = dobj.unused_data
                dobj = dctx.decompressobj()
            if out:
                yield out
    if in_frame:
        raise EOFError(f"{name} ends inside a zstd frame (truncated)")


def _fs(params: RawDocumentsParams) -> fsspec.AbstractFileSystem:
    return fsspec.core.url_to_fs(params.url)[0]


def _run_task(task: _Task) -> _Done:
    """Parse and validate one task (in a worker process or a Ray task)."""
    got = _Collect(task.params)
    if task.kind == "range":
        try:
            with _fs(task.params).open(task.path, "rb") as fh:
                fh.seek(task.start)
                for line in _split_lines(_read_blocks(fh, task.stop - task.start), max_line_bytes(task.params)):
                    got.line(line)
        except Exception as exc:  # vanished, unreadable: the rest of this range is lost, counted
            got.unreadable(exc)
    elif task.kind == "lines":
        for line in task.data.split(b"\n"):
            got.line(line)
    elif task.kind == "overlong":
        got.line(_Overlong(task.stop, task.data))
    elif task.kind == "error":
        got.bad.append(_Bad(1, "unreadable_file", task.message, "", None, b"truncated", "after"))
    elif task.kind == "parquet":
        _parquet_task(task, got)
    else:
        raise ValueError(f"unknown ingestion task kind {task.kind!r}")
    return got.done()


def _parquet_task(task: _Task, got: _Collect) -> None:
    params = task.params
    with _fs(params).open(task.path, "rb") as fh:
        try:
            pf = pq.ParquetFile(fh)
        except Exception as exc:
            got.bad.append(_Bad(0, "unreadable_file", str(exc), "", None, b"corrupt", "file"))
            return
        groups = list(range(pf.num_row_groups)) if task.stop < 0 else list(range(task.start, task.stop))
        schema = pf.schema_arrow
        field_ = schema.field(params.text_field) if params.text_field in schema.names else None
        if field_ is None or not (pa.types.is_string(field_.type) or pa.types.is_large_string(field_.type)):
            got_type = "missing" if field_ is None else str(field_.type)
            # One quarantine row per record, so input counts still add up.
            rows = sum(pf.metadata.row_group(g).num_rows for g in groups)
            for i in range(rows):
                got.bad.append(_Bad(i, "wrong_schema", f"text column {params.text_field!r} is {got_type}", "",
                                    None, b"schema", "file"))
            return
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=4096, row_groups=groups):
                for rec in batch.to_pylist():
                    row += 1
                    got.record(rec, row, orjson.dumps(rec, option=orjson.OPT_SORT_KEYS, default=str))
        except Exception as exc:
            got.bad.append(_Bad(row + 1, "unreadable_file", f"{type(exc).__name__}: {exc}", "", None,
                                b"truncated", "after_row"))


def _line_starts(fs: fsspec.AbstractFileSystem, path: str, size: int, step: int) -> list[int]:
    """Offsets 0 < o < size of about every ``step`` bytes, each moved forward to a line start
    (reading blocks, so a very long line is never held whole)."""
    cuts: list[int] = []
    with fs.open(path, "rb") as fh:
        target = step
        while target < size:
            fh.seek(target - 1)  # the byte before: a cut right after a newline stays put
            pos = target - 1
            while True:
                block = fh.read(1 << 16)
                if not block:
                    return cuts
                nl = block.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(block)
            if pos >= size:
                return cuts
            cuts.append(pos)
            target = pos + step
    return cuts


def _stream_tasks(
    fs: fsspec.AbstractFileSystem, path: str, params: RawDocumentsParams, step: int
) -> Iterator[_Task]:
    """Tasks of a compressed JSONL file: decompressed here (a stream cannot be split), its lines
    handed out in pieces of about ``step`` bytes; the unreadable rest of a damaged file is one
    ``error`` task after the complete lines before the damage."""
    name = path.rsplit("/", 1)[-1]
    comp = infer_compression(path)
    lines: list[bytes] = []
    size = 0
    try:
        with fs.open(path, "rb", compression=None if comp == "zstd" else comp) as fh:
            blocks = _zstd_blocks(fh, name) if comp == "zstd" else _read_blocks(fh)
            for line in _split_lines(blocks, max_line_bytes(params)):
                if isinstance(line, _Overlong):
                    if lines:
                        yield _Task(params, path, "lines", data=b"\n".join(lines))
                        lines, size = [], 0
                    yield _Task(params, path, "overlong", stop=line.size, data=line.head)
                    continue
                lines.append(line)
                size += len(line) + 1
                if size >= step:
                    yield _Task(params, path, "lines", data=b"\n".join(lines))
                    lines, size = [], 0
    except Exception as exc:  # truncated gzip/zstd, corrupt stream: keep the complete lines read
        if lines:
            yield _Task(params, path, "lines", data=b"\n".join(lines))
            lines = []
        yield _Task(params, path, "error", message=f"{type(exc).__name__}: {exc}")
    if lines:
        yield _Task(params, path, "lines", data=b"\n".join(lines))


def _parquet_tasks(fs: fsspec.AbstractFileSystem, path: str, params: RawDocumentsParams, step: int) -> Iterator[_Task]:
    """Row groups of a Parquet file in tasks of about ``step`` (uncompressed) bytes; one task
    for a file whose footer cannot be read (the task reports it)."""
    try:
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception:
        yield _Task(params, path, "parquet", stop=-1)
        return
    start, first_row, size, rows = 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        size += meta.row_group(g).total_byte_size
        rows += meta.row_group(g).num_rows
        if size >= step or g == meta.num_row_groups - 1:
            yield _Task(params, path, "parquet", start=start, stop=g + 1, first_row=first_row)
            start, first_row, size, rows = g + 1, first_row + rows, 0, 0
    if meta.num_row_groups == 0:
        yield _Task(params, path, "parquet", stop=0)


def _tasks(fs: fsspec.AbstractFileSystem, files: list[tuple[str, int]], params: RawDocumentsParams,
           step: int) -> Iterator[_Task]:
    for path, size in files:
        if size == 0:
            continue
        if _format_of(path, params.format) == "parquet":
            yield from _parquet_tasks(fs, path, params, step)
        elif infer_compression(path) is not None:
            yield from _stream_tasks(fs, path, params, step)
        else:
            bounds = [0, *_line_starts(fs, path, size, step), size]
            for start, stop in itertools.pairwise(bounds):
                yield _Task(params, path, "range", start=start, stop=stop)


# --- the ingesting process ------------------------------------------------------------------------


class _Output:
    """Assigns ids to what the tasks found, in order, and writes documents and quarantine in
    parts of ``batch_rows``; resolves duplicate record ids at the end."""

    def __init__(self, output: PartitionWriter, params: RawDocumentsParams, crawl: str, source: str,
                 batch_rows: int) -> None:
        self.output, self.params, self.source, self.batch_rows = output, params, source, batch_rows
        self.ids = _Ids(crawl, source)
        self.table = "documents"  # where document parts go ("documents_checked" while rewriting)
        self.docs: list[pa.Table] = []
        self.pending = 0
        self.bad: list[dict[str, Any]] = []
        self.reasons: Counter[str] = Counter()
        self.kept = 0
        self.chars = 0
        # (record id digest, content digest, doc_id) per record that has an id, "S16" each: 48 bytes
        # a record, no strings, so a source of millions of records can be checked for id clashes
        self.record_ids: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, task: _Task, done: _Done, base: int) -> None:
        digests = [done.digests[i:i + 16] for i in range(0, len(done.digests), 16)]
        raw_ids = self.ids.assign(digests)
        n = done.docs.num_rows
        table = pa.table({
            "doc_id": pa.array([r.hex() for r in raw_ids], pa.string()), "record_id": done.docs["record_id"],
            "source": pa.array([self.source] * n, pa.string()), "url": done.docs["url"],
            "text": done.docs["text"], "metadata": done.docs["metadata"],
        }, schema=DOCUMENTS)
        if self.params.id_field is not None and n:
            rids = table["record_id"].to_pylist()
            has = [i for i, r in enumerate(rids) if r is not None]
            if has:
                self.record_ids.append((
                    np.array([xxhash.xxh3_128_digest(rids[i].encode()) for i in has], dtype="S16"),
                    np.array([digests[i] for i in has], dtype="S16"),
                    np.array([raw_ids[i] for i in has], dtype="S16"),
                ))
        self._add_docs(table)
        self.kept += n
        self.chars += done.chars
        if done.bad:
            self._add_bad(task, done.bad, base)

    def _add_docs(self, table: pa.Table) -> None:
        self.docs.append(table)
        self.pending += table.num_rows
        while self.pending >= self.batch_rows:
            self._flush_docs(self.batch_rows)

    def _flush_docs(self, rows: int | None = None) -> None:
        table = pa.concat_tables(self.docs) if self.docs else DOCUMENTS.empty_table()
        rows = table.num_rows if rows is None else rows
        self.output.write(self.table, table.slice(0, rows))
        rest = table.slice(rows)
        self.docs = [rest] if rest.num_rows else []
        self.pending = rest.num_rows

    def _add_bad(self, task: _Task, bad: list[_Bad], base: int) -> None:
        name = task.name
        keys, rows = [], []
        for b in bad:
            pos = base + b.pos
            if b.style == "record":
                where, detail = f"{name}:{pos}", f"{name}:{pos}: {b.message}"
            elif b.style == "after":
                where, detail = f"{name}:{pos}", f"{name} after line {pos - 1}: {b.message}"
            elif b.style == "after_row":
                where, detail = f"{name}:{pos}", f"{name} after row {pos - 1}: {b.message}"
            else:
                where, detail = f"{name}:{pos}", f"{name}: {b.message}"
            keys.append(_bad_digest(where, b.raw_digest))
            rows.append((b.record_id, b.reason, detail, b.raw))
        for doc_id, (record_id, reason, detail, raw) in zip(self.ids.assign(keys), rows, strict=True):
            self.quarantine(doc_id.hex(), record_id, reason, detail, raw)

    def quarantine(self, doc_id: str, record_id: str | None, reason: str, detail: str, raw: str) -> None:
        self.bad.append({"doc_id": doc_id, "record_id": record_id, "source": self.source,
                         "reason": reason, "detail": detail[:500], "raw": raw[:RAW_EXCERPT]})
        self.reasons[reason] += 1
        if len(self.bad) >= self.batch_rows:
            self._flush_bad()

    def _flush_bad(self) -> None:
        self.output.write("quarantine", pa.Table.from_pylist(self.bad, schema=QUARANTINE))
        self.bad = []

    def close(self) -> None:
        self._flush_docs()
        self._duplicate_record_ids()
        self._flush_bad()

    def _duplicate_record_ids(self) -> None:
        """A record_id that names records with different content: the lowest doc_id stays, every
        other document of that id is quarantined (``duplicate_record_id``). Identical copies of
        the kept record stay for the exact stage. The documents are rewritten only if one moves."""
        if not self.record_ids:
            return
        rid, digest, doc = (np.concatenate(cols) for cols in zip(*self.record_ids, strict=True))
        self.record_ids = []
        order = np.lexsort((doc, rid))  # by record id, then doc_id: each group's first is its winner
        rid, digest, doc = rid[order], digest[order], doc[order]
        first = np.ones(len(rid), bool)
        first[1:] = rid[1:] != rid[:-1]
        winner = np.flatnonzero(first)[np.cumsum(first) - 1]  # row of each row's winner
        losers = np.flatnonzero(digest != digest[winner])
        if not len(losers):
            return
        # raw "S16" values lose trailing NUL bytes when taken out of numpy: pad them back
        moved = {doc[i].ljust(16, b"\x00").hex(): doc[winner[i]].ljust(16, b"\x00").hex() for i in losers}
        drop = pa.array(sorted(moved), pa.string())
        store, pdir = self.output.store, self.output.pdir
        self.table, self.kept, self.chars = "documents_checked", 0, 0
        out: list[tuple[str, str | None, str]] = []
        for name in self.output.tables.get("documents", []):
            with store.fs.open(f"{pdir}/{name}", "rb") as fh:
                for batch in pq.ParquetFile(fh).iter_batches(batch_size=self.batch_rows):
                    table = pa.Table.from_batches([batch]).cast(DOCUMENTS)
                    gone = pc.is_in(table["doc_id"], value_set=drop)
                    for row in table.filter(gone).select(["doc_id", "record_id", "text"]).to_pylist():
                        out.append((row["doc_id"], row["record_id"], row["text"][:RAW_EXCERPT]))
                    table = table.filter(pc.invert(gone))
                    self.kept += table.num_rows
                    self.chars += int(pc.sum(pc.utf8_length(table["text"])).as_py() or 0)
                    self._add_docs(table)
        self._flush_docs()
        # The checked parts replace the first ones, which no manifest names: deleted at commit.
        self.output.rename("documents_checked", "documents")
        for doc_id, record_id, raw in sorted(out, key=lambda r: r[0]):
            assert record_id is not None
            self.quarantine(doc_id, record_id, "duplicate_record_id",
                            f"record_id {record_id!r} also names a different record, {moved[doc_id]} "
                            "(the lowest doc_id of the id is kept)", raw)


def run(
    params: RawDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Ingest one source. Report: input, documents, quarantined, per-reason counts, files, chars,
    blank lines, empty files, tasks."""
    assert partition.source is not None
    fs, files = list_files(params)
    sized = [(path, int(fs.size(path) or 0)) for path in files]
    step = execution.ingest_task_bytes
    out = _Output(output, params, partition.crawl, partition.source, execution.batch_rows)
    tasks = _tasks(fs, sized, params, step)
    if sum(size for _, size in sized) > step and (execution.executor == "ray" or execution.resolved_workers() > 1):
        done_tasks: Iterator[tuple[_Task, _Done]] = zip_results(tasks, _run_task, execution)
    else:  # one task's worth of input: no pool to start
        done_tasks = ((task, _run_task(task)) for task in tasks)
    blank = n_tasks = 0
    lines: Counter[str] = Counter()  # lines read so far per file, to number lines across tasks
    records: Counter[str] = Counter()
    for task, done in done_tasks:
        n_tasks += 1
        base = task.first_row if task.kind == "parquet" else lines[task.path]
        out.add(task, done, base)
        lines[task.path] += done.lines
        blank += done.blank
        records[task.path] += done.docs.num_rows + len(done.bad)
    out.close()
    quarantined = sum(out.reasons.values())
    return {
        "input": out.kept + quarantined,
        "documents": out.kept,
        "quarantined": quarantined,
        "quarantine_reasons": dict(sorted(out.reasons.items())),
        "files": len(files),
        "empty_files": sum(1 for path, _ in sized if records[path] == 0),
        "tasks": n_tasks,
        "blank_lines": blank,
        "chars": out.chars,
    }


def _record_row(
    rec: Any, params: RawDocumentsParams
) -> tuple[dict[str, Any] | None, str | None, str, str | None]:
    """(row, reason, detail, record_id) for one parsed record; ``row`` is None when it is bad."""
    if not isinstance(rec, dict):
        return None, "not_an_object", f"record is a JSON {type(rec).__name__}", None
    record_id = _as_str(rec.get(params.id_field)) if params.id_field else None
    if params.text_field not in rec or rec[params.text_field] is None:
        return None, "missing_text", f"no {params.text_field!r} field", record_id
    text = rec[params.text_field]
    if not isinstance(text, str):
        return None, "text_not_string", f"{params.text_field!r} is a {type(text).__name__}", record_id
    if not text.strip():
        return None, "empty_text", "text is empty or whitespace", record_id
    if params.max_chars is not None and len(text) > params.max_chars:
        return None, "text_too_long", f"text has {len(text)} characters, more than max_chars={params.max_chars}", \
            record_id
    if "\x00" in text:
        return None, "nul_byte", "text contains a NUL character", record_id
    meta = {k: v for k, v in rec.items() if k not in (params.text_field, params.id_field, params.url_field)}
    row = {
        "record_id": record_id,
        "url": _as_str(rec.get(params.url_field)) if params.url_field else None,
        "text": text,
        "metadata": orjson.dumps(meta, option=orjson.OPT_SORT_KEYS, default=str).decode() if meta else None,
    }
    return row, None, "", record_id


def _as_str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
