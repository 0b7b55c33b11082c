"""One partition run in this process and described: its outcome, its materialization metadata
and its checks' verdicts (``Done``), what the warm pool's workers, ``Fanout`` (a partition that
ran elsewhere is described here) and an asset step do alike; and how a step tells a
partition's error, on one line."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from curation_dagster.run.done import Done
from curation_dagster.run.judge import Judge, evaluator
from curation_dagster.run.metadata import asset_metadata
from curation_dagster.run.place import Curation
from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS, manifests_read_once
from stages.execute import Outcome, execute, metadata
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import Store


def describe(resource: Curation, spec: CrawlSpec, program: str, source: str | None, outcome: Outcome,
             started: float, checks: bool = True, judge: Judge | None = None, store: Store | None = None) -> Done:
    """A partition that ran (``started``: ``time.perf_counter()`` when its launch began), with its
    materialization metadata and, where ``checks``, every verdict of its checks (``judge``: an
    evaluator of the crawl that a step's partitions share; ``store``: the resource's, if at hand)."""
    verdicts = []
    # The checks look up committed state (a crawl-wide partition's, every source's manifests): each
    # manifest once, within one block; the metadata takes the partition's from its outcome.
    with manifests_read_once():
        meta = asset_metadata(store or resource.store(), program, spec, source, metadata(outcome), outcome.manifest)
        if checks:
            judge = judge or evaluator(resource, spec.crawl)
            verdicts = [(kind.name, kind.blocking, judge(kind, program, source))
                        for kind in CHECK_KINDS if kind.applies(PROGRAMS[program])]
    wall = meta.get("wall_s")
    busy = time.perf_counter() - started - (float(wall) if isinstance(wall, int | float) else outcome.seconds)
    return Done(program, source, outcome, None, meta, verdicts, max(busy, 0.0))


def finish(resource: Curation, store: Store, spec: CrawlSpec, program: str, source: str | None,
           execution: ExecutionParams, force: bool, emit: Callable[[str], None] | None = None,
           checks: bool = True, judge: Judge | None = None) -> Done:
    """Run one partition in this process and describe it: what a pool worker does for each
    (``judge``: the step's evaluator, else one of its own)."""
    t0 = time.perf_counter()
    try:
        # The partition's keys, derived once for its run and its description (a pool worker's
        # partition derived them 2-3 times: 1 ms a time at 200 sources), and each manifest read
        # once for both (a source stage's partition made 6-22 reads at 200 sources).
        with manifests_read_once():
            outcome = execute(store, spec, program, source, execution, force=force, emit=emit)
            return describe(resource, spec, program, source, outcome, t0, checks, judge, store)
    except Exception as exc:
        return Done(program, source, error=one_line(exc), trace=traceback.format_exc())


def told(label: str, error: str) -> str:
    """A partition's error as a step tells it: ``label: error`` (once, when the error names it)."""
    return error if error.startswith(f"{label}: ") else f"{label}: {error}"


def one_line(exc: BaseException) -> str:
    """An exception as the one line ``curate run`` prints: its message's last line, else its class."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def step_judge(resource: Curation, crawl: str) -> Judge | None:
    """An evaluator for one step's partitions (the checks' bounds and the crawl's record, read
    once, as ``Fanout``'s), else None where it cannot be made: each partition's ``describe`` then
    makes its own and reports the error as that partition's."""
    try:
        return evaluator(resource, crawl)
    except Exception:
        return None
