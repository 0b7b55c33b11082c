"""Peak RSS of a subprocess, for the memory-bound tests: source of a ``peak_kib()`` function to
prepend to a ``python -c`` script.

It reads the kernel's high-water mark of the process's own memory (``VmHWM``). Not
``ru_maxrss``: Linux carries that over from the parent across fork + exec, so a child of a
pytest process that once held 1 GB reports at least 1 GB whatever it does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PEAK = """
import resource
def peak_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def reset_peak():
    # The high-water mark restarts at the current RSS (Linux >= 4.0: "5" to clear_refs), so a
    # measurement is not hidden under an earlier peak (a kernel's compilation, a warm-up run).
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return peak_kib()
"""


def bytes_per_document(script: str, timeout_s: float = 600) -> float:
    """Run ``script`` (``PEAK`` first, then a kernel on a generated input, printing ``(peak_kib()
    - base) * 1024 / documents``) in a fresh interpreter with only this checkout on the path."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout)


def peak_over_start(script: str, *args: str, timeout_s: float = 600) -> float:
    """Run ``script`` with ``args`` in a fresh interpreter with only this checkout on the path
    and return the number it prints last: the KiB its measured step took over the RSS it
    started at (``reset_peak()`` before, ``peak_kib()`` after), or that per item. Arrow
    allocates from the system allocator here, as numpy does: jemalloc's retained pages made
    the same step's peak vary by a third between runs. And glibc's threshold for serving an
    allocation by its own mapping is fixed (128 KiB, its default start): glibc raises it each
    time such a mapping is freed, after which batch-sized buffers come from the heap, whose freed
    pages stay resident and grow with the number of batches read until they level off (a
    streamed read's peak rose by 8-13 MB from 8 to 38 batches, 34-107 bytes "a document" of a
    crawl-wide program that holds none; flat at a fixed threshold)."""
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout_s,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ARROW_DEFAULT_MEMORY_POOL": "system",
                               "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.split()[-1])


def slope(script: str, small: int, large: int, *args: str) -> float:
    """Bytes a document of the step ``script`` measures (``peak_over_start``) from two corpus
    sizes, each in a process of its own: ``(peak(large) - peak(small)) / (large - small)``, so
    that fixed costs (imports, compiled kernels, buffers of one batch) are not counted."""
    return (peak_over_start(script, str(large), *args) - peak_over_start(script, str(small), *args)) * 1024 / (
        large - small)


# Source of ``fuzzy_inputs(root, n)``: committed raw_documents and minhash_signatures partitions of
# ``n`` documents in two sources (a third in near-duplicate triples: one text and one signature,
# but for a short tail), written straight from numpy, and the Inputs of lsh_buckets over them.
FUZZY_INPUTS = """
import numpy as np
import pyarrow as pa
from stages.params import ExecutionParams
from stages.programs.minhash_signatures import signature_table
from stages.store import Manifest, Store
from stages.task import Inputs

def commit(store, pdir, program, source, tables, params=None, report=None):
    w = store.writer(pdir)
    for name, t in tables.items():
        for a in range(0, max(t.num_rows, 1), 20_000):
            w.write(name, t.slice(a, 20_000))
    w.commit(Manifest(program=program, params_key="k", data_version="v", crawl="c1", source=source,
                      params=params or {}, report=report or {}))
    w.close()
    return pdir

def hex_ids(rng, n):
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[rng.integers(0, 16, 32 * n, dtype=np.uint8)]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digits)])

def fuzzy_inputs(root, n, num_perm=260, text_chars=160, seed=0):
    store = Store(root)
    rng = np.random.default_rng(seed)
    base = np.arange(n)
    base = np.where(base % 9 < 3, base - base % 3, base)  # rows 9k..9k+2: one triple
    letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz", np.uint8)
    dirs = {"raw_documents": {}, "minhash_signatures": {}}
    for s, source in enumerate(("a", "b")):
        rows = base[s::2]
        m = len(rows)
        mix = (rows[:, None].astype(np.uint64) * np.uint64(2654435761)
               + np.arange(text_chars, dtype=np.uint64) * np.uint64(40503))
        text = letters[((mix ^ (mix >> np.uint64(15))) * np.uint64(2246822519) >> np.uint64(20)) % np.uint64(27)]
        text[:, -4:] = letters[np.arange(m)[:, None] % 27]  # the tail
        offsets = np.arange(0, text_chars * m + 1, text_chars, dtype=np.int32)
        texts = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())])
        ids = hex_ids(rng, m)
        sig = (rows[:, None].astype(np.uint64) * 2654435761 + np.arange(num_perm, dtype=np.uint64) * 40503)
        sig = (sig ^ (sig >> np.uint64(13))).astype(np.uint32)
        sig[:, -1] += (np.arange(m) % 3).astype(np.uint32)  # near, not identical
        dirs["raw_documents"][source] = commit(store, f"{root}/raw_documents/{source}", "raw_documents", source,
                                               {"documents": pa.table({"doc_id": ids, "text": texts})})
        dirs["minhash_signatures"][source] = commit(
            store, f"{root}/minhash_signatures/{source}", "minhash_signatures", source,
            {"signatures": signature_table(ids, sig)}, params={"num_perm": num_perm, "shingle": 24, "seed": 42})
    return store, dirs
"""

# Source of ``embedding_inputs(root, n, dim)``: committed document_embeddings partitions of ``n``
# documents in two sources (unit float16 vectors around ``n // 200`` directions) and their Inputs'
# dirs; ``commit`` and ``hex_ids`` come from ``FUZZY_INPUTS``.
EMBEDDING_INPUTS = """
def embedding_inputs(root, n, dim=64, seed=0):
    store = Store(root)
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(n // 200, 1), dim)).astype(np.float32)
    dirs = {"document_embeddings": {}}
    for source, m in (("a", n // 2), ("b", n - n // 2)):
        x = centers[rng.integers(0, len(centers), m)] + rng.normal(scale=0.05, size=(m, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float16).reshape(-1)), dim)
        dirs["document_embeddings"][source] = commit(store, f"{root}/document_embeddings/{source}",
                                                     "document_embeddings", source,
                                                     {"embeddings": pa.table({"doc_id": hex_ids(rng, m),
                                                                              "embedding": emb})})
    return store, dirs
"""
