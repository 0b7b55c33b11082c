"""LSH over MinHash signatures: band keys, buckets to anchor edges, exact verification, components.

Band by band, as SEDD does instead of a global shuffle: ``band_keys`` gives every document one
uint64 key per band, ``band_edges`` groups ONE band's keys (a sort, memory O(n) for that band)
and links every bucket member to the bucket's anchor (its lowest id), so a bucket of m documents
yields m - 1 edges however large it is. ``verify_candidates`` checks the edges of all bands
against the true Jaccard of the shingle sets (with a bounded fallback to bucket-mates for
members that fail against their anchor), ``connected_components`` turns the kept edges into
groups.
See ``docs/minhash.md`` for the definitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numba
import numpy as np
import numpy.typing as npt
from numba import njit, prange

from stages.kernels.minhash import (
    _U64_1,
    BAND_SEED_MULT,
    Docs,
    Utf8Batch,
    _decode,
    _fmix64,
    _pow_base,
    _readonly,
    _roll,
    as_utf8,
)

SIZE_CLASSES = 40  # bucket-size histogram: class c counts buckets with 2**c <= size < 2**(c + 1)
# Pair verification's blocks of text (``_block_budget``):
_BLOCK_MIN = 64 << 10  # bytes a block at least (smaller ones hash a cut component's documents twice)
_BLOCK_MAX = 1 << 20  # bytes a block at most (its hashes: 8 bytes a byte, on each thread)
_BLOCKS_PER_THREAD = 4  # blocks differ in cost: several a thread
_BLOCK_DOCS = 8  # a block holds this many of the largest document in pairs, at least


# --- band keys -----------------------------------------------------------------------------------


@njit(cache=True, parallel=True)
def _band_keys_kernel(sigs: Any, bands: int, rows: int, out: Any) -> None:
    for i in prange(sigs.shape[0]):
        for band in range(bands):
            h = _fmix64(np.uint64(band + 1) * np.uint64(BAND_SEED_MULT))
            for j in range(rows):
                h = _fmix64(h ^ np.uint64(sigs[i, band * rows + j]))
            out[i, band] = h


def band_keys(sigs: npt.NDArray[np.uint32], bands: int, rows: int) -> npt.NDArray[np.uint64]:
    """uint64 (n, bands): one bucket key per document and band.

    sigs: uint32 (n, num_perm) with ``bands * rows <= num_perm``; band t covers columns
    ``t*rows .. (t+1)*rows - 1``. Key: ``h = fmix64((t + 1) * BAND_SEED_MULT mod 2**64)``, then
    ``h = fmix64(h XOR v)`` for each of the band's ``rows`` values v in column order. Keys of
    different bands differ, so bands may share one table.
    """
    sigs = _readonly(np.ascontiguousarray(sigs, dtype=np.uint32))
    if sigs.ndim != 2:
        raise ValueError("sigs must be 2-D (n, num_perm)")
    if bands < 1 or rows < 1 or bands * rows > sigs.shape[1]:
        raise ValueError(f"need 1 <= bands * rows <= num_perm = {sigs.shape[1]}")
    out = np.empty((sigs.shape[0], bands), dtype=np.uint64)
    if sigs.shape[0]:
        _band_keys_kernel(sigs, bands, rows, out)
    return out


# --- buckets to edges ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketStats:
    """What one band's (or, merged, several bands') buckets looked like.

    size_hist: int64 (SIZE_CLASSES,), class c = buckets with 2**c <= size < 2**(c+1) (class 0
    holds the singletons). largest: up to ``top`` (size, key) pairs of buckets with 2+ members,
    biggest first, ties by key.
    """

    docs: int
    buckets: int
    edges: int
    size_hist: npt.NDArray[np.int64]
    largest: tuple[tuple[int, int], ...] = field(default=())

    def merge(self, other: BucketStats, top: int = 10) -> BucketStats:
        """Counts summed, largest buckets of both (keys of different bands never coincide)."""
        largest = sorted(self.largest + other.largest, key=lambda sk: (-sk[0], sk[1]))[:top]
        return BucketStats(
            docs=self.docs + other.docs,
            buckets=self.buckets + other.buckets,
            edges=self.edges + other.edges,
            size_hist=self.size_hist + other.size_hist,
            largest=tuple(largest),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (for asset metadata)."""
        last = int(np.flatnonzero(self.size_hist)[-1]) + 1 if self.size_hist.any() else 0
        return {
            "docs": self.docs,
            "buckets": self.buckets,
            "edges": self.edges,
            "size_hist": {f"{1 << c}-{(1 << (c + 1)) - 1}": int(self.size_hist[c]) for c in range(last)},
            "largest": [{"size": s, "key": f"{k:016x}"} for s, k in self.largest],
        }


