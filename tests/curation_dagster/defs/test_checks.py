"""Asset checks: planted manifests with exact expected verdicts, the real tiny crawl passing every
check, and a failed blocking check stopping ``curate run``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from curation_dagster.defs.checks import evaluate
from curation_dagster.defs.resources import CurationResource, save_spec
from curation_dagster.ops.config import load_config
from stages.catalog import PROGRAMS
from stages.checks import (
    CHECK_KINDS,
    ChecksConfig,
    Verdict,
    evaluate_doc_id_unique,
    evaluate_empty_result,
    evaluate_giant_groups,
    evaluate_ledger_consistency,
    evaluate_over_deletion,
)
from stages.dataroot import CRAWLS_DIR, DataRoot
from stages.spec import CrawlSpec
from stages.store import Manifest, Store
from tests.support import ops_workdir
from tests.support import tiny_corpus as T

KIND = {k.name: k for k in CHECK_KINDS}


def plant(store: Store, spec: CrawlSpec, program: str, source: str | None = None, report: dict[str, Any] | None = None,
          tables: dict[str, pa.Table] | None = None) -> None:
    """Commit a partition with exactly this report (and tables) at the path the spec names."""
    w = store.writer(DataRoot(store).output_dir(spec, program, source))
    for name, table in (tables or {}).items():
        w.write(name, table)
    w.commit(Manifest(program, "planted", "planted", spec.crawl, source, {}, report=report or {}))


@pytest.fixture
def spec() -> CrawlSpec:
    return CrawlSpec(crawl="c1", sources={s: {"url": f"/nowhere/{s}"} for s in ("a", "b", "c")},
                     stages=("heuristic", "exact"))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "data"))


def plant_counts(store: Store, spec: CrawlSpec, docs: dict[str, int], heuristic: dict[str, int],
                 exact: dict[str, int]) -> None:
    for s, n in docs.items():
        plant(store, spec, "raw_documents", s, {"documents": n})
        plant(store, spec, "document_languages", s, {"enabled": False, "input": n, "removed": 0})
        plant(store, spec, "filtered_documents", s, {"input": n, "removed": heuristic[s]})
    plant(store, spec, "exact_duplicates", None,
          {"enabled": True, "removed": sum(exact.values()), "removed_per_source": exact})


def cfg(**checks: Any) -> ChecksConfig:
    return ChecksConfig.model_validate(checks)


def test_over_deletion_per_source_stage(store: Store, spec: CrawlSpec) -> None:
    plant_counts(store, spec, {"a": 1000, "b": 1000, "c": 10}, {"a": 950, "b": 100, "c": 10}, {"a": 0, "b": 0, "c": 0})
    v = evaluate_over_deletion(store, spec, "filtered_documents", "a", cfg())
    assert (v.passed, v.severity) == (False, "ERROR")
    assert v.description.startswith("stage heuristic removed more than 90.0% of: a 95.0% (950 of 1,000); not "
                                    "applied, the crawl stops here")
    # names the setting that would allow it
    assert "raise checks.over_deletion.per_stage.heuristic in curate.yaml" in v.description
    assert {k: v.metadata[k] for k in ("stage", "bound", "min_documents", "worst_fraction", "worst_source",
                                       "sources_judged", "sources_not_judged")} == {
        "stage": "heuristic", "bound": "90.0%", "min_documents": "1,000", "worst_fraction": 0.95, "worst_source": "a",
        "sources_judged": 1, "sources_not_judged": 0}
    v = evaluate_over_deletion(store, spec, "filtered_documents", "b", cfg())
    assert v.passed and v.description == "stage heuristic removed at most 10.0% of a judged source (bound 90.0%)"
    v = evaluate_over_deletion(store, spec, "filtered_documents", "c", cfg())  # 100 % of 10 documents
    # not "passed ... at most 100 %", nor any fraction beside the pass: the source is too small
    # to judge, and says so; its fraction is in the per-source table, marked not judged
    assert v.passed and v.description == ("NOT JUDGED: stage heuristic: every source is too small; not judged "
                                          "(under min_documents 1,000): c (10 documents)")
    assert (v.metadata["sources_judged"], v.metadata["sources_not_judged"]) == (0, 1)
    assert "| c | 10 | 10 | 100.0% | not judged: under min_documents 1,000 |" in (v.table or "")
    # a passing verdict shows no fraction over its bound, whichever sources it names
    for source in ("b", "c"):
        v = evaluate_over_deletion(store, spec, "filtered_documents", source, cfg())
        assert v.passed and all(float(p) <= 90.0 for p in re.findall(r"([0-9.]+)%", v.description)), v.description
    loose = cfg(over_deletion={"per_stage": {"heuristic": 0.96}})
    assert evaluate_over_deletion(store, spec, "filtered_documents", "a", loose).passed


def test_over_deletion_crawl_stage_counts_what_reached_it(store: Store, spec: CrawlSpec) -> None:
    # a: 3000 ingested, 1500 survive the heuristics, exact removes 1380 of those = 92 %.
    plant_counts(store, spec, {"a": 3000, "b": 1000, "c": 1000}, {"a": 1500, "b": 0, "c": 0},
                 {"a": 1380, "b": 100, "c": 0})
    v = evaluate_over_deletion(store, spec, "exact_duplicates", None, cfg())
    assert not v.passed and v.severity == "ERROR"
    assert v.description.startswith("stage exact removed more than 90.0% of: a 92.0% (1,380 of 1,500); ")
    assert "checks.over_deletion.per_stage.exact" in v.description
    assert v.table is not None and v.table.splitlines()[2:] == [
        "| a | 1,500 | 1,380 | 92.0% | judged |", "| b | 1,000 | 100 | 10.0% | judged |",
        "| c | 1,000 | 0 | 0.0% | judged |"]
    assert evaluate_over_deletion(store, spec, "exact_duplicates", None,
                                  cfg(over_deletion={"per_stage": {"exact": 0.95}})).passed


def test_empty_result_warns_on_a_large_crawl_only(store: Store, spec: CrawlSpec) -> None:
    plant_counts(store, spec, {"a": 12_000, "b": 8_000, "c": 0}, {"a": 0, "b": 0, "c": 0}, {})
    v = evaluate_empty_result(store, spec, "exact_duplicates", None, cfg())
    assert (v.passed, v.severity) == (False, "WARN")
    assert v.description.startswith("stage exact found no duplicate among 20,000 documents")
    bigger = cfg(empty_result={"min_documents": 20_001})
    assert evaluate_empty_result(store, spec, "exact_duplicates", None, bigger).passed
    plant(store, spec, "exact_duplicates", None, {"enabled": False, "removed": 0, "removed_per_source": {}})
    v = evaluate_empty_result(store, spec, "exact_duplicates", None, cfg())
    assert v.passed and v.description == "stage exact is disabled for this crawl"


def test_giant_groups_generic_over_largest_keys(store: Store, spec: CrawlSpec) -> None:
    plant(store, spec, "lsh_buckets", None,
          {"nodes": 100_000, "largest_buckets": [{"size": 6000, "key": "00ff"}, {"size": 10, "key": "0a0b"}]})
    v = evaluate_giant_groups(store, spec, "lsh_buckets", None, cfg())
    assert (v.passed, v.severity) == (False, "WARN")
    assert v.description.startswith(
        "giant group(s) in lsh_buckets: buckets of 6,000 documents (bound 5,000 of 100,000)")
    assert v.metadata == {"documents": 100_000, "bound": 5000, "largest_buckets": 6000}
    plant(store, spec, "duplicate_components", None, {"nodes": 100_000, "largest_clusters": [4000, 3]})
    v = evaluate_giant_groups(store, spec, "duplicate_components", None, cfg())
    assert v.passed and v.description == "largest group 4,000 <= bound 5,000"
    # small crawls: the absolute floor (min_size) applies
    plant(store, spec, "duplicate_components", None, {"nodes": 500, "largest_clusters": [400]})
    assert evaluate_giant_groups(store, spec, "duplicate_components", None, cfg()).passed
    lower = cfg(giant_groups={"min_size": 100})
    assert not evaluate_giant_groups(store, spec, "duplicate_components", None, lower).passed
    plant(store, spec, "exact_duplicates", None, {"removed": 3, "groups": 2})
    v = evaluate_giant_groups(store, spec, "exact_duplicates", None, cfg())
    assert v.passed and v.metadata == {"stats": "none"}


def test_doc_id_unique(store: Store, spec: CrawlSpec) -> None:
    plant(store, spec, "curated_documents", "a", tables={"documents": pa.table({"doc_id": ["x", "y", "x", "z"]})})
    v = evaluate_doc_id_unique(store, spec, "curated_documents", "a", cfg())
    assert (v.passed, v.severity) == (False, "ERROR")
    assert v.description == "1 doc_id(s) occur more than once in curated_documents.documents: x"
    assert v.metadata == {"rows": 4, "distinct": 3, "duplicated_ids": 1}
    plant(store, spec, "curated_documents", "b", tables={"documents": pa.table({"doc_id": ["x", "y"]})})
    assert evaluate_doc_id_unique(store, spec, "curated_documents", "b", cfg()).passed


def curated(store: Store, spec: CrawlSpec, source: str, rows: int, **report: Any) -> None:
    plant(store, spec, "curated_documents", source, report,
          tables={"documents": pa.table({"doc_id": [f"{source}{i}" for i in range(rows)]})})


def test_ledger_consistency_of_a_curated_partition(store: Store, spec: CrawlSpec) -> None:
    counts = {"input": 10, "kept": 5, "quarantined": 2, "removed": {"heuristic": 2, "exact": 1}}
    curated(store, spec, "a", 5, **counts)
    v = evaluate_ledger_consistency(store, spec, "curated_documents", "a", cfg())
    assert v.passed and v.description == "every document is kept, quarantined or removed exactly once"
    curated(store, spec, "a", 5, **{**counts, "input": 11})
    v = evaluate_ledger_consistency(store, spec, "curated_documents", "a", cfg())
    assert not v.passed and v.description == "input 11 != kept + quarantined + removed = 10"
    curated(store, spec, "a", 4, **counts)
    assert evaluate_ledger_consistency(store, spec, "curated_documents", "a", cfg()).description == \
        "4 curated rows but kept = 5"


def test_ledger_consistency_of_the_ledger(store: Store, spec: CrawlSpec) -> None:
    entries = {s: {"input": 4, "kept": 1, "quarantined": 1, "removed": {"heuristic": 1, "exact": 1}}
               for s in spec.sources}
    for s, e in entries.items():
        curated(store, spec, s, 1, **e)
    rows = [(s, st) for s in spec.sources for st in ("quarantine", "heuristic", "exact")]
    ledger = pa.table({"doc_id": [f"{s}-{st}" for s, st in rows], "source": [s for s, _ in rows],
                       "stage": [st for _, st in rows]})
    plant(store, spec, "removal_ledger", None, {"crawl": "c1", "sources": entries}, {"ledger": ledger})
    assert evaluate_ledger_consistency(store, spec, "removal_ledger", None, cfg()).passed
    plant(store, spec, "removal_ledger", None, {"crawl": "c1", "sources": entries}, {"ledger": ledger.slice(1)})
    v = evaluate_ledger_consistency(store, spec, "removal_ledger", None, cfg())
    assert not v.passed and v.description == "a/quarantine: 0 ledger rows, report says 1"
    curated(store, spec, "b", 2, **{**entries["b"], "kept": 2, "input": 5})  # curated re-run after the ledger
    plant(store, spec, "removal_ledger", None, {"crawl": "c1", "sources": entries}, {"ledger": ledger})
    v = evaluate_ledger_consistency(store, spec, "removal_ledger", None, cfg())
    assert v.description == "b: ledger built from a stale curated_documents (kept 1 vs 2 now)"


def test_partitions_outside_the_crawl_and_unmaterialized(tmp_path: Path, spec: CrawlSpec) -> None:
    curation = CurationResource(workdir=str(tmp_path))
    v = evaluate(curation, KIND["over_deletion"], "filtered_documents", "c1", "a")
    assert (v.passed, v.severity, v.description) == (False, "WARN", f"crawl 'c1' is not registered in {tmp_path}/data")
    save_spec(tmp_path, spec)
    v = evaluate(curation, KIND["over_deletion"], "filtered_documents", "c1", "blog")
    assert v.passed and v.metadata == {"in_crawl": False}
    v = evaluate(curation, KIND["over_deletion"], "filtered_documents", "c1", "a")
    assert (v.passed, v.severity, v.metadata) == (False, "WARN", {"materialized": False})


def test_the_recrawled_tiny_crawl_passes_every_check(prepared: ops_workdir.Prepared) -> None:
    import dagster as dg

    curation = CurationResource(workdir=str(prepared.workdir))
    spec = curation.spec(T.CRAWL)
    verdicts = {}
    for program in PROGRAMS.values():
        for kind in CHECK_KINDS:
            if kind.applies(program):
                for source in spec.partitions(program.name):
                    verdict = evaluate(curation, kind, program.name, T.CRAWL, source)
                    verdicts[(program.name, kind.name, source)] = verdict
    failed = {k: v.description for k, v in verdicts.items() if not v.passed}
    assert not failed
    forum = verdicts[("filtered_documents", "over_deletion", "forum")]
    # 4 of 16: under min_documents, so not judged, and the verdict says so (not "at most 25 %")
    assert forum.description == ("NOT JUDGED: stage heuristic: every source is too small; not judged (under "
                                 "min_documents 1,000): forum (16 documents)")
    assert (forum.metadata["sources_judged"], forum.metadata["sources_not_judged"]) == (0, 1)
    # ... and every check the Dagster runs executed along the way passed, per partition.
    with dg.DagsterInstance.from_config(str(prepared.home)) as instance:
        evaluations = [e.dagster_event.event_specific_data for run in instance.get_runs()
                       for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
    executed = {(ev.asset_key.to_user_string(), ev.check_name, ev.partition) for ev in evaluations}
    expected = {(p, k, str(s)) for (p, k, src) in verdicts for s in [f"tiny|{src}" if src else "tiny"]}
    assert executed == expected
    assert all(ev.passed for ev in evaluations)


def test_curate_run_stops_at_a_failed_blocking_check(tmp_path: Path) -> None:
    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import RunFailed, run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    (workdir / "curate.yaml").write_text(yaml.safe_dump(
        {"checks": {"over_deletion": {"per_stage": {"heuristic": 0.2}, "min_documents": 0}}}))
    assert load_config(workdir).checks.over_deletion.bound("heuristic") == 0.2
    spec = T.spec(stages=("heuristic", "exact"))
    message = f"filtered_documents[{T.CRAWL}|forum]: check over_deletion failed: stage heuristic removed more " \
              "than 20.0% of: forum 25.0% (4 of 16); not applied, the crawl stops here. If intended, raise " \
              "checks.over_deletion.per_stage.heuristic in curate.yaml; else fix the stage's parameters"
    resource = CurationResource(workdir=str(workdir), workers=1)
    with pytest.raises(RunFailed) as err:
        run_crawl(workdir, home, spec, quiet=True, resource=resource)
    assert str(err.value) == message
    store = Store(str(workdir / "data"))
    assert DataRoot(store).manifest(spec, "exact_duplicates", None) is None  # blocked
    # A rerun finds filtered_documents[c|forum] up to date, and its check still holds the crawl back.
    with pytest.raises(RunFailed) as err:
        run_crawl(workdir, home, spec, quiet=True, resource=resource)
    assert str(err.value) == message
    record = json.loads((workdir / "data" / CRAWLS_DIR / "tiny.json").read_text())
    assert record["spec"]["stages"] == ["heuristic", "exact"]


def _over_deletion(home: Path, source: str) -> list[Any]:
    """The over_deletion evaluations of filtered_documents[tiny|source] on the instance, oldest first."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.ASSET_CHECK_EVALUATION),
                                             ascending=True)
    evs = [r.event_log_entry.dagster_event.event_specific_data for r in records]
    return [ev for ev in evs if ev.check_name == "over_deletion" and ev.asset_key.to_user_string() ==
            "filtered_documents" and str(ev.partition) == f"{T.CRAWL}|{source}"]


