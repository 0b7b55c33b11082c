"""The loaded ``Definitions`` against a checked-in snapshot of the asset graph: every asset's key,
group, kinds, partitions, deps (with their partition mappings), tags, owners, code version and
resources metadata; every asset check (blocking or not, its partitions); the schedules and sensors.

A refactor of ``curation_dagster`` or of the program catalog must leave the graph the UI and the
daemon see unchanged; a change meant to change it regenerates the snapshot and shows up in review
as a diff of ``tests/data/golden/asset_specs.json``:

    CURATE_UPDATE_GOLDEN=1 python -m pytest tests/curation_dagster/defs/test_definitions.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

SNAPSHOT = Path(__file__).resolve().parents[2] / "data" / "golden" / "asset_specs.json"
UPDATE_ENV = "CURATE_UPDATE_GOLDEN"


def _partitions(partitions_def: Any) -> Any:
    """A partitions definition as JSON: ``"dynamic:<name>"``, or ``{dimension: ...}`` of a multi one."""
    import dagster as dg

    if partitions_def is None:
        return None
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return {d.name: _partitions(d.partitions_def) for d in partitions_def.partitions_defs}
    if isinstance(partitions_def, dg.DynamicPartitionsDefinition):
        return f"dynamic:{partitions_def.name}"
    return type(partitions_def).__name__


def _mapping(mapping: Any) -> Any:
    """A declared partition mapping as JSON: its class and, for a dimension mapping, the dimension."""
    if mapping is None:
        return None
    out = {"class": type(mapping).__name__}
    if getattr(mapping, "partition_dimension_name", None):
        out["dimension"] = mapping.partition_dimension_name
    return out


def _plain(value: Any) -> Any:
    """A metadata value as JSON (``MetadataValue.text`` and the like carry it in ``.value``)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return getattr(value, "value", repr(value))


def snapshot(defs: Any) -> dict[str, Any]:
    """What the snapshot holds, from loaded ``Definitions``; every list sorted, so order is no change."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for spec in defs.resolve_all_asset_specs():
        assets[spec.key.to_user_string()] = {
            "group": spec.group_name,
            "kinds": sorted(spec.kinds),
            "partitions": _partitions(spec.partitions_def),
            "deps": [{"asset": dep.asset_key.to_user_string(), "partition_mapping": _mapping(dep.partition_mapping)}
                     for dep in sorted(spec.deps, key=lambda d: d.asset_key.to_user_string())],
            "tags": {k: v for k, v in sorted(spec.tags.items()) if not k.startswith("dagster/kind/")},
            "owners": sorted(spec.owners),
            "code_version": spec.code_version,
            "metadata": {k: _plain(v) for k, v in sorted(spec.metadata.items())},
        }
    checks = {}
    for key in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        check = graph.get_check_spec(key)
        checks[f"{key.asset_key.to_user_string()}:{key.name}"] = {
            "blocking": check.blocking,
            "partitions": _partitions(check.partitions_def),
            "additional_deps": sorted(d.asset_key.to_user_string() for d in check.additional_deps),
        }
    repo = defs.get_repository_def()
    return {
        "assets": dict(sorted(assets.items())),
        "checks": checks,
        "schedules": sorted(s.name for s in repo.schedule_defs),
        "sensors": sorted(s.name for s in repo.sensor_defs),
    }


def test_asset_specs_match_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from curation_dagster.defs.definitions import build_definitions

    monkeypatch.delenv("CURATE_WORKDIR", raising=False)
    got = snapshot(build_definitions(str(tmp_path / "workdir")))
    if os.environ.get(UPDATE_ENV):
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"{UPDATE_ENV} is set: wrote {SNAPSHOT.name}")
    want = json.loads(SNAPSHOT.read_text())
    how = f"if the change is meant, regenerate the snapshot with {UPDATE_ENV}=1 and review its diff"
    assert sorted(got["assets"]) == sorted(want["assets"]), f"asset keys differ; {how}"
    for key, spec in want["assets"].items():
        for field, value in spec.items():
            assert got["assets"][key][field] == value, f"asset {key}: {field} differs; {how}"
    assert got["checks"] == want["checks"], f"asset checks differ; {how}"
    assert got["schedules"] == want["schedules"] and got["sensors"] == want["sensors"], \
        f"schedules or sensors differ; {how}"
    assert got == want, f"the snapshot's shape differs; {how}"


def test_the_snapshot_pins_the_graph() -> None:
    """The snapshot says something: every program is an asset, the fan-in deps map by crawl, the
    GPU stages are kinded gpu, over_deletion blocks and giant_groups only warns."""
    want = json.loads(SNAPSHOT.read_text())
    assets = want["assets"]
    assert {"raw_documents", "fuzzy_duplicates", "removal_ledger"} <= set(assets)
    assert assets["raw_documents"]["partitions"] == {"crawl": "dynamic:crawl", "source": "dynamic:source"}
    assert assets["removal_ledger"]["partitions"] == "dynamic:crawl"
    fan_in = {d["asset"]: d["partition_mapping"] for d in assets["exact_duplicates"]["deps"]}
    assert fan_in["raw_documents"] == {"class": "MultiToSingleDimensionPartitionMapping", "dimension": "crawl"}
    assert "gpu" in assets["document_embeddings"]["kinds"] and "cpu" in assets["raw_documents"]["kinds"]
    over_deletion = [c["blocking"] for k, c in want["checks"].items() if k.endswith(":over_deletion")]
    giant_groups = [c["blocking"] for k, c in want["checks"].items() if k.endswith(":giant_groups")]
    assert over_deletion and all(over_deletion) and giant_groups and not any(giant_groups)


def test_the_code_location_loads_as_the_ui_loads_it(tmp_path: Path) -> None:
    """Every definition resolves as a code server resolves it (the UI refuses a location whose op,
    graph or job names collide; building a job alone does not notice), and the jobs are the crawl
    job and the registration job."""
    from curation_dagster.defs.definitions import build_definitions

    repo = build_definitions(str(tmp_path)).get_repository_def()
    repo.load_all_definitions()
    assert sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")) == \
        ["curate_register", "curate_run"]
