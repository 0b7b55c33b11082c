"""The warm pool's fork server (``curation_dagster.run.pool``): a fresh process that imports the
programs once, from which each pool worker is forked with them imported.

Starting it costs the process that starts it a fork and an exec; its imports (1-1.5 s of CPU) run
in it. Started by the pool's first worker, it held ``curate run`` up: the process waited for those
imports before its run began. ``curate run`` of a crawl that names two sources or more starts it
before its own imports (``start``), so the two import side by side, on two cores.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

from stages.catalog import PROGRAMS
from stages.parallel import PRELOAD as FORKED_PRELOAD

# What a worker has imported when the pool's fork server forks it: the executor and the programs,
# and what any forked worker would import itself (``stages.parallel.PRELOAD``: pandas, 0.2 s of
# CPU in each worker otherwise). Not numba's implementations, imported at a worker's first kernel
# loaded from the cache (0.2 s more): they import scipy.linalg, whose OpenBLAS would start its
# threads in the fork server, with its settings, not the partition's.
PRELOAD = ["curation_dagster.run.pool", *(f"stages.programs.{name}" for name in PROGRAMS), *FORKED_PRELOAD]


def start() -> None:
    """Start this process's fork server with ``PRELOAD``, without waiting for its imports
    (nothing where it runs already). The pool's workers adopt the environment the pool is made in
    (``curation_dagster.run.pool``), not the fork server's."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
