"""Recrawls: the sensor registers a new crawl snapshot (partitions + runs), declarative automation
carries it through the mixed source x crawl / crawl graph to the ledger, a failed blocking check
holds it back, the schedule registers a dated crawl; and a rerun resumes from committed work."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from curation_dagster.defs.assets import ASSETS
from curation_dagster.defs.checks import CHECKS
from curation_dagster.defs.definitions import build_definitions
from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.recrawl import ROOT_PROGRAMS, discover, spec_for
from curation_dagster.defs.resources import CurationResource, load_spec, save_spec
from curation_dagster.ops.config import RecrawlConfig
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from tests.support import ops_workdir
from tests.support import tiny_corpus as T
from tests.support.metadata import md_table


def test_root_programs_are_the_per_source_head_of_the_graph() -> None:
    assert ROOT_PROGRAMS[:3] == ["raw_documents", "document_languages", "filtered_documents"]
    for name in ROOT_PROGRAMS:
        assert PROGRAMS[name].level == "source"
        assert all(dep in ROOT_PROGRAMS for dep in PROGRAMS[name].deps)
    for name, program in PROGRAMS.items():  # nothing else could join them
        if name not in ROOT_PROGRAMS:
            assert program.level == "crawl" or any(d not in ROOT_PROGRAMS for d in program.deps)


def test_sensor_adds_partitions_saves_the_spec_and_requests_root_runs(prepared: ops_workdir.Prepared) -> None:
    result = prepared.sensor_result
    assert [(r.partitions_def_name, list(r.partition_keys)) for r in result.dynamic_partitions_requests] == [
        ("crawl", ["tiny"]), ("source", ["forum", "news", "wiki"])]
    runs = [(str(r.partition_key), r.run_key, [k.to_user_string() for k in r.asset_selection], r.tags)
            for r in result.run_requests]
    tags = {"curate/crawl": "tiny", "curate/trigger": "recrawl_sensor"}
    roots = ["raw_documents", "filtered_documents"]  # the crawl switched stage language off
    assert runs == [(f"tiny|{s}", f"tiny|{s}", roots, tags) for s in ("forum", "news", "wiki")]
    spec = load_spec(prepared.workdir, "tiny")
    assert {s: p.url for s, p in spec.sources.items()} == {s: f"{prepared.prefix}/tiny/{s}" for s in T.SOURCES}
    assert spec.sources["forum"].text_field == "body" and spec.sources["wiki"].id_field == "page_id"
    assert spec.keep.source_priority == T.EXPECTED["keep"]["source_priority"]
    assert spec.stages == ("heuristic", "exact")


def test_new_crawl_flows_through_the_graph_in_dependency_order(prepared: ops_workdir.Prepared) -> None:
    spec = load_spec(prepared.workdir, "tiny")
    # What the crawl runs: the programs of its stages (heuristic, exact), ingestion and output;
    # a switched-off program has no partition, so it is never requested nor waited on.
    running = {p for p in PROGRAMS if spec.partitions(p)}
    assert running == {"raw_documents", "filtered_documents", "exact_duplicates", "curated_documents",
                       "removal_ledger"}
    roots = running & set(ROOT_PROGRAMS)
    done = set(roots)  # the sensor's runs
    for tick in prepared.ticks:
        for asset in tick:
            assert set(PROGRAMS[asset].deps) & running <= done | set(tick), f"{asset} requested before its inputs"
        done |= set(tick)
    assert done == running
    for asset, parts in (t for tick in prepared.ticks for t in tick.items()):  # exactly the crawl's partitions
        assert parts == (["tiny"] if PROGRAMS[asset].level == "crawl" else ["tiny|forum", "tiny|news", "tiny|wiki"])
    assert sum(len(tick) for tick in prepared.ticks) == len(running) - len(roots)  # each asset once
    store = CurationResource(workdir=str(prepared.workdir)).store()
    report = T.table_report(store, spec)
    assert {s: {k: r[k] for k in ("input", "kept", "quarantined")} for s, r in report["sources"].items()} == {
        s: {k: c[k] for k in ("input", "kept", "quarantined")} for s, c in T.EXPECTED["default"]["counts"].items()}
    print(f"recrawl of tiny: {prepared.runs} runs, {len(prepared.ticks)} automation ticks, {prepared.seconds:.1f}s")


def test_sensor_skips_known_crawls(prepared: ops_workdir.Prepared, tmp_path: Path) -> None:
    # the crawl is registered: a second look finds nothing new (on a copy: tests share the workdir)
    home = tmp_path / "dagster"
    shutil.copytree(prepared.home, home)
    curation = CurationResource(workdir=str(prepared.workdir))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        sensor = build_definitions(str(prepared.workdir)).get_repository_def().get_sensor_def("recrawl_sensor")
        out = sensor(dg.build_sensor_context(instance=instance, resources={"curation": curation}))
    assert isinstance(out, dg.SkipReason) and out.skip_message == f"no new crawl under {prepared.prefix}"


def test_discover_waits_for_the_ready_marker_and_skips_bad_names(tmp_path: Path) -> None:
    for folder in ("c2/news", "c3/news", "c3/wiki", "bad name/news", "c4"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "c3" / "_SUCCESS").write_text("")
    (tmp_path / "c3" / "notes.txt").write_text("a file, not a source")
    found, notes = discover(RecrawlConfig(prefix=str(tmp_path), ready_marker="_SUCCESS"))
    assert found == {"c3": {"news": f"{tmp_path}/c3/news", "wiki": f"{tmp_path}/c3/wiki"}}
    assert notes[0].startswith("invalid crawl name 'bad name'")
    assert notes[1:] == ["c2: no _SUCCESS yet", "c4: no _SUCCESS yet"]
    found, _ = discover(RecrawlConfig(prefix=f"file://{tmp_path}"))  # any fsspec URL; c4 has no source
    assert sorted(found) == ["c2", "c3"] and found["c2"] == {"news": f"file://{tmp_path}/c2/news"}


def test_spec_for_copies_a_template_crawl(tmp_path: Path) -> None:
    save_spec(tmp_path, T.spec(stages=("heuristic",), params={"exact_duplicates": {"lowercase": True}}))
    cfg = RecrawlConfig(prefix="s3://bucket/crawls", template="tiny", source_defaults={"text_field": "content"})
    root = DataRoot.open(workdir=tmp_path)
    spec = spec_for(root, cfg, "c9", {"forum": "s3://bucket/crawls/c9/forum", "blog": "s3://b/c9/blog"})
    assert spec is not None
    assert spec.sources["forum"].text_field == "body" and spec.sources["forum"].url == "s3://bucket/crawls/c9/forum"
    assert spec.sources["blog"].text_field == "content"  # a new source gets the defaults
    assert spec.stages == ("heuristic",) and spec.params == {"exact_duplicates": {"lowercase": True}}
    skip = spec_for(root, cfg.model_copy(update={"new_sources": "skip"}), "c9", {"blog": "s3://b/c9/blog"})
    assert skip is None


def test_schedule_registers_a_dated_crawl(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    ops_workdir.write_curate_yaml(workdir, tmp_path / "snapshots")
    cfg = yaml.safe_load((workdir / "curate.yaml").read_text())
    cfg["recrawl"].update(cron="0 3 * * 1", crawl_name="weekly-%Y%m%d")
    for fields in cfg["recrawl"]["sources"].values():
        fields["url"] = "{prefix}/{crawl}/" + "x"
    (workdir / "curate.yaml").write_text(yaml.safe_dump(cfg))
    repo = build_definitions(str(workdir)).get_repository_def()
    schedule = repo.get_schedule_def("recrawl_schedule")
    assert schedule.cron_schedule == "0 3 * * 1"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert (schedule.description or "").startswith("Configured: recrawl.cron '0 3 * * 1' (UTC) in curate.yaml.")
    # no recrawl.cron: no schedule at all (a listed one would show a placeholder cron as a plan)
    assert build_definitions(str(tmp_path)).get_repository_def().schedule_defs == []
    curation = CurationResource(workdir=str(workdir))
    with dg.instance_for_test() as instance:
        tick = dt.datetime(2025, 6, 2, 3, tzinfo=dt.UTC)
        ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=tick,
                                        resources={"curation": curation}, repository_def=repo)
        requests = schedule.evaluate_tick(ctx).run_requests
        assert requests is not None
        assert [str(r.partition_key) for r in requests] == [f"weekly-20250602|{s}" for s in ("forum", "news", "wiki")]
        assert instance.get_dynamic_partitions("crawl") == ["weekly-20250602"]
        assert instance.get_dynamic_partitions("source") == ["forum", "news", "wiki"]
        spec = load_spec(workdir, "weekly-20250602")
        assert spec.sources["news"].url == f"{tmp_path / 'snapshots'}/weekly-20250602/x"
        again = schedule.evaluate_tick(ctx)
        assert not again.run_requests and "already registered" in (again.skip_message or "")


def test_curate_register_job_registers_a_crawl_with_its_sources(tmp_path: Path) -> None:
    """The UI's way to create a crawl (Jobs -> curate_register -> Launchpad): its spec, sources
    included, in the data root and both dynamic partitions, as `curate register` does; launched
    again for the same crawl, it refuses and names what to do instead."""
    job = build_definitions(str(tmp_path)).get_job_def("curate_register")
    sources = T.source_config()
    config = {"ops": {"register_crawl": {"config": {"crawl": "c9", "sources": sources}}}}
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(run_config=config, instance=instance).success
        assert instance.get_dynamic_partitions("crawl") == ["c9"]
        assert sorted(instance.get_dynamic_partitions("source")) == sorted(T.SOURCES)
        again = job.execute_in_process(run_config=config, instance=instance, raise_on_error=False)
        assert not again.success
        (failure,) = [e for e in again.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        assert "crawl 'c9' is registered already: launch curate_run with crawl: c9" in str(failure.event_specific_data)
    spec = DataRoot.open(None, tmp_path).spec("c9")
    assert {n: (s.url, s.id_field) for n, s in spec.sources.items()} == {
        n: (f["url"], f["id_field"]) for n, f in sources.items()}


def test_failed_blocking_check_holds_the_crawl_back(tmp_path: Path) -> None:
    """Eager automation requests nothing downstream of a partition whose over_deletion failed."""
    workdir, prefix = tmp_path / "w", tmp_path / "snapshots"
    workdir.mkdir()
    ops_workdir.write_curate_yaml(workdir, prefix, checks={"over_deletion": {"per_stage": {"heuristic": 0.2},
                                                                             "min_documents": 0}})
    ops_workdir.snapshot(prefix, "tiny")
    defs = build_definitions(str(workdir), workers=1)
    curation = CurationResource(workdir=str(workdir), workers=1)
    with dg.instance_for_test() as instance:
        with ops_workdir.cached_partitions(instance):
            cursor = dg.evaluate_automation_conditions(defs=defs, instance=instance).cursor
        result = defs.get_repository_def().get_sensor_def("recrawl_sensor")(
            dg.build_sensor_context(instance=instance, resources={"curation": curation}))
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        outcome: dict[str, Any] = {}
        for run in result.run_requests:
            r = dg.materialize([*ASSETS, *CHECKS], selection=run.asset_selection, partition_key=run.partition_key,
                               instance=instance, resources={"curation": curation}, raise_on_error=False,
                               run_config=ops_workdir.QUIET)
            failed = [(e.check_name, e.severity.value) for e in r.get_asset_check_evaluations() if not e.passed]
            outcome[str(run.partition_key)] = (r.success, failed)
        # forum loses 4 of 16 (25 %) and news 6 of 22 (27 %) to the heuristics; wiki 2 of 12 (17 %).
        assert outcome == {"tiny|forum": (False, [("over_deletion", "ERROR")]),
                           "tiny|news": (False, [("over_deletion", "ERROR")]), "tiny|wiki": (True, [])}
        with ops_workdir.cached_partitions(instance):
            tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        assert tick.get_num_requested(dg.AssetKey("exact_duplicates")) == 0
        assert tick.total_requested == 0


def test_a_pair_outside_its_crawl_is_refused_and_neither_requested_nor_waited_on(tmp_path: Path) -> None:
    """The source dimension is shared by every crawl: crawl tiny of forum and news, on an instance
    that knows source blog (another crawl's). The automation carries tiny to its ledger without
    requesting tiny|blog or waiting on it; launched by hand, tiny|blog fails naming the crawl's
    sources and records nothing. So does a partition of a program whose stage the crawl switched
    off (language), which the automation neither requests nor waits on either."""
    workdir, prefix = tmp_path / "w", tmp_path / "snapshots"
    workdir.mkdir()
    prefix.mkdir()
    ops_workdir.write_curate_yaml(workdir, prefix)
    defs = build_definitions(str(workdir), workers=1)
    curation = CurationResource(workdir=str(workdir), workers=1)
    prepared = ops_workdir.Prepared(workdir, prefix, tmp_path, None)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source", ["blog"])
        with ops_workdir.cached_partitions(instance):
            cursor = dg.evaluate_automation_conditions(defs=defs, instance=instance).cursor
        shutil.rmtree(ops_workdir.snapshot(prefix, "tiny") / "wiki")
        result = defs.get_repository_def().get_sensor_def("recrawl_sensor")(
            dg.build_sensor_context(instance=instance, resources={"curation": curation}))
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        for run in result.run_requests:
            ops_workdir.materialize(instance, curation, [k.to_user_string() for k in run.asset_selection],
                                    run.partition_key)
        ops_workdir.automate(instance, defs, curation, cursor, prepared)
        requested = {key for tick in prepared.ticks for keys in tick.values() for key in keys}
        assert requested and not {key for key in requested if key.endswith("|blog")}
        assert instance.get_materialized_partitions(dg.AssetKey("removal_ledger")) == {"tiny"}  # not waited on
        assert instance.get_materialized_partitions(dg.AssetKey("curated_documents")) == {"tiny|forum", "tiny|news"}

        assert "document_languages" not in {asset for tick in prepared.ticks for asset in tick}
        for asset, source, why in [
            ("raw_documents", "blog", "raw_documents[tiny|blog]: source 'blog' is not part of crawl 'tiny', whose "
                                      "sources are forum, news; nothing materialized"),
            ("document_languages", "news", "document_languages[tiny|news]: crawl 'tiny' switched stage language off "
                                           "(its stages: heuristic, exact), so document_languages has no partition "
                                           "in it; nothing materialized"),
        ]:
            before = instance.get_materialized_partitions(dg.AssetKey(asset))
            refused = dg.materialize([*ASSETS, *CHECKS], selection=[asset], partition_key=partition_key("tiny", source),
                                     instance=instance, resources={"curation": curation}, raise_on_error=False,
                                     run_config=ops_workdir.QUIET)
            assert not refused.success
            (failure,) = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
            assert why in str(failure.event_specific_data)
            assert f"tiny|{source}" not in instance.get_materialized_partitions(dg.AssetKey(asset)) and \
                instance.get_materialized_partitions(dg.AssetKey(asset)) == before


def test_rerunning_a_failed_partition_resumes_from_committed_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stages.programs.filtered_documents as filtered

    save_spec(tmp_path, T.spec(stages=("heuristic", "exact")))
    curation = CurationResource(workdir=str(tmp_path), workers=1)
    key = partition_key("tiny", "news")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("crawl", ["tiny"])
        instance.add_dynamic_partitions("source", list(T.SOURCES))

        def run() -> dg.ExecuteInProcessResult:
            return dg.materialize([*ASSETS, *CHECKS],
                                  selection=["raw_documents", "filtered_documents"],  # the crawl's
                                  partition_key=key, instance=instance, resources={"curation": curation},
                                  raise_on_error=False, run_config=ops_workdir.QUIET)

        def boom(*args: Any) -> dict[str, Any]:
            raise RuntimeError("worker lost")

        with monkeypatch.context() as m:
            m.setattr(filtered, "run", boom)
            first = run()
        assert not first.success
        (raw,) = first.asset_materializations_for_node("raw_documents")
        assert raw.metadata["cached"].value is False
        second = run()  # "re-execute" in the UI: same partition, same assets
        assert second.success
        (raw2,) = second.asset_materializations_for_node("raw_documents")
        (flt,) = second.asset_materializations_for_node("filtered_documents")
    assert raw2.metadata["cached"].value is True  # committed in the failed run: not recomputed
    assert raw2.metadata["data_version"].value == raw.metadata["data_version"].value
    assert flt.metadata["cached"].value is False and md_table(flt.metadata["counts"])["removed"] == 6


def test_recrawl_storage_options_are_never_written(tmp_path: Path) -> None:
    """curate.yaml's recrawl storage_options (a planted secret) open the snapshot prefix and reach
    no crawl spec, run request, Dagster event or file of the workdir; a prefix with a credential
    in it is refused by the sensor's config, without echoing it."""
    from curation_dagster.ops.config import load_config
    from curation_dagster.ops.location import workdir_paths

    planted = "recrawl-planted-secret-4b1"
    workdir, prefix = tmp_path / "workdir", tmp_path / "snapshots"
    workdir.mkdir()
    prefix.mkdir()
    ops_workdir.write_curate_yaml(workdir, prefix, recrawl={"storage_options": {"secret": planted}})
    ops_workdir.snapshot(prefix, T.CRAWL)
    _, home = workdir_paths(str(workdir))
    curation = CurationResource(workdir=str(workdir), workers=1)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        sensor = build_definitions(str(workdir)).get_repository_def().get_sensor_def("recrawl_sensor")
        result = sensor(dg.build_sensor_context(instance=instance, resources={"curation": curation}))
        assert result.run_requests and planted not in repr(result)
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        run = result.run_requests[0]
        ops_workdir.materialize(instance, curation, [k.to_user_string() for k in run.asset_selection],
                                run.partition_key)
    assert load_spec(workdir, T.CRAWL).sources  # registered in the data root
    written = [p for p in workdir.rglob("*") if p.is_file() and p.name != "curate.yaml"]
    assert len(written) > 10 and [p for p in written if planted.encode() in p.read_bytes()] == []
    cfg = yaml.safe_load((workdir / "curate.yaml").read_text())
    cfg["recrawl"]["prefix"] = f"s3://AKIAPLANTED:{planted}@bucket/snapshots"
    (workdir / "curate.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="recrawl prefix carries credentials") as exc:
        load_config(workdir)
    assert planted not in str(exc.value)


@pytest.mark.parametrize(("form", "says"), [
    ({"crawl": "../c9", "sources": {"a": {"url": "x"}}}, "invalid crawl name '../c9'"),
    ({"crawl": "c9", "template": "nope"}, "crawl 'nope' is not registered"),
    ({"crawl": "c9", "sources": {"a": {"text_field": "text"}}}, "source(s) a have no url"),
])
def test_curate_register_job_refuses_a_bad_form_in_one_line(tmp_path: Path, form: dict[str, Any], says: str) -> None:
    job = build_definitions(str(tmp_path)).get_job_def("curate_register")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(run_config={"ops": {"register_crawl": {"config": form}}},
                                        instance=instance, raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    data = failure.step_failure_data
    assert data.user_failure_data is not None, data.error  # a Failure, not a traceback
    assert data.error is not None and says in data.error.message and "\n" not in data.error.message.strip()