def _check_state(home: Path, program: str = "filtered_documents", check: str = "over_deletion",
                 partitions: Any = None) -> dict[str, list[str]]:
    """The partitions of a check by status, as the UI's partition statuses and the automation's
    ``check_failed`` / ``check_passed`` read them (Dagster's check state: an evaluation counts only
    for the materialization it targets, and only while that is the partition's latest)."""
    import dagster as dg

    from curation_dagster.defs.partitions import source_crawl_partitions

    key = dg.AssetCheckKey(dg.AssetKey(program), check)
    with dg.DagsterInstance.from_config(str(home)) as instance, \
            dg.partition_loading_context(dynamic_partitions_store=instance):
        state = instance.event_log_storage.get_asset_check_state([(key, partitions or source_crawl_partitions)])[key]
        return {status.value: sorted(str(k) for k in subset.subset_value.get_partition_keys())
                for status, subset in state.subsets.items() if not subset.is_empty}


def test_a_crawl_runs_evaluations_count_for_the_materialization_they_judged(tmp_path: Path) -> None:
    """The crawl run's own evaluations target the materialization the run just stored: the check
    state shows the blocked partitions failed and the others passed (without a target, Dagster's
    check state drops them: neither failed nor passed)."""
    import dagster as dg

    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import RunFailed, run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    (workdir / "curate.yaml").write_text(yaml.safe_dump(
        {"checks": {"over_deletion": {"per_stage": {"heuristic": 0.2}, "min_documents": 0}}}))
    with pytest.raises(RunFailed):
        run_crawl(workdir, home, T.spec(stages=("heuristic", "exact")), quiet=True,
                  resource=CurationResource(workdir=str(workdir), workers=1))
    assert _check_state(home) == {"FAILED": [f"{T.CRAWL}|forum", f"{T.CRAWL}|news"], "SUCCEEDED": [f"{T.CRAWL}|wiki"]}
    (failed,) = _over_deletion(home, "forum")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (mat,) = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("filtered_documents"), asset_partitions=[f"{T.CRAWL}|forum"]), limit=5).records
    assert (failed.target_materialization_data.storage_id, failed.target_materialization_data.run_id) == \
        (mat.storage_id, mat.run_id)


