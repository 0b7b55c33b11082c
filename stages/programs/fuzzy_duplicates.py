"""fuzzy_duplicates[crawl]: one survivor per near-duplicate component, the rest removed.

The survivor is chosen by the shared keep rule (``stages.keep``: source priority, then doc_id),
so it never depends on worker count or order. Each removed document names its survivor in
``duplicate_of``; ``score`` is the exact Jaccard similarity of the two, at float32 precision (it
can be below the verification threshold when the two are linked through a chain of
near-duplicates).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.keep import fixed_ids, pick_survivors, source_priorities
from stages.kernels.lsh import sorted_find
from stages.params import ExecutionParams, FuzzyDuplicatesParams
from stages.removal import REMOVED, removal_table
from stages.reports import DuplicateComponentsReport, FuzzyDuplicatesReport, read_as
from stages.store import PartitionWriter
from stages.task import Inputs, Partition


def _verified_jaccard(inputs: Inputs, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 (e,): the stored Jaccard of the verified edge between nodes a[j] and b[j], NaN where
    there is none (or the edges were not verified)."""
    edges = inputs.read("duplicate_components", "edges")
    src, dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    jac = edges["jaccard"].to_numpy()
    key = (np.maximum(src, dst) << 31) | np.minimum(src, dst)
    order = np.argsort(key, kind="stable")
    at = sorted_find(key[order], (np.maximum(a, b) << 31) | np.minimum(a, b))
    out = np.full(len(at), np.nan, np.float32)
    out[at >= 0] = jac[order][at[at >= 0]]
    return out


def run(
    params: FuzzyDuplicatesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> FuzzyDuplicatesReport:
    """Report: documents in components, removed, removed per source."""
    comps = inputs.read("duplicate_components", "components")
    if not params.enabled or comps.num_rows == 0:
        output.write("removed", REMOVED.empty_table())
        return FuzzyDuplicatesReport(enabled=params.enabled, input=comps.num_rows, removed=0, removed_per_source={})
    from stages.backend import resolve
    from stages.pair_texts import pair_jaccard

    # Columnar: ids as 32 bytes a row, priorities through the sources' dictionary; Python
    # strings only for the removed rows and their survivors.
    doc_id = fixed_ids(comps["doc_id"])
    earlier = np.asarray(pc.not_equal(comps["crawl"], partition.crawl).to_numpy(zero_copy_only=False), bool)
    # Documents kept by an earlier crawl always win (they are already published), and are never
    # removed here: only this crawl's documents can be.
    priority = source_priorities(comps["source"], partition.spec.keep.source_priority)
    priority = np.where(earlier, np.iinfo(np.int64).min, priority)
    survivor = pick_survivors(comps["component"].to_numpy(), priority, doc_id)
    removed = np.flatnonzero((survivor != np.arange(len(survivor))) & ~earlier)
    keep_of = survivor[removed]

    def rows_of(column: str, rows: np.ndarray) -> np.ndarray:
        return np.asarray(comps[column].take(pa.array(rows, pa.int64())).to_numpy(zero_copy_only=False), dtype=object)

    source = rows_of("source", removed)
    kept_crawl, kept_sources = rows_of("crawl", keep_of), rows_of("source", keep_of)
    kept_source = np.where(earlier[keep_of], kept_crawl + "/" + kept_sources, kept_sources)

    # Exact Jaccard of each removed document with its survivor, for the ledger's score: taken from
    # the verified edge where the two are linked directly (the usual case), else computed from the
    # texts, read component by component, at most text_block_bytes at a time.
    node = comps["node"].to_numpy()
    score = _verified_jaccard(inputs, node[removed], node[keep_of])
    todo = np.flatnonzero(np.isnan(score))
    if todo.shape[0]:
        shingle = read_as(inputs.manifest("duplicate_components"), DuplicateComponentsReport).shingle or 24
        component = comps["component"].to_numpy()
        rows = removed[todo].astype(np.int64)
        computed, _ = pair_jaccard(inputs, comps["doc_id"].combine_chunks(), rows, keep_of[todo], component[rows],
                                   shingle=shingle, backend=resolve(execution.backend),
                                   budget=execution.text_block_bytes, batch_rows=execution.batch_rows,
                                   reserve=execution.spill_reserve_bytes)
        score[todo] = computed.astype(np.float32)  # as stored on the edges

    table = removal_table(
        doc_id[removed].astype(str), source, "", doc_id[keep_of].astype(str), kept_source,
        score.astype(np.float64),
        reasons=np.where(earlier[keep_of], "near_duplicate_of_earlier_crawl", "near_duplicate"),
    )
    output.write("removed", table)
    return FuzzyDuplicatesReport(
        enabled=True,
        input=int(comps.num_rows),
        removed=len(removed),
        components=len(np.unique(survivor)),
        removed_per_source=dict(sorted(Counter(source.tolist()).items())),
        removed_as_earlier_crawl_duplicates=int(earlier[keep_of].sum()),
    )