def band_edges(
    keys: npt.NDArray[np.uint64], ids: npt.NDArray[np.int64], *, top: int = 10
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], BucketStats]:
    """Anchor edges of ONE band: (src int64 (e,), dst int64 (e,), stats).

    keys: uint64 (n,) this band's key per document; ids: int64 (n,) node ids (distinct).
    Documents with equal keys form a bucket; its anchor is the member with the lowest id and
    every other member gets one edge ``src=member -> dst=anchor``: e = n - buckets edges, O(n log n)
    time, O(n) memory however large a bucket grows. Edges come grouped by bucket (ascending
    key), members in ascending id.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    ids = np.asarray(ids, dtype=np.int64)
    if keys.shape != ids.shape or keys.ndim != 1:
        raise ValueError("keys and ids must be 1-D of equal length")
    n = keys.shape[0]
    if n == 0:
        stats = BucketStats(0, 0, 0, np.zeros(SIZE_CLASSES, np.int64), ())
        return np.zeros(0, np.int64), np.zeros(0, np.int64), stats
    if n > 1 and bool((ids[1:] > ids[:-1]).all()):
        # ids ascending (a caller reading many bands orders its rows by id once): a stable sort
        # of the keys alone orders by (key, id), at half a lexsort's cost (77k rows: 5 against 10 ms)
        order = np.argsort(keys, kind="stable")
    else:
        order = np.lexsort((ids, keys))
    k_sorted = keys[order]
    id_sorted = ids[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(k_sorted[1:], k_sorted[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    bucket = np.cumsum(first) - 1  # bucket index of each sorted row
    member = ~first
    src = id_sorted[member]
    dst = id_sorted[starts][bucket[member]]

    sizes = np.diff(np.append(starts, n))
    size_class = np.floor(np.log2(sizes)).astype(np.int64)
    hist = np.bincount(size_class, minlength=SIZE_CLASSES)[:SIZE_CLASSES].astype(np.int64)
    multi = np.flatnonzero(sizes > 1)
    big = multi[np.lexsort((k_sorted[starts[multi]], -sizes[multi]))[:top]]
    largest = tuple((int(sizes[i]), int(k_sorted[starts[i]])) for i in big)
    stats = BucketStats(n, int(starts.shape[0]), int(src.shape[0]), hist, largest)
    return src, dst, stats


# --- exact verification --------------------------------------------------------------------------


@njit(inline="always")
def _table_cap(m: int) -> int:
    cap = 16
    while cap < 2 * m:
        cap *= 2
    return cap


@njit
def _shingles(data: Any, lo: int, hi: int, k: int, bk: Any, cps: Any, hs: Any) -> int:
    """Every shingle hash H of one document (repeats included) into ``hs``; returns how many.

    H = 0 is stored as 1, since 0 marks an empty slot of the set below: a 2**-64 event per
    shingle. Buffers hold ``hi - lo`` entries.
    """
    n = _decode(data, lo, hi, cps)
    ns = max(n - k + 1, 1) if n else 0
    if ns:
        _roll(cps, n, k, 0, ns, np.uint64(0), bk, hs, np.uint64(0))
    for i in range(ns):
        if hs[i] == 0:
            hs[i] = _U64_1
    return ns


@njit(cache=True)
def _plan_kernel(a: Any, b: Any, group: Any, size: Any, budget: int, seen: Any, gseen: Any, out: Any) -> int:
    """out[p] = block of pair p (pairs sorted by group); returns the number of blocks.

    ``seen[x]`` is the last block holding document x, ``gseen[x]`` the first pair of the last group
    that counted it (both start at -1).
    """
    e = a.shape[0]
    block = 0
    used = 0
    p = 0
    while p < e:
        q = p
        while q < e and group[q] == group[p]:
            q += 1
        need = 0  # bytes of the group's distinct documents
        for i in range(p, q):
            if gseen[a[i]] != p:
                gseen[a[i]] = p
                need += size[a[i]]
            if gseen[b[i]] != p:
                gseen[b[i]] = p
                need += size[b[i]]
        if need and used and used + need > budget:  # the group fits a fresh block better than this one
            block += 1
            used = 0
        for i in range(p, q):
            add = 0
            if seen[a[i]] != block:
                add += size[a[i]]
            if seen[b[i]] != block and b[i] != a[i]:
                add += size[b[i]]
            if add and used and used + add > budget:  # a group larger than a block: split it
                block += 1
                used = 0
                add = size[a[i]] + (size[b[i]] if b[i] != a[i] else 0)
            seen[a[i]] = block
            seen[b[i]] = block
            used += add
            out[i] = block
        p = q
    return block + 1 if e else 0


def pack_blocks(
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
    budget: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Pairs packed so that the texts of each block's documents take at most ``budget`` bytes (a
    single pair larger than that gets a block alone): (order int64 (e,) of the pairs, by (group,
    dst, src); block int64 (e,) of each pair in that order, non-decreasing; number of blocks).

    src, dst: int64 (e,) document indices into ``size`` (int64 (n,) text bytes); group: int64 (e,),
    pairs of one group are kept in one block where they fit. The packing follows the order
    (group, dst, src), so it does not depend on the order the pairs come in.
    """
    order = np.lexsort((src, dst, group))
    block = np.empty(src.shape[0], np.int64)
    n = size.shape[0]
    blocks = _plan_kernel(src[order], dst[order], group[order], size, budget,
                          np.full(n, -1, np.int64), np.full(n, -1, np.int64), block)
    return order, block, int(blocks)


