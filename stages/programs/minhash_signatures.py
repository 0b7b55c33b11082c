"""minhash_signatures[source, crawl]: MinHash signatures of the documents still alive.

Reads the survivors of the heuristic and exact stages and writes ``doc_id`` plus a
``signature`` of ``num_perm`` little-endian uint32 (fixed-size binary), computed straight from the Arrow text
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
    """doc_id string + signature fixed_size_binary[4 * num_perm] (little-endian uint32) from uint32
    (n, num_perm). Binary, not a list of uint32: Parquet writes and reads a list with a level per
    value (0.35 s each way for 78k documents here), a fixed-size binary as one block (0.08 s)."""
    n, num_perm = sigs.shape
    data = np.ascontiguousarray(sigs, dtype="<u4")
    return pa.table({"doc_id": doc_id, "signature": pa.Array.from_buffers(
        pa.binary(4 * num_perm), n, [None, pa.py_buffer(data)])})


def signature_matrix(column: pa.ChunkedArray | pa.Array, num_perm: int) -> np.ndarray:
    """uint32 (n, num_perm) of a ``signature`` column (``signature_table``'s, or the
    fixed_size_list<uint32> of the parts written before it: the same values, so they were not
    re-keyed); writable (numba compiles another specialization for a read-only array)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_matrix(chunk, num_perm) for chunk in chunks if len(chunk)]
    if not parts:
        return np.zeros((0, num_perm), np.uint32)
    return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)


def _matrix(chunk: pa.Array, num_perm: int) -> np.ndarray:
    """A read-only uint32 (len(chunk), num_perm) view of one chunk of signatures."""
    if pa.types.is_fixed_size_binary(chunk.type):
        if chunk.type.byte_width != 4 * num_perm:
            raise ValueError(f"signatures of {chunk.type.byte_width} bytes, not {4 * num_perm} (num_perm {num_perm})")
        words = np.frombuffer(chunk.buffers()[1], "<u4").astype(np.uint32, copy=False)  # a copy only on big-endian
        return words[chunk.offset * num_perm:(chunk.offset + len(chunk)) * num_perm].reshape(-1, num_perm)
    return chunk.flatten().to_numpy().reshape(-1, num_perm)


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
