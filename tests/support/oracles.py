"""Test oracles: plain implementations of what the production kernels compute, written without
their optimisations, for the tests to compare against (never imported by ``stages``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stages.kernels import minhash as mh


def signatures_reference(
    hashes: npt.NDArray[np.uint64], *, num_perm: int = 260, seed: int = 42
) -> npt.NDArray[np.uint32]:
    """uint32 (num_perm,): the signature of a shingle-hash set, in plain numpy: the
    kernel's contract written without numba, to check ``minhash.signatures`` against."""
    a, b = mh.hash_params(num_perm, seed)
    sig = np.full(num_perm, mh.EMPTY, dtype=np.uint32)
    if hashes.shape[0] == 0:
        return sig
    x = (np.asarray(hashes, dtype=np.uint64) >> np.uint64(32))[None, :]
    y = (a.astype(np.uint64)[:, None] * x + b.astype(np.uint64)[:, None]) & np.uint64(0xFFFFFFFF)
    lo = y.min(axis=1).astype(np.uint32)
    hi = (np.uint64(0xFFFFFFFF) - y.max(axis=1)).astype(np.uint32)
    sig[0::2] = lo
    sig[1::2] = hi[: num_perm // 2]
    return sig
