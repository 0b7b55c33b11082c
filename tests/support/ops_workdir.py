"""A workdir whose crawl arrived the way a production recrawl does, built once per test session
(the ``prepared`` fixture of ``tests/conftest.py``).

The tiny corpus is laid out as a crawl snapshot ``<prefix>/tiny/<source>/``; the recrawl sensor
(evaluated with ``build_sensor_context`` on a real SQLite instance in ``<workdir>/dagster``)
registers it, its run requests are executed in-process, and then declarative automation is
evaluated tick by tick (``evaluate_automation_conditions``, the daemon's own evaluation) with
every requested partition executed in-process, grouped into one run per partition key as the
daemon does, until nothing is requested. Stages: heuristic and exact (the others run disabled),
so the ledger must equal ``expected.json``'s ``default`` counts.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import tiny_corpus as T

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
STAGES = ["heuristic", "exact"]


@dataclass
class Prepared:
    workdir: Path
    prefix: Path
    home: Path
    sensor_result: Any
    ticks: list[dict[str, list[str]]] = field(default_factory=list)  # asset -> requested partition keys
    runs: int = 0
    seconds: float = 0.0


def write_curate_yaml(workdir: Path, prefix: Path, **extra: Any) -> None:
    sources = {name: {k: v for k, v in fields.items() if k != "url"} for name, fields in T.source_config().items()}
    cfg = {"recrawl": {"prefix": str(prefix), "sources": sources, "keep": T.EXPECTED["keep"], "stages": STAGES}}
    for key, value in extra.items():
        cfg.setdefault(key, {}).update(value)
    (workdir / "curate.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def snapshot(prefix: Path, crawl: str) -> Path:
    """The tiny corpus copied to ``<prefix>/<crawl>/<source>/``."""
    for name in T.SOURCES:
        shutil.copytree(T.TINY / name, prefix / crawl / name)
    return prefix / crawl


def materialize(instance: Any, curation: Any, assets: list[str], partition_key: Any) -> None:
    import dagster as dg

    from curation_dagster.defs.assets import ASSETS
    from curation_dagster.defs.checks import CHECKS

    result = dg.materialize(
        [*ASSETS, *CHECKS], selection=dg.AssetSelection.assets(*assets), partition_key=partition_key,
        instance=instance, resources={"curation": curation}, raise_on_error=False, run_config=QUIET,
    )
    assert result.success, f"{assets}[{partition_key}] failed"


@contextmanager
def cached_partitions(instance: Any) -> Iterator[None]:
    """Within one evaluation, read each dynamic partition list from SQLite once: the tester
    re-reads it ~1,200 times per tick (3 s of a 3.5 s tick); nothing adds partitions meanwhile."""
    read = instance.get_dynamic_partitions
    cache: dict[str, Any] = {}

    def cached(partitions_def_name: str) -> Any:
        if partitions_def_name not in cache:
            cache[partitions_def_name] = read(partitions_def_name)
        return cache[partitions_def_name]

    instance.get_dynamic_partitions = cached
    try:
        yield
    finally:
        del instance.get_dynamic_partitions


def automate(instance: Any, defs: Any, curation: Any, cursor: Any, prepared: Prepared, max_ticks: int = 30) -> Any:
    """Evaluate the automation tick by tick, running what it requests, until it requests nothing."""
    import dagster as dg

    keys = sorted(defs.resolve_asset_graph().get_all_asset_keys())
    for _ in range(max_ticks):
        with cached_partitions(instance):
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        cursor = result.cursor
        by_key: dict[Any, list[str]] = {}
        tick: dict[str, list[str]] = {}
        for key in keys:
            parts = result.get_requested_partitions(key)
            if parts:
                tick[key.to_user_string()] = sorted(str(p) for p in parts)
            for pk in parts:
                by_key.setdefault(pk, []).append(key.to_user_string())
        if not by_key:
            return cursor
        prepared.ticks.append(tick)
        for pk, assets in sorted(by_key.items(), key=lambda kv: str(kv[0])):
            materialize(instance, curation, assets, pk)
            prepared.runs += 1
    raise AssertionError(f"automation still requesting after {max_ticks} ticks: {prepared.ticks[-1]}")


def prepare(root: Path) -> Prepared:
    import dagster as dg

    from curation_dagster.defs.definitions import build_definitions
    from curation_dagster.defs.resources import CurationResource
    from curation_dagster.ops.location import workdir_paths

    warnings.filterwarnings("ignore", module="dagster")
    t0 = time.perf_counter()
    workdir, prefix = root / "workdir", root / "snapshots"
    workdir.mkdir(parents=True)
    prefix.mkdir()
    write_curate_yaml(workdir, prefix)
    _, home = workdir_paths(str(workdir))
    defs = build_definitions(str(workdir), workers=1)
    curation = CurationResource(workdir=str(workdir), workers=1)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # The automation sensor runs before the crawl appears (as in a deployment).
        with cached_partitions(instance):
            cursor = dg.evaluate_automation_conditions(defs=defs, instance=instance).cursor
        snapshot(prefix, T.CRAWL)
        sensor = defs.get_repository_def().get_sensor_def("recrawl_sensor")
        result = sensor(dg.build_sensor_context(instance=instance, resources={"curation": curation}))
        prepared = Prepared(workdir, prefix, home, result)
        for req in result.dynamic_partitions_requests:  # what the sensor daemon does with them
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        for run in result.run_requests:
            materialize(instance, curation, [k.to_user_string() for k in run.asset_selection], run.partition_key)
            prepared.runs += 1
        automate(instance, defs, curation, cursor, prepared)
    prepared.seconds = time.perf_counter() - t0
    return prepared

