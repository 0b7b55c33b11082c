"""duplicate_components[crawl]: candidate edges -> exactly verified edges -> connected components.

With ``verify="jaccard"`` (the default) every distinct candidate pair is checked against the
exact Jaccard similarity of the two documents' shingle sets before it becomes an edge, which
cuts the false-positive chains LSH builds through boilerplate; members whose anchor is not a
true partner are compared with a bounded number of bucket-mates (``max_leaders``). Memory is
bounded: candidate edges are read one band at a time (only the distinct pairs are held) and the
texts of the documents in them through ``stages.pair_texts`` (at most ``text_block_bytes``).
Per document (tested under 330 bytes, measured 208-225 with a third of the documents in
candidate pairs: tests/stages/programs/test_crawl_memory.py): ``nodes`` (~55), the sorted ids
of the candidates, labels and component sizes (8 each), and those candidates' texts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack

import numpy as np
import pyarrow as pa

from stages.backend import CPU, connected_components_on, resolve
from stages.kernels.lsh import BandEdges, distinct_pairs, verify_stream
from stages.pair_texts import PairTexts
from stages.params import DuplicateComponentsParams, ExecutionParams
from stages.reports import DuplicateComponentsReport, LshBucketsReport, read_as
from stages.store import PartitionWriter
from stages.task import Inputs, Partition
from stages.timing import helper_thread, timed

COMPONENTS = pa.schema([
    ("node", pa.int64()), ("doc_id", pa.string()), ("source", pa.string()), ("crawl", pa.string()),
    ("component", pa.int64()),
])
EDGES = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("jaccard", pa.float32())])
EDGE_BATCH_ROWS = 1 << 20  # candidate edges read per batch (24 MB)


def band_stream(inputs: Inputs, batch_rows: int) -> Callable[[], Iterator[BandEdges]]:
    """The ``lsh_buckets`` edges as a re-iterable stream of bands (ascending, one band in memory)."""
    store, pdir = inputs.store, inputs.dir("lsh_buckets")

    def stream() -> Iterator[BandEdges]:
        held: list[pa.RecordBatch] = []
        done: set[int] = set()

        def flush() -> Iterator[BandEdges]:
            if held:
                t = pa.Table.from_batches(held)
                band = int(t["band"][0].as_py())
                if band in done or (done and band < max(done)):
                    raise RuntimeError(f"lsh_buckets edges are not written band by band (band {band} again)")
                done.add(band)
                yield band, t["src"].to_numpy(), t["dst"].to_numpy()
                held.clear()

        for batch in store.iter_batches(pdir, "edges", ["src", "dst", "band"], batch_rows):
            band = batch.column(2).to_numpy()
            cuts = np.flatnonzero(np.diff(band)) + 1
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(band)], strict=True):
                if held and held[0].column(2)[0].as_py() != band[lo]:
                    yield from flush()
                held.append(batch.slice(lo, hi - lo))
        yield from flush()

    return stream


def _on_edges(inputs: Inputs, n: int) -> np.ndarray:
    """int64, ascending: the nodes on some ``lsh_buckets`` edge (those of the distinct candidate
    pairs), from one read of the edges' ids (a byte a node)."""
    on = np.zeros(n, dtype=bool)
    for batch in inputs.store.iter_batches(inputs.dir("lsh_buckets"), "edges", ["src", "dst"], EDGE_BATCH_ROWS):
        on[batch.column(0).to_numpy()] = True
        on[batch.column(1).to_numpy()] = True
    return np.flatnonzero(on)


def _close(gathering: Future[PairTexts] | None, stop: threading.Event) -> None:
    """The gathered texts' spill folder removed, once the gather has ended: where the program
    ends before it (a failure), the gather is stopped at its next block."""
    if gathering is None:
        return
    stop.set()  # a gather that ended already is not affected
    if gathering.exception() is None:
        gathering.result().close()


