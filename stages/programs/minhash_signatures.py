"""minhash_signatures[source, crawl]: MinHash signatures of the documents still alive.

Reads the survivors of the heuristic and exact stages and writes ``doc_id`` plus a
``signature`` fixed-size list of ``num_perm`` uint32, computed straight from the Arrow text
buffer (no Python string per document) by the numba kernel ``stages.kernels.minhash``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from stages.params import ExecutionParams, MinhashSignaturesParams
from stages.paths import PartitionWriter
from stages.registry import Inputs, Partition
from stages.removal import survivors


def signature_table(doc_id: pa.Array, sigs: np.ndarray) -> pa.Table:
    """doc_id string + signature fixed_size_list<uint32>[num_perm] from uint32 (n, num_perm)."""
    flat = pa.array(sigs.reshape(-1), pa.uint32())
    return pa.table({"doc_id": doc_id, "signature": pa.FixedSizeListArray.from_arrays(flat, sigs.shape[1])})


def signature_matrix(column: pa.ChunkedArray | pa.Array, num_perm: int) -> np.ndarray:
    """uint32 (n, num_perm) view of a ``signature`` column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy().reshape(-1, num_perm)


def run(
    params: MinhashSignaturesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: documents, bytes of text, kernel seconds and MB/s."""
    assert partition.source is not None
    empty = signature_table(pa.array([], pa.string()), np.zeros((0, params.num_perm), np.uint32))
    if not params.enabled:
        output.write("signatures", empty)
        return {"enabled": False, "documents": 0}
    from stages.kernels.minhash import from_arrow, signatures

    docs = 0
    nbytes = 0
    kernel_s = 0.0
    for table in survivors(inputs, partition.source, ["doc_id", "text"], execution.batch_rows):
        text = table["text"].combine_chunks()
        batch = from_arrow(text)
        t0 = time.perf_counter()
        sigs = signatures(batch, shingle=params.shingle, num_perm=params.num_perm, seed=params.seed)
        kernel_s += time.perf_counter() - t0
        output.write("signatures", signature_table(table["doc_id"].combine_chunks(), sigs))
        docs += table.num_rows
        nbytes += int(batch.offsets[-1] - batch.offsets[0])
    if docs == 0:
        output.write("signatures", empty)
    return {
        "enabled": True,
        "documents": docs,
        "bytes": nbytes,
        "kernel_seconds": round(kernel_s, 3),
        "kernel_mb_per_s": round(nbytes / 1e6 / kernel_s, 1) if kernel_s > 0 else None,
    }
