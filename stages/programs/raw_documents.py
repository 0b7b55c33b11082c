"""raw_documents[source, crawl]: ingest JSONL (.gz/.zst) or Parquet records and assign doc_ids.

The ``doc_id`` is derived from the record's content, never from its position: 32 hex chars of
xxh3-128 over ``crawl, source, canonical JSON of the whole record, occurrence``. The canonical
JSON has sorted keys, so whitespace or key order in the input does not matter; ``occurrence``
numbers identical records within the source (identical records are interchangeable, so which
copy gets which number does not matter). Splitting, merging or reordering the input files
therefore leaves every id unchanged. A collision is an error, never an overwrite.

Bad records are quarantined with a reason and counted, never dropped: invalid UTF-8 or JSON,
a record that is not an object, a missing/null, non-string or empty text, a NUL byte in the
text, a Parquet file without a string text column, and a truncated or corrupt file (one row
for the unreadable rest of that file).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
import zstandard

from stages.params import ExecutionParams, RawDocumentsParams
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst",
                  ".ndjson.gz", ".ndjson.zst")
PARQUET_SUFFIXES = (".parquet", ".pq")
RAW_EXCERPT = 2000  # characters of a bad record kept in the quarantine table

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


class NoInputError(FileNotFoundError):
    """The source URL matches no readable JSONL or Parquet file."""


def list_files(params: RawDocumentsParams) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The input files of a source, sorted: a file, a directory (recursively) or a glob."""
    fs, path = fsspec.core.url_to_fs(params.url)
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


@dataclass
class _Ids:
    """Assigns content-derived doc_ids and detects collisions within one source."""

    crawl: str
    source: str
    seen: Counter[bytes] = field(default_factory=Counter)
    issued: set[str] = field(default_factory=set)

    def assign(self, canonical: bytes) -> str:
        content = xxhash.xxh3_128_digest(canonical)
        k = self.seen[content]
        self.seen[content] = k + 1
        doc_id = xxhash.xxh3_128_hexdigest(
            b"\x00".join([self.crawl.encode(), self.source.encode(), content, str(k).encode()])
        )
        if doc_id in self.issued:
            raise RuntimeError(f"doc_id collision in source {self.source!r}: {doc_id}")
        self.issued.add(doc_id)
        return doc_id

    def bad(self, where: str, raw: bytes) -> str:
        """Id of a quarantined record: from its file-relative position and bytes (not stable
        across re-sharding, which is fine: nothing downstream joins on it)."""
        return self.assign(b"\x01quarantine\x00" + where.encode() + b"\x00" + raw)


class _Batches:
    """Accumulates good and quarantined rows and writes them in parts of ``batch_rows``."""

    def __init__(self, output: PartitionWriter, source: str, batch_rows: int) -> None:
        self.output, self.source, self.batch_rows = output, source, batch_rows
        self.docs: list[dict[str, Any]] = []
        self.bad: list[dict[str, Any]] = []
        self.reasons: Counter[str] = Counter()
        self.kept = 0
        self.chars = 0

    def add_doc(self, row: dict[str, Any]) -> None:
        self.docs.append(row)
        self.kept += 1
        self.chars += len(row["text"])
        if len(self.docs) >= self.batch_rows:
            self.flush_docs()

    def add_bad(self, doc_id: str, record_id: str | None, reason: str, detail: str, raw: str) -> None:
        self.bad.append({"doc_id": doc_id, "record_id": record_id, "source": self.source,
                         "reason": reason, "detail": detail[:500], "raw": raw[:RAW_EXCERPT]})
        self.reasons[reason] += 1

    def flush_docs(self) -> None:
        self.output.write("documents", pa.Table.from_pylist(self.docs, schema=DOCUMENTS))
        self.docs = []

    def close(self) -> None:
        self.flush_docs()
        self.output.write("quarantine", pa.Table.from_pylist(self.bad, schema=QUARANTINE))


