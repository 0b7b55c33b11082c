"""Removal lists: the one table format every removing program writes, and how it is applied.

Programs never delete. Every removing program writes a ``removed`` table (schema ``REMOVED``)
naming each removed document, the reason, the kept document it duplicated (dedup) and a score
(the value that decided it) — in each source partition for per-source programs, in the crawl
partition for corpus-wide ones. Later programs see only the survivors of
earlier ones (``survivors``), so a duplicate group never keeps a document a cheaper stage has
already removed, and every removed document is attributed to exactly one stage.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.catalog import PROGRAMS, STAGES
from stages.progress import Progress
from stages.store import Manifest, Store
from stages.task import Inputs

REMOVED = pa.schema([
    ("doc_id", pa.string()),
    ("source", pa.string()),
    ("reason", pa.string()),
    ("duplicate_of", pa.string()),
    ("duplicate_of_source", pa.string()),
    ("score", pa.float64()),
])


def removed_ids(inputs: Inputs, program: str, source: str) -> pa.Array:
    """doc_ids that ``program`` removes from ``source`` (string array, in the list's order). An
    empty list (most are: a disabled stage writes one) is known from its manifest, no part read."""
    crawl_wide = PROGRAMS[program].level != "source"
    pdir = inputs.dir(program, None if crawl_wide else source)
    manifest = inputs.manifest(program, None if crawl_wide else source)
    names = manifest.tables.get("removed", [])
    if not names or manifest.rows.get("removed") == 0:
        return pa.array([], pa.string())
    if not crawl_wide:
        return inputs.store.read_table(pdir, "removed", ["doc_id"], manifest)["doc_id"].combine_chunks()
    return crawl_removed_ids(inputs.store, pdir, manifest, source)


# Crawl-wide removal lists' doc_ids split by source, in this process, most recently used last. A
# pool worker runs a crawl's source partitions one after another and each reads the same
# crawl-wide lists (exact and fuzzy dedup's): at 200 sources, read and filtered whole 200 times
# over. Keyed by the partition's folder and what its manifest commits: data version, part names
# (unique to the attempt that wrote them) and sizes, so a list committed again is read again,
# never served from an earlier commit.
_BY_SOURCE: OrderedDict[tuple[str, str, tuple[tuple[str, int | None], ...]], tuple[int, dict[str, pa.Array]]] = \
    OrderedDict()
# Bytes of doc_ids held at most, all lists together; a larger list is read and filtered per
# partition, as before, so no worker holds it between partitions.
BY_SOURCE_BYTES = 64 << 20
_BY_SOURCE_LOCK = threading.Lock()


def crawl_removed_ids(store: Store, pdir: str, manifest: Manifest, source: str) -> pa.Array:
    """doc_ids of ``source`` in the crawl-wide removal list committed at ``pdir`` by ``manifest``
    (string array, in the list's order): read once per commit and process, and split by source
    (``_BY_SOURCE``)."""
    names = manifest.tables.get("removed", [])
    key = (store.url(pdir), manifest.data_version, tuple((n, manifest.sizes.get(n)) for n in names))
    with _BY_SOURCE_LOCK:  # partitions of one process may run on threads (Dagster's in-process executor)
        held = _BY_SOURCE.get(key)
        if held is not None:
            _BY_SOURCE.move_to_end(key)
    if held is not None:
        return held[1].get(source, pa.array([], pa.string()))
    table = store.read_table(pdir, "removed", ["doc_id", "source"], manifest)
    size = table["doc_id"].nbytes
    if size > BY_SOURCE_BYTES:
        return table.filter(pc.equal(table["source"], source))["doc_id"].combine_chunks()
    by_source = split_by_source(table)
    with _BY_SOURCE_LOCK:
        _BY_SOURCE[key] = (size, by_source)
        while sum(n for n, _ in _BY_SOURCE.values()) > BY_SOURCE_BYTES:
            _BY_SOURCE.popitem(last=False)
    return by_source.get(source, pa.array([], pa.string()))


def split_by_source(table: pa.Table) -> dict[str, pa.Array]:
    """{source: its doc_ids, in table order} of a table with ``doc_id`` and ``source``: one stable
    sort by source, then zero-copy slices (rows with a null source belong to none)."""
    ids = table["doc_id"].combine_chunks()
    codes_of = pc.dictionary_encode(table["source"].combine_chunks())
    codes = np.asarray(pc.fill_null(codes_of.indices, -1), np.int64)
    order = np.argsort(codes, kind="stable")
    ordered = ids.take(pa.array(order))
    bounds = np.searchsorted(codes[order], np.arange(len(codes_of.dictionary) + 1))
    return {str(name): ordered.slice(int(a), int(b - a))
            for name, a, b in zip(codes_of.dictionary.to_pylist(), bounds[:-1], bounds[1:], strict=True)}


def applied_programs(inputs: Inputs) -> list[str]:
    """The removing programs among a task's inputs, in pipeline order."""
    return [name for name in STAGES.values() if name in inputs.dirs]


def removal_lists(inputs: Inputs, source: str) -> dict[str, pa.Array]:
    """{program: doc_ids it removes from ``source``} of the removing programs among a task's
    inputs, in pipeline order (``removed_ids``)."""
    return {name: removed_ids(inputs, name, source) for name in applied_programs(inputs)}


def dropped_ids(lists: Iterable[pa.Array]) -> pa.Array:
    """The doc_ids of all ``lists`` (string arrays) in one string array, in their order."""
    drop = list(lists)
    return pa.chunked_array(drop, type=pa.string()).combine_chunks() if drop else pa.array([], pa.string())


def survivor_count(inputs: Inputs, source: str, removed: dict[str, pa.Array] | None = None) -> int:
    """How many rows ``survivors`` yields, from the manifests and removal lists without reading
    the documents: ids are unique within a source (a collision is an ingestion error), and each
    removed document is in one list only, among this source's raw rows."""
    lists = (removal_lists(inputs, source) if removed is None else removed).values()
    return inputs.manifest("raw_documents", source).rows.get("documents", 0) - sum(len(ids) for ids in lists)


def survivors(
    inputs: Inputs, source: str, columns: list[str] | None, batch_rows: int = 20_000,
    progress: Progress | None = None, removed: dict[str, pa.Array] | None = None,
) -> Iterator[pa.Table]:
    """Batches of ``raw_documents`` rows of ``source`` that no input removal list removes
    (``removed``: the lists, where the caller has read them: ``removal_lists``).
    With ``progress``, the survivors are expected and each batch advances it (documents, and
    UTF-8 bytes of ``text`` where it is read): a program's main pass over its documents."""
    removed = removal_lists(inputs, source) if removed is None else removed
    dropped = dropped_ids(removed.values())
    if progress is not None:
        progress.expect(docs=survivor_count(inputs, source, removed))
    for batch in inputs.store.iter_batches(inputs.dir("raw_documents", source), "documents", columns, batch_rows):
        table = pa.Table.from_batches([batch])
        if len(dropped):
            table = kept_rows(table, ~np.asarray(pc.is_in(table["doc_id"], value_set=dropped)))
        if progress is not None:
            nbytes = pc.sum(pc.binary_length(table["text"])).as_py() if "text" in table.column_names else 0
            progress.advance(table.num_rows, int(nbytes or 0))
        yield table


def kept_rows(table: pa.Table, keep: np.ndarray) -> pa.Table:
    """The rows of ``table`` where ``keep`` (bool (rows,)) is true, in order: zero-copy slices of
    ``table`` (one chunk per run of kept rows) where the removed rows are few, so long texts are
    not copied; a filtered copy where runs are many and short."""
    if keep.all():
        return table
    edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
    starts, stops = edges[0::2], edges[1::2]
    if len(starts) > 16 and 64 * len(starts) > len(keep):  # runs of < 64 rows: chunks would cost more
        return table.filter(pa.array(keep))
    if not len(starts):
        return table.slice(0, 0)
    return pa.concat_tables([table.slice(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)])


def removal_table(
    doc_id: np.ndarray, source: np.ndarray, reason: str, duplicate_of: np.ndarray | None,
    duplicate_of_source: np.ndarray | None, score: np.ndarray | None, reasons: np.ndarray | None = None,
) -> pa.Table:
    """A ``REMOVED`` table from equal-length arrays (None columns become nulls); ``reasons``
    gives a reason per row instead of the one ``reason``."""
    n = len(doc_id)
    return pa.table({
        "doc_id": pa.array(doc_id, pa.string()),
        "source": pa.array(source, pa.string()),
        "reason": pa.array(reasons if reasons is not None else [reason] * n, pa.string()),
        "duplicate_of": pa.array(duplicate_of, pa.string()) if duplicate_of is not None else pa.nulls(n, pa.string()),
        "duplicate_of_source": (pa.array(duplicate_of_source, pa.string()) if duplicate_of_source is not None
                                else pa.nulls(n, pa.string())),
        "score": (pa.array(score, pa.float64(), from_pandas=True) if score is not None
                  else pa.nulls(n, pa.float64())),
    }, schema=REMOVED)


def kept_where(duplicate_of_source: pa.Array | pa.ChunkedArray, crawl: str) -> tuple[pa.Array, pa.Array]:
    """(source, crawl) of the kept document each removal duplicated, from a ``REMOVED`` table's
    ``duplicate_of_source``: ``"<crawl>/<source>"`` names a document an earlier crawl kept (source
    and crawl names never hold a ``/``), a bare ``<source>`` one of ``crawl`` itself; both null
    where the row names no kept document. String arrays, columnar."""
    col = pa.chunked_array([duplicate_of_source]) if isinstance(duplicate_of_source, pa.Array) \
        else duplicate_of_source
    col = col.cast(pa.string()).combine_chunks()
    earlier = pc.fill_null(pc.greater_equal(pc.find_substring(col, "/"), 0), False)
    source = pc.replace_substring_regex(col, "^[^/]*/", "")
    of_crawl = pc.if_else(earlier, pc.replace_substring_regex(col, "/.*$", ""),
                          pc.if_else(pc.is_valid(col), pa.scalar(crawl, pa.string()), pa.scalar(None, pa.string())))
    return source, of_crawl


PART_ROWS = 1 << 20  # rows of a removal part built at once (~150 MiB of Arrow columns at most)


def removal_parts(
    doc_id: np.ndarray, source_index: np.ndarray, names: list[str], reason: str,
    rows: np.ndarray, kept: np.ndarray | None, part_rows: int = PART_ROWS, *,
    kept_index: np.ndarray | None = None, kept_names: list[str] | None = None,
    score: np.ndarray | None = None, reasons: tuple[np.ndarray, list[str]] | None = None,
) -> Iterator[pa.Table]:
    """``REMOVED`` tables, ``part_rows`` rows at a time, for the rows ``rows`` of a crawl's
    columns (``doc_id``: ``"S32"`` (n,), see ``stages.keep.fixed_ids``; ``source_index``: int (n,)
    into ``names``), each the duplicate of row ``kept[i]`` (or none). Built from the numpy
    buffers: no Python object and no fixed-width unicode copy per removed document, so a removal
    list of any length costs its index arrays (16 bytes a removed document) plus one part.

    Optional, aligned as said: ``kept_index`` int (n,) into ``kept_names``, the kept document's
    ``duplicate_of_source`` label (default: its ``source_index`` into ``names``); ``score`` float
    (len(rows),), NaN written as null; ``reasons`` (codes int (len(rows),), labels): a reason per
    row instead of the one ``reason``."""
    labels = pa.array(names, pa.string())
    kept_labels = labels if kept_names is None else pa.array(kept_names, pa.string())
    kept_of = source_index if kept_index is None else kept_index
    reason_labels = None if reasons is None else pa.array(reasons[1], pa.string())
    if len(rows) == 0:
        yield REMOVED.empty_table()  # the table exists, with its schema, when nothing is removed
    for start in range(0, len(rows), part_rows):
        r = rows[start:start + part_rows]
        d = kept[start:start + part_rows] if kept is not None else None
        n = len(r)
        yield pa.table({
            "doc_id": id_column(doc_id[r]),
            "source": labels.take(pa.array(source_index[r])),
            "reason": (pa.repeat(pa.scalar(reason, pa.string()), n) if reasons is None or reason_labels is None
                       else reason_labels.take(pa.array(reasons[0][start:start + part_rows]))),
            "duplicate_of": id_column(doc_id[d]) if d is not None else pa.nulls(n, pa.string()),
            "duplicate_of_source": (kept_labels.take(pa.array(kept_of[d])) if d is not None
                                    else pa.nulls(n, pa.string())),
            "score": (pa.array(np.asarray(score[start:start + part_rows], np.float64), pa.float64(),
                               from_pandas=True) if score is not None else pa.nulls(n, pa.float64())),
        }, schema=REMOVED)


def id_column(ids: np.ndarray) -> pa.Array:
    """A string column of fixed-width ``"S<w>"`` ids, from their bytes (ids shorter than the
    width, NUL-padded by numpy, go through a copy instead)."""
    width = ids.dtype.itemsize
    raw = np.ascontiguousarray(ids).view(np.uint8)
    if len(ids) == 0 or width == 0 or not raw.reshape(len(ids), width)[:, -1].all():
        return pa.array(ids.astype(str) if len(ids) else [], pa.string())
    offsets = np.arange(0, width * (len(ids) + 1), width, dtype=np.int64 if width * len(ids) >= 2**31 else np.int32)
    kind = pa.large_string() if offsets.dtype == np.int64 else pa.string()
    out = pa.Array.from_buffers(kind, len(ids), [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
    return out if kind == pa.string() else out.cast(pa.string())


def raw_dirs(inputs: Inputs, holding: Collection[tuple[str, str]] | None = None, crawl: str = "") -> list[str]:
    """``raw_documents`` partitions a task may read texts from: its crawl's and, for incremental
    dedup, those of the earlier crawls it is deduplicated against. ``holding``: only those of these
    (crawl, source) pairs (``crawl``: the task's own), where the documents wanted are known to be
    (a doc_id is of one crawl and source: ``stages.ingest.ids``)."""
    dirs = [inputs.dir("raw_documents", s) for s in inputs.sources("raw_documents")
            if holding is None or (crawl, s) in holding]
    for earlier, outputs in inputs.prior.items():
        dirs.extend(d for name, d in sorted(outputs.items()) if name.startswith("raw_documents/")
                    and (holding is None or (earlier, name.removeprefix("raw_documents/")) in holding))
    return dirs
