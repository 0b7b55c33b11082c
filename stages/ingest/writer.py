"""The ingesting process's side: ids for what the tasks found, in input order, written in parts.

Tasks come back in input order (``stages.parallel.zip_results``), so this process numbers lines
across the tasks of a file, numbers occurrences of identical records and assigns doc_ids: ids,
locators, quarantine and the written tables are the same for any task size, worker count or
executor. Memory: ``batch_rows`` rows, ~24 bytes per distinct record (occurrence numbers) and,
with an id field, 48 bytes per record that has an id (the duplicate-id check).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from stages.ingest.ids import Ids, bad_digest
from stages.ingest.records import RAW_EXCERPT, Bad, Done
from stages.ingest.tasks import Task
from stages.params import RawDocumentsParams
from stages.store import PartitionWriter

DOCUMENTS = pa.schema([
    ("doc_id", pa.string()),
    ("record_id", pa.string()),
    ("source", pa.string()),
    ("url", pa.string()),
    ("locator", pa.string()),  # where the record was read: "<file>:<line>" or "<file>#<row>"
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
    ("duplicate_of", pa.string()),  # duplicate_record_id: the kept document of that record id; else null
])


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_SET_CHECKED = 4096  # record ids checked for repeats with a set, not sorted (``_duplicate_record_ids``)


def hex_ids(raw: bytes) -> pa.Array:
    """string (n,): the 32-character lowercase hex of each 16-byte id of ``raw`` (concatenated;
    ``bytes.hex`` of each), at once."""
    digits = np.frombuffer(raw, np.uint8).reshape(-1, 16)
    n = len(digits)
    text = np.empty((n, 32), np.uint8)
    text[:, 0::2] = _HEX[digits >> 4]
    text[:, 1::2] = _HEX[digits & 15]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(text)])


class Output:
    """Assigns ids to what the tasks found and writes documents and quarantine in parts of
    ``batch_rows``; resolves duplicate record ids at the end (``close``)."""

    def __init__(self, output: PartitionWriter, params: RawDocumentsParams, crawl: str, source: str,
                 batch_rows: int) -> None:
        self.output, self.params, self.source, self.batch_rows = output, params, source, batch_rows
        self.ids = Ids(crawl, source)
        self.table = "documents"  # where document parts go ("documents_checked" while rewriting)
        self.docs: list[pa.Table] = []
        self.pending = 0
        self.bad: list[dict[str, Any]] = []
        self.reasons: Counter[str] = Counter()
        self.kept = 0
        self.chars = 0
        self.damaged: list[dict[str, Any]] = []
        # (record id digest, content digest, doc_id) per record that has an id, "S16" each: 48 bytes
        # a record, no strings, so a source of millions of records can be checked for id clashes
        self.record_ids: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, task: Task, done: Done, base: int) -> None:
        """``done``, found by ``task``; ``base``: lines (rows) of its file before the task."""
        raw_ids = self.ids.assign(done.digests)
        n = done.docs.num_rows
        sep = "#" if task.is_rows else ":"
        name = task.file.name
        table = pa.table({
            "doc_id": hex_ids(raw_ids), "record_id": done.docs["record_id"],
            "source": pa.repeat(pa.scalar(self.source, pa.string()), n), "url": done.docs["url"],
            "locator": pc.binary_join_element_wise(f"{name}{sep}", pc.cast(pa.array(base + done.positions),
                                                                           pa.string()), ""),
            "text": done.docs["text"], "metadata": done.docs["metadata"],
        }, schema=DOCUMENTS)
        if self.params.id_field is not None and n:
            rids = table["record_id"]
            has = np.flatnonzero(np.asarray(rids.is_valid()))
            if len(has):
                # the ids' UTF-8 bytes as they are: bytes values, no str to encode
                named = pc.drop_null(rids).cast(pa.large_binary()).to_pylist()
                self.record_ids.append((
                    np.frombuffer(b"".join(map(xxhash.xxh3_128_digest, named)), "S16"),
                    np.frombuffer(done.digests, "S16")[has],
                    np.frombuffer(raw_ids, "S16")[has],
                ))
        self._add_docs(table)
        self.kept += n
        self.chars += done.chars
        if done.bad:
            self._add_bad(task, done.bad, base)
        if done.damage is not None:
            self.damaged.append(done.damage)

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

    def _add_bad(self, task: Task, bad: list[Bad], base: int) -> None:
        sep = "#" if task.is_rows else ":"
        keys, rows = [], []
        for b in bad:
            where = f"{task.file.name}{sep}{base + b.pos}"
            keys.append(bad_digest(where, b.raw_digest))
            rows.append((b.record_id, b.reason, f"{where}: {b.message}", b.raw))
        ids = self.ids.assign(b"".join(keys))
        for i, (record_id, reason, detail, raw) in enumerate(rows):
            self.quarantine(ids[16 * i:16 * i + 16].hex(), record_id, reason, detail, raw)

    def quarantine(self, doc_id: str, record_id: str | None, reason: str, detail: str, raw: str,
                   duplicate_of: str | None = None) -> None:
        self.bad.append({"doc_id": doc_id, "record_id": record_id, "source": self.source,
                         "reason": reason, "detail": detail[:500], "raw": raw[:RAW_EXCERPT],
                         "duplicate_of": duplicate_of})
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
        # Nearly always each id names one record. Up to a few thousand, a set of them says so for
        # less than the sort's numpy calls cost (values out of numpy lose trailing NULs, the same
        # ones from the same 16 bytes: distinct digests stay distinct).
        if len(rid) <= _SET_CHECKED and len(set(rid.tolist())) == len(rid):
            return
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
        self.table, self.kept, self.chars = "documents_checked", 0, 0
        out: list[tuple[str, str | None, str]] = []
        for batch in self.output.iter_batches("documents", self.batch_rows):
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
                            "(the lowest doc_id of the id is kept)", raw, duplicate_of=moved[doc_id])
