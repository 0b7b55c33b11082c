"""The payload of curation-dagster: one pure data program per asset, with no Dagster dependency
(only ``dagster_pipes``, lazily, at ``python -m stages``), and what they share: the catalog, the
crawl spec, resolving and executing a partition, the store and data root, the check verdicts."""

import os as _os
import sys as _sys


def _arrow_allocator() -> None:
    """Arrow's buffers from jemalloc, not its default mimalloc, unless the environment names a
    pool (``ARROW_DEFAULT_MEMORY_POOL``). mimalloc's segments take transparent huge pages (THP
    ``madvise``, the common setting): a first touch anywhere in 2 MB faults all of it in, and in a
    virtual machine such a fault took 10 ms (70 MB of fresh buffers: 320-465 ms of system time,
    30-60 ms from jemalloc's 4 KB pages); a 200-source crawl faulted in 2,050 huge pages a run with
    mimalloc, none with jemalloc (docs/profile.md).

    Arrow's C++ default pool follows the environment at pyarrow's first import, so where pyarrow
    is not imported yet (this package imports it) the environment names jemalloc, for this
    process and those started from it: Linux only, where pyarrow's wheels carry it (elsewhere
    Arrow would warn that it has none). Where a caller imported pyarrow first, pyarrow's default
    pool is set instead (what its functions allocate from unless told otherwise; a C++ kernel that
    takes no pool, Acero's group-by, then stays on mimalloc), if this pyarrow has jemalloc."""
    if _os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "jemalloc") != "jemalloc":
        return
    if "pyarrow" not in _sys.modules:
        if _sys.platform == "linux":
            _os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
        return
    import pyarrow as pa  # imported already: nothing to load

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without it
        return
    _os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"


_arrow_allocator()


def _openmp_waits() -> None:
    """OpenMP's threads asleep between a process's parallel kernels (``OMP_WAIT_POLICY=PASSIVE``)
    unless the environment names a policy. GNU OpenMP (numba's threading layer here) spins each
    of its threads for a while after every parallel region, so a worker between its numba kernels
    kept a core busy that the other worker and the run's recording were waiting for: passive, a
    fuzzy crawl of 200 sources on two cores spent 0.25 s less CPU and took 0.15 s less (four
    alternated pairs, docs/profile.md), its kernels no slower, nor a CPU model's embedding. The
    runtime reads it when it loads (a process's first parallel kernel, after this package's
    import), and the processes started from here inherit it."""
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_openmp_waits()


def _openblas_waits() -> None:
    """OpenBLAS's threads asleep once idle (``OPENBLAS_THREAD_TIMEOUT=4``: 2^4 cycles, its least)
    unless the environment names a timeout. Each OpenBLAS that numpy and scipy load starts a
    thread per core beside the caller, and each spins for 2^28 cycles (~0.1 s) before it sleeps:
    after its start, whether or not a BLAS call ever comes, and after every call. Importing numpy
    and scipy.linalg cost 0.34-0.37 s of CPU here with the default, 0.18-0.20 s with this, in
    every process that loads them (``curate run``'s own, its pool's fork server, where both run
    beside each other on the way to the first partition); a BLAS call wakes the threads it uses
    (above OpenBLAS's size threshold, where a wake-up is small beside the call). OpenBLAS reads it
    when it loads (numpy's import, after this package's), and the processes started from here
    inherit it."""
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


_openblas_waits()
