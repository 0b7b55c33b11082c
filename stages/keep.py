"""The one keep rule shared by exact, fuzzy and semantic dedup.

Within a group of duplicates the document with the lowest ``(priority, doc_id)`` survives;
every other member is removed as a duplicate of that survivor. Because the rule is a total
order on values carried by the documents themselves, the survivor never depends on worker
count, shard layout or the order in which documents arrive.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def pick_survivors(
    group: npt.NDArray[np.integer],
    priority: npt.NDArray[np.integer],
    doc_id: npt.NDArray[np.str_] | npt.NDArray[np.object_],
) -> npt.NDArray[np.int64]:
    """Index of the survivor of each row's group.

    group: int (n,) group label per row (any integers; rows with equal labels are duplicates).
    priority: int (n,) lower wins. doc_id: str (n,) tie-break, lower wins.
    Returns int64 (n,): for row i, the row index of the survivor of ``group[i]``;
    ``survivor[i] == i`` means row i is kept.
    """
    n = len(group)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.asarray(doc_id).astype(str)
    # lexsort sorts by the last key first: group, then priority, then doc_id.
    order = np.lexsort((ids, np.asarray(priority), np.asarray(group)))
    g_sorted = np.asarray(group)[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = g_sorted[1:] != g_sorted[:-1]
    first_of_run = order[starts]
    run_index = np.cumsum(starts) - 1
    survivor = np.empty(n, dtype=np.int64)
    survivor[order] = first_of_run[run_index]
    return survivor