@njit
def _hashed(data: Any, offsets: Any, k: int, bk: Any, docs: Any, j: int, hashes: Any, span: Any, at: int,
            cps: Any) -> int:
    """The block's ``j``-th document (row ``docs[j]``) hashed into ``hashes`` from ``at``, unless it
    is already (``span[j, 0] >= 0``): its (start, count) in ``span[j]``. Returns the next free slot."""
    if span[j, 0] >= 0:
        return at
    lo, hi = offsets[docs[j]], offsets[docs[j] + 1]
    span[j, 0] = at
    span[j, 1] = _shingles(data, lo, hi, k, bk, cps, hashes[at : at + hi - lo])
    return at + span[j, 1]


@njit
def _verify_block(data: Any, offsets: Any, k: int, docs: Any, member: Any, anchor: Any, out: Any, hashes: Any,
                  span: Any, cps: Any) -> None:
    """out[p] = Jaccard(docs[member[p]], docs[anchor[p]]) for the pairs of one block.

    ``docs``: int64 the block's distinct document rows; ``member``, ``anchor``: int64 (e,)
    indices into ``docs``, the pairs sorted so that those of one anchor are adjacent. Every
    document's shingles are hashed once into ``hashes`` (uint64, at least the documents' bytes;
    ``span``: int64 (at least len(docs), 2); ``cps``: uint32 at least the largest's bytes), not
    once for each pair it is in, and just before its first run of pairs reads it (while they are
    in cache). Per run of one anchor, an open-addressing table holds the anchor's set; slot i is
    (key, stamp) at ``table[2i], table[2i+1]``. Member q (1, 2, ...) probes each of its shingles
    once: a key with stamp != q is an anchor shingle seen for the first time (intersection + 1,
    stamp it q), a key with stamp q a repeat, an empty slot a shingle only the member has (insert
    it, stamped q). The member's insertions are undone in reverse order afterwards, which
    restores the linear-probing table exactly.
    """
    bk = _pow_base(k)
    span[: docs.shape[0], 0] = -1
    at = 0
    e = member.shape[0]
    p = 0
    while p < e:
        a = anchor[p]
        at = _hashed(data, offsets, k, bk, docs, a, hashes, span, at, cps)
        q = p
        m_size = 1
        while q < e and anchor[q] == a:
            at = _hashed(data, offsets, k, bk, docs, member[q], hashes, span, at, cps)
            m_size = max(m_size, span[member[q], 1])
            q += 1
        ns = span[a, 1]
        cap = _table_cap(ns + m_size)
        mask = np.uint64(cap - 1)
        table = np.zeros(2 * cap, dtype=np.uint64)
        undo = np.empty(m_size, dtype=np.int64)
        na = 0
        for i in range(span[a, 0], span[a, 0] + ns):
            h = hashes[i]
            slot = np.int64(h & mask)
            while table[2 * slot] != 0 and table[2 * slot] != h:
                slot = (slot + 1) & (cap - 1)
            if table[2 * slot] == 0:
                table[2 * slot] = h
                na += 1
        for r in range(p, q):
            stamp = np.uint64(r - p + 1)
            inter = 0
            nb = 0
            nu = 0
            for i in range(span[member[r], 0], span[member[r], 0] + span[member[r], 1]):
                h = hashes[i]
                slot = np.int64(h & mask)
                while True:
                    cur = table[2 * slot]
                    if cur == h:
                        if table[2 * slot + 1] != stamp:
                            table[2 * slot + 1] = stamp
                            inter += 1
                            nb += 1
                        break
                    if cur == 0:
                        table[2 * slot] = h
                        table[2 * slot + 1] = stamp
                        undo[nu] = slot
                        nu += 1
                        nb += 1
                        break
                    slot = (slot + 1) & (cap - 1)
            for u in range(nu - 1, -1, -1):
                table[2 * undo[u]] = 0
            union = na + nb - inter
            out[r] = 1.0 if union == 0 else inter / union
        p = q


