"""exact_duplicates[crawl]: corpus-wide exact dedup on a hash of normalized text.

Reads the survivors of the heuristic filters of every source of the crawl, groups documents
whose normalized-text hashes are equal and keeps one per group by the shared keep rule
(``stages.keep``); every other member is written to the removal list with ``duplicate_of``.
Memory: 16 bytes of hash + 32 bytes of id per document, never the texts of the whole crawl.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from stages.keep import pick_survivors
from stages.kernels.exact import duplicate_groups, text_hashes
from stages.params import ExactDuplicatesParams, ExecutionParams
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition
from stages.removal import REMOVED, removal_table, survivors


def run(
    params: ExactDuplicatesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: input (survivors seen), removed, groups (with >1 member), removed per source."""
    if not params.enabled:
        output.write("removed", REMOVED.empty_table())
        return {"enabled": False, "input": 0, "removed": 0, "removed_per_source": {}}
    ids: list[np.ndarray] = []
    sources: list[np.ndarray] = []
    hashes: list[np.ndarray] = []
    for source in inputs.sources("raw_documents"):
        for table in survivors(inputs, source, ["doc_id", "text"], execution.batch_rows,
                               progress=partition.progress):
            ids.append(np.asarray(table["doc_id"].to_numpy(zero_copy_only=False), dtype="S32"))
            sources.append(np.full(table.num_rows, source, dtype=object))
            hashes.append(text_hashes(table["text"].to_pylist(), params.lowercase))
    if not ids:
        output.write("removed", REMOVED.empty_table())
        return {"enabled": True, "input": 0, "removed": 0, "groups": 0, "removed_per_source": {}}
    doc_id = np.concatenate(ids)
    source_arr = np.concatenate(sources)
    groups = duplicate_groups(np.concatenate(hashes))
    priority = np.array([partition.spec.keep.source_priority.get(s, 0) for s in source_arr], dtype=np.int64)
    survivor = pick_survivors(groups, priority, doc_id)
    removed = np.flatnonzero(survivor != np.arange(len(survivor)))
    dup = survivor[removed]
    output.write("removed", removal_table(
        doc_id[removed].astype(str), source_arr[removed], "exact_duplicate",
        doc_id[dup].astype(str), source_arr[dup], None,
    ))
    per_source = Counter(source_arr[removed].tolist())
    return {
        "enabled": True,
        "input": len(doc_id),
        "removed": len(removed),
        "groups": len(np.unique(groups[dup])),
        "removed_per_source": dict(sorted(per_source.items())),
    }
