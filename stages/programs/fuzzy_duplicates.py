"""fuzzy_duplicates[crawl]: one survivor per near-duplicate component, the rest removed.

The survivor is chosen by the shared keep rule (``stages.keep``: source priority, then doc_id),
so it never depends on worker count or order. Each removed document names its survivor in
``duplicate_of``; ``score`` is the exact Jaccard similarity of the two, at float32 precision (it
can be below the verification threshold when the two are linked through a chain of
near-duplicates).
Memory: beside the ``components`` table, about 100 bytes a document for its columns as numpy
(id ``"S32"``, int32 codes of source and crawl, the keep rule's priority, sort order and
survivors), then ~30 a removed document and one part of the removal list at a time
(``removals``): no Python object per document. Measured 170 bytes a document at the peak for 1M
documents (631 before); tested under 230 by ``tests/stages/programs/test_fuzzy_memory.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.keep import fixed_ids, pick_survivors
from stages.kernels.lsh import sorted_find
from stages.params import ExecutionParams, FuzzyDuplicatesParams
from stages.removal import REMOVED, raw_dirs, removal_parts
from stages.reports import DuplicateComponentsReport, FuzzyDuplicatesReport, MinhashSignaturesReport, read_as
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


def reached(inputs: Inputs) -> int:
    """The documents of this crawl that reached fuzzy dedup: those ``minhash_signatures`` signed,
    the survivors of every remover before it, over all sources. Not the documents in components
    (only those with a near-duplicate), nor the earlier crawls' kept documents merged in."""
    return sum(read_as(inputs.manifest("minhash_signatures", s), MinhashSignaturesReport).documents
               for s in inputs.sources("minhash_signatures"))


def run(
    params: FuzzyDuplicatesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> FuzzyDuplicatesReport:
    """Report: the documents that reached the stage (``reached``), removed, removed per source."""
    if not params.enabled:  # switched off: its inputs, of its own stage, are too (never made)
        output.write("removed", REMOVED.empty_table())
        return FuzzyDuplicatesReport(enabled=False, input=0, removed=0, removed_per_source={})
    comps = inputs.read("duplicate_components", "components")
    if comps.num_rows == 0:
        output.write("removed", REMOVED.empty_table())
        return FuzzyDuplicatesReport(enabled=True, input=reached(inputs), removed=0, removed_per_source={})
    from stages.backend import resolve
    from stages.pair_texts import pair_jaccard

    def scores(removed: np.ndarray, keep_of: np.ndarray) -> np.ndarray:
        # Exact Jaccard of each removed document with its survivor, for the ledger's score: taken
        # from the verified edge where the two are linked directly (the usual case), else computed
        # from the texts, read component by component, at most text_block_bytes at a time.
        node = comps["node"].to_numpy()
        score = _verified_jaccard(inputs, node[removed], node[keep_of])
        todo = np.flatnonzero(np.isnan(score))
        if todo.shape[0]:
            shingle = read_as(inputs.manifest("duplicate_components"), DuplicateComponentsReport).shingle or 24
            component = comps["component"].to_numpy()
            rows = removed[todo].astype(np.int64)
            # Only the raw_documents partitions that hold them are read, not every one (the
            # benchmark's corpora: a few hundred documents, in 82 and 154 of 200 sources).
            ends = pa.array(np.concatenate([rows, keep_of[todo]]))
            holding = set(zip(comps["crawl"].take(ends).to_pylist(), comps["source"].take(ends).to_pylist(),
                              strict=True))
            computed, _ = pair_jaccard(inputs, comps["doc_id"].combine_chunks(), rows, keep_of[todo], component[rows],
                                       shingle=shingle, backend=resolve(execution.backend),
                                       budget=execution.text_block_bytes, batch_rows=execution.batch_rows,
                                       reserve=execution.spill_reserve_bytes,
                                       dirs=raw_dirs(inputs, holding, partition.crawl))
            score[todo] = computed.astype(np.float32)  # as stored on the edges
        return score

    report: dict[str, Any] = {}
    for part in removals(comps, partition.crawl, partition.spec.keep.source_priority, scores, report):
        output.write("removed", part)
    return FuzzyDuplicatesReport(enabled=True, input=reached(inputs), **report)


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """int32 (n,) index of each row's value in the distinct values (a short list) of a string
    column without nulls, and those values: one lookup per distinct value, no ``str`` per row."""
    values = pc.unique(column)
    return (np.asarray(pc.index_in(column, value_set=values).to_numpy(zero_copy_only=False), np.int32),
            values.to_pylist())


def removals(
    comps: pa.Table, crawl: str, source_priority: Mapping[str, int],
    scores: Callable[[np.ndarray, np.ndarray], np.ndarray], report: dict[str, Any],
) -> Iterator[pa.Table]:
    """The ``removed`` parts for the ``components`` table of ``duplicate_components`` (columns
    doc_id, source, crawl, component; ``crawl`` is this crawl, rows of others were kept by earlier
    crawls). ``scores(removed, keep_of)``: float (r,) score of each removed row (int64 (r,)) against
    its survivor row, NaN for none. Fills ``report`` (removed, components, removed_per_source,
    removed_as_earlier_crawl_duplicates).

    Memory beside the table: about 100 bytes a document (its id as ``"S32"``, int32 codes of
    source, crawl and kept label, the keep rule's priority, sort order and survivors), then ~30 a
    removed document (rows, survivors, score, reason code) and one part of the removal list
    (``stages.removal.removal_parts``): no Python object per document. At most 230 bytes a
    document in all at 1M documents (``tests/stages/programs/test_fuzzy_memory.py``)."""
    doc_id = fixed_ids(comps["doc_id"])
    source_index, names = _codes(comps["source"])
    crawl_index, crawls = _codes(comps["crawl"])
    earlier = crawl_index != (crawls.index(crawl) if crawl in crawls else -1)
    # Documents kept by an earlier crawl always win (they are already published), and are never
    # removed here: only this crawl's documents can be.
    priority = np.asarray([source_priority.get(s, 0) for s in names], np.int64)[source_index]
    priority[earlier] = np.iinfo(np.int64).min
    survivor = pick_survivors(comps["component"].to_numpy(), priority, doc_id)
    del priority
    removed = np.flatnonzero((survivor != np.arange(len(survivor))) & ~earlier)
    keep_of = survivor[removed]
    report["components"] = len(np.unique(survivor))
    del survivor
    score = scores(removed, keep_of)
    # The kept document's ``duplicate_of_source``: "<crawl>/<source>" when an earlier crawl kept
    # it (see ``stages.removal.kept_where``), else its source; one label per (crawl, source).
    kept_names = [s if c == crawl else f"{c}/{s}" for c in crawls for s in names]
    kept_index = crawl_index * np.int32(len(names)) + source_index
    del crawl_index
    of_earlier = earlier[keep_of].astype(np.int8)
    del earlier
    counts = np.bincount(source_index[removed], minlength=len(names))
    report["removed"] = len(removed)
    report["removed_per_source"] = dict(sorted((names[k], int(c)) for k, c in enumerate(counts) if c))
    report["removed_as_earlier_crawl_duplicates"] = int(of_earlier.sum())
    yield from removal_parts(doc_id, source_index, names, "", removed, keep_of, kept_index=kept_index,
                             kept_names=kept_names, score=score,
                             reasons=(of_earlier, ["near_duplicate", "near_duplicate_of_earlier_crawl"]))
