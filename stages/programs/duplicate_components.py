"""duplicate_components[crawl]: candidate edges -> exactly verified edges -> connected components.

With ``verify="jaccard"`` (the default) every distinct candidate pair is checked against the
exact Jaccard similarity of the two documents' shingle sets before it becomes an edge, which
cuts the false-positive chains LSH builds through boilerplate; members whose anchor is not a
true partner are compared with a bounded number of bucket-mates (``max_leaders``). Only the
texts of documents that appear in a candidate edge are read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import connected_components_on, pair_jaccard_on, resolve
from stages.kernels.lsh import verify_pairs
from stages.params import DuplicateComponentsParams, ExecutionParams
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition
from stages.removal import texts_of

COMPONENTS = pa.schema([
    ("node", pa.int64()), ("doc_id", pa.string()), ("source", pa.string()), ("crawl", pa.string()),
    ("component", pa.int64()),
])
EDGES = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("jaccard", pa.float32())])


def _texts_for(
    inputs: Inputs, nodes: pa.Table, wanted: np.ndarray, execution: ExecutionParams
) -> tuple[Any, np.ndarray]:
    """(Utf8Batch of the wanted nodes' texts, int64 (n_nodes,) row of each node in it or -1)."""
    from stages.kernels.minhash import from_arrow

    node_ids = nodes["doc_id"].combine_chunks().take(pa.array(wanted))
    ids, texts = texts_of(inputs, node_ids, execution.batch_rows)
    # Put the texts in the order of ``wanted``: row r holds node wanted[r].
    position = pc.index_in(node_ids, value_set=ids).to_numpy(zero_copy_only=False)
    if position.dtype == object or (position < 0).any():
        raise RuntimeError("a candidate document is missing from raw_documents")
    ordered = texts.take(pa.array(position.astype(np.int64)))
    row_of = np.full(nodes.num_rows, -1, np.int64)
    row_of[wanted] = np.arange(len(wanted))
    return from_arrow(ordered), row_of


def _pair_blocks(s: np.ndarray, d: np.ndarray, max_docs: int) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) ranges of pairs touching at most ``max_docs`` distinct documents
    (pairs come sorted by their first id, so a block's documents are mostly contiguous)."""
    step = max(1, max_docs // 2)  # a pair adds at most two documents
    return [(lo, min(len(s), lo + step)) for lo in range(0, len(s), step)]


def _distinct(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an int64 array (sort + neighbour compare)."""
    x = np.sort(x)
    keep = np.ones(x.shape[0], dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


def run(
    params: DuplicateComponentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: candidate pairs, verified edges, components, documents in components, largest."""
    if not params.enabled:
        output.write("components", COMPONENTS.empty_table())
        output.write("edges", EDGES.empty_table())
        return {"enabled": False, "components": 0}
    backend = resolve(execution.backend)
    lsh_dir = inputs.dir("lsh_buckets")
    shingle = int(inputs.manifest("lsh_buckets").report["shingle"])
    nodes = inputs.store.read_table(lsh_dir, "nodes")
    cand = inputs.store.read_table(lsh_dir, "edges")
    src = cand["src"].to_numpy()
    dst = cand["dst"].to_numpy()
    band = cand["band"].to_numpy().astype(np.int64)
    n = nodes.num_rows
    candidates = len(_distinct(src * max(n, 1) + dst))
    blocks = [0]
    if params.verify == "jaccard" and len(src):

        def jaccard(s: np.ndarray, d: np.ndarray) -> np.ndarray:
            """Pair Jaccard, reading the texts of at most ``verify_block_docs`` documents at a time."""
            out = np.empty(len(s), np.float64)
            for lo, hi in _pair_blocks(s, d, execution.verify_block_docs):
                wanted = _distinct(np.concatenate([s[lo:hi], d[lo:hi]]))
                batch, row_of = _texts_for(inputs, nodes, wanted, execution)
                out[lo:hi] = pair_jaccard_on(backend, batch, row_of[s[lo:hi]], row_of[d[lo:hi]], shingle=shingle)
                blocks[0] += 1
            return out

        e_src, e_dst, jac = verify_pairs(n, src, dst, band, jaccard, threshold=params.threshold,
                                         max_fallback=params.max_leaders)
    else:
        packed = _distinct(src * max(n, 1) + dst)
        e_src, e_dst = packed // max(n, 1), packed % max(n, 1)
        jac = np.full(len(e_src), np.nan, np.float32)
    output.write("edges", pa.table({"src": e_src, "dst": e_dst, "jaccard": jac}, schema=EDGES))
    label = connected_components_on(backend, n, e_src, e_dst)
    sizes = np.bincount(label, minlength=n) if n else np.zeros(0, np.int64)
    member = sizes[label] > 1 if n else np.zeros(0, bool)
    idx = np.flatnonzero(member)
    output.write("components", pa.table({
        "node": idx, "doc_id": nodes["doc_id"].combine_chunks().take(pa.array(idx)),
        "source": nodes["source"].combine_chunks().take(pa.array(idx)),
        "crawl": nodes["crawl"].combine_chunks().take(pa.array(idx)), "component": label[idx],
    }, schema=COMPONENTS))
    comp_sizes = sizes[sizes > 1]
    top = np.sort(comp_sizes)[::-1][:10]
    return {
        "enabled": True,
        "backend": backend.name,
        "verify": params.verify,
        "shingle": shingle,
        "threshold": params.threshold,
        "nodes": n,
        "candidate_pairs": candidates,
        "edges": len(e_src),
        "rejected_pairs": candidates - len(e_src) if params.verify == "jaccard" else 0,
        "text_blocks": blocks[0],
        "components": len(comp_sizes),
        "documents_in_components": len(idx),
        "largest_clusters": [int(x) for x in top],
    }
