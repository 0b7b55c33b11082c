"""semantic_duplicates[crawl]: SemDeDup within each cluster; the removal list of stage ``semantic``.

Streams ``semantic_clusters`` one cluster at a time (memory: the largest cluster, one
``pairwise_batch_size``-square tile and numpy columns of 86 bytes an appearance — two ``"S32"``
ids, source codes, cluster, rank, similarity — with no Python object per document; the removal
list is written a part at a time by ``stages.removal.removal_parts``, ``neighbors`` in parts of
``PART_ROWS`` rows too; measured ~360 bytes a
document at the peak, tested under 450 by ``tests/stages/programs/test_semantic_memory.py``), drops documents that
an earlier remover among the inputs (exact, fuzzy) removed, ranks the cluster (``which_to_keep``)
and finds, for every document, the most similar earlier-ranked one
(``stages.kernels.semantic.max_earlier_similarity``); a document spilled into a second cluster
keeps its best appearance. Documents at cosine ``>= 1 - eps`` are
removed as duplicates of that document; the similarity is the score. Every ranking is one total
order over the crawl (a spilled row carries its own cluster's distance), so two documents are
never each removed as the other's duplicate.

Tables: ``removed`` (stages.removal.REMOVED) and ``neighbors``: every ranked document with its
most similar earlier-ranked document and the similarity (null for the first of a cluster), at
any similarity, so ``curate semantic-audit`` can show pairs in every band and eps can be chosen
by reading them.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import resolve
from stages.keep import fixed_ids
from stages.params import ExecutionParams, SemanticDuplicatesParams
from stages.programs.semantic_clusters import removed_before
from stages.removal import PART_ROWS, REMOVED, id_column, removal_parts
from stages.reports import SemanticDuplicatesReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

if TYPE_CHECKING:
    from stages.kernels.semantic import WhichToKeep

REASON = "semantic_duplicate"
NEIGHBORS = pa.schema([
    ("doc_id", pa.string()), ("source", pa.string()), ("cluster", pa.int32()), ("rank", pa.int32()),
    ("neighbor", pa.string()), ("neighbor_source", pa.string()), ("similarity", pa.float32()),
])
# Similarity bands of the report (lower edges), highest first.
# Cosine similarity of normalized embeddings is in [-1, 1]: the lowest band takes every value,
# negative ones included (a small cluster's nearest neighbour can point away).
BANDS = (0.99, 0.97, 0.95, 0.93, 0.90, 0.85, 0.80, 0.70, -1.0)


def clusters(inputs: Inputs, batch_rows: int) -> Iterator[pa.Table]:
    """The rows of ``semantic_clusters`` one cluster at a time (the table is sorted by cluster)."""
    pdir = inputs.dir("semantic_clusters")
    pending: pa.Table | None = None
    for batch in inputs.store.iter_batches(pdir, "clusters", None, batch_rows):
        t = pa.Table.from_batches([batch])
        t = pa.concat_tables([pending, t]) if pending is not None else t
        labels = t["cluster"].to_numpy()
        if len(labels) == 0:
            continue
        last = np.searchsorted(labels, labels[-1], side="left")
        yield from _runs(t.slice(0, last))
        pending = t.slice(last)
    if pending is not None and pending.num_rows:
        yield from _runs(pending)


def _runs(t: pa.Table) -> Iterator[pa.Table]:
    labels = t["cluster"].to_numpy()
    cuts = [0, *(np.flatnonzero(labels[1:] != labels[:-1]) + 1).tolist(), len(labels)]
    for a, b in itertools.pairwise(cuts):
        if b > a:
            yield t.slice(a, b - a)


def band(similarity: float) -> str:
    """The report's band label of one nearest-neighbour similarity (``>=0.95``, ..., ``>=-1.00``)."""
    lo = next((b for b in BANDS if similarity >= b), BANDS[-1])  # float32 rounding below -1
    return f">={lo:.2f}"


