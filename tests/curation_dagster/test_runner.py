"""``curate run``'s runs: a wave of switched-off stages is recorded without a Dagster run, yet
every partition keeps one materialization and its check evaluations on the instance, and the
outputs equal those of the executor alone (no Dagster)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from curation_dagster.checks import CHECK_KINDS
from curation_dagster.instance import ensure_instance_config
from curation_dagster.partitions import partition_key
from curation_dagster.resources import CurationResource
from curation_dagster.runner import DATA_VERSION_TAG, plan, run_crawl, switched_off
from stages.catalog import PROGRAMS
from stages.plan import plan_task
from stages.spec import CrawlSpec
from stages.store import Manifest, Store
from tests.support.tiny_corpus import CRAWL, fast_tmp, read, run_all, spec


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("doc_id", "ascending"), ("source", "ascending")])


def test_switched_off_stages_make_no_run_and_stay_materialized_and_checked(tmp_path: Path) -> None:
    crawl = spec(stages=["fuzzy"])
    off = {p for p in PROGRAMS if not getattr(crawl.program_params(p, crawl.partitions(p)[0]), "enabled", True)}
    assert {"document_languages", "filtered_documents", "exact_duplicates", "document_embeddings",
            "semantic_clusters", "semantic_duplicates", "quality_scores", "contaminated_documents"} == off
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        runs = instance.get_runs()
        # One run per wave and partition that has a switched-on program; none for the others.
        want = [(wave, s) for wave, s in plan(crawl) if not switched_off(crawl, wave, s)]
        assert want == [(wave, s) for wave, s in plan(crawl) if set(wave) - off]
        assert len(runs) == len(want) == 3 * len(crawl.sources) + 2
        ran = sorted(tuple(sorted(e.asset_materialization.asset_key.to_user_string()
                                  for e in instance.all_logs(r.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                                  if e.asset_materialization is not None)) for r in runs)
        assert ran == sorted(tuple(sorted(w)) for w, _ in want)
        want_checks: set[tuple[str, str, str]] = set()
        for program in PROGRAMS:
            for source in crawl.partitions(program):
                key = str(partition_key(CRAWL, source))
                records = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=AssetKey(program), asset_partitions=[key]), limit=10).records
                assert len(records) == 1, (program, source)
                entry = records[0].event_log_entry
                assert (entry.run_id == "") == (program in off and not (set(_wave(program)) - off)), program
                mat = entry.asset_materialization
                assert mat is not None
                enabled = mat.metadata.get("enabled")
                assert (enabled is not None and enabled.value is False) == (program in off), program
                # Both kinds carry the data version under the tag Dagster reads it from.
                tags = mat.tags or {}
                assert tags.get(DATA_VERSION_TAG) == _manifest(resource, crawl, program, source).data_version
                want_checks |= {(program, kind.name, key) for kind in CHECK_KINDS if kind.applies(PROGRAMS[program])}
        # Every check of every partition was evaluated: in its run, or without one.
        evaluated = {(ev.asset_key.to_user_string(), ev.check_name, ev.partition)
                     for run_id in ["", *(r.run_id for r in runs)]
                     for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
                     if e.dagster_event is not None
                     for ev in [e.dagster_event.event_specific_data]}
        assert want_checks and want_checks <= evaluated
        # The same outputs as the executor alone writes.
        alone = Store(str(tmp_path / "alone"))
        run_all(alone, crawl)
        mine = resource.store()
        assert _sorted(read(mine, crawl, "removal_ledger", "ledger")).equals(
            _sorted(read(alone, crawl, "removal_ledger", "ledger")))


def _wave(program: str) -> list[str]:
    from stages.catalog import waves

    return next(w for w in waves() if program in w)


def _manifest(resource: CurationResource, crawl: CrawlSpec, program: str, source: str | None) -> Manifest:
    store = resource.store()
    manifest = store.read_manifest(plan_task(store, crawl, program, source).output_dir)
    assert manifest is not None
    return manifest