def test_a_raised_bound_records_the_new_verdict_of_a_current_partition(tmp_path: Path) -> None:
    """A crawl stopped by a blocking over_deletion, the bound raised in curate.yaml, curate run
    again: the current partition is not rerun, but its check's new verdict (passed) is recorded,
    targeting its materialization, so the UI and the automation no longer show it failed; the
    crawl completes. An unchanged verdict is not recorded again."""
    import dagster as dg

    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import RunFailed, run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    bounds = {"over_deletion": {"per_stage": {"heuristic": 0.2}, "min_documents": 0}}
    (workdir / "curate.yaml").write_text(yaml.safe_dump({"checks": bounds}))
    spec = T.spec(stages=("heuristic", "exact"))
    resource = CurationResource(workdir=str(workdir), workers=1)
    with pytest.raises(RunFailed):
        run_crawl(workdir, home, spec, quiet=True, resource=resource)
    (failed,) = _over_deletion(home, "forum")
    assert (failed.passed, failed.severity) == (False, dg.AssetCheckSeverity.ERROR)
    (wiki,) = _over_deletion(home, "wiki")
    assert wiki.passed

    bounds["over_deletion"]["per_stage"]["heuristic"] = 0.5
    (workdir / "curate.yaml").write_text(yaml.safe_dump({"checks": bounds}))
    report = run_crawl(workdir, home, spec, quiet=True, resource=resource)
    assert report.crawl == T.CRAWL  # the crawl completes: its ledger is built
    before, after = _over_deletion(home, "forum")
    assert before == failed and after.passed and after.severity == dg.AssetCheckSeverity.ERROR
    assert after.description == "stage heuristic removed at most 25.0% of a judged source (bound 50.0%)"
    assert len(_over_deletion(home, "wiki")) == 1  # passed before, passes now: not recorded again
    key = dg.AssetCheckKey(dg.AssetKey("filtered_documents"), "over_deletion")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (mat,) = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("filtered_documents"), asset_partitions=[f"{T.CRAWL}|forum"]), limit=5).records
        assert after.target_materialization_data.storage_id == mat.storage_id  # the output it judged
        # what the UI's check status and the automation's check_failed read: passed, and current
        # (it targets the partition's latest materialization, or they would not count it)
        (info,) = instance.event_log_storage.get_asset_check_partition_info([key], partition_keys=[f"{T.CRAWL}|forum"])
        assert (info.latest_execution_status.value, info.is_current) == ("SUCCEEDED", True)


