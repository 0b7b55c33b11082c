"""What a warm pool's worker has imported when the fork server forks it (the fork server's one
preload, ``curation_dagster.run.forkserver.PRELOAD``; importing it is its whole purpose): the
executor (``curation_dagster.run.pool``), every program, pyarrow's pandas shim settled without
pandas (``stages.parallel.preload``: importing pandas was a quarter of this preload), and
numba's CPU target with its implementations, which a process loads before its first kernel from
numba's cache (0.28-0.34 s in each worker's first ``minhash_signatures`` partition otherwise,
both workers at once). No Dagster: a worker describes its partitions without it
(``curation_dagster.run.values``), and the preload takes 0.54 s instead of 1.2 (0.83 with numba's
target), within the ``curate run`` process's own start.

Numba's implementations import scipy.linalg, whose OpenBLAS starts its thread pool here, as
numpy's already has: OpenBLAS stops its pool before a fork and starts it again in the child
when a call needs it, with the fork server's thread count (``OPENBLAS_NUM_THREADS`` as the
pool sets it applies only to a BLAS loaded after). No program calls scipy's BLAS; numpy's
matrix products (semantic dedup) were in that case before.

Importing it freezes what the importing process then holds (``gc.freeze``: the fork server's
workers collect only their own objects): import it in the fork server alone."""

from __future__ import annotations

import importlib

from stages.parallel import collector_paused

with collector_paused(freeze=True):  # most of the fork server's start; its workers then collect only their own
    import curation_dagster.run.pool  # noqa: F401
    from stages.catalog import PROGRAMS
    from stages.parallel import load_kernel_target, preload

    for _name in PROGRAMS:
        importlib.import_module(f"stages.programs.{_name}")
    preload()
    load_kernel_target()
