"""What a warm pool's worker has imported when the fork server forks it (the fork server's one
preload, ``curation_dagster.run.forkserver.PRELOAD``; importing it is its whole purpose): the
executor (``curation_dagster.run.pool``), every program, and what any forked worker would import
itself (``stages.parallel.PRELOAD``: pandas, 0.2 s of CPU in each worker otherwise). Not numba's
implementations, imported at a worker's first kernel loaded from the cache (0.2 s more): they
import scipy.linalg, whose OpenBLAS would start its threads in the fork server, with its
settings, not the partition's.

Importing it freezes what the importing process then holds (``gc.freeze``: the fork server's
workers collect only their own objects): import it in the fork server alone."""

from __future__ import annotations

import importlib

from stages.parallel import collector_paused

with collector_paused(freeze=True):  # most of the fork server's start; its workers then collect only their own
    import curation_dagster.run.pool  # noqa: F401
    from stages.catalog import PROGRAMS
    from stages.parallel import preload

    for _name in PROGRAMS:
        importlib.import_module(f"stages.programs.{_name}")
    preload()