@njit(cache=True, parallel=True)
def _pair_kernel(data: Any, offsets: Any, k: int, docs: Any, doc_start: Any, member: Any, anchor: Any,
                 pair_start: Any, workers: int, out: Any) -> None:
    """Exact Jaccard of every pair (``_verify_block``): block b's documents are
    ``docs[doc_start[b]:doc_start[b+1]]``, its pairs ``pair_start[b]:pair_start[b+1]``. Worker w
    of ``workers`` (in parallel) takes blocks w, w + workers, ... with one set of buffers, sized
    for the largest of them."""
    blocks = pair_start.shape[0] - 1
    for w in prange(workers):
        most, big, count = 1, 1, 1
        for b in range(w, blocks, workers):
            total = 0
            for j in range(doc_start[b], doc_start[b + 1]):
                size = offsets[docs[j] + 1] - offsets[docs[j]]
                total += size
                big = max(big, size)
            most = max(most, total)
            count = max(count, doc_start[b + 1] - doc_start[b])
        hashes = np.empty(most, dtype=np.uint64)  # a document has at most one shingle a byte
        span = np.empty((count, 2), dtype=np.int64)
        cps = np.empty(big, dtype=np.uint32)
        for b in range(w, blocks, workers):
            p0, p1 = pair_start[b], pair_start[b + 1]
            _verify_block(data, offsets, k, docs[doc_start[b] : doc_start[b + 1]], member[p0:p1], anchor[p0:p1],
                          out[p0:p1], hashes, span, cps)


@njit(cache=True)
def _block_docs(a: Any, b: Any, block: Any, blocks: int, n: int) -> Any:
    """Each block's distinct documents and each pair's ends among them: (docs int64, doc_start
    int64 (blocks + 1,), a_at int64 (e,), b_at int64 (e,)), ``docs[doc_start[block[i]] +
    a_at[i]] == a[i]``. ``block``: int64 (e,) non-decreasing, below ``blocks``; rows below ``n``."""
    e = a.shape[0]
    seen = np.full(n, -1, dtype=np.int64)  # the last block holding document x
    local = np.empty(n, dtype=np.int64)  # its index among that block's documents
    docs = np.empty(2 * e, dtype=np.int64)
    doc_start = np.zeros(blocks + 1, dtype=np.int64)
    a_at = np.empty(e, dtype=np.int64)
    b_at = np.empty(e, dtype=np.int64)
    nd = 0
    cur = -1
    for i in range(e):
        while cur < block[i]:
            cur += 1
            doc_start[cur] = nd
        for x in (a[i], b[i]):
            if seen[x] != cur:
                seen[x] = cur
                local[x] = nd - doc_start[cur]
                docs[nd] = x
                nd += 1
        a_at[i] = local[a[i]]
        b_at[i] = local[b[i]]
    while cur < blocks:
        cur += 1
        doc_start[cur] = nd
    return docs[:nd], doc_start, a_at, b_at


