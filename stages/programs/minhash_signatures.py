"""minhash_signatures[source, crawl]: MinHash signatures of the documents still alive.

Reads the survivors of the heuristic and exact stages and writes ``doc_id`` plus a
``signature`` fixed-size list of ``num_perm`` uint32, computed straight from the Arrow text
buffer (no Python string per document) by the numba kernel ``stages.kernels.minhash``.
Batches fan out through ``stages.parallel``: in this process on every core, or one Ray task per
batch; rows depend only on their own text, so the output is the same either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from stages.backend import CPU, Backend, fanout, resolve, signatures_on
from stages.parallel import kernel_cpus, zip_results
from stages.params import ExecutionParams, MinhashSignaturesParams
from stages.removal import survivors
from stages.reports import MinhashSignaturesReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition


def signature_table(doc_id: pa.Array, sigs: np.ndarray) -> pa.Table:
    """doc_id string + signature fixed_size_list<uint32>[num_perm] from uint32 (n, num_perm)."""
    flat = pa.array(sigs.reshape(-1), pa.uint32())
    return pa.table({"doc_id": doc_id, "signature": pa.FixedSizeListArray.from_arrays(flat, sigs.shape[1])})


def signature_matrix(column: pa.ChunkedArray | pa.Array, num_perm: int) -> np.ndarray:
    """uint32 (n, num_perm) view of a ``signature`` column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy().reshape(-1, num_perm)


@dataclass(frozen=True)
class _Signer:
    """One batch's signatures (picklable, so a process pool or a Ray task can run it)."""

    shingle: int
    num_perm: int
    seed: int
    backend: Backend = CPU

    def __call__(self, table: pa.Table) -> tuple[np.ndarray, int, float]:
        """uint32 (rows, num_perm) signatures, bytes of text, kernel seconds."""
        from stages.kernels.minhash import from_arrow

        batch = from_arrow(table["text"].combine_chunks())
        t0 = time.perf_counter()
        sigs = signatures_on(self.backend, batch, shingle=self.shingle, num_perm=self.num_perm, seed=self.seed)
        return sigs, int(batch.offsets[-1] - batch.offsets[0]), time.perf_counter() - t0


def run(
    params: MinhashSignaturesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> MinhashSignaturesReport:
    """Report: documents, bytes of text, kernel seconds and MB/s."""
    assert partition.source is not None
    empty = signature_table(pa.array([], pa.string()), np.zeros((0, params.num_perm), np.uint32))
    if not params.enabled:
        output.write("signatures", empty)
        return MinhashSignaturesReport(enabled=False, documents=0)
    backend = resolve(execution.backend)
    signer = _Signer(params.shingle, params.num_perm, params.seed, backend)
    docs = 0
    nbytes = 0
    kernel_s = 0.0
    tables = survivors(inputs, partition.source, ["doc_id", "text"], execution.batch_rows,
                       progress=partition.progress)
    resources = fanout(backend, execution, kernel_cpus(execution))  # a twin: one GPU per call
    for table, (sigs, size, seconds) in zip_results(tables, signer, execution, **resources):
        kernel_s += seconds
        output.write("signatures", signature_table(table["doc_id"].combine_chunks(), sigs))
        docs += table.num_rows
        nbytes += size
    if docs == 0:
        output.write("signatures", empty)
    return MinhashSignaturesReport(
        enabled=True,
        backend=backend.name,
        documents=docs,
        bytes=nbytes,
        kernel_seconds=round(kernel_s, 3),
        kernel_mb_per_s=round(nbytes / 1e6 / kernel_s, 1) if kernel_s > 0 else None,
    )