def test_a_bound_moved_after_an_up_to_date_crawl_shows_its_new_verdict(tmp_path: Path) -> None:
    """A crawl complete and current; the bound lowered, raised, lowered, raised: each curate run
    records the verdicts that changed, in a run (Dagster keeps one runless evaluation per
    partition), so the check state (the UI's, the automation's) follows what curate run acts on:
    failed and stopped, passed and complete. Run again unchanged, it makes no run."""
    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import RunFailed, run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    spec = T.spec(stages=("heuristic", "exact"))
    resource = CurationResource(workdir=str(workdir), workers=1)
    forum, news, wiki = (f"{T.CRAWL}|{s}" for s in ("forum", "news", "wiki"))

    def run(bound: float) -> None:
        bounds = {"over_deletion": {"per_stage": {"heuristic": bound}, "min_documents": 0}}
        (workdir / "curate.yaml").write_text(yaml.safe_dump({"checks": bounds}))
        run_crawl(workdir, home, spec, quiet=True, resource=resource)

    run(0.5)
    assert _check_state(home) == {"SUCCEEDED": [forum, news, wiki]}
    for _ in range(2):
        with pytest.raises(RunFailed, match=r"filtered_documents\[tiny\|forum\]: check over_deletion failed"):
            run(0.2)
        assert _check_state(home) == {"FAILED": [forum, news], "SUCCEEDED": [wiki]}
        run(0.5)
        assert _check_state(home) == {"SUCCEEDED": [forum, news, wiki]}
    assert [e.passed for e in _over_deletion(home, "forum")] == [True, False, True, False, True]
    assert len(_over_deletion(home, "wiki")) == 1  # its verdict never changed
    runs = len(_runs(home))
    run(0.5)  # nothing stale, no verdict changed
    assert len(_runs(home)) == runs


