"""Executing partitions: ``execute`` runs one (skipped when an up-to-date output is committed)
and commits it atomically, ``execute_crawl`` runs a whole crawl without Dagster, ``metadata``
is what a materialization publishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stages import params as P
from stages.backend import reported as reported_backend
from stages.catalog import PROGRAMS, partition_name
from stages.ingest.files import listings_held
from stages.progress import Progress
from stages.reports import read
from stages.resolve import data_version, load_program, resolve_task
from stages.spec import CrawlSpec
from stages.store import Manifest, Store, manifests_held
from stages.task import Inputs, Partition
from stages.timing import clocked, figures, timing_report


@dataclass
class Outcome:
    manifest: Manifest
    skipped: bool
    seconds: float


@clocked  # the partition's read/compute/write split (stages.timing), into report["timing"]
def execute(
    store: Store, spec: CrawlSpec, program: str, source: str | None,
    execution: P.ExecutionParams | None = None, force: bool = False, emit: Callable[[str], None] | None = None,
) -> Outcome:
    """Run one partition unless an up-to-date committed output exists; commit it atomically.
    ``emit`` receives the partition's progress lines (``stages.progress``), if given. Each
    manifest it reads is read once (``stages.store.manifests_held``), each source listed once
    (``stages.ingest.files.listings_held``)."""
    with manifests_held(), listings_held():
        return _execute(store, spec, program, source, execution, force, emit)


def _execute(
    store: Store, spec: CrawlSpec, program: str, source: str | None,
    execution: P.ExecutionParams | None, force: bool, emit: Callable[[str], None] | None,
) -> Outcome:
    t0 = time.perf_counter()
    execution = execution or P.ExecutionParams()
    task = resolve_task(store, spec, program, source)
    progress = Progress(partition_name(program, spec.crawl, task.source), emit, execution.progress_interval_s)
    version = data_version(store, task)
    # Current: committed for this data version with every part it names whole (a deleted or
    # truncated part is recomputed, never served).
    existing = store.current_manifest(task.output_dir, version)
    if existing is not None and not force:
        progress.finish(skipped=True)
        return Outcome(existing, True, time.perf_counter() - t0)
    writer = store.writer(task.output_dir, execution.intermediate_compression)
    try:
        module = load_program(program)
        report = module.run(
            task.params, Inputs(store, task.input_dirs, task.prior_dirs), writer,
            Partition(spec.crawl, task.source, spec, progress), execution,
        )
        report = report.model_copy(update={
            "seconds": round(time.perf_counter() - t0, 3),
            "backend": report.backend or reported_backend(report.dump()),  # cpu | gpu | gpu-twin-on-cpu
            "timing": timing_report(),
        })
        manifest = Manifest(
            program=program, params_key=task.key, data_version=version, crawl=spec.crawl,
            source=task.source, params=task.params.canonical(), report=report.dump(),
        )
        writer.commit(manifest, together=True)
    finally:
        writer.close()  # a failed attempt releases the partition at once, not when collected
    progress.finish()
    return Outcome(manifest, False, time.perf_counter() - t0)


def metadata(outcome: Outcome) -> dict[str, Any]:
    """Materialization metadata of one partition (plain JSON values, so Dagster and Dagster
    Pipes publish the same thing): rows in/out, removals per reason, params, params_key."""
    m = outcome.manifest
    meta: dict[str, Any] = {
        "params_key": m.params_key,
        "data_version": m.data_version,
        "params": m.params,
        "rows": m.rows,
        "cached": outcome.skipped,
        "seconds": round(outcome.seconds, 3),
    }
    report = read(m)
    meta.update(report.metadata())
    if not outcome.skipped:  # a cached step's figures are its original run's, not this one's
        meta.update(figures(m.report))
    meta["report"] = report.dump()
    return meta


def execute_crawl(
    store: Store, spec: CrawlSpec, execution: P.ExecutionParams | None = None, force: bool = False
) -> dict[tuple[str, str | None], Outcome]:
    """Every partition of a crawl in dependency order, without Dagster (tests, benchmarks, pods)."""
    return {
        (name, source): execute(store, spec, name, source, execution, force)
        for name in PROGRAMS
        for source in spec.partitions(name)
    }
