"""Semantic deduplication kernels (SemDeDup): length-bucketed embedding, k-means, tiled pairwise.

Every torch kernel here runs unchanged on ``device="cpu"`` and ``device="cuda"`` (the CPU twin
*is* the GPU kernel on another device): same contract, same output dtypes, results equal up to
float rounding (see tests/stages/programs/test_semantic.py, the ``gpu`` parity test). Kernels take arrays or
tensors and return arrays or tensors; they read no files and log nothing. The model is passed
in as a function (``forward``), loaded once by the caller.

Semantics follow SemDeDup (Abbas et al. 2023) as NeMo Curator documents it: documents of a
cluster are ranked (``rank_order``); a document is a duplicate when its cosine similarity to
some *earlier-ranked* document of its cluster is ``>= 1 - eps``; the earlier one may itself be
a duplicate of something earlier still (no transitive closure, no greedy chain).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch
import xxhash

WhichToKeep = Literal["hard", "easy", "random", "priority"]
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- embedding


def length_batches(
    lengths: npt.NDArray[np.integer], batch_tokens: int, max_rows: int = 4096
) -> list[npt.NDArray[np.int64]]:
    """Row indices in batches of equal or near-equal token length, longest first.

    lengths: int (n,) tokens per row (>= 1). Rows are sorted by length (descending, ties by row
    index), then cut into consecutive batches whose padded size ``rows * longest`` stays within
    ``batch_tokens`` (a batch holds at least one row) and at most ``max_rows`` rows. Sorting by
    token length means a batch pads at most to the length of its first row, which is within a
    few tokens of every other row's: almost no compute is spent on padding.
    Returns a list of int64 arrays; together they hold every index in [0, n) exactly once.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[npt.NDArray[np.int64]] = []
    i, n = 0, len(order)
    while i < n:
        longest = int(lengths[order[i]])
        rows = max(1, min(max_rows, batch_tokens // max(longest, 1)))
        batches.append(order[i:i + rows].astype(np.int64))
        i += rows
    return batches


def pad_batch(token_ids: Sequence[Sequence[int]], rows: npt.NDArray[np.int64], pad_id: int) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(input_ids, attention_mask), both int64 (len(rows), longest): the rows' token ids
    right-padded with ``pad_id``; the mask is 1 on real tokens."""
    lens = np.fromiter((len(token_ids[r]) for r in rows), dtype=np.int64, count=len(rows))
    width = int(lens.max()) if len(rows) else 0
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for k, r in enumerate(rows):
        ids[k, :lens[k]] = token_ids[r]
        mask[k, :lens[k]] = 1
    return ids, mask


def embed(
    forward: Forward, token_ids: Sequence[Sequence[int]], pad_id: int, dim: int,
    batch_tokens: int, device: str | torch.device, max_rows: int = 4096,
) -> npt.NDArray[np.float32]:
    """float32 (n, dim): L2-normalised sentence embeddings of pre-tokenised rows.

    forward(input_ids int64 (b, L), attention_mask int64 (b, L)) -> (b, dim) pooled embeddings
    (any float dtype; the model's compute dtype is the caller's choice). Rows are batched by
    ``length_batches``; the output is in the input row order. Normalisation is done in float32,
    so bf16 compute on a GPU still yields unit vectors to float32 precision.
    """
    n = len(token_ids)
    out = np.empty((n, dim), dtype=np.float32)
    if n == 0:
        return out
    lengths = np.fromiter((max(len(t), 1) for t in token_ids), dtype=np.int64, count=n)
    with torch.inference_mode():
        for rows in length_batches(lengths, batch_tokens, max_rows):
            ids, mask = pad_batch(token_ids, rows, pad_id)
            pooled = forward(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
            unit = torch.nn.functional.normalize(pooled.float(), dim=1)
            out[rows] = unit.cpu().numpy()
    return out


NORM_ROWS = 1 << 14  # rows normalised at once by embedding_matrix


def embedding_matrix(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.float32]:
    """float32 (n, d) from a fixed-size-list column (float16 or float32 leaves), each row
    re-normalised to unit length: float16 storage rounds the norm to about 1e-3, and cosines
    are dot products of unit rows. A zero row, or one with a NaN, is zeros."""
    # Filled chunk by chunk and normalised in place: one float32 matrix (4 * d bytes a row) and
    # one chunk's leaves beside it, never a combined copy of the column or a second matrix.
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    assert isinstance(column.type, pa.FixedSizeListType)
    d = column.type.list_size
    x = np.empty((len(column), d), np.float32)
    at = 0
    for chunk in chunks:
        x[at:at + len(chunk)] = chunk.flatten().to_numpy(zero_copy_only=False).reshape(len(chunk), d)
        at += len(chunk)
    for a in range(0, len(x), NORM_ROWS):  # a block at a time: norm's squares are a temporary matrix
        block = x[a:a + NORM_ROWS]
        norm = np.linalg.norm(block, axis=1, keepdims=True)
        np.divide(block, norm, out=block, where=norm > 0)
        block[~(norm[:, 0] > 0)] = 0.0  # a zero row, or one with a NaN: zeros
    return x


# --------------------------------------------------------------------------- k-means


def _assign(x: torch.Tensor, centroids: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(label int64 (n,), similarity float32 (n,)): the centroid of highest dot product per row
    (the first one on ties), computed ``chunk`` rows at a time."""
    labels = torch.empty(len(x), dtype=torch.int64, device=x.device)
    sims = torch.empty(len(x), dtype=torch.float32, device=x.device)
    for a in range(0, len(x), chunk):
        s = x[a:a + chunk] @ centroids.T
        sims[a:a + chunk], labels[a:a + chunk] = s.max(dim=1)
    return labels, sims


def _cluster_sums(x: torch.Tensor, labels: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums float32 (k, d), counts float32 (k,)) of the rows of each label.

    Summed as one-hot matrix products rather than ``index_add_``: a GEMM adds in a fixed order,
    whereas atomics on a GPU add in arrival order, so the same data gives the same centroids run
    after run.
    """
    sums = torch.zeros(k, x.shape[1], dtype=torch.float32, device=x.device)
    counts = torch.zeros(k, dtype=torch.float32, device=x.device)
    for a in range(0, len(x), chunk):
        lab = labels[a:a + chunk]
        onehot = torch.zeros(len(lab), k, dtype=torch.float32, device=x.device)
        onehot[torch.arange(len(lab), device=x.device), lab] = 1.0
        sums += onehot.T @ x[a:a + chunk]
        counts += onehot.sum(dim=0)
    return sums, counts


def kmeans_plus_plus(x: torch.Tensor, k: int, seed: int, chunk: int = 16384) -> npt.NDArray[np.int64]:
    """int64 (k,): k distinct row indices of ``x`` chosen by k-means++ (D^2 sampling with
    D = 1 - cosine to the nearest chosen row). The draws use ``numpy.random.default_rng(seed)``
    on the host, so CPU and GPU choose the same rows."""
    n = len(x)
    rng = np.random.default_rng(seed)
    chosen = [int(rng.integers(n))]
    nearest = torch.full((n,), -math.inf, dtype=torch.float32, device=x.device)
    for _ in range(1, k):
        c = x[chosen[-1]]
        for a in range(0, n, chunk):
            nearest[a:a + chunk] = torch.maximum(nearest[a:a + chunk], x[a:a + chunk] @ c)
        d2 = (1.0 - nearest).clamp(min=0.0).double().square().cpu().numpy()
        d2[chosen] = 0.0
        total = d2.sum()
        if total <= 0:  # fewer distinct rows than k: take unchosen rows in order
            rest = np.setdiff1d(np.arange(n), chosen)[: k - len(chosen)]
            chosen.extend(int(r) for r in rest)
            break
        chosen.append(int(rng.choice(n, p=d2 / total)))
    return np.asarray(chosen, dtype=np.int64)


def kmeans_fit(x: torch.Tensor, k: int, iterations: int, seed: int, chunk: int = 16384) -> torch.Tensor:
    """float32 (k, d) unit centroids of spherical k-means (cosine) on the rows of ``x``.

    x: float32 (n, d) on any device, unit rows, n >= 1; k is capped at n. Initial centroids by
    ``kmeans_plus_plus`` (seeded, host-side draws: the same on every device). A cluster left
    empty is re-seeded with the row least similar to its centroid. Stops after ``iterations``
    Lloyd steps or when no label changes.
    """
    n = len(x)
    k = max(1, min(k, n))
    init = kmeans_plus_plus(x, k, seed, chunk)
    centroids = x[torch.from_numpy(init).to(x.device)].clone()
    labels = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    for _ in range(iterations):
        new, sims = _assign(x, centroids, chunk)
        if torch.equal(new, labels):
            break
        labels = new
        sums, counts = _cluster_sums(x, labels, k, chunk)
        empty = torch.nonzero(counts == 0).flatten()
        if len(empty):
            # Least similar rows first; stable sort so ties are broken by row index.
            far = torch.sort(sims, stable=True).indices[: len(empty)]
            sums[empty] = x[far]
            counts[empty] = 1.0
        centroids = torch.nn.functional.normalize(sums, dim=1)
    return centroids


def _fit_rows(
    n: int, k: int, fit_fraction: float, min_fit_per_cluster: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Sorted row indices of the fitting sample: ``fit_fraction`` of the rows, but at least
    ``min_fit_per_cluster * k`` (and at most all ``n``)."""
    m = min(n, max(math.ceil(fit_fraction * n), min_fit_per_cluster * k))
    if m >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)


def semantic_clusters(
    x: torch.Tensor, n_clusters: int, max_cluster_size: int, docs_per_cluster: int,
    fit_fraction: float, min_fit_per_cluster: int, iterations: int, seed: int,
    spill_margin: float = 0.0, max_depth: int = 3, chunk: int = 16384,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64], dict[str, int]]:
    """Cluster every row of ``x``: (label int64 (n,), centroid distance float32 (n,),
    second cluster int64 (n,), stats).

    x: float32 (n, d), unit rows, on any device. Spherical k-means with ``n_clusters`` centroids
    is fitted on a sample (``_fit_rows``) and every row is assigned to its most similar centroid.
    A cluster with more than ``max_cluster_size`` rows is split again by k-means into
    ``ceil(size / docs_per_cluster)`` parts (fitted the same way, seed derived from ``seed`` and
    the cluster), up to ``max_depth`` times; a split that does not shrink the cluster (identical
    rows) is abandoned. Labels are 0..K-1, numbered in order of (parent cluster, sub-cluster).
    The distance is ``1 - cos(row, mean direction of its final cluster)``.

    Spill: a row whose similarity to the second-closest cluster mean is within ``spill_margin``
    of its own cluster's is also placed in that cluster (``second``, else -1). Near-duplicates
    on either side of a k-means boundary then still meet in one cluster; this is what keeps the
    partition's recall against all-pairs within 1% (docs/semantic.md).
    stats: clusters, splits, fit_rows, largest (own rows), spilled (rows with a second cluster).
    """
    n = len(x)
    stats = {"clusters": 0, "splits": 0, "fit_rows": 0, "largest": 0, "spilled": 0}
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64), stats

    def fit_assign(rows: torch.Tensor | None, k: int, s: int) -> npt.NDArray[np.int64]:
        sub = x if rows is None else x[rows]
        rng = np.random.default_rng(s)
        fit = _fit_rows(len(sub), k, fit_fraction, min_fit_per_cluster, rng)
        stats["fit_rows"] += len(fit)
        centroids = kmeans_fit(sub[torch.from_numpy(fit).to(x.device)], k, iterations, s, chunk)
        return _assign(sub, centroids, chunk)[0].cpu().numpy()

    labels = fit_assign(None, n_clusters, seed)
    # Each pass splits the clusters over the cap; labels are renumbered in (parent, child) order.
    for depth in range(max_depth):
        big = np.flatnonzero(np.bincount(labels) > max_cluster_size)
        child = np.zeros(n, np.int64)
        for c in big:
            rows = np.flatnonzero(labels == c)
            k2 = max(2, math.ceil(len(rows) / docs_per_cluster))
            sub = fit_assign(torch.from_numpy(rows).to(x.device), k2, seed + 7919 * (depth + 1) + int(c))
            if np.bincount(sub).max() < len(rows):  # else: identical rows, nothing to split
                child[rows] = sub
                stats["splits"] += 1
        if not child.any():
            break
        _, labels = np.unique(np.stack([labels, child], axis=1), axis=0, return_inverse=True)
        labels = labels.reshape(-1).astype(np.int64)
    _, labels = np.unique(labels, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    k = int(labels.max()) + 1
    lab_t = torch.from_numpy(labels).to(x.device)
    sums, _ = _cluster_sums(x, lab_t, k, chunk)
    means = torch.nn.functional.normalize(sums, dim=1)
    sim = torch.empty(n, dtype=torch.float32, device=x.device)
    second = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    for a in range(0, n, chunk):
        s = x[a:a + chunk] @ means.T
        own = s.gather(1, lab_t[a:a + chunk, None]).squeeze(1)
        sim[a:a + chunk] = own
        if k > 1 and spill_margin > 0:
            s.scatter_(1, lab_t[a:a + chunk, None], -math.inf)
            best, arg = s.max(dim=1)
            second[a:a + chunk] = torch.where(own - best <= spill_margin, arg, -1)
    stats["clusters"] = k
    stats["largest"] = int(np.bincount(labels).max())
    second_np = second.cpu().numpy()
    stats["spilled"] = int((second_np >= 0).sum())
    return labels, (1.0 - sim).clamp_(min=0.0).cpu().numpy(), second_np, stats


# --------------------------------------------------------------------------- ranking and pairwise


def rank_order(
    which_to_keep: WhichToKeep, distance: npt.NDArray[np.floating], doc_id: Sequence[str] | npt.NDArray[np.str_],
    priority: npt.NDArray[np.integer], seed: int = 42,
) -> npt.NDArray[np.int64]:
    """int64 (m,): the rows of one cluster in rank order; earlier-ranked documents are kept.

    - ``hard``: farthest from the centroid first (distance descending, then doc_id descending),
      as NeMo Curator: keeps the outliers, removes the prototypical copies.
    - ``easy``: closest to the centroid first (distance ascending, then doc_id ascending).
    - ``random``: by xxh64 of ``"<seed>:<doc_id>"`` (ties by doc_id): random, yet the same for a
      document whatever the shard layout or worker count.
    - ``priority``: the shared keep rule of ``stages.keep``: lowest (priority, doc_id) first, so
      of two mutual duplicates the one exact and fuzzy dedup would keep is kept.
    distance: float (m,) ``1 - cos(doc, centroid)``; priority: int (m,) lower wins.
    """
    ids = np.asarray(doc_id).astype(str)
    if which_to_keep == "hard":
        return np.lexsort((ids, np.asarray(distance)))[::-1].astype(np.int64)
    if which_to_keep == "easy":
        return np.lexsort((ids, np.asarray(distance))).astype(np.int64)
    if which_to_keep == "random":
        h = np.fromiter((xxhash.xxh64_intdigest(f"{seed}:{d}".encode()) for d in ids), dtype=np.uint64, count=len(ids))
        return np.lexsort((ids, h)).astype(np.int64)
    if which_to_keep == "priority":
        return np.lexsort((ids, np.asarray(priority))).astype(np.int64)
    raise ValueError(f"which_to_keep must be hard, easy, random or priority, got {which_to_keep!r}")


def max_earlier_similarity(x: torch.Tensor, batch: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row i of a ranked cluster: the highest dot product with an earlier row j < i.

    x: (m, d) float tensor on any device, rows in rank order (unit rows make this the cosine).
    Returns (similarity float32 (m,), index int64 (m,)) on x's device: ``index[i]`` is the
    earliest j < i attaining the maximum; row 0 has similarity -inf and index -1.
    Computed in tiles of ``batch`` query rows x ``batch`` candidate rows, only on and below the
    diagonal: memory is O(batch^2) whatever the cluster size, work is m^2/2 dot products.
    """
    m = len(x)
    x = x.float()
    best = torch.full((m,), -math.inf, dtype=torch.float32, device=x.device)
    arg = torch.full((m,), -1, dtype=torch.int64, device=x.device)
    for qa in range(0, m, batch):
        q = x[qa:qa + batch]
        rows = torch.arange(qa, qa + len(q), device=x.device)
        qbest, qarg = best[qa:qa + batch], arg[qa:qa + batch]
        for ca in range(0, min(qa + len(q), m), batch):
            s = q @ x[ca:ca + batch].T
            if ca + batch > qa:  # the diagonal tile: only candidates strictly before the row
                cols = torch.arange(ca, ca + s.shape[1], device=x.device)
                s = s.masked_fill(cols[None, :] >= rows[:, None], -math.inf)
            tmax, targ = s.max(dim=1)  # first index of the maximum on ties
            better = tmax > qbest  # strict: an earlier tile wins a tie
            qbest = torch.where(better, tmax, qbest)
            qarg = torch.where(better, targ + ca, qarg)
        best[qa:qa + batch], arg[qa:qa + batch] = qbest, qarg
    return best, arg


def duplicate_mask(similarity: npt.NDArray[np.floating] | torch.Tensor, eps: float) -> npt.NDArray[np.bool_]:
    """bool (m,): rows whose earlier-ranked similarity is ``>= 1 - eps`` (removed)."""
    sim = similarity.cpu().numpy() if isinstance(similarity, torch.Tensor) else np.asarray(similarity)
    return np.asarray(sim >= 1.0 - eps)


def best_appearances(
    doc: npt.NDArray[np.int64], similarity: npt.NDArray[np.floating], primary: npt.NDArray[np.bool_],
    cluster: npt.NDArray[np.integer],
) -> npt.NDArray[np.int64]:
    """int64: the index of one appearance per document (a document spilled into a second cluster
    appears twice): the highest similarity, then the one in its own cluster, then the lower
    cluster id. Sorted by ``doc``."""
    if len(doc) == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((np.asarray(cluster), ~np.asarray(primary), -np.asarray(similarity, np.float64), doc))
    d = np.asarray(doc)[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = d[1:] != d[:-1]
    return order[first].astype(np.int64)


def partitioned_similarity(
    x: torch.Tensor, labels: npt.NDArray[np.int64], second: npt.NDArray[np.int64], rank: npt.NDArray[np.int64],
    batch: int = 1024,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """(similarity float32 (n,), neighbor int64 (n,)): ``max_earlier_similarity`` within every
    cluster (own rows plus spilled ones), each cluster ranked by the global ``rank`` (int64 (n,),
    position of each row in the rank order), merged per row by ``best_appearances``. With one
    cluster this is all-pairs. The in-memory reference of what ``semantic_duplicates`` streams."""
    n = len(labels)
    docs, sims, nbrs, prim, clus = [], [], [], [], []
    for c in np.unique(labels):
        rows = np.flatnonzero((labels == c) | (second == c))
        rows = rows[np.argsort(rank[rows], kind="stable")]
        s, a = max_earlier_similarity(x[torch.from_numpy(rows).to(x.device)], batch)
        a_np = a.cpu().numpy()
        docs.append(rows)
        sims.append(s.cpu().numpy())
        nbrs.append(np.where(a_np >= 0, rows[np.maximum(a_np, 0)], -1))
        prim.append(labels[rows] == c)
        clus.append(np.full(len(rows), c))
    doc, sim, nbr = np.concatenate(docs), np.concatenate(sims), np.concatenate(nbrs)
    pick = best_appearances(doc, sim, np.concatenate(prim), np.concatenate(clus))
    out_sim = np.full(n, -np.inf, dtype=np.float32)
    out_nbr = np.full(n, -1, dtype=np.int64)
    out_sim[doc[pick]] = sim[pick]
    out_nbr[doc[pick]] = nbr[pick]
    return out_sim, out_nbr