def _runs(home: Path) -> list[Any]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_runs())


def test_a_runless_evaluation_counts_for_the_partitions_latest_materialization(tmp_path: Path) -> None:
    """A check evaluation recorded without a run (a later crawl's prior_crawls_current, failed
    after an earlier crawl was rerun) targets the partition's latest materialization: the check
    state shows it failed (without a target, Dagster's drops it)."""
    import dagster as dg

    from curation_dagster.defs.checks import record_runless_check
    from curation_dagster.defs.partitions import crawl_partitions
    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    run_crawl(workdir, home, T.spec(stages=("exact",)), quiet=True,
              resource=CurationResource(workdir=str(workdir), workers=1))
    kind = KIND["prior_crawls_current"]
    assert _check_state(home, "removal_ledger", kind.name, crawl_partitions) == {"SUCCEEDED": [T.CRAWL]}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        record_runless_check(instance, "removal_ledger", kind, Verdict(False, "stale"), T.CRAWL)
    assert _check_state(home, "removal_ledger", kind.name, crawl_partitions) == {"FAILED": [T.CRAWL]}


def test_a_stopped_crawl_still_shows_what_its_stage_would_remove(tmp_path: Path, capsys: Any) -> None:
    """No ledger after a blocking check stopped the crawl: report, ledger and explain show the
    stopped stage's removal list, marked not applied, and so does the failed check's metadata."""
    import pyarrow.parquet as pq

    from curation_dagster import cli
    from curation_dagster.ops.location import workdir_paths
    from curation_dagster.run.in_process import RunFailed, run_crawl

    workdir, home = workdir_paths(str(tmp_path / "w"))
    (workdir / "curate.yaml").write_text(yaml.safe_dump(
        {"checks": {"over_deletion": {"per_stage": {"heuristic": 0.2}, "min_documents": 0}}}))
    spec = T.spec(stages=("heuristic", "exact"))
    with pytest.raises(RunFailed):
        run_crawl(workdir, home, spec, quiet=True, resource=CurationResource(workdir=str(workdir), workers=1))
    store = Store(str(workdir / "data"))
    removed = store.read_table(DataRoot(store).output_dir(spec, "filtered_documents", "forum"), "removed")
    reasons = sorted(set(removed["reason"].to_pylist()))
    capsys.readouterr()
    assert cli.main(["report", "--workdir", str(workdir), "--crawl", T.CRAWL, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["applied"] is False
    forum = out["would_remove"]["forum"]["heuristic"]
    assert sum(forum.values()) == removed.num_rows == 4 and sorted(forum) == reasons
    assert cli.main(["report", "--workdir", str(workdir), "--crawl", T.CRAWL]) == 1
    text = capsys.readouterr().out
    assert "NOT APPLIED" in text and "forum" in text
    assert cli.main(["ledger", "--workdir", str(workdir), "--crawl", T.CRAWL, "--out", str(tmp_path / "l.parquet")]) \
        == 1
    written = pq.read_table(tmp_path / "l.parquet")
    assert set(written["applied"].to_pylist()) == {False}
    assert set(removed["doc_id"].to_pylist()) <= set(written["doc_id"].to_pylist())
    assert "NOT APPLIED" in capsys.readouterr().out
    doc = removed["doc_id"][0].as_py()
    assert cli.main(["explain", "--workdir", str(workdir), "--crawl", T.CRAWL, doc]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{doc}: would be removed by stage 'heuristic' ({removed['reason'][0].as_py()}): "
                           "NOT APPLIED") and "  text: " in text
    # the failed check's metadata: the same list, per source and reason, with examples
    verdict = evaluate(CurationResource(workdir=str(workdir)), KIND["over_deletion"], "filtered_documents",
                       T.CRAWL, "forum")
    assert not verdict.passed
    assert verdict.metadata["would_remove"].value.startswith("**NOT APPLIED**: what stage `heuristic` would remove")
    examples = [dict(r.data) for r in verdict.metadata["would_remove_examples"].value.records]
    assert {e["reason"] for e in examples} == set(reasons) and all(e["excerpt"] for e in examples)
    # ... and the evaluation curate run recorded on the instance carries them: the UI's Checks tab
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.ASSET_CHECK_EVALUATION))
    failed = [r.event_log_entry.dagster_event.event_specific_data for r in records]
    failed = [ev for ev in failed if ev.check_name == "over_deletion" and not ev.passed]
    forum = [ev for ev in failed if str(ev.partition) == f"{T.CRAWL}|forum"]  # news fails too, at 20 %
    assert forum and forum[0].metadata["would_remove"].value.startswith("**NOT APPLIED**")
    assert "| forum | heuristic |" in forum[0].metadata["would_remove"].value
    assert "checks.over_deletion.per_stage.heuristic" in (forum[0].description or "")