def _check_rows(n: int, *arrays: npt.NDArray[np.int64]) -> None:
    for arr in arrays:
        if arr.shape[0] and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"row index out of range [0, {n})")


def _as_pairs(src: Any, dst: Any, *more: Any) -> list[npt.NDArray[np.int64]]:
    arrays = [np.asarray(a, dtype=np.int64) for a in (src, dst, *more)]
    if any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
        raise ValueError("edge arrays must be 1-D of equal length")
    return arrays


def _jaccard64(batch: Utf8Batch, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], shingle: int,
               group: npt.NDArray[np.int64] | None = None) -> Any:
    """float64 (e,) exact Jaccard per pair. The pairs are packed into blocks of at most
    ``_block_budget`` bytes of their documents' text (``pack_blocks``: the pairs of one ``group``
    kept in one block where they fit), blocks verified in parallel, each document hashed once a
    block (``_verify_block``). ``group``: int64 (e,), the pair graph's component of each pair
    where the caller has it (``duplicate_components``, ``fuzzy_duplicates``): a member of several
    anchors is then hashed once; None, each anchor's pairs together. Only how the work is cut:
    the results do not depend on it. Memory beside the texts (peak RSS, 1M documents of 100
    bytes): 158 MiB for 2M pairs, as the kernel before blocks; 45 MiB for 200,000 pairs against
    its 18 (arrays over ``batch``'s rows, ~28 bytes a document), with each thread's buffers (8
    bytes a byte of its largest block)."""
    _check_rows(len(batch), src, dst)
    e = src.shape[0]
    out = np.empty(e, dtype=np.float64)
    if e == 0:
        return out
    size = np.diff(batch.offsets)
    paired = np.zeros(size.shape[0], dtype=bool)  # the documents in pairs: what the blocks hold
    paired[src] = True
    paired[dst] = True
    held = size[paired]
    group = dst if group is None else np.asarray(group, np.int64)
    order, block, blocks = pack_blocks(src, dst, group, size, _block_budget(int(held.sum()), int(held.max())))
    a, b = src[order], dst[order]  # member, anchor: by (group, anchor, member)
    docs, doc_start, a_at, b_at = _block_docs(a, b, block, blocks, size.shape[0])
    pair_start = np.searchsorted(block, np.arange(blocks + 1))
    jac = np.empty(e, dtype=np.float64)
    workers = min(numba.get_num_threads(), blocks)
    _pair_kernel(batch.data, batch.offsets, shingle, docs, doc_start, a_at, b_at, pair_start, workers, jac)
    out[order] = jac
    return out


def _block_budget(total: int, largest: int) -> int:
    """Text bytes a block of ``_jaccard64`` holds: about ``_BLOCKS_PER_THREAD`` blocks a numba
    thread, within [``_BLOCK_MIN``, ``_BLOCK_MAX``], and ``_BLOCK_DOCS`` times the ``largest``
    document in pairs at least: a block too small for an anchor and several of its members would
    hash the anchor once for each (a cluster of long near-duplicates)."""
    share = total // (_BLOCKS_PER_THREAD * numba.get_num_threads())
    return int(max(min(max(share, _BLOCK_MIN), _BLOCK_MAX), _BLOCK_DOCS * largest))


def pair_jaccard(
    docs: Docs, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], *, shingle: int = 24
) -> npt.NDArray[np.float32]:
    """float32 (e,): exact Jaccard of the shingle sets of ``docs[src[j]]`` and ``docs[dst[j]]``.

    src, dst: int64 (e,) row indices into ``docs``. Sets are of 64-bit shingle hashes (see
    ``shingle_hashes``); two empty texts have Jaccard 1 (identical), empty vs. non-empty 0.
    """
    src, dst = _as_pairs(src, dst)
    return _jaccard64(as_utf8(docs), src, dst, shingle).astype(np.float32)


def jaccard_verify(
    docs: Docs,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    *,
    shingle: int = 24,
    threshold: float = 0.8,
) -> npt.NDArray[np.bool_]:
    """bool (e,): the pair's exact Jaccard >= threshold (compared in float64)."""
    src, dst = _as_pairs(src, dst)
    return _jaccard64(as_utf8(docs), src, dst, shingle) >= threshold


