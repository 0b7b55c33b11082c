"""exact_duplicates[crawl]: corpus-wide exact dedup on a hash of normalized text.

Reads the survivors of the heuristic filters of every source of the crawl, groups documents
whose normalized-text hashes are equal and keeps one per group by the shared keep rule
(``stages.keep``); every other member is written to the removal list with ``duplicate_of``.
Memory: 16 bytes of hash + 32 bytes of id per document, never the texts of the whole crawl.
"""

from __future__ import annotations

import numpy as np

from stages.keep import fixed_ids, pick_survivors
from stages.kernels.exact import duplicate_groups, text_hashes
from stages.params import ExactDuplicatesParams, ExecutionParams
from stages.removal import REMOVED, removal_table, survivors
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
    doc_id = np.concatenate(ids)
    source_index = np.concatenate(sources)
    groups = duplicate_groups(np.concatenate(hashes))
    priority = np.array([partition.spec.keep.source_priority.get(s, 0) for s in names], np.int64)[source_index]
    survivor = pick_survivors(groups, priority, doc_id)
    removed = np.flatnonzero(survivor != np.arange(len(survivor)))
    dup = survivor[removed]
    name_of = np.array(names, dtype=object)
    output.write("removed", removal_table(
        doc_id[removed].astype(str), name_of[source_index[removed]], "exact_duplicate",
        doc_id[dup].astype(str), name_of[source_index[dup]], None,
    ))
    counts = np.bincount(source_index[removed], minlength=len(names))
    per_source = {names[k]: int(c) for k, c in enumerate(counts) if c}
    return ExactDuplicatesReport(
        enabled=True,
        input=len(doc_id),
        removed=len(removed),
        groups=len(np.unique(groups[dup])),
        removed_per_source=dict(sorted(per_source.items())),
    )
