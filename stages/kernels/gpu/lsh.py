"""torch twins of ``stages.kernels.lsh``: band keys, bucket grouping, exact Jaccard, components.

Same contracts and the same bits as the CPU kernels (docs/minhash.md §4–§7), on any torch device:

* ``band_keys``: the fmix64 chain per band, all documents and bands at once, ``rows`` steps.
* ``band_edges``: one band's buckets from a device sort. ``torch.sort`` orders int64, the CPU
  kernel uint64: keys are sorted with their sign bit flipped, which is the unsigned order, and
  by id within a key (a stable sort by key of the id-sorted rows), so edges come out in the CPU
  order. Bucket statistics (histogram, largest) are computed on the host from the bucket sizes.
* ``pair_jaccard64``: shingle hashes from the MinHash twin; each document's set becomes sorted
  ``doc * R + rank(H)`` keys (R = distinct hashes of the call), and a pair's intersection is
  counted by searching the smaller set's keys in the other document's: the same integers as the
  CPU hash tables (H = 0 is read as 1 there and here), hence the same float64 ratio.
* ``connected_components``: min-label propagation with hooking (each edge also lowers the label
  of its endpoints' current labels) and pointer jumping until a fixpoint; a label is always a node
  of the component and never above the node, so the fixpoint labels every node with the smallest
  index of its component, as the scipy reference does.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import numpy.typing as npt
import torch

from stages.kernels.gpu.minhash import fmix64, s64, shingle_hashes, to_device
from stages.kernels.lsh import SIZE_CLASSES, BucketStats, _as_pairs, _check_rows
from stages.kernels.lsh import verify_candidates as _verify_candidates
from stages.kernels.minhash import BAND_SEED_MULT, Docs, Utf8Batch, as_utf8

_I64_MIN = -(1 << 63)
_ROWS_PER_PASS = 1 << 20  # documents per band-key pass: 8 bytes x num_perm each on the device
_PROBES_PER_PASS = 1 << 24  # set elements searched per pass of pair_jaccard64


def band_keys(
    sigs: npt.NDArray[np.uint32], bands: int, rows: int, *, device: str | torch.device = "cpu"
) -> npt.NDArray[np.uint64]:
    """uint64 (n, bands): ``stages.kernels.lsh.band_keys`` on ``device``, bit for bit.

    sigs: uint32 (n, num_perm) with ``bands * rows <= num_perm``.
    """
    sigs = np.ascontiguousarray(sigs, dtype=np.uint32)
    if sigs.ndim != 2:
        raise ValueError("sigs must be 2-D (n, num_perm)")
    if bands < 1 or rows < 1 or bands * rows > sigs.shape[1]:
        raise ValueError(f"need 1 <= bands * rows <= num_perm = {sigs.shape[1]}")
    n = sigs.shape[0]
    out = np.empty((n, bands), dtype=np.uint64)
    seeds = torch.tensor([s64((t + 1) * BAND_SEED_MULT) for t in range(bands)], dtype=torch.int64, device=device)
    start = fmix64(seeds)
    for r0 in range(0, n, _ROWS_PER_PASS):
        part = to_device(sigs[r0 : r0 + _ROWS_PER_PASS, : bands * rows], device)
        vals = (part.to(torch.int64) & 0xFFFFFFFF).view(-1, bands, rows)  # zero-extended uint32
        h = start.expand(vals.shape[0], bands)
        for j in range(rows):
            h = fmix64(h ^ vals[:, :, j])
        out[r0 : r0 + _ROWS_PER_PASS] = h.cpu().numpy().view(np.uint64)
    return out


def band_edges(
    keys: npt.NDArray[np.uint64], ids: npt.NDArray[np.int64], *, top: int = 10, device: str | torch.device = "cpu"
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], BucketStats]:
    """Anchor edges of ONE band: ``stages.kernels.lsh.band_edges`` on ``device``, bit for bit.

    keys: uint64 (n,), ids: int64 (n,) distinct. Returns (src int64 (e,), dst int64 (e,), stats):
    every bucket member but the lowest id points at that anchor, buckets in ascending (unsigned)
    key order, members in ascending id.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    ids = np.asarray(ids, dtype=np.int64)
    if keys.shape != ids.shape or keys.ndim != 1:
        raise ValueError("keys and ids must be 1-D of equal length")
    n = keys.shape[0]
    if n == 0:
        stats = BucketStats(0, 0, 0, np.zeros(SIZE_CLASSES, np.int64), ())
        return np.zeros(0, np.int64), np.zeros(0, np.int64), stats
    k = to_device(keys, device) ^ _I64_MIN  # signed order of the flipped keys = unsigned order
    i = to_device(ids, device)
    by_id = torch.argsort(i)
    order = by_id[torch.sort(k[by_id], stable=True).indices]
    k_sorted = k[order]
    id_sorted = i[order]
    first = torch.ones(n, dtype=torch.bool, device=k.device)
    first[1:] = k_sorted[1:] != k_sorted[:-1]
    starts = torch.nonzero(first).flatten()
    bucket = torch.cumsum(first, 0) - 1
    member = ~first
    src = id_sorted[member]
    dst = id_sorted[starts][bucket[member]]

    # statistics on the host, exactly as the CPU kernel computes them
    starts_np = starts.cpu().numpy()
    sizes = np.diff(np.append(starts_np, n))
    size_class = np.floor(np.log2(sizes)).astype(np.int64)
    hist = np.bincount(size_class, minlength=SIZE_CLASSES)[:SIZE_CLASSES].astype(np.int64)
    multi = np.flatnonzero(sizes > 1)
    head_keys = (k_sorted[starts[torch.from_numpy(multi).to(k.device)]] ^ _I64_MIN).cpu().numpy().view(np.uint64)
    big = np.lexsort((head_keys, -sizes[multi]))[:top]
    largest = tuple((int(sizes[multi[j]]), int(head_keys[j])) for j in big)
    stats = BucketStats(n, int(starts_np.shape[0]), int(src.shape[0]), hist, largest)
    return src.cpu().numpy(), dst.cpu().numpy(), stats


