"""semantic_duplicates[crawl]: SemDeDup within each cluster; the removal list of stage ``semantic``.

Streams ``semantic_clusters`` one cluster at a time (memory: the largest cluster, one
``pairwise_batch_size``-square tile and a few small columns per document), drops documents that
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
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import resolve
from stages.params import ExecutionParams, SemanticDuplicatesParams
from stages.programs.semantic_clusters import removed_before
from stages.removal import REMOVED, removal_table
from stages.reports import SemanticDuplicatesReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

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
    import torch

    from stages.kernels.semantic import (
        best_appearances,
        duplicate_mask,
        embedding_matrix,
        max_earlier_similarity,
        rank_order,
    )

    device = resolve(execution.backend).device
    # Already dropped by semantic_clusters; checked again so that this removal list can never
    # name a document that an earlier stage removed, whatever produced the clusters.
    gone = pa.chunked_array(
        [removed_before(inputs, s) for s in sorted(partition.spec.sources)], type=pa.string()
    ).combine_chunks()
    priority_of = partition.spec.keep.source_priority
    n_clusters = pairs = 0
    seconds = 0.0
    # One appearance per (document, cluster); a spilled document appears twice and keeps the
    # appearance with the most similar earlier-ranked neighbour (kernels.best_appearances).
    parts: dict[str, list[Any]] = {k: [] for k in ("doc", "src", "cluster", "primary", "rank", "nbr",
                                                         "nbr_src", "sim")}
    for cluster in clusters(inputs, execution.batch_rows):
        if len(gone):
            cluster = cluster.filter(pc.invert(pc.is_in(cluster["doc_id"], value_set=gone)))
        m = cluster.num_rows
        if m == 0:
            continue
        ids = np.asarray(cluster["doc_id"].to_pylist(), dtype=object)
        src = np.asarray(cluster["source"].to_pylist(), dtype=object)
        priority = np.array([priority_of.get(s, 0) for s in src], dtype=np.int64)
        order = rank_order(params.which_to_keep, cluster["distance"].to_numpy(), ids, priority, params.seed)
        x = embedding_matrix(cluster["embedding"].take(pa.array(order)))
        t0 = time.perf_counter()
        sim_t, arg_t = max_earlier_similarity(torch.from_numpy(x).to(device), execution.pairwise_batch_size)
        sim, arg = sim_t.cpu().numpy(), arg_t.cpu().numpy()
        seconds += time.perf_counter() - t0
        pairs += m * (m - 1) // 2
        ids, src = ids[order], src[order]
        has = arg >= 0
        parts["doc"].append(ids)
        parts["src"].append(src)
        parts["cluster"].append(np.full(m, cluster["cluster"][0].as_py(), np.int32))
        parts["primary"].append(cluster["primary"].to_numpy(zero_copy_only=False)[order])
        parts["rank"].append(np.arange(m, dtype=np.int32))
        parts["nbr"].append(np.where(has, ids[np.maximum(arg, 0)], None))
        parts["nbr_src"].append(np.where(has, src[np.maximum(arg, 0)], None))
        parts["sim"].append(sim.astype(np.float32))
        n_clusters += 1
    if n_clusters:
        col = {k: np.concatenate(v) for k, v in parts.items()}
        _, doc_index = np.unique(col["doc"].astype(str), return_inverse=True)
        pick = best_appearances(doc_index.reshape(-1), col["sim"], col["primary"], col["cluster"])
        col = {k: v[pick] for k, v in col.items()}
    else:
        col = {k: np.zeros(0, object) for k in parts}
        col["sim"] = np.zeros(0, np.float32)
    has = np.isfinite(col["sim"])
    output.write("neighbors", pa.table({
        "doc_id": pa.array(col["doc"], pa.string()), "source": pa.array(col["src"], pa.string()),
        "cluster": pa.array(col["cluster"], pa.int32()), "rank": pa.array(col["rank"], pa.int32()),
        "neighbor": pa.array(col["nbr"], pa.string()), "neighbor_source": pa.array(col["nbr_src"], pa.string()),
        "similarity": pa.array(np.where(has, col["sim"], 0.0).astype(np.float32), mask=~has),
    }, schema=NEIGHBORS))
    dup = duplicate_mask(col["sim"], params.eps)
    output.write("removed", removal_table(
        col["doc"][dup].astype(str), col["src"][dup], REASON, col["nbr"][dup], col["nbr_src"][dup],
        col["sim"][dup].astype(np.float64),
    ))
    removed_per_source = Counter(col["src"][dup].tolist())
    bands = Counter(band(float(v)) for v in col["sim"][has])
    n = len(col["doc"])
    removed_rows = int(dup.sum())
    return SemanticDuplicatesReport(
        enabled=True,
        input=n,
        clusters=n_clusters,
        appearances=sum(len(v) for v in parts["doc"]),
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
