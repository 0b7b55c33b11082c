"""semantic_clusters[crawl]: k-means clusters of the embeddings of every source of a crawl.

Reads ``document_embeddings`` of every source, drops the documents that an earlier remover
among this program's inputs (exact, fuzzy) removed, fits spherical k-means on a sample and
assigns every row; clusters over ``max_cluster_size`` are split again
(``stages.kernels.semantic.semantic_clusters``). Output table ``clusters``, sorted by cluster:
doc_id, source, cluster (int32), primary (false for a document spilled into its second-closest
cluster), distance (float32, ``1 - cos`` to the mean direction of the document's own cluster),
embedding (as stored upstream). ``semantic_duplicates`` streams it one cluster at a
time, so its memory is bounded by the largest cluster.

Memory per document, at ``dim`` dimensions: the stored embeddings (2 * dim as float16) and ids,
one float32 matrix (4 * dim: 1.5 GB per million documents at 384 dimensions; on the GPU when
the backend is one), k-means' labels and similarities, and its assignment tile (16,384 rows x
one float per cluster); the output is taken a part at a time. Tested under 900 bytes at 64
dimensions, measured 590-604 (tests/stages/programs/test_crawl_memory.py).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import resolve
from stages.params import ExecutionParams, SemanticClustersParams
from stages.removal import dropped_ids, removal_lists
from stages.reports import SemanticClustersReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition


def clusters_schema(embedding: pa.DataType) -> pa.Schema:
    return pa.schema([
        ("doc_id", pa.string()), ("source", pa.string()), ("cluster", pa.int32()), ("primary", pa.bool_()),
        ("distance", pa.float32()), ("embedding", embedding),
    ])


def removed_before(inputs: Inputs, source: str) -> pa.Array:
    """doc_ids of ``source`` removed by the removers among the task's inputs (string array)."""
    return dropped_ids(removal_lists(inputs, source).values())


def surviving_embeddings(inputs: Inputs) -> tuple[pa.Table, int]:
    """(doc_id, source, embedding) of every source minus earlier removals; and rows dropped."""
    tables = []
    dropped = 0
    for source in inputs.sources("document_embeddings"):
        t = inputs.read("document_embeddings", "embeddings", source, ["doc_id", "embedding"])
        gone = removed_before(inputs, source)
        if len(gone) and t.num_rows:
            keep = pc.invert(pc.is_in(t["doc_id"], value_set=gone))
            dropped += t.num_rows - pc.sum(keep.cast(pa.int64())).as_py()
            t = t.filter(keep)
        tables.append(t.append_column("source", pa.repeat(pa.scalar(source, pa.string()), t.num_rows)))
    if not tables:
        return pa.table({}), dropped
    # The sources' chunks side by side, not combined: no second copy of the embeddings.
    return pa.concat_tables(tables).select(["doc_id", "source", "embedding"]), dropped


def take_rows(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``column``'s ``rows`` (positions in the whole column), in order: taken from each chunk
    they fall in, so no call combines the column's chunks (``ChunkedArray.take`` joins them all
    on every call: a full copy each time)."""
    chunks = column.chunks
    starts = np.cumsum([0] + [len(c) for c in chunks])
    which = np.searchsorted(starts, rows, side="right") - 1  # an empty chunk shares its start
    local = rows - starts[which]
    order = np.argsort(which, kind="stable")  # the rows grouped by chunk, in order within each
    pieces = []
    for c in np.unique(which):
        mine = order[which[order] == c]
        pieces.append(chunks[c].take(pa.array(local[mine])))
    if not pieces:
        return pa.array([], column.type)
    grouped = pa.concat_arrays(pieces)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return grouped.take(pa.array(back))


def run(
    params: SemanticClustersParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> SemanticClustersReport:
    """Report: input, dropped (removed earlier), clusters, largest, splits, fit_rows, seconds per phase."""
    if not params.enabled:
        output.write("clusters", clusters_schema(pa.list_(pa.float16(), 0)).empty_table())
        return SemanticClustersReport(enabled=False, input=0)
    table, dropped = surviving_embeddings(inputs)
    if table.num_rows == 0:
        emb_type = table.schema.field("embedding").type if table.num_columns else pa.list_(pa.float16(), 0)
        output.write("clusters", clusters_schema(emb_type).empty_table())
        return SemanticClustersReport(enabled=True, input=0, dropped=dropped, clusters=0)
    import torch

    from stages.kernels.semantic import embedding_matrix, semantic_clusters

    device = resolve(execution.backend).device
    t0 = time.perf_counter()
    x = torch.from_numpy(embedding_matrix(table["embedding"])).to(device)
    n = table.num_rows
    k = params.n_clusters or math.ceil(n / params.docs_per_cluster)
    t1 = time.perf_counter()
    labels, distance, second, stats = semantic_clusters(
        x, k, params.max_cluster_size, params.docs_per_cluster, params.fit_fraction,
        params.min_fit_per_cluster, params.iterations, params.seed, params.spill_margin,
    )
    t2 = time.perf_counter()
    del x  # the float32 matrix: the rows are written from the table's own (stored) embeddings
    # Own rows and spilled rows (a document's second cluster), sorted by cluster; a spilled row
    # carries the distance to the document's own cluster, so every cluster ranks it alike.
    guest = np.flatnonzero(second >= 0)
    row = np.concatenate([np.arange(n), guest])
    cluster = np.concatenate([labels, second[guest]])
    order = np.lexsort((row, cluster))
    row, cluster = row[order], cluster[order]
    primary, dist = order < n, distance[row].astype(np.float32)
    del order
    schema = clusters_schema(table.schema.field("embedding").type)
    # A part at a time: the rows taken for one part, never a reordered copy of the whole table.
    for a in range(0, len(row), execution.batch_rows):
        b = a + execution.batch_rows
        rows = row[a:b]
        output.write("clusters", pa.table({
            "doc_id": take_rows(table["doc_id"], rows), "source": take_rows(table["source"], rows),
            "cluster": pa.array(cluster[a:b].astype(np.int32)),
            "primary": pa.array(primary[a:b]),
            "distance": pa.array(dist[a:b]),
            "embedding": take_rows(table["embedding"], rows),
        }, schema=schema))
    sizes = np.bincount(labels)
    return SemanticClustersReport(
        enabled=True,
        input=n,
        dropped=dropped,
        n_clusters=k,
        clusters=stats["clusters"],
        largest=stats["largest"],
        median_size=float(np.median(sizes)),
        splits=stats["splits"],
        spilled=stats["spilled"],
        fit_rows=stats["fit_rows"],
        device=device,
        load_seconds=round(t1 - t0, 3),
        kmeans_seconds=round(t2 - t1, 3),
    )