def connected_components(
    n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], *, device: str | torch.device = "cpu"
) -> npt.NDArray[np.int64]:
    """int64 (n,): ``stages.kernels.lsh.connected_components`` on ``device``: every node labelled
    with the smallest node index of its (weakly connected) component."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError("src and dst must have equal length")
    _check_rows(n, src, dst)
    label = torch.arange(n, dtype=torch.int64, device=device)
    if n == 0 or src.shape[0] == 0:
        return label.cpu().numpy()
    u = to_device(src, device)
    v = to_device(dst, device)
    while True:
        lu, lv = label[u], label[v]
        low = torch.minimum(lu, lv)
        new = label.clone()
        for index in (u, v, lu, lv):  # the endpoints and their current labels (hooking)
            new.scatter_reduce_(0, index, low, "amin")
        new = new[new]  # pointer jumping
        if torch.equal(new, label):
            return label.cpu().numpy()
        label = new


def _subset(batch: Utf8Batch, rows: npt.NDArray[np.int64]) -> Utf8Batch:
    """The documents ``rows`` of ``batch`` as a batch of their own, in that order."""
    lo = batch.offsets[rows]
    lengths = batch.offsets[rows + 1] - lo
    offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    take = np.repeat(lo - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
    return Utf8Batch(batch.data[take], offsets)


def pair_jaccard64(
    docs: Docs, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], shingle: int = 24,
    *, device: str | torch.device = "cpu",
) -> npt.NDArray[np.float64]:
    """float64 (e,): exact Jaccard of the shingle-hash sets of ``docs[src[j]]`` and ``docs[dst[j]]``,
    equal bit for bit to ``stages.kernels.lsh._jaccard64`` (two empty texts 1.0, empty vs. not 0.0).

    Only the documents named in a pair are hashed, each once per call.
    """
    batch = as_utf8(docs)
    src, dst = _as_pairs(src, dst)
    _check_rows(len(batch), src, dst)
    e = src.shape[0]
    if e == 0:
        return np.zeros(0, np.float64)
    rows, local = np.unique(np.concatenate([src, dst]), return_inverse=True)
    h_np, ns = shingle_hashes(_subset(batch, rows), shingle=shingle, device=device)
    h = to_device(h_np, device)
    h = torch.where(h == 0, torch.ones_like(h), h)  # as the CPU tables store it
    m = rows.shape[0]
    doc = torch.repeat_interleave(torch.arange(m, device=h.device), to_device(ns, device), output_size=h.shape[0])
    distinct, rank = torch.unique(h, return_inverse=True)
    r = max(int(distinct.shape[0]), 1)
    if m * r >= 1 << 62:
        raise ValueError("too many documents x distinct shingles for one call: split the pairs")
    sets = torch.unique(doc * r + rank)  # sorted; document d's set is a contiguous run
    size = torch.bincount(sets // r, minlength=m)
    first = torch.cumsum(size, 0) - size
    a = to_device(local[:e], device)
    b = to_device(local[e:], device)
    small = torch.where(size[a] <= size[b], a, b)  # probe with the smaller set
    other = torch.where(size[a] <= size[b], b, a)
    count = size[small]
    inter = torch.zeros(e, dtype=torch.int64, device=h.device)
    ends = np.cumsum(count.cpu().numpy())
    p0 = 0
    while p0 < e:
        base = int(ends[p0 - 1]) if p0 else 0
        p1 = max(int(np.searchsorted(ends, base + _PROBES_PER_PASS, side="right")), p0 + 1)
        c = count[p0:p1]
        total = int(ends[p1 - 1]) - base
        if total:
            pair = torch.repeat_interleave(torch.arange(p0, p1, device=h.device), c, output_size=total)
            pos = first[small[pair]] + torch.arange(total, device=h.device) - (torch.cumsum(c, 0) - c)[pair - p0]
            probe = other[pair] * r + sets[pos] % r
            at = torch.searchsorted(sets, probe).clamp(max=sets.shape[0] - 1)
            inter.index_add_(0, pair, (sets[at] == probe).to(torch.int64))
        p0 = p1
    union = size[a] + size[b] - inter
    jac = torch.where(union == 0, torch.ones(e, dtype=torch.float64, device=h.device),
                      inter.to(torch.float64) / union.clamp(min=1).to(torch.float64))
    return jac.cpu().numpy()


def verify_candidates(
    docs: Docs,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    band: npt.NDArray[np.int64],
    *,
    shingle: int = 24,
    threshold: float = 0.8,
    max_fallback: int = 8,
    device: str | torch.device = "cpu",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """``stages.kernels.lsh.verify_candidates`` with the Jaccard of every pair computed on
    ``device`` (``pair_jaccard64``); pair selection and the fallback are the CPU code itself."""
    return _verify_candidates(docs, src, dst, band, shingle=shingle, threshold=threshold,
                              max_fallback=max_fallback, jaccard=partial(pair_jaccard64, device=device))