def sorted_distinct(x: npt.NDArray[Any], kind: Literal["quicksort", "stable"] = "quicksort") -> npt.NDArray[Any]:
    """Sorted distinct values: a sort and a neighbour compare (numpy's hash-based ``unique`` is
    several times slower on millions of int64). ``kind="stable"`` suits input made of sorted runs."""
    x = np.sort(x, kind=kind)
    keep = np.ones(x.shape[0], dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


def sorted_find(haystack: npt.NDArray[Any], x: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """int64 (len(x),): the index of each x[j] in the sorted array ``haystack``, -1 where absent
    (binary search, no hash table)."""
    out = np.full(x.shape[0], -1, np.int64)
    if haystack.shape[0] and x.shape[0]:
        at = np.minimum(np.searchsorted(haystack, x), haystack.shape[0] - 1)
        hit = haystack[at] == x
        out[hit] = at[hit]
    return out


def _check_pair_ids(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> None:
    if a.shape[0] and (min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= 1 << 31):
        raise ValueError("pair ids must lie in [0, 2**31)")


def _unique_pairs(
    a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], return_index: bool = False
) -> tuple[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """Distinct (a, b) pairs sorted by (a, b), and (with ``return_index``) the index of each
    pair's first occurrence. Packs a pair into one int64 (a 1-D sort is ~10x faster than
    ``np.unique(axis=0)``); ids must be >= 0 and below 2**31."""
    _check_pair_ids(a, b)
    packed = (a.astype(np.int64) << 31) | b.astype(np.int64)
    # A sort and a neighbour compare: np.unique's hash path is ~5x slower on millions of int64.
    order = np.argsort(packed, kind="stable") if return_index else None
    ordered = packed[order] if order is not None else np.sort(packed)
    new = np.ones(ordered.shape[0], dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    uniq = ordered[new]
    first = order[new] if order is not None else np.zeros(0, np.int64)
    return (uniq >> 31, uniq & ((1 << 31) - 1)), first


BandEdges = tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""(band, src int64 (e,), dst int64 (e,)): the anchor edges of one band (``band_edges``)."""


def _band_offers(
    src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], stray: npt.NDArray[np.bool_], max_fallback: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(who, mate) int64: up to ``max_fallback`` bucket-mates per stray member of ONE band.

    ``stray`` (bool per edge): the member's edge to its anchor failed verification. A bucket is
    an anchor ``dst`` with its members in id order; a stray member at index i (of c) is offered
    the mates i+1, i+2, ... (wrapping round, anchor excluded). Only buckets holding a stray
    member are sorted, so the cost follows the failed edges, not the band.
    """
    if not stray.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    held = np.zeros(int(max(src.max(), dst.max())) + 1, dtype=bool)
    held[dst[stray]] = True
    keep = held[dst]
    s, d, st = src[keep], dst[keep], stray[keep]
    order = np.lexsort((s, d))
    s, d, st = s[order], d[order], st[order]
    e = s.shape[0]
    new = np.empty(e, dtype=bool)
    new[0] = True
    np.not_equal(d[1:], d[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    gi = np.cumsum(new) - 1
    count = np.diff(np.append(starts, e))[gi]  # members (anchor excluded) in the row's bucket
    index = np.arange(e) - starts[gi]
    rows = np.flatnonzero(st & (count > 1))
    offers = np.minimum(count[rows] - 1, max_fallback)
    rep = np.repeat(rows, offers)
    step = np.arange(rep.shape[0]) - np.repeat(np.cumsum(offers) - offers, offers) + 1
    mate = s[starts[gi[rep]] + (index[rep] + step) % count[rep]]
    return s[rep], mate


def _fallback_pairs(
    bands: Iterable[BandEdges], failed: npt.NDArray[np.int64], label: npt.NDArray[np.int64], max_fallback: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Bucket-mate pairs to verify, as distinct canonical (high, low) pairs sorted.

    ``failed``: the (member, anchor) pairs that failed verification, packed ``member << 31 |
    anchor`` and sorted; ``label`` (n,): components of the edges that passed. In every band, a
    member whose edge to its anchor failed is offered up to ``max_fallback`` mates of that
    bucket (``_band_offers``); offers already in one component are dropped (verifying them
    cannot change the components). Bands stream: only the distinct chosen pairs are held.
    """
    packed = np.zeros(0, np.int64)
    # Only an edge of a member with a failed pair can be stray: a bitmap of those members passes
    # the binary search a fraction of each band (20 bands of 73k edges, 16k failed: 0.11 -> 0.04 s).
    failing = np.zeros(label.shape[0], dtype=bool)
    failing[failed >> 31] = True
    for _, src, dst in bands:
        stray = failing[src]
        at = np.flatnonzero(stray)
        stray[at] = sorted_find(failed, (src[at] << 31) | dst[at]) >= 0
        who, mate = _band_offers(src, dst, stray, max_fallback)
        apart = label[who] != label[mate]
        hi, lo = np.maximum(who, mate)[apart], np.minimum(who, mate)[apart]
        if hi.shape[0]:
            packed = sorted_distinct(np.concatenate([packed, (hi << 31) | lo]))
    return packed >> 31, packed & ((1 << 31) - 1)


def split_bands(
    src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], band: npt.NDArray[np.int64]
) -> Callable[[], Iterator[BandEdges]]:
    """Edge arrays of all bands (any order) as a re-iterable stream of bands in ascending order."""
    src, dst, band = _as_pairs(src, dst, band)
    order = np.argsort(band, kind="stable")
    b = band[order]
    cuts = np.flatnonzero(np.diff(b)) + 1
    spans = list(zip(np.concatenate([[0], cuts]).tolist(), np.append(cuts, b.shape[0]).tolist(), strict=True))

    def stream() -> Iterator[BandEdges]:
        for lo, hi in spans:
            if hi > lo:
                yield int(b[lo]), src[order[lo:hi]], dst[order[lo:hi]]

    return stream


@njit(cache=True, nogil=True)  # beside duplicate_components' gather of texts on another thread
def _union_sorted(a: Any, b: Any) -> Any:
    """int64: the distinct values of two ascending int64 arrays, ascending (one merge)."""
    out = np.empty(a.shape[0] + b.shape[0], dtype=np.int64)
    i = 0
    j = 0
    k = 0
    while i < a.shape[0] or j < b.shape[0]:
        if j == b.shape[0] or (i < a.shape[0] and a[i] <= b[j]):
            v = a[i]
            i += 1
        else:
            v = b[j]
            j += 1
        if k == 0 or out[k - 1] != v:
            out[k] = v
            k += 1
    return out[:k]


def _band_pairs(src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """int64: one band's distinct pairs packed ``src << 31 | dst``, ascending.

    A band's anchor edges name each member once (a document has one key a band): where the
    members are dense among the ids, a scatter by member orders them without a sort (77k edges:
    0.5 against 4 ms); edges that repeat a member (any caller's) are sorted."""
    _check_pair_ids(src, dst)
    e = src.shape[0]
    if e and int(src.max()) < 8 * e:
        slot = np.full(int(src.max()) + 1, -1, np.int64)
        slot[src] = dst
        member = np.flatnonzero(slot >= 0)
        if member.shape[0] == e:  # every member once
            return (member << 31) | slot[member]
    (s, d), _ = _unique_pairs(src, dst)
    return (s << 31) | d


def distinct_pairs(bands: Iterable[BandEdges]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Distinct (src, dst) pairs over all bands, sorted; memory: the distinct pairs plus one band."""
    packed = np.zeros(0, np.int64)
    for _, src, dst in bands:
        packed = _union_sorted(packed, _band_pairs(np.asarray(src, np.int64), np.asarray(dst, np.int64)))
    packed = packed.copy()  # not the merge's buffer, which can be twice its size
    return packed >> 31, packed & ((1 << 31) - 1)


def verify_stream(
    n: int,
    bands: Callable[[], Iterable[BandEdges]],
    jaccard: Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.float64]],
    *,
    threshold: float = 0.8,
    max_fallback: int = 8,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32], int, int]:
    """``verify_candidates`` over node ids 0..n-1 with the edges read band by band (``bands()``
    yields them in ascending band order, at most twice) and the pair Jaccard from a callback
    (``jaccard(src, dst) -> float64 (e,)``), so a caller holds one band of edges and fetches texts
    block by block. Returns (src, dst, jaccard, distinct candidate pairs, fallback pairs compared)."""
    if max_fallback < 0:
        raise ValueError("max_fallback must be >= 0")
    ps, pd = distinct_pairs(bands())
    if ps.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), 0, 0
    _check_rows(n, ps, pd)
    jac = jaccard(ps, pd)
    ok = jac >= threshold
    out_s, out_d, out_j = [ps[ok]], [pd[ok]], [jac[ok]]
    fallback = 0
    if max_fallback:
        packed = (ps << 31) | pd  # sorted: distinct_pairs sorts by (src, dst)
        label = connected_components(n, ps[ok], pd[ok])
        fs, fd = _fallback_pairs(bands(), packed[~ok], label, max_fallback)
        # a mate pair that is also an anchor pair (either way round) was verified in step 1
        tried = (sorted_find(packed, (fs << 31) | fd) >= 0) | (sorted_find(packed, (fd << 31) | fs) >= 0)
        fs, fd = fs[~tried], fd[~tried]
        fallback = int(fs.shape[0])
        fj = jaccard(fs, fd) if fs.shape[0] else np.zeros(0, np.float64)
        ok = fj >= threshold
        out_s.append(fs[ok])
        out_d.append(fd[ok])
        out_j.append(fj[ok])
    return (np.concatenate(out_s), np.concatenate(out_d), np.concatenate(out_j).astype(np.float32),
            int(ps.shape[0]), fallback)


def verify_candidates(
    docs: Docs,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    band: npt.NDArray[np.int64],
    *,
    shingle: int = 24,
    threshold: float = 0.8,
    max_fallback: int = 8,
    jaccard: Callable[..., Any] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Exactly verified edges: (src int64 (v,), dst int64 (v,), jaccard float32 (v,)).

    src, dst, band: int64 (e,) the anchor edges of all bands (``band_edges`` output of band t
    with ``band = t``), ids being row indices into ``docs``; a bucket is a (band, dst) pair.

    1. Every distinct (member, anchor) pair is verified once, however many bands proposed it;
       pairs with Jaccard >= threshold are kept.
    2. In every bucket, a member whose edge to the anchor failed (LSH chained it to the
       anchor, or the anchor is unrelated boilerplate) is compared with up to ``max_fallback``
       of its bucket-mates (see ``_fallback_pairs``), unless the two are already in one
       component of the passing edges; so two duplicates that meet only in a bucket with an
       unrelated anchor still join, whether or not either has other partners. Cost: at most
       ``max_fallback`` extra comparisons per failed (member, bucket), whatever the bucket
       size, i.e. a constant factor of the failed candidate edges LSH proposed.
    Kept edges are (higher id, lower id) for fallback pairs and (member, anchor) otherwise.
    ``jaccard(batch, src, dst, shingle) -> float64 (e,)`` replaces the pair kernel (a GPU twin with
    the same output, ``stages.kernels.gpu.lsh.pair_jaccard64``); default the numba one.
    """
    jaccard64 = jaccard or _jaccard64
    src, dst, band = _as_pairs(src, dst, band)
    batch = as_utf8(docs)
    _check_rows(len(batch), src, dst)
    e_src, e_dst, e_jac, _, _ = verify_stream(len(batch), split_bands(src, dst, band),
                                           lambda s, d: jaccard64(batch, s, d, shingle),
                                           threshold=threshold, max_fallback=max_fallback)
    return e_src, e_dst, e_jac


# --- components ---------------------------------------------------------------------------------


def connected_components(
    n: int,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """int64 (n,): component label per node, the smallest node index in its component.

    src, dst: int64 (e,) undirected edges between nodes 0..n-1 (duplicates and self-loops are
    fine). The label does not depend on edge order, so re-sharded inputs label alike.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components as scipy_cc

    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError("src and dst must have equal length")
    _check_rows(n, src, dst)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    graph = coo_matrix((np.ones(src.shape[0], dtype=np.int8), (src, dst)), shape=(n, n)).tocsr()
    _, labels = scipy_cc(graph, directed=True, connection="weak")
    _, first = np.unique(labels, return_index=True)  # first node of each label = its minimum
    return first[labels].astype(np.int64)