def _record_row(
    rec: Any, params: RawDocumentsParams, source: str
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
    if "\x00" in text:
        return None, "nul_byte", "text contains a NUL character", record_id
    meta = {k: v for k, v in rec.items() if k not in (params.text_field, params.id_field, params.url_field)}
    row = {
        "record_id": record_id,
        "source": source,
        "url": _as_str(rec.get(params.url_field)) if params.url_field else None,
        "text": text,
        "metadata": orjson.dumps(meta, option=orjson.OPT_SORT_KEYS, default=str).decode() if meta else None,
    }
    return row, None, "", record_id


def _as_str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def _jsonl_records(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line bytes) of a JSONL file; compression inferred from the suffix."""
    if path.lower().endswith(".zst"):
        yield from enumerate(_zstd_lines(fs, path), 1)
        return
    with fs.open(path, "rb", compression="infer") as fh:
        yield from enumerate(fh, 1)


def _zstd_lines(fs: fsspec.AbstractFileSystem, path: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a .zst file, across every frame; a file that ends inside a frame raises EOFError.

    Not fsspec's ``compression="infer"``: its zstandard fallback (Python < 3.14 without
    backports.zstd) returns a reader without ``readline`` that stops after the first frame and
    ends a truncated file silently, with a partial last line.
    """
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    in_frame = False
    rest = b""
    with fs.open(path, "rb") as raw:
        while data := raw.read(chunk):
            while data:
                in_frame = True
                out = dobj.decompress(data)
                data = b""
                if dobj.eof:
                    in_frame = False
                    data = dobj.unused_data
                    dobj = dctx.decompressobj()
                if out:
                    *lines, rest = (rest + out).split(b"\n")
                    for line in lines:
                        yield line + b"\n"
    if in_frame:
        raise EOFError(f"{path.rsplit('/', 1)[-1]} ends inside a zstd frame (truncated)")
    if rest:
        yield rest


def run(
    params: RawDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Ingest one source. Report: input, documents, quarantined, per-reason counts, files, chars."""
    assert partition.source is not None
    source = partition.source
    fs, files = list_files(params)
    ids = _Ids(partition.crawl, source)
    out = _Batches(output, source, execution.batch_rows)
    blank = 0
    for path in files:
        name = path.rsplit("/", 1)[-1]
        if _format_of(path, params.format) == "parquet":
            _ingest_parquet(fs, path, name, params, source, ids, out)
            continue
        lineno = 0
        try:
            for lineno, line in _jsonl_records(fs, path):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    blank += 1
                    continue
                _ingest_line(line, f"{name}:{lineno}", params, source, ids, out)
        except Exception as exc:  # truncated gzip/zstd, corrupt stream: keep what was read
            out.add_bad(ids.bad(f"{name}:{lineno + 1}", b"truncated"), None, "unreadable_file",
                        f"{name} after line {lineno}: {type(exc).__name__}: {exc}", "")
    out.close()
    quarantined = sum(out.reasons.values())
    return {
        "input": out.kept + quarantined,
        "documents": out.kept,
        "quarantined": quarantined,
        "quarantine_reasons": dict(sorted(out.reasons.items())),
        "files": len(files),
        "blank_lines": blank,
        "chars": out.chars,
    }


def _ingest_line(
    line: bytes, where: str, params: RawDocumentsParams, source: str, ids: _Ids, out: _Batches
) -> None:
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
            reason = "invalid_json"
        except UnicodeDecodeError:
            reason = "invalid_utf8"
        raw = line.decode("utf-8", errors="backslashreplace")
        out.add_bad(ids.bad(where, line), None, reason, f"{where}: {exc}", raw)
        return
    row, reason, detail, record_id = _record_row(rec, params, source)
    canonical = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS, default=str)
    if row is None:
        assert reason is not None
        out.add_bad(ids.bad(where, canonical), record_id, reason, f"{where}: {detail}",
                    canonical.decode(errors="backslashreplace"))
        return
    row["doc_id"] = ids.assign(canonical)
    out.add_doc(row)


def _ingest_parquet(
    fs: fsspec.AbstractFileSystem, path: str, name: str, params: RawDocumentsParams,
    source: str, ids: _Ids, out: _Batches,
) -> None:
    with fs.open(path, "rb") as fh:
        try:
            pf = pq.ParquetFile(fh)
        except Exception as exc:
            out.add_bad(ids.bad(name, b"corrupt"), None, "unreadable_file", f"{name}: {exc}", "")
            return
        field_ = pf.schema_arrow.field(params.text_field) if params.text_field in pf.schema_arrow.names else None
        if field_ is None or not (pa.types.is_string(field_.type) or pa.types.is_large_string(field_.type)):
            got = "missing" if field_ is None else str(field_.type)
            # One quarantine row per record, so input counts still add up.
            for i in range(pf.metadata.num_rows):
                out.add_bad(ids.bad(f"{name}:{i}", b"schema"), None, "wrong_schema",
                            f"{name}: text column {params.text_field!r} is {got}", "")
            return
        row_index = 0
        try:
            for batch in pf.iter_batches(batch_size=4096):
                for rec in batch.to_pylist():
                    row_index += 1
                    row, reason, detail, record_id = _record_row(rec, params, source)
                    canonical = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS, default=str)
                    if row is None:
                        assert reason is not None
                        out.add_bad(ids.bad(f"{name}:{row_index}", canonical), record_id, reason,
                                    f"{name}:{row_index}: {detail}", canonical.decode(errors="replace"))
                        continue
                    row["doc_id"] = ids.assign(canonical)
                    out.add_doc(row)
        except Exception as exc:
            out.add_bad(ids.bad(f"{name}:{row_index}", b"truncated"), None, "unreadable_file",
                        f"{name} after row {row_index}: {type(exc).__name__}: {exc}", "")