def run(
    params: SemanticDuplicatesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> SemanticDuplicatesReport:
    """Report: input, clusters, removed, removed per source, pairs compared, pairs/s, similarity bands."""
    if not params.enabled:
        output.write("removed", REMOVED.empty_table())
        output.write("neighbors", NEIGHBORS.empty_table())
        return SemanticDuplicatesReport(enabled=False, input=0, removed=0, removed_per_source={})
    device = resolve(execution.backend).device
    # Already dropped by semantic_clusters; checked again so that this removal list can never
    # name a document that an earlier stage removed, whatever produced the clusters.
    gone = pa.chunked_array(
        [removed_before(inputs, s) for s in sorted(partition.spec.sources)], type=pa.string()
    ).combine_chunks()
    stats: dict[str, Any] = {}
    tables = clusters(inputs, execution.batch_rows)
    if len(gone):
        tables = (t.filter(pc.invert(pc.is_in(t["doc_id"], value_set=gone))) for t in tables)
    col, names = appearances(tables, params.which_to_keep, params.seed, partition.spec.keep.source_priority,
                             device, execution.pairwise_batch_size, stats)
    for name, table in output_tables(col, names, params.eps, stats):
        output.write(name, table)
    n_clusters, pairs, seconds = stats["clusters"], stats["pairs"], stats["seconds"]
    removed_per_source, removed_rows, n = stats["removed_per_source"], stats["removed"], len(col["doc"])
    has = np.isfinite(col["sim"])
    bands = Counter(band(float(v)) for v in col["sim"][has])
    return SemanticDuplicatesReport(
        enabled=True,
        input=n,
        clusters=n_clusters,
        appearances=stats["appearances"],
        removed=removed_rows,
        removed_per_source=dict(sorted(removed_per_source.items())),
        eps=params.eps,
        which_to_keep=params.which_to_keep,
        pairs=pairs,
        device=device,
        pairwise_seconds=round(seconds, 3),
        pairs_per_second=round(pairs / seconds) if seconds > 0 else None,
        similarity_bands={b: bands[b] for b in (f">={lo:.2f}" for lo in BANDS) if bands[b]},
    )


def appearances(
    tables: Iterable[pa.Table], which_to_keep: WhichToKeep, seed: int, priority_of: Mapping[str, int],
    device: str, batch: int, stats: dict[str, Any],
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every document's best appearance among the clusters ``tables`` (rows of
    ``semantic_clusters``, one cluster each), ranked (``which_to_keep``) and with its most similar
    earlier-ranked neighbour: columns doc, nbr ``"S32"``; src, nbr_src int32 into the returned
    source names; cluster, rank int32; primary, has (a neighbour) bool; sim float32 (-inf for
    none), one row a document, sorted by doc. Fills ``stats`` (clusters, pairs, seconds,
    appearances). Memory: 86 bytes an appearance beside the largest cluster."""
    import torch

    from stages.kernels.semantic import best_appearances, embedding_matrix, max_earlier_similarity, rank_order

    stats.update(clusters=0, pairs=0, seconds=0.0)
    names: list[str] = []
    code_of: dict[str, int] = {}
    parts: dict[str, list[Any]] = {k: [] for k in ("doc", "src", "cluster", "primary", "rank", "nbr",
                                                         "nbr_src", "has", "sim")}
    for cluster in tables:
        m = cluster.num_rows
        if m == 0:
            continue
        ids = np.asarray(cluster["doc_id"].to_pylist(), dtype=object)  # one cluster's: for rank_order
        values = pc.unique(cluster["source"])
        for v in values.to_pylist():
            if v not in code_of:
                code_of[v] = len(names)
                names.append(v)
        src = np.asarray([code_of[v] for v in values.to_pylist()], np.int32)[
            np.asarray(pc.index_in(cluster["source"], value_set=values).to_numpy(zero_copy_only=False), np.int64)]
        priority = np.asarray([priority_of.get(v, 0) for v in names], np.int64)[src]
        order = rank_order(which_to_keep, cluster["distance"].to_numpy(), ids, priority, seed)
        x = embedding_matrix(cluster["embedding"].take(pa.array(order)))
        t0 = time.perf_counter()
        sim_t, arg_t = max_earlier_similarity(torch.from_numpy(x).to(device), batch)
        sim, arg = sim_t.cpu().numpy(), arg_t.cpu().numpy()
        stats["seconds"] += time.perf_counter() - t0
        stats["pairs"] += m * (m - 1) // 2
        fixed, src = fixed_ids(cluster["doc_id"])[order], src[order]
        has = arg >= 0
        nbr = np.where(has, arg, np.arange(m))
        parts["doc"].append(fixed)
        parts["src"].append(src)
        parts["cluster"].append(np.full(m, cluster["cluster"][0].as_py(), np.int32))
        parts["primary"].append(cluster["primary"].to_numpy(zero_copy_only=False)[order])
        parts["rank"].append(np.arange(m, dtype=np.int32))
        parts["nbr"].append(fixed[nbr])
        parts["nbr_src"].append(src[nbr])
        parts["has"].append(has)
        parts["sim"].append(sim.astype(np.float32))
        stats["clusters"] += 1
    if stats["clusters"]:
        # Column by column, each freed as soon as it is replaced: one column's copy at a time.
        col = {k: np.concatenate(parts.pop(k)) for k in list(parts)}
        stats["appearances"] = len(col["doc"])
        _, doc_index = np.unique(col["doc"], return_inverse=True)
        pick = best_appearances(doc_index.reshape(-1), col["sim"], col["primary"], col["cluster"])
        del doc_index
        for k in col:
            col[k] = col[k][pick]
    else:
        col = {"doc": np.zeros(0, "S32"), "src": np.zeros(0, np.int32), "cluster": np.zeros(0, np.int32),
               "primary": np.zeros(0, bool), "rank": np.zeros(0, np.int32), "nbr": np.zeros(0, "S32"),
               "nbr_src": np.zeros(0, np.int32), "has": np.zeros(0, bool), "sim": np.zeros(0, np.float32)}
        stats["appearances"] = 0
    return col, names


def output_tables(
    col: dict[str, np.ndarray], names: list[str], eps: float, stats: dict[str, Any],
) -> Iterator[tuple[str, pa.Table]]:
    """("removed", part)s then ("neighbors", part)s (``PART_ROWS`` rows each; one, empty, for
    no document) from ``appearances``' columns: rows at
    similarity ``>= 1 - eps`` are removed as duplicates of their neighbour. Fills ``stats``
    (removed, removed_per_source)."""
    from stages.kernels.semantic import duplicate_mask

    dup = duplicate_mask(col["sim"], eps) & col["has"]
    rows = np.flatnonzero(dup)
    n = len(col["doc"])
    counts = np.bincount(col["src"][rows], minlength=len(names))
    stats["removed"] = len(rows)
    stats["removed_per_source"] = {names[k]: int(c) for k, c in enumerate(counts) if c}
    # removal_parts names each removal's kept document by a row of the same columns: the
    # neighbours of the removed rows are appended after the crawl's rows.
    doc_all = np.concatenate([col["doc"], col["nbr"][rows]])
    src_all = np.concatenate([col["src"], col["nbr_src"][rows]])
    for part in removal_parts(doc_all, src_all, names, REASON, rows, n + np.arange(len(rows)),
                              score=col["sim"][rows]):
        yield "removed", part
    del doc_all, src_all, part
    labels = pa.array(names, pa.string())
    none = pa.scalar(None, pa.string())
    # A part of PART_ROWS rows at a time, like the removal list: the Arrow columns of one part
    # beside the numpy ones, never a second copy of the crawl's (one part below PART_ROWS rows).
    for a in range(0, max(n, 1), PART_ROWS):
        c = {k: v[a:a + PART_ROWS] for k, v in col.items()}
        has = np.isfinite(c["sim"])
        named = pa.array(c["has"])
        yield "neighbors", pa.table({
            "doc_id": id_column(c["doc"]), "source": labels.take(pa.array(c["src"])),
            "cluster": pa.array(c["cluster"], pa.int32()), "rank": pa.array(c["rank"], pa.int32()),
            "neighbor": pc.if_else(named, id_column(c["nbr"]), none),
            "neighbor_source": pc.if_else(named, labels.take(pa.array(c["nbr_src"])), none),
            "similarity": pa.array(np.where(has, c["sim"], 0.0).astype(np.float32), mask=~has),
        }, schema=NEIGHBORS)
