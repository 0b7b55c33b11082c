"""The payload of curation-dagster: one pure data program per asset, with no Dagster dependency
(only ``dagster_pipes``, lazily, at ``python -m stages``), and what they share: the catalog, the
crawl spec, resolving and executing a partition, the store and data root, the check verdicts."""

import os as _os
import sys as _sys

# Arrow's buffers from jemalloc, not its default mimalloc (``stages.store._arrow_memory_pool``):
# Arrow's C++ default pool is chosen when pyarrow is first imported, so here, before any module
# of this package imports it; processes started from this one inherit it. Linux only, where
# pyarrow's wheels carry jemalloc (elsewhere Arrow would warn that it has none). A pool the
# environment names already stays.
if _sys.platform == "linux" and "pyarrow" not in _sys.modules:
    _os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