def run(
    params: DuplicateComponentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> DuplicateComponentsReport:
    """Report: candidate pairs, verified edges, components, documents in components, largest."""
    if not params.enabled:
        output.write("components", COMPONENTS.empty_table())
        output.write("edges", EDGES.empty_table())
        return DuplicateComponentsReport(enabled=False, components=0)
    backend = resolve(execution.backend)
    lsh_dir = inputs.dir("lsh_buckets")
    shingle = read_as(inputs.manifest("lsh_buckets"), LshBucketsReport).shingle
    assert shingle is not None, "an enabled lsh_buckets reports the signatures' shingle"
    nodes = inputs.store.read_table(lsh_dir, "nodes")
    doc_ids = nodes["doc_id"].combine_chunks()
    n = nodes.num_rows
    bands = band_stream(inputs, EDGE_BATCH_ROWS)
    blocks, text_bytes, spilled, fallback = 0, 0, False, 0
    if params.verify == "jaccard":
        with ExitStack() as stack:
            # The candidates' texts are gathered on a thread (with the manifests this partition
            # holds) while this one sorts out the distinct pairs (both mostly outside the GIL:
            # Arrow's reads, numpy's sorts). Their documents are those of the band edges, every
            # one of which is a candidate pair.
            submit = stack.enter_context(helper_thread("pair-texts"))
            wanted = _on_edges(inputs, n)
            stop = threading.Event()
            gathering = submit(PairTexts, inputs, doc_ids, wanted, budget=execution.text_block_bytes,
                               batch_rows=execution.batch_rows, reserve=execution.spill_reserve_bytes,
                               stop=stop) if wanted.shape[0] else None
            del wanted
            stack.callback(_close, gathering, stop)
            found: list[tuple[PairTexts, np.ndarray]] = []

            def jaccard(s: np.ndarray, d: np.ndarray) -> np.ndarray:
                """Pair Jaccard holding at most ``text_block_bytes`` of text. The first call brings
                every candidate pair: their texts, gathered once (later calls, the fallback's
                bucket-mates, are among them), pairs of one candidate component share a block."""
                if not found:
                    assert gathering is not None, "candidate pairs come from band edges"
                    label = connected_components_on(CPU, n, s, d)  # while the gather may still read
                    with timed("read"):  # the scan of raw_documents: this partition's read, on a helper
                        found.append((gathering.result(), label))
                texts, label = found[0]
                return texts.jaccard(s, d, label[s], shingle=shingle, backend=backend)

            e_src, e_dst, jac, candidates, fallback = verify_stream(
                n, bands, jaccard, threshold=params.threshold, max_fallback=params.max_leaders)
            if found:  # what sizing TMPDIR and text_block_bytes needs to know
                blocks, text_bytes, spilled = found[0][0].blocks, int(found[0][0].size.sum()), found[0][0].spilled
    else:
        e_src, e_dst = distinct_pairs(bands())
        candidates = len(e_src)
        jac = np.full(len(e_src), np.nan, np.float32)
    output.write("edges", pa.table({"src": e_src, "dst": e_dst, "jaccard": jac}, schema=EDGES))
    label = connected_components_on(backend, n, e_src, e_dst)
    sizes = np.bincount(label, minlength=n) if n else np.zeros(0, np.int64)
    member = sizes[label] > 1 if n else np.zeros(0, bool)
    idx = np.flatnonzero(member)
    output.write("components", pa.table({
        "node": idx, "doc_id": doc_ids.take(pa.array(idx)),
        "source": nodes["source"].combine_chunks().take(pa.array(idx)),
        "crawl": nodes["crawl"].combine_chunks().take(pa.array(idx)), "component": label[idx],
    }, schema=COMPONENTS))
    comp_sizes = sizes[sizes > 1]
    top = np.sort(comp_sizes)[::-1][:10]
    return DuplicateComponentsReport(
        enabled=True,
        backend=backend.name,
        verify=params.verify,
        shingle=shingle,
        threshold=params.threshold,
        nodes=n,
        candidate_pairs=candidates,
        fallback_pairs=fallback,
        edges=len(e_src),
        rejected_pairs=candidates + fallback - len(e_src) if params.verify == "jaccard" else 0,
        text_blocks=blocks,
        candidate_text_bytes=text_bytes,
        text_spilled=spilled,
        components=len(comp_sizes),
        documents_in_components=len(idx),
        largest_clusters=[int(x) for x in top],
    )
