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
