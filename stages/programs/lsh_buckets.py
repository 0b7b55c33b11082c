"""lsh_buckets[crawl]: the bucket index (band keys per document) and anchor edges, band by band.

Pass 1 streams every source's signatures once and writes ``nodes`` (node, doc_id, source) and
``band_keys`` (node + one uint64 column per band): the persisted bucket index a later crawl
dedups against. Pass 2 reads one band column at a time (memory: 8 bytes per document), groups
equal keys and links each bucket member to the bucket's anchor, its lowest node (SEDD's band
by band streaming instead of a global shuffle; one anchor per bucket keeps a giant bucket of
boilerplate pages linear). Bands are independent, so they can run as separate tasks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.params import ExecutionParams, LshBucketsParams, lsh_curve, lsh_threshold
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition

NODES = pa.schema([("node", pa.int64()), ("doc_id", pa.string()), ("source", pa.string()), ("crawl", pa.string())])
EDGES = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("band", pa.int32())])


def band_column(band: int) -> str:
    return f"b{band:03d}"


def _add_prior(
    inputs: Inputs, output: PartitionWriter, crawl: str, node: int, params: LshBucketsParams, base: dict[str, Any]
) -> int:
    """Append the kept documents of an earlier crawl from its persisted bucket index (no
    signature is recomputed). Returns the next free node id."""
    outputs = inputs.prior[crawl]
    store = inputs.store
    pdir = outputs["lsh_buckets/"]
    manifest = store.read_manifest(pdir)
    assert manifest is not None
    same = {k: manifest.report.get(k) for k in ("bands", "rows", "shingle", "num_perm", "seed")}
    mine = {k: base.get(k) for k in same}
    if same != mine:
        raise ValueError(f"crawl {crawl}'s bucket index was built with {same}, this crawl uses {mine}: "
                         "incremental dedup needs the same MinHash and LSH parameters")
    kept = [store.read_table(d, "documents", ["doc_id"])["doc_id"] for name, d in sorted(outputs.items())
            if name.startswith("curated_documents/")]
    kept_ids = pa.chunked_array([c for t in kept for c in t.chunks], pa.string()).combine_chunks()
    nodes = store.read_table(pdir, "nodes")
    keys = store.read_table(pdir, "band_keys")
    own = pc.and_(pc.equal(nodes["crawl"], crawl), pc.is_in(nodes["doc_id"], value_set=kept_ids))
    nodes, keys = nodes.filter(own), keys.filter(own)
    n = nodes.num_rows
    ids = np.arange(node, node + n, dtype=np.int64)
    output.write("nodes", pa.table({"node": ids, "doc_id": nodes["doc_id"], "source": nodes["source"],
                                    "crawl": nodes["crawl"]}, schema=NODES))
    output.write("band_keys", keys.set_column(0, "node", pa.array(ids)))
    base.setdefault("prior_documents", {})[crawl] = n
    return node + n


def run(
    params: LshBucketsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: nodes, candidate edges, bucket-size histogram, largest buckets, the S-curve."""
    curve = {f"{s:.2f}": round(p, 4) for s, p in lsh_curve(params.bands, params.rows)}
    base = {"bands": params.bands, "rows": params.rows,
            "threshold": round(lsh_threshold(params.bands, params.rows), 4), "s_curve": curve}
    if not params.enabled:
        output.write("nodes", NODES.empty_table())
        output.write("edges", EDGES.empty_table())
        return {"enabled": False, **base, "nodes": 0, "edges": 0}
    from stages.kernels.lsh import band_edges, band_keys
    from stages.programs.minhash_signatures import signature_matrix

    sig_params = inputs.manifest("minhash_signatures", inputs.sources("minhash_signatures")[0]).params
    num_perm = sig_params["num_perm"]
    base.update(shingle=sig_params["shingle"], num_perm=num_perm, seed=sig_params["seed"])
    if params.bands * params.rows > num_perm:
        raise ValueError(f"bands x rows = {params.bands * params.rows} exceeds num_perm = {num_perm}")
    node = 0
    for source in inputs.sources("minhash_signatures"):
        pdir = inputs.dir("minhash_signatures", source)
        for batch in inputs.store.iter_batches(pdir, "signatures", None, execution.batch_rows):
            n = batch.num_rows
            ids = np.arange(node, node + n, dtype=np.int64)
            keys = band_keys(signature_matrix(batch.column(1), num_perm), params.bands, params.rows)
            output.write("nodes", pa.table({"node": ids, "doc_id": batch.column(0),
                                            "source": pa.array([source] * n, pa.string()),
                                            "crawl": pa.array([partition.crawl] * n, pa.string())}, schema=NODES))
            cols = {"node": pa.array(ids)}
            cols.update({band_column(b): pa.array(keys[:, b]) for b in range(params.bands)})
            output.write("band_keys", pa.table(cols))
            node += n
    for crawl in sorted(inputs.prior):
        node = _add_prior(inputs, output, crawl, node, params, base)
    if node == 0:
        output.write("nodes", NODES.empty_table())
        output.write("edges", EDGES.empty_table())
        return {"enabled": True, **base, "nodes": 0, "edges": 0}
    stats = None
    for band in range(params.bands):
        t = output.read("band_keys", ["node", band_column(band)])
        src, dst, band_stats = band_edges(t.column(1).to_numpy(), t.column(0).to_numpy())
        stats = band_stats if stats is None else stats.merge(band_stats)
        output.write("edges", pa.table({"src": src, "dst": dst, "band": np.full(len(src), band, np.int32)},
                                       schema=EDGES))
    assert stats is not None
    summary = stats.as_dict()
    return {"enabled": True, **base, "nodes": node, "edges": summary["edges"],
            "bucket_size_hist": summary["size_hist"], "largest_buckets": summary["largest"]}
