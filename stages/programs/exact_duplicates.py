"""exact_duplicates[crawl]: corpus-wide exact dedup on a hash of normalized text.

Reads the survivors of the heuristic filters of every source of the crawl, groups documents
whose normalized-text hashes are equal and keeps one per group by the shared keep rule
(``stages.keep``); every other member is written to the removal list with ``duplicate_of``.
Memory: 52 bytes a document for the crawl's columns (32 of id, 16 of hash, 4 of source) and
~56 more while groups and survivors are found, then 16 a removed document and one part of the
removal list at a time (``removals``); never the texts of the whole crawl, never a Python object
per document. Tested: ``tests/stages/programs/test_exact_memory.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from stages.keep import fixed_ids, pick_survivors
from stages.kernels.exact import duplicate_groups, text_hashes
from stages.params import ExactDuplicatesParams, ExecutionParams
from stages.removal import REMOVED, removal_parts, survivors
from stages.reports import ExactDuplicatesReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition


def run(
    params: ExactDuplicatesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> ExactDuplicatesReport:
    """Report: input (survivors seen), removed, groups (with >1 member), removed per source."""
    if not params.enabled:
        output.write("removed", REMOVED.empty_table())
        return ExactDuplicatesReport(enabled=False, input=0, removed=0, removed_per_source={})
    ids: list[np.ndarray] = []
    sources: list[np.ndarray] = []  # each row's source, as its index in ``names``
    hashes: list[np.ndarray] = []
    names = inputs.sources("raw_documents")
    for k, source in enumerate(names):
        for table in survivors(inputs, source, ["doc_id", "text"], execution.batch_rows,
                               progress=partition.progress):
            ids.append(fixed_ids(table["doc_id"]))
            sources.append(np.full(table.num_rows, k, np.int32))
            hashes.append(text_hashes(table["text"].to_pylist(), params.lowercase))
    if not ids:
        output.write("removed", REMOVED.empty_table())
        return ExactDuplicatesReport(enabled=True, input=0, removed=0, groups=0, removed_per_source={})
    doc_id, source_index, text_hash = np.concatenate(ids), np.concatenate(sources), np.concatenate(hashes)
    del ids, sources, hashes  # the per-batch pieces: each column once
    report: dict[str, Any] = {"input": len(doc_id)}
    parts = removals(doc_id, source_index, text_hash, names,
                     [partition.spec.keep.source_priority.get(s, 0) for s in names], report)
    del text_hash  # dropped by ``removals`` once grouped
    for part in parts:
        output.write("removed", part)
    return ExactDuplicatesReport(enabled=True, **report)


def removals(
    doc_id: np.ndarray, source_index: np.ndarray, hashes: np.ndarray, names: list[str], priorities: list[int],
    report: dict[str, Any],
) -> Iterator[pa.Table]:
    """The ``removed`` parts of the crawl's documents: ``doc_id`` ``"S32"`` (n,), ``source_index``
    int32 (n,) into ``names`` (whose keep priorities ``priorities`` are), ``hashes`` uint64 (n, 2).
    Fills ``report`` (removed, groups, removed_per_source). Memory beside the 52 bytes a document
    of the inputs: ~56 a document while groups and survivors are found (int64 labels, sort order,
    survivors), then 16 a removed document and one part (``stages.removal.removal_parts``)."""
    groups = duplicate_groups(hashes)
    del hashes
    survivor = pick_survivors(groups, np.asarray(priorities, np.int64)[source_index], doc_id)
    removed = np.flatnonzero(survivor != np.arange(len(survivor)))
    dup = survivor[removed]
    del survivor
    report["groups"] = len(np.unique(groups[dup]))
    del groups
    counts = np.bincount(source_index[removed], minlength=len(names))
    report["removed"] = len(removed)
    report["removed_per_source"] = dict(sorted((names[k], int(c)) for k, c in enumerate(counts) if c))
    yield from removal_parts(doc_id, source_index, names, "exact_duplicate", removed, dup)
