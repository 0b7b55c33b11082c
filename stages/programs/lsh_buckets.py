"""lsh_buckets[crawl]: the bucket index (band keys per document) and anchor edges, band by band.

Pass 1 streams every source's signatures once and writes ``nodes`` (node, doc_id, source) and
``band_keys`` (node + one uint64 column per band): the persisted bucket index a later crawl
dedups against. Pass 2 reads one band column at a time (memory: 8 bytes per document), groups
equal keys and links each bucket member to the bucket's anchor, its lowest node (SEDD's band
by band streaming instead of a global shuffle; one anchor per bucket keeps a giant bucket of
boilerplate pages linear). Bands are independent: pass 2 runs one task per group of
``BANDS_PER_TASK`` bands (``stages.parallel``: threads of this process, or Ray tasks on other
machines), each reading only its band columns from the ``band_keys`` parts this attempt wrote
and ordering its rows by node once. Edges are written band by band in band order whichever
executor ran them, so the output is identical.

Memory per document (tested under 370 bytes, measured 239-251: tests/stages/programs/
test_crawl_memory.py): the ``nodes`` table (~55 bytes) and its sort, then the sorted ids (32)
and their order (8) that number each batch's documents by binary search (``IdIndex``; a hash
table of every id per batch cost O(documents) a batch); pass 2's task holds its 4 band columns
(8 bytes each), its rows' order by node, the ordered ids and one band in that order (8 each) and
the bucket sort, a task a thread locally (``workers`` of them). Beside it, one batch of signatures
and its band keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.backend import CPU, Backend, band_edges_on, band_keys_on, fanout, resolve
from stages.pair_texts import IdIndex
from stages.parallel import zip_results
from stages.params import ExecutionParams, LshBucketsParams, lsh_curve, lsh_threshold
from stages.reports import Bucket, LshBucketsReport, read_as
from stages.store import PartitionWriter, Store
from stages.task import Inputs, Partition

NODES = pa.schema([("node", pa.int64()), ("doc_id", pa.string()), ("source", pa.string()), ("crawl", pa.string())])
EDGES = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("band", pa.int32())])


BANDS_PER_TASK = 4  # memory of one task: (1 + 4) x 8 bytes per document read, 3 x 8 to order them, 4 bands of edges


def band_column(band: int) -> str:
    return f"b{band:03d}"


@dataclass(frozen=True)
class _BandGroup:
    """Anchor edges of a group of bands, read from part files of ``band_keys`` (picklable: the
    store carries its filesystem and storage options, so a Ray task on another node reads the
    same objects)."""

    store: Store
    pdir: str
    parts: tuple[str, ...]
    backend: Backend = CPU

    def __call__(self, bands: list[int]) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        """(src int64, dst int64, BucketStats) per band of ``bands``, in that order."""
        t = self.store.read_parts(self.pdir, list(self.parts), ["node", *map(band_column, bands)])
        ids = t.column(0).to_numpy()
        # Rows in node order, once for the group: each band's sort is then of its keys alone.
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        return [band_edges_on(self.backend, t.column(1 + i).to_numpy()[order], ids) for i in range(len(bands))]


def _hashing(report: LshBucketsReport) -> dict[str, int | None]:
    """The MinHash and LSH parameters a bucket index was built with: equal ones can be merged."""
    return {"bands": report.bands, "rows": report.rows, "shingle": report.shingle, "num_perm": report.num_perm,
            "seed": report.seed}


def _prior_rows(inputs: Inputs, crawl: str, base: LshBucketsReport) -> tuple[pa.Table, pa.Table] | None:
    """(nodes, band_keys) of the documents an earlier crawl kept, from its persisted bucket index
    (no signature is recomputed); band_keys' ``node`` column is replaced by ``doc_id``. None where
    that crawl left fuzzy dedup out, so none of its documents has a signature: it has no index
    (``stages.spec.prior_outputs`` names none), or, registered before, the empty one such a crawl
    then wrote."""
    outputs = inputs.prior[crawl]
    store = inputs.store
    pdir = outputs.get("lsh_buckets/")
    if pdir is None:
        return None
    manifest = store.read_manifest(pdir)
    assert manifest is not None
    theirs = read_as(manifest, LshBucketsReport)
    if not theirs.enabled:
        return None
    same, mine = _hashing(theirs), _hashing(base)
    if same != mine:
        raise ValueError(f"crawl {crawl}'s bucket index was built with {same}, this crawl uses {mine}: "
                         "incremental dedup needs the same MinHash and LSH parameters")
    kept = [store.read_table(d, "documents", ["doc_id"])["doc_id"] for name, d in sorted(outputs.items())
            if name.startswith("curated_documents/")]
    kept_ids = pa.chunked_array([c for t in kept for c in t.chunks], pa.string()).combine_chunks()
    nodes = store.read_table(pdir, "nodes").sort_by("node")  # node i is row i
    keys = store.read_table(pdir, "band_keys")
    doc_of_key = nodes["doc_id"].combine_chunks().take(keys["node"].combine_chunks())
    crawl_of_key = nodes["crawl"].combine_chunks().take(keys["node"].combine_chunks())
    own_key = pc.and_(pc.equal(crawl_of_key, crawl), pc.is_in(doc_of_key, value_set=kept_ids))
    keys = keys.set_column(0, "doc_id", doc_of_key).filter(own_key)
    nodes = nodes.filter(pc.and_(pc.equal(nodes["crawl"], crawl), pc.is_in(nodes["doc_id"], value_set=kept_ids)))
    return nodes.drop_columns(["node"]), keys


def _canonical_nodes(inputs: Inputs, crawl: str, prior: list[pa.Table]) -> pa.Table:
    """Every document of the index, numbered by the rank of its doc_id: node ids (and so the
    anchor of every bucket) never depend on source order, sharding or arrival order."""
    parts = []
    for source in inputs.sources("minhash_signatures"):
        ids = inputs.read("minhash_signatures", "signatures", source, ["doc_id"])["doc_id"]
        n = len(ids)
        parts.append(pa.table({"doc_id": ids, "source": pa.repeat(pa.scalar(source, pa.string()), n),
                               "crawl": pa.repeat(pa.scalar(crawl, pa.string()), n)}))
    tables = [t.cast(NODES.remove(0)) for t in (*parts, *prior)]
    table = pa.concat_tables(tables) if tables else NODES.remove(0).empty_table()
    table = table.sort_by("doc_id")
    return table.add_column(0, "node", pa.array(np.arange(table.num_rows, dtype=np.int64))).cast(NODES)


def _nodes_of(index: IdIndex, ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """int64 (len(ids),): each doc_id's node, its row in the canonical nodes (the first where an
    id repeats, null where none), as ``pc.index_in`` answers. ``index``: the nodes' ids, indexed
    once; ``pc.index_in`` hashed all of them again for each batch (at 20,000 rows a batch, 50
    times over 1M ids: two thirds of this program's time)."""
    pos = index.find(ids)
    return pa.array(pos, pa.int64(), mask=pos < 0)


def _signature_blocks(inputs: Inputs, batch_rows: int) -> Iterator[tuple[pa.ChunkedArray, pa.ChunkedArray]]:
    """(doc_id, signature) of every source's signatures, in source order, in blocks of at most
    ``batch_rows`` rows (or one batch) that span sources (``Store.iter_blocks``): a crawl of many
    small sources makes one kernel call and one ``band_keys`` part per block, not per source (at
    200 sources of 43 documents, 200 parts each written, fsynced and read again by every band
    group)."""
    pdirs = [inputs.dir("minhash_signatures", s) for s in inputs.sources("minhash_signatures")]
    for block in inputs.store.iter_blocks(pdirs, "signatures", None, batch_rows):
        yield block.column(0), block.column(1)


def run(
    params: LshBucketsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> LshBucketsReport:
    """Report: nodes, candidate edges, bucket-size histogram, largest buckets, the S-curve."""
    curve = {f"{s:.2f}": round(p, 4) for s, p in lsh_curve(params.bands, params.rows)}
    threshold = round(lsh_threshold(params.bands, params.rows), 4)
    if not params.enabled:
        output.write("nodes", NODES.empty_table())
        output.write("edges", EDGES.empty_table())
        return LshBucketsReport(enabled=False, bands=params.bands, rows=params.rows, threshold=threshold,
                                s_curve=curve, nodes=0, edges=0)
    from stages.programs.minhash_signatures import signature_matrix

    backend = resolve(execution.backend)
    sig_params = inputs.manifest("minhash_signatures", inputs.sources("minhash_signatures")[0]).params
    num_perm = sig_params["num_perm"]
    base = LshBucketsReport(enabled=True, bands=params.bands, rows=params.rows, threshold=threshold, s_curve=curve,
                            backend=backend.name, shingle=sig_params["shingle"], num_perm=num_perm,
                            seed=sig_params["seed"])
    if params.bands * params.rows > num_perm:
        raise ValueError(f"bands x rows = {params.bands * params.rows} exceeds num_perm = {num_perm}")
    by_crawl = {crawl: rows for crawl in sorted(inputs.prior) if (rows := _prior_rows(inputs, crawl, base)) is not None}
    prior = list(by_crawl.values())
    if prior:
        base = base.model_copy(update={"prior_documents": {crawl: p[0].num_rows for crawl, p in by_crawl.items()}})
    nodes = _canonical_nodes(inputs, partition.crawl, [p[0] for p in prior])
    output.write("nodes", nodes)
    node = nodes.num_rows
    if node == 0:
        output.write("edges", EDGES.empty_table())
        return base.model_copy(update={"nodes": 0, "edges": 0})
    # A document's node is its position among the sorted ids, found by binary search (a hash
    # table of every id rebuilt per batch cost O(nodes) time and memory a batch).
    index = IdIndex(nodes["doc_id"].combine_chunks())
    del nodes  # written; only its row count is needed from here on
    for ids, sigs in _signature_blocks(inputs, execution.batch_rows):
        keys = band_keys_on(backend, signature_matrix(sigs, num_perm), params.bands, params.rows)
        cols = {"node": _nodes_of(index, ids)}
        cols.update({band_column(b): pa.array(keys[:, b]) for b in range(params.bands)})
        output.write("band_keys", pa.table(cols))
    for _, keys in prior:
        output.write("band_keys", keys.set_column(0, "node", _nodes_of(index, keys["doc_id"])))
    del index, prior, by_crawl  # pass 2 holds only its band columns
    stats = None
    groups = [list(range(b, min(b + BANDS_PER_TASK, params.bands))) for b in range(0, params.bands, BANDS_PER_TASK)]
    job = _BandGroup(output.store, output.pdir, tuple(output.tables["band_keys"]), backend)
    # Threads, locally: a group's work is Arrow's read and numpy's sorts, which release the GIL
    # (77k documents, 20 bands: 0.11 s on two threads against 0.2 s for two forked processes,
    # whose edges came back pickled).
    for bands, results in zip_results(groups, job, execution, threads=True, **fanout(backend, execution)):
        for band, (src, dst, band_stats) in zip(bands, results, strict=True):
            stats = band_stats if stats is None else stats.merge(band_stats)
            # a part a band: duplicate_components' reader holds a part's batch while it yields its bands
            output.write("edges", pa.table({"src": src, "dst": dst, "band": np.full(len(src), band, np.int32)},
                                           schema=EDGES))
    assert stats is not None
    summary = stats.as_dict()
    return base.model_copy(update={
        "nodes": node, "edges": summary["edges"], "bucket_size_hist": summary["size_hist"],
        "largest_buckets": [Bucket.model_validate(b) for b in summary["largest"]]})
