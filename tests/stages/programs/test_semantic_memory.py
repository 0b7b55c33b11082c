"""semantic_duplicates' memory per document (issue 30): its crawl-level columns used to be object
arrays (a ``str`` per id, neighbour and source) with a unicode copy of every id; they are now
numpy columns (``appearances``) and the removal list is written a part at a time
(``output_tables``). Both the result and the bound are tested: the same ``neighbors`` and
``removed`` tables as the object-array construction they replace (spilled documents included),
and a peak of at most ``BOUND`` bytes a document for 300k documents streamed in clusters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stages.programs.semantic_duplicates import NEIGHBORS, REASON, appearances, output_tables
from stages.removal import REMOVED, removal_table
from tests.support.peak_rss import PEAK, bytes_per_document

BOUND = 450  # bytes a document at 300k documents (measured 366; the object arrays 817)

CLUSTERS = """
import numpy as np
import pyarrow as pa
def cluster_tables(n, size=500, dim=8, seed=0, spill=0):
    # Clusters of ``size`` rows around size/4 centres (many near-duplicates), made one at a time
    # so that the input costs nothing beside the cluster at hand; ``spill`` rows of each cluster
    # appear again in the next one (primary false), as semantic_clusters spills boundary rows.
    rng = np.random.default_rng(seed)
    hexd, names = np.frombuffer(b"0123456789abcdef", np.uint8), pa.array(["web", "books", "code"])
    carry = None
    for c, start in enumerate(range(0, n, size)):
        m = min(size, n - start)
        digits = hexd[rng.integers(0, 16, 32 * m, dtype=np.uint8)]
        offsets = np.arange(0, 32 * m + 1, 32, dtype=np.int32)
        ids = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(offsets), pa.py_buffer(digits)])
        centers = rng.normal(size=(m // 4 + 1, dim)).astype(np.float32)
        x = centers[rng.integers(0, len(centers), m)] + rng.normal(scale=0.01, size=(m, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        t = pa.table({"doc_id": ids, "source": names.take(pa.array(rng.integers(0, 3, m, dtype=np.int8))),
                      "cluster": pa.array(np.full(m, c, np.int32)),
                      "distance": pa.array(rng.random(m).astype(np.float32)),
                      "primary": pa.array(np.ones(m, bool)),
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim)})
        if carry is not None:
            carry = carry.set_column(2, "cluster", pa.array(np.full(carry.num_rows, c, np.int32)))
            carry = carry.set_column(4, "primary", pa.array(np.zeros(carry.num_rows, bool)))
            t = pa.concat_tables([t, carry]).combine_chunks()
        carry = t.filter(t["primary"]).slice(0, spill) if spill else None
        yield t
"""
namespace: dict[str, Any] = {}
exec(CLUSTERS, namespace)
cluster_tables = namespace["cluster_tables"]


def object_arrays(tables: Any, eps: float) -> tuple[pa.Table, pa.Table]:
    """(neighbors, removed) as semantic_duplicates built them before: object arrays, one piece."""
    import torch

    from stages.kernels.semantic import (
        best_appearances,
        duplicate_mask,
        embedding_matrix,
        max_earlier_similarity,
        rank_order,
    )

    parts: dict[str, list[Any]] = {k: [] for k in ("doc", "src", "cluster", "primary", "rank", "nbr", "nbr_src",
                                                   "sim")}
    for cluster in tables:
        m = cluster.num_rows
        ids = np.asarray(cluster["doc_id"].to_pylist(), dtype=object)
        src = np.asarray(cluster["source"].to_pylist(), dtype=object)
        priority = np.array([{"books": -1}.get(s, 0) for s in src], dtype=np.int64)
        order = rank_order("priority", cluster["distance"].to_numpy(), ids, priority, 42)
        x = embedding_matrix(cluster["embedding"].take(pa.array(order)))
        sim_t, arg_t = max_earlier_similarity(torch.from_numpy(x), 64)
        sim, arg = sim_t.numpy(), arg_t.numpy()
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
    col = {k: np.concatenate(v) for k, v in parts.items()}
    _, doc_index = np.unique(col["doc"].astype(str), return_inverse=True)
    pick = best_appearances(doc_index.reshape(-1), col["sim"], col["primary"], col["cluster"])
    col = {k: v[pick] for k, v in col.items()}
    has = np.isfinite(col["sim"])
    neighbors = pa.table({
        "doc_id": pa.array(col["doc"], pa.string()), "source": pa.array(col["src"], pa.string()),
        "cluster": pa.array(col["cluster"], pa.int32()), "rank": pa.array(col["rank"], pa.int32()),
        "neighbor": pa.array(col["nbr"], pa.string()), "neighbor_source": pa.array(col["nbr_src"], pa.string()),
        "similarity": pa.array(np.where(has, col["sim"], 0.0).astype(np.float32), mask=~has),
    }, schema=NEIGHBORS)
    dup = duplicate_mask(col["sim"], eps)
    removed = removal_table(col["doc"][dup].astype(str), col["src"][dup], REASON, col["nbr"][dup],
                            col["nbr_src"][dup], col["sim"][dup].astype(np.float64))
    return neighbors, removed


def test_the_tables_equal_the_object_array_construction() -> None:
    stats: dict[str, Any] = {}
    col, names = appearances(cluster_tables(3000, size=200, spill=30), "priority", 42, {"books": -1}, "cpu", 64,
                             stats)
    got: dict[str, list[pa.Table]] = {"neighbors": [], "removed": []}
    for name, table in output_tables(col, names, 0.07, stats):
        got[name].append(table)
    neighbors, removed = object_arrays(cluster_tables(3000, size=200, spill=30), 0.07)
    assert len(got["neighbors"]) == 1 and got["neighbors"][0].equals(neighbors)
    assert pa.concat_tables(got["removed"]).equals(removed) and removed.schema == REMOVED
    assert 1000 < removed.num_rows < 3000 and neighbors.num_rows == 3000  # one row a document
    assert stats["appearances"] == 3000 + 14 * 30 and stats["removed"] == removed.num_rows


def test_neighbors_in_parts_equal_the_one_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.programs import semantic_duplicates

    def tables() -> dict[str, list[pa.Table]]:
        col, names = appearances(cluster_tables(3000, size=200, spill=30), "priority", 42, {}, "cpu", 64, {})
        out: dict[str, list[pa.Table]] = {"neighbors": [], "removed": []}
        for name, table in output_tables(col, names, 0.07, {}):
            out[name].append(table)
        return out

    whole = tables()
    monkeypatch.setattr(semantic_duplicates, "PART_ROWS", 700)
    parts = tables()
    assert [t.num_rows for t in parts["neighbors"]] == [700, 700, 700, 700, 200]
    assert pa.concat_tables(parts["neighbors"]).equals(whole["neighbors"][0])
    assert all(t.schema == NEIGHBORS for t in parts["neighbors"])


def test_no_cluster_gives_empty_tables() -> None:
    stats: dict[str, Any] = {}
    col, names = appearances(iter(()), "priority", 42, {}, "cpu", 64, stats)
    tables = list(output_tables(col, names, 0.07, stats))
    assert [(name, t.num_rows) for name, t in tables] == [("removed", 0), ("neighbors", 0)]
    assert tables[0][1].schema == REMOVED and tables[1][1].schema == NEIGHBORS and stats["clusters"] == 0


def test_300k_documents_in_clusters_cost_a_bounded_amount_each() -> None:
    script = PEAK + CLUSTERS + """
import torch
from stages.kernels.semantic import max_earlier_similarity
from stages.programs.semantic_duplicates import appearances, output_tables
n = 300_000
max_earlier_similarity(torch.zeros((4, 8)), 64)  # torch's own start-up is not the program's
list(cluster_tables(1000))
base = peak_kib()
stats = {}
col, names = appearances(cluster_tables(n), "priority", 42, {}, "cpu", 1024, stats)
rows = sum(t.num_rows for name, t in output_tables(col, names, 0.07, stats) if name == "removed")
assert rows == stats["removed"] > n // 2, rows
print((peak_kib() - base) * 1024 / n)
"""
    per_doc = bytes_per_document(script)
    assert per_doc < BOUND, f"{per_doc:.0f} bytes a document"
