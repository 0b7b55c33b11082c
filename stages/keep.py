"""The one keep rule shared by exact, fuzzy and semantic dedup.

Within a group of duplicates the document with the lowest ``(priority, doc_id)`` survives;
every other member is removed as a duplicate of that survivor. Because the rule is a total
order on values carried by the documents themselves, the survivor never depends on worker
count, shard layout or the order in which documents arrive.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

ID_BYTES = 32  # a doc_id: 32 hex characters (stages.ingest.ids)


def fixed_ids(ids: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bytes_]:
    """A string column of doc_ids as numpy ``"S32"``, read from Arrow's buffers: 32 bytes a
    document and no Python object per document (``to_numpy`` makes one ``str`` each). Ids of
    another length, or nulls, fall back to a copy through Python."""
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    out = []
    for chunk in chunks:
        n = len(chunk)
        if n == 0:
            continue
        lengths = pc.binary_length(chunk)
        if chunk.null_count or pc.min_max(lengths).as_py() != {"min": ID_BYTES, "max": ID_BYTES}:
            out.append(np.asarray(chunk.to_numpy(zero_copy_only=False), dtype=f"S{ID_BYTES}"))
            continue
        width = np.dtype(np.int64 if pa.types.is_large_string(chunk.type) else np.int32)
        start = np.frombuffer(chunk.buffers()[1], dtype=width, count=1, offset=chunk.offset * width.itemsize)[0]
        out.append(np.frombuffer(chunk.buffers()[2], dtype=f"S{ID_BYTES}", count=n, offset=int(start)))
    return np.concatenate(out) if out else np.zeros(0, f"S{ID_BYTES}")


def source_priorities(
    sources: pa.Array | pa.ChunkedArray, priority: Mapping[str, int]
) -> npt.NDArray[np.int64]:
    """int64 (n,): ``priority`` of each row's source (0 when none is given), through a
    dictionary encoding: one lookup per distinct source, never one per document."""
    encoded = pc.dictionary_encode(sources)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    out = [np.array([priority.get(s, 0) for s in c.dictionary.to_pylist()], np.int64)[
           c.indices.to_numpy(zero_copy_only=False)] for c in chunks if len(c)]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def pick_survivors(
    group: npt.NDArray[np.integer],
    priority: npt.NDArray[np.integer],
    doc_id: npt.NDArray[np.bytes_] | npt.NDArray[np.str_] | npt.NDArray[np.object_] | pa.Array | pa.ChunkedArray,
) -> npt.NDArray[np.int64]:
    """Index of the survivor of each row's group.

    group: int (n,) group label per row (any integers; rows with equal labels are duplicates).
    priority: int (n,) lower wins. doc_id: (n,) tie-break, lower wins: fixed-width bytes
    (``"S32"``, see :func:`fixed_ids`; sorted as they are, no copy), str, or an Arrow string
    column (read as ``"S32"``). UTF-8 bytes sort like their code points, so every form agrees.
    Returns int64 (n,): for row i, the row index of the survivor of ``group[i]``;
    ``survivor[i] == i`` means row i is kept. Memory: the three columns, the sort order and
    the result; no Python object per row.
    """
    n = len(group)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if isinstance(doc_id, pa.Array | pa.ChunkedArray):
        ids: np.ndarray = fixed_ids(doc_id)
    else:
        ids = np.asarray(doc_id)
        if ids.dtype.kind == "O":  # Python strings: numpy sorts only fixed-width ones
            ids = ids.astype(str)
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
