"""Exact Jaccard of document pairs whose texts need not fit in memory.

Fuzzy dedup checks millions of candidate pairs against the true Jaccard of their shingle sets; the
texts of the documents in them can be as large as the corpus. ``pair_jaccard`` holds at most
``text_block_bytes`` of text at a time:

1. one scan of ``raw_documents`` keeps the wanted texts, spilling them to a local file once they
   pass the budget (a corpus whose candidate texts fit never touches the disk);
2. the pairs are packed into blocks whose documents' texts fit the budget: pairs sorted by group
   (a connected component of the pair graph), a group kept whole in one block where it fits, a
   larger one split between blocks (a document can then be read into several);
3. the spilled texts are scattered into one file per block, and each block is loaded and run
   through the pair kernel (numba, or its torch twin) alone.

Every pair is computed exactly once whatever the budget, so results do not depend on it. Before
any spilled byte is written (the gathered texts, batch by batch; the block files, all at once),
the free space of the spill folder (under ``TMPDIR``) is checked: a spill that would leave less
than ``reserve`` bytes free fails first, in one line naming the settings that make room.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import Backend, pair_jaccard_on
from stages.errors import StageError
from stages.keep import ID_BYTES, fixed_ids
from stages.kernels.lsh import pack_blocks, sorted_distinct, sorted_find
from stages.params import SPILL_RESERVE
from stages.removal import raw_dirs
from stages.scratch import scratch_folder
from stages.task import Inputs

_ROWS = pa.schema([("node", pa.int64()), ("text", pa.large_string())])


class SpillSpaceError(StageError):
    """The spill folder has not the room a spill needs (a user setting to change, not a crash)."""


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def check_free_space(folder: Path, needed: int, reserve: int) -> None:
    """Fail with :class:`SpillSpaceError` unless writing ``needed`` more bytes under ``folder``
    leaves at least ``reserve`` bytes free (before they are written: a full disk would fail
    whatever shares it, and late)."""
    free = shutil.disk_usage(folder).free
    if free - needed < reserve:
        raise SpillSpaceError(
            f"fuzzy dedup needs to spill {_size(needed)} more of candidate texts to {folder.parent} (TMPDIR), "
            f"which has {_size(free)} free and keeps {_size(reserve)} (spill_reserve_bytes): raise text_block_bytes "
            "(curate.yaml execution:) to hold more in memory, or give TMPDIR more room (in a pod: CURATE_K8S_TMP_GIB)"
        )


class _Gathered:
    """The wanted texts, in memory until they pass the budget, then in a local Arrow file."""

    def __init__(self, budget: int, tmp: Path, reserve: int) -> None:
        self.budget = budget
        self.tmp = tmp
        self.reserve = reserve
        self.held: list[pa.RecordBatch] = []
        self.bytes = 0
        self.writer: pa.ipc.RecordBatchFileWriter | None = None

    def add(self, batch: pa.RecordBatch, nbytes: int) -> None:
        self.bytes += nbytes
        if self.writer is None and self.bytes <= self.budget:
            self.held.append(batch)
            return
        check_free_space(self.tmp, self.bytes if self.writer is None else nbytes, self.reserve)
        if self.writer is None:
            self.writer = pa.ipc.new_file(str(self.tmp / "gathered.arrow"), _ROWS)
            for held in self.held:
                self.writer.write_batch(held)
            self.held = []
        self.writer.write_batch(batch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    @property
    def spilled(self) -> bool:
        return self.writer is not None


class IdIndex:
    """Positions of strings in a fixed set, built once (``pc.index_in`` rebuilds its hash table on
    every call, which dominates a scan of many batches against a million ids). ASCII ids (doc_ids
    are hex) are kept as one sorted fixed-width bytes array and found by binary search; any other
    set falls back to ``pc.index_in``."""

    def __init__(self, ids: pa.Array) -> None:
        self.ids = ids
        self.width = 0
        if len(ids) and ids.null_count == 0 and pc.all(pc.string_is_ascii(ids)).as_py() \
                and not pc.any(pc.match_substring(ids, "\x00")).as_py():
            self.width = max(int(pc.max(pc.binary_length(ids)).as_py()), 1)
            keys = self._fixed(ids)
            self.order = np.argsort(keys, kind="stable")
            self.keys = keys[self.order]
            del keys

    def _fixed(self, ids: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bytes_]:
        """``ids`` (none longer than ``width``) as numpy fixed-width bytes; doc_ids (32 bytes
        each) straight from Arrow's buffers, without a ``str`` per id."""
        if self.width == ID_BYTES:
            return fixed_ids(ids)
        return np.asarray(ids.to_numpy(zero_copy_only=False), dtype=f"S{self.width}")

    def find(self, values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
        """int64 (len(values),): position of each value in the set, -1 where absent."""
        if not self.width:
            pos = pc.index_in(values, value_set=self.ids)
            return np.asarray(pc.fill_null(pos, -1).to_numpy(zero_copy_only=False), np.int64)
        out = np.full(len(values), -1, np.int64)
        # only ids that could be in the set reach the bytes conversion (it rejects non-ASCII)
        ok = pc.and_(pc.and_(pc.less_equal(pc.binary_length(values), self.width), pc.string_is_ascii(values)),
                     pc.invert(pc.match_substring(values, "\x00")))
        rows = np.flatnonzero(pc.fill_null(ok, False).to_numpy(zero_copy_only=False))
        if rows.shape[0]:
            cand = self._fixed(pc.take(values, pa.array(rows)))
            at = sorted_find(self.keys, cand)
            out[rows[at >= 0]] = self.order[at[at >= 0]]
        return out


class GatherStopped(Exception):
    """A gather of texts left before its end (``PairTexts``' ``stop``): its caller failed meanwhile."""


def _gather(
    inputs: Inputs, doc_ids: pa.Array, wanted: npt.NDArray[np.int64], budget: int, tmp: Path, batch_rows: int,
    reserve: int, stop: threading.Event | None = None, dirs: list[str] | None = None,
) -> tuple[_Gathered, npt.NDArray[np.int64]]:
    """One scan of ``raw_documents`` (this crawl's and the earlier crawls' it reads; ``dirs``: those
    partitions alone) for the texts of documents ``wanted`` (sorted indices into ``doc_ids``).
    Returns the gathered (node, text) rows and int64 (n,) text bytes per document (0 where not
    wanted). ``stop`` set: ``GatherStopped`` at the next block."""
    size = np.zeros(len(doc_ids), np.int64)
    found = np.zeros(len(doc_ids), dtype=bool)
    index = IdIndex(doc_ids.take(pa.array(wanted)))
    gathered = _Gathered(budget, tmp, reserve)
    try:
        for block in inputs.store.iter_blocks(raw_dirs(inputs) if dirs is None else dirs, "documents",
                                              ["doc_id", "text"], batch_rows):
            if stop is not None and stop.is_set():
                raise GatherStopped
            pos = index.find(block.column(0).combine_chunks())
            rows = np.flatnonzero(pos >= 0)
            if not rows.shape[0]:
                continue
            node = wanted[pos[rows]]
            # the first copy of a document wins (an earlier crawl can hold the same doc_id)
            node, first = np.unique(node, return_index=True)
            fresh = ~found[node]
            rows, node = rows[first[fresh]], node[fresh]
            if not rows.shape[0]:
                continue
            found[node] = True
            # Taken chunk by chunk (a source's batch each): Arrow's take on the chunked column
            # would join every text of the block first, a fresh copy of them all for each block.
            order = np.argsort(rows, kind="stable")
            rows, node = rows[order], node[order]
            texts = block.column(1)
            starts = np.cumsum([0, *(len(chunk) for chunk in texts.chunks)])
            cuts = np.searchsorted(rows, starts)
            for chunk, start, lo, hi in zip(texts.chunks, starts, cuts, cuts[1:], strict=False):
                if lo == hi:
                    continue
                # a chunk wanted whole (a corpus of near-duplicates: most are) is kept as it is
                text = (chunk if hi - lo == len(chunk) else chunk.take(pa.array(rows[lo:hi] - start))
                        ).cast(pa.large_string())
                nbytes = pc.binary_length(text).to_numpy().astype(np.int64)
                size[node[lo:hi]] = nbytes
                gathered.add(pa.record_batch([pa.array(node[lo:hi]), text], schema=_ROWS), int(nbytes.sum()))
    finally:
        gathered.close()
    missing = int(wanted.shape[0] - found[wanted].sum())
    if missing:
        raise RuntimeError(f"{missing} candidate documents are missing from raw_documents")
    return gathered, size


def _scatter(source: Path, tmp: Path, node_block: npt.NDArray[np.int64], blocks: int) -> list[Path]:
    """Copy each gathered row into the file of every block holding its document.

    node_block: int64 (m,) distinct ``node << 32 | block`` values, sorted.
    """
    paths = [tmp / f"block-{b:05d}.arrow" for b in range(blocks)]
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    nodes_of = node_block >> 32
    try:
        with pa.OSFile(str(source)) as fh:  # read, not mapped: mapped pages would count as memory
            reader = pa.ipc.open_file(fh)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                node = batch.column(0).to_numpy()
                lo = np.searchsorted(nodes_of, node, side="left")
                hi = np.searchsorted(nodes_of, node, side="right")
                count = hi - lo
                row = np.repeat(np.arange(node.shape[0]), count)
                at = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(row.shape[0])
                block = node_block[at] & 0xFFFFFFFF
                order = np.argsort(block, kind="stable")
                row, block = row[order], block[order]
                cuts = np.flatnonzero(np.diff(block)) + 1
                for part in np.split(np.arange(row.shape[0]), cuts):
                    if part.shape[0]:
                        b = int(block[part[0]])
                        if b not in writers:
                            writers[b] = pa.ipc.new_file(str(paths[b]), _ROWS)
                        writers[b].write_batch(batch.take(pa.array(row[part])))
    finally:
        for w in writers.values():
            w.close()
    return paths


class PairTexts:
    """The texts of a set of documents, gathered once, for exact Jaccard of pairs among them.

    Use as a context manager (the local spill directory is removed on exit). ``jaccard`` can be
    called repeatedly (e.g. verification, then its fallback) without reading ``raw_documents``
    again; each call holds at most ``budget`` bytes of text.
    """

    def __init__(self, inputs: Inputs, doc_ids: pa.Array, wanted: npt.NDArray[np.int64], *,
                 budget: int, batch_rows: int = 20_000, reserve: int = SPILL_RESERVE,
                 stop: threading.Event | None = None, dirs: list[str] | None = None) -> None:
        """doc_ids: string (n,) the documents' ids; wanted: int64 indices into it (any order,
        repeats allowed) of the documents whose texts pairs will need; reserve: bytes a spill
        leaves free in its folder (``ExecutionParams.spill_reserve_bytes``); stop: set by a caller
        that gathers on another thread and failed meanwhile (``GatherStopped``); dirs: the
        ``raw_documents`` partitions that hold them (``stages.removal.raw_dirs``), else all."""
        self.n = len(doc_ids)
        self.budget = budget
        self.reserve = reserve
        self.blocks = 0  # blocks loaded over all calls
        self._tmp = scratch_folder("pair-texts")
        self._cached: tuple[Any, npt.NDArray[np.int64]] | None = None
        try:
            self._gathered, self.size = _gather(inputs, doc_ids, sorted_distinct(np.asarray(wanted, np.int64)),
                                                budget, self._tmp, batch_rows, reserve, stop, dirs)
        except BaseException:
            self.close()
            raise

    @property
    def spilled(self) -> bool:
        """Whether the texts passed the budget and went to local disk."""
        return self._gathered.spilled

    def __enter__(self) -> PairTexts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._cached = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _in_memory(self) -> tuple[Any, npt.NDArray[np.int64]]:
        """(Utf8Batch, int64 (n,) row of each document in it or -1) when nothing was spilled."""
        from stages.kernels.minhash import from_arrow

        if self._cached is None:
            table = pa.Table.from_batches(self._gathered.held, _ROWS)
            self._gathered.held = []
            row_of = np.full(self.n, -1, np.int64)
            row_of[table.column(0).to_numpy()] = np.arange(table.num_rows)
            self._cached = (from_arrow(table.column(1)), row_of)
        return self._cached

    def jaccard(
        self,
        src: npt.NDArray[np.int64],
        dst: npt.NDArray[np.int64],
        group: npt.NDArray[np.int64] | None,
        *,
        shingle: int,
        backend: Backend,
    ) -> npt.NDArray[np.float64]:
        """float64 (e,): exact Jaccard of each pair. src, dst: int64 (e,) wanted documents; group:
        int64 (e,) a label keeping related pairs in one block (the pair graph's component), or
        None where none is known."""
        from stages.kernels.minhash import from_arrow

        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        out = np.empty(src.shape[0], np.float64)
        if not src.shape[0]:
            return out
        if not self._gathered.spilled:
            texts, row_of = self._in_memory()
            if (row_of[src] < 0).any() or (row_of[dst] < 0).any():
                raise ValueError("a pair names a document that was not gathered")
            self.blocks += 1
            out[:] = pair_jaccard_on(backend, texts, row_of[src], row_of[dst], shingle=shingle, group=group)
            return out
        group = np.zeros(src.shape[0], np.int64) if group is None else np.asarray(group, np.int64)
        order, block, blocks = pack_blocks(src, dst, group, self.size, self.budget)  # block: of order's pairs
        node_block = sorted_distinct(np.concatenate([(src[order] << 32) | block, (dst[order] << 32) | block]))
        check_free_space(self._tmp, int(self.size[node_block >> 32].sum()), self.reserve)  # the block files
        paths = _scatter(self._tmp / "gathered.arrow", self._tmp, node_block, blocks)
        cuts = np.searchsorted(block, np.arange(blocks + 1))
        row_of = np.full(self.n, -1, np.int64)
        for b in range(blocks):
            pairs = order[cuts[b]:cuts[b + 1]]
            with pa.OSFile(str(paths[b])) as fh:
                table = pa.ipc.open_file(fh).read_all()
            paths[b].unlink()
            node = table.column(0).to_numpy()
            row_of[node] = np.arange(node.shape[0])
            texts = from_arrow(table.column(1))
            del table
            if (row_of[src[pairs]] < 0).any() or (row_of[dst[pairs]] < 0).any():
                raise ValueError("a pair names a document that was not gathered")
            out[pairs] = pair_jaccard_on(backend, texts, row_of[src[pairs]], row_of[dst[pairs]], shingle=shingle,
                                         group=group[pairs])
            row_of[node] = -1
            self.blocks += 1
        return out


def pair_jaccard(
    inputs: Inputs,
    doc_ids: pa.Array,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64] | None,
    *,
    shingle: int,
    backend: Backend,
    budget: int,
    batch_rows: int = 20_000,
    reserve: int = SPILL_RESERVE,
    dirs: list[str] | None = None,
) -> tuple[npt.NDArray[np.float64], int]:
    """(float64 (e,) exact Jaccard of each pair, blocks used): ``PairTexts`` for one set of pairs.

    doc_ids: string (n,) the documents' ids; src, dst: int64 (e,) indices into it; group: as in
    ``PairTexts.jaccard``. Texts are read from ``raw_documents`` (``dirs``: those partitions
    alone), at most ``budget`` bytes at once.
    """
    if not len(src):
        return np.empty(0, np.float64), 0
    with PairTexts(inputs, doc_ids, np.concatenate([src, dst]), budget=budget, batch_rows=batch_rows,
                   reserve=reserve, dirs=dirs) as texts:
        out = texts.jaccard(src, dst, group, shingle=shingle, backend=backend)
        return out, texts.blocks
