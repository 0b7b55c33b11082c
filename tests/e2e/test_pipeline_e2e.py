"""The tiny corpus end to end through a real Dagster instance, against counts derived from its planting.

``tests/data/tiny/expected.json`` is computed by ``tests/data/make_tiny.py`` from what was planted
(never from a pipeline run). One ``curate run`` (module fixture) materializes the whole graph;
later tests copy its workdir to change parameters without disturbing it.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from curation_dagster import cli
from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.resources import CurationResource, load_spec
from curation_dagster.run.in_process import run_crawl
from stages.catalog import PROGRAMS, QUARANTINE, partition_name, waves
from stages.kernels.exact import normalize
from stages.kernels.heuristics import RULE_TABLE, score_text
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store
from tests.support.metadata import md_table
from tests.support.tiny_corpus import (
    CRAWL,
    EXPECTED,
    SOURCES,
    STAGES,
    assert_counts,
    counts,
    downstream,
    fast_tmp,
    output_dir,
    read,
    write_config,
)

DEFAULT = EXPECTED["default"]
RULE_SCORE = {rule.name: rule.score for rule in RULE_TABLE}


def curate(*args: str) -> tuple[int, str, str]:
    """``curate ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def run(workdir: Path, config: Path, *extra: str) -> str:
    code, out, err = curate("run", "--workdir", str(workdir), "--crawl", CRAWL, "--config", str(config),
                            *extra)  # not --quiet: the tests read its line per partition
    assert code == 0, err
    return out


class Workdir:
    """A workdir after ``curate run``: its spec, store and ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.spec: CrawlSpec = load_spec(path, CRAWL)
        self.store = Store(str(path / "data"))

    def ledger(self) -> list[dict[str, Any]]:
        out = self.path / "ledger.parquet"
        code, _, err = curate("ledger", "--workdir", str(self.path), "--crawl", CRAWL, "--out", str(out))
        assert code == 0, err
        return pq.read_table(out).to_pylist()

    def report(self) -> dict[str, Any]:
        code, out, err = curate("report", "--workdir", str(self.path), "--crawl", CRAWL, "--json")
        assert code == 0, err
        return json.loads(out)

    def documents(self, program: str = "raw_documents") -> dict[str, dict[str, Any]]:
        """doc_id -> row of ``program``'s documents table, over every source."""
        rows = {}
        for s in SOURCES:
            for row in read(self.store, self.spec, program, "documents", s).to_pylist():
                rows[row["doc_id"]] = row
        return rows


def manifests(workdir: Path) -> dict[str, tuple[int, str]]:
    """Every committed manifest under the data root: relative path -> (mtime_ns, content)."""
    return {str(p.relative_to(workdir)): (p.stat().st_mtime_ns, p.read_text())
            for p in sorted((workdir / "data").rglob(MANIFEST))}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workdir]:
    with fast_tmp(tmp_path_factory.mktemp("e2e")) as root:
        workdir = root / "work"
        out = run(workdir, write_config(root / "curate.json"))
        assert out.count(" + ") == sum(len(load_spec(workdir, CRAWL).partitions(p)) for p in PROGRAMS)
        yield Workdir(workdir)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    with fast_tmp(tmp_path / "scratch") as path:
        yield path


def assert_reran_only_changed(out: str, before: CrawlSpec, after: CrawlSpec) -> None:
    """The run's progress lines: every partition whose key changed was materialized (+), every
    other one was up to date (=); a switched-off program's neither (it has no partition)."""
    old, new = before.keys(), after.keys()
    for (program, source), key in new.items():
        if not after.partitions(program):
            assert f"{program}[" not in out, program
            continue
        label = partition_name(program, after.crawl, source)
        mark = "=" if old[(program, source)] == key else "+"
        assert f"  {mark} {label} " in out, (label, mark)


def copy_workdir(base: Workdir, dest: Path) -> Path:
    shutil.copytree(base.path, dest)  # copy2 keeps mtimes, so unchanged manifests stay comparable
    return dest


# --- counts -------------------------------------------------------------------------------------------


def test_report_json_has_the_issue_shape_and_the_planted_counts(base: Workdir) -> None:
    report = base.report()
    assert set(report) == {"crawl", "sources"}
    assert report["crawl"] == CRAWL
    assert set(report["sources"]) == set(SOURCES)
    for row in report["sources"].values():
        assert set(row) == {"input", "kept", "quarantined", "removed"}
        assert all(isinstance(row[k], int) for k in ("input", "kept", "quarantined"))
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in row["removed"].items())
        assert row["input"] == row["kept"] + row["quarantined"] + sum(row["removed"].values())
    assert_counts(report["sources"], DEFAULT["counts"])


def test_stage_reports_match_the_planting(base: Workdir) -> None:
    for s in SOURCES:
        raw = base.store.read_manifest(output_dir(base.store, base.spec, "raw_documents", s))
        flt = base.store.read_manifest(output_dir(base.store, base.spec, "filtered_documents", s))
        assert raw is not None and flt is not None
        assert raw.report["quarantine_reasons"] == DEFAULT["quarantine_reasons"][s], s
        assert raw.report["input"] == DEFAULT["counts"][s]["input"]
        assert flt.report["removed_per_reason"] == DEFAULT["heuristic_reasons"][s], s
    exact = base.store.read_manifest(output_dir(base.store, base.spec, "exact_duplicates"))
    assert exact is not None
    removed = Counter()
    for group in DEFAULT["exact_groups"].values():
        removed.update(group["removed"])
    assert exact.report["removed_per_source"] == dict(removed)
    assert exact.report["groups"] == len(DEFAULT["exact_groups"])
    # The scores are cached apart from the decisions, one partition per source.
    cached = sorted(p.parent.name for p in (base.path / "data" / "heuristic_scores").rglob(MANIFEST))
    assert cached == sorted(SOURCES)


# --- the ledger ---------------------------------------------------------------------------------------


def test_ledger_has_one_row_per_removed_or_quarantined_document(base: Workdir) -> None:
    ledger = base.ledger()
    assert len({r["doc_id"] for r in ledger}) == len(ledger)
    per_stage = Counter((r["source"], r["stage"]) for r in ledger)
    assert {stage for _, stage in per_stage} == {QUARANTINE, *STAGES}
    for s, c in DEFAULT["counts"].items():
        assert per_stage[(s, QUARANTINE)] == c["quarantined"]
        for stage, n in c["removed"].items():
            assert per_stage[(s, stage)] == n, (s, stage)
    assert sum(per_stage.values()) == sum(c["input"] - c["kept"] for c in DEFAULT["counts"].values())
    for s in SOURCES:
        assert Counter(r["reason"] for r in ledger if (r["source"], r["stage"]) == (s, QUARANTINE)) == \
            DEFAULT["quarantine_reasons"][s]
        assert Counter(r["reason"] for r in ledger if (r["source"], r["stage"]) == (s, "heuristic")) == \
            DEFAULT["heuristic_reasons"][s]
    assert {r["reason"] for r in ledger if r["stage"] == "exact"} == {"exact_duplicate"}
    # Nothing removed is in the output, and everything not removed is.
    raw, curated = base.documents(), base.documents("curated_documents")
    assert set(curated) == set(raw) - {r["doc_id"] for r in ledger}


def test_every_planted_record_gets_its_outcome(base: Workdir) -> None:
    ledger = base.ledger()
    curated = base.documents("curated_documents")
    by_record = {(r["source"], r["record_id"]): r for r in ledger if r["record_id"] is not None}
    kept = {(d["source"], d["record_id"]) for d in curated.values()}
    raw = {(d["source"], d["record_id"]): d for d in base.documents().values()}
    for s, outcomes in DEFAULT["outcomes"].items():
        for record_id, want in outcomes.items():
            if want == "kept":
                assert (s, record_id) in kept, (s, record_id)
                assert (s, record_id) not in by_record
                continue
            row = by_record[(s, record_id)]
            assert f"{row['stage']}:{row['reason']}" == want, (s, record_id)
            if row["stage"] == "heuristic":  # the score is the value of the rule that fired
                text = raw[(s, record_id)]["text"]
                assert row["score"] == pytest.approx(score_text(text)[RULE_SCORE[row["reason"]]])


def test_exact_duplicates_point_to_a_kept_document_with_the_same_normalized_text(base: Workdir) -> None:
    ledger = base.ledger()
    raw, curated = base.documents(), base.documents("curated_documents")
    exact = [r for r in ledger if r["stage"] == "exact"]
    assert exact
    for r in exact:
        kept = r["duplicate_of"]
        assert kept in curated, r
        assert normalize(raw[r["doc_id"]]["text"]) == normalize(curated[kept]["text"])
        assert r["duplicate_of_record_id"] == curated[kept]["record_id"]
        assert r["score"] is None
    # The planted whitespace and NFKC variants were caught through normalization alone.
    variants = {r["record_id"] for r in exact if raw[r["doc_id"]]["text"] != curated[r["duplicate_of"]]["text"]}
    assert {"news-030", "p-120"} <= variants
    assert len(variants & {"news-021", "news-022"}) == 1 and len(variants & {"p-110", "p-210"}) == 1
    # Each planted group: one survivor, in the source the keep rule prefers, the others point to it.
    removed = {r["doc_id"]: r for r in exact}
    for name, group in DEFAULT["exact_groups"].items():
        members = [d for d in raw.values() if [d["source"], d["record_id"]] in group["members"]]
        assert len(members) == len(group["members"]), name
        survivors = [d for d in members if d["doc_id"] in curated]
        assert len(survivors) == 1, name
        assert survivors[0]["source"] == group["kept_source"], name
        for d in members:
            if d is not survivors[0]:
                assert removed[d["doc_id"]]["duplicate_of"] == survivors[0]["doc_id"], name
        assert dict(Counter(removed[d["doc_id"]]["source"] for d in members if d["doc_id"] in removed)) == \
            group["removed"]


def test_identical_records_get_distinct_ids(base: Workdir) -> None:
    raw = base.documents()
    twins = [d for d in raw.values() if d["record_id"] == "news-020"]
    assert len(twins) == 2 and twins[0]["doc_id"] != twins[1]["doc_id"]
    assert all(d["metadata"] and json.loads(d["metadata"])["title"] == "news 020" for d in twins)


# --- curate explain --------------------------------------------------------------------------------


def test_explain_a_removed_and_a_kept_document(base: Workdir) -> None:
    ledger = base.ledger()
    row = next(r for r in ledger if r["stage"] == "exact" and r["record_id"] == "p-120")  # forum copy of wiki
    code, out, _ = curate("explain", "--workdir", str(base.path), "--crawl", CRAWL, row["doc_id"])
    assert code == 0
    assert "removed by stage 'exact' (exact_duplicate)" in out
    assert f"duplicate of: {row['duplicate_of']}" in out
    assert "record_id eclipse, source wiki" in out

    heuristic = next(r for r in ledger if r["stage"] == "heuristic" and r["reason"] == "max_lorem_ipsum")
    code, out, _ = curate("explain", "--workdir", str(base.path), "--crawl", CRAWL, heuristic["doc_id"])
    assert code == 0 and "removed by stage 'heuristic' (max_lorem_ipsum)" in out

    code, out, _ = curate("explain", "--workdir", str(base.path), "--crawl", CRAWL, row["duplicate_of"])
    assert code == 0
    assert out.startswith(f"{row['duplicate_of']}: kept (source wiki, record_id eclipse)")

    code, out, _ = curate("explain", "--workdir", str(base.path), "--crawl", CRAWL, "0" * 32)
    assert code == 1 and "not a document" in out


# --- Dagster -----------------------------------------------------------------------------------------


def test_definitions_load_with_an_asset_per_program() -> None:
    from curation_dagster.defs.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert keys == set(PROGRAMS)
    assert {"raw_documents", "filtered_documents", "exact_duplicates", "curated_documents",
            "removal_ledger"} <= keys
    graph = defs.resolve_asset_graph()
    for name, program in PROGRAMS.items():  # the Dagster graph is the registry's graph
        assert {k.to_user_string() for k in graph.get(AssetKey(name)).parent_keys} == set(program.deps), name
    assert defs.get_assets_def("exact_duplicates").partitions_def is not None


def test_waves_order_the_graph() -> None:
    """Every program in exactly one wave, each wave of one level, every input from an earlier
    wave or from earlier in the same one (same partition, so the run orders them)."""
    order = [p for wave in waves() for p in wave]
    assert sorted(order) == sorted(PROGRAMS)
    for i, wave in enumerate(waves()):
        assert len({PROGRAMS[p].level for p in wave}) == 1
        if i:
            assert PROGRAMS[wave[0]].level != PROGRAMS[waves()[i - 1][0]].level  # greedy: no two alike in a row
        for program in wave:
            assert all(order.index(dep) < order.index(program) for dep in PROGRAMS[program].deps), program
    assert waves()[0][:3] == ["raw_documents", "document_languages", "filtered_documents"]


def test_instance_records_a_materialization_per_asset_partition(base: Workdir) -> None:
    instance = DagsterInstance.from_config(str(base.path / "dagster"))
    # One run for the crawl, with one step per asset and a materialization per partition of each.
    (run,) = instance.get_runs()
    steps = [e.step_key for e in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)]
    assert steps == [p for wave in waves() for p in wave]
    materialized = sorted((e.asset_materialization.asset_key.to_user_string(), e.asset_materialization.partition)
                          for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                          if e.asset_materialization is not None)
    assert materialized == sorted((p, str(partition_key(CRAWL, s))) for p in PROGRAMS for s in base.spec.partitions(p))
    keys = base.spec.keys()
    for program in PROGRAMS:
        for source in base.spec.partitions(program):
            records = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(program),
                                   asset_partitions=[str(partition_key(CRAWL, source))]), limit=10,
            ).records
            assert len(records) == 1, (program, source)
            mat = records[0].event_log_entry.asset_materialization
            assert mat is not None
            assert mat.metadata["params_key"].value == keys[(program, source)]
            shown = [*mat.metadata, *md_table(mat.metadata["counts"])] if source else list(mat.metadata)
            assert "params" in mat.metadata and any(k.startswith("rows/") for k in shown)
            assert all(not isinstance(v.value, dict) for k, v in mat.metadata.items() if k != "report"), \
                (program, [k for k, v in mat.metadata.items() if isinstance(v.value, dict)])


# --- reruns and parameter changes ---------------------------------------------------------------------


def test_second_run_recomputes_nothing(base: Workdir, scratch: Path) -> None:
    before = manifests(base.path)
    runs = DagsterInstance.from_config(str(base.path / "dagster")).get_runs_count()
    out = run(base.path, write_config(scratch / "curate.json"))
    n = sum(len(base.spec.partitions(p)) for p in PROGRAMS)
    assert out.count("up to date") == n and " + " not in out
    assert manifests(base.path) == before
    assert DagsterInstance.from_config(str(base.path / "dagster")).get_runs_count() == runs


@pytest.mark.slow  # a second run of every re-keyed partition through Dagster
def test_threshold_change_rekeys_downstream_but_not_ingestion_or_scores(base: Workdir, scratch: Path) -> None:
    work = copy_workdir(base, scratch / "work")
    data = work / "data"
    before = manifests(work)
    config = write_config(scratch / "curate.json", params={"filtered_documents": {"max_lorem_ipsum": None}})
    out = run(work, config)
    after = Workdir(work)
    old_keys, new_keys = base.spec.keys(), after.spec.keys()
    rekeyed = downstream("filtered_documents")
    assert "raw_documents" not in rekeyed and {"exact_duplicates", "removal_ledger"} <= rekeyed
    for (program, source), key in new_keys.items():
        assert (key != old_keys[(program, source)]) == (program in rekeyed), (program, source)
    assert_reran_only_changed(out, base.spec, after.spec)
    # raw documents and the heuristic scores are reused untouched: no new key dir, same manifests.
    for program in ("raw_documents", "heuristic_scores"):
        assert sorted(p.name for p in (data / program).iterdir()) == \
            sorted(p.name for p in (base.path / "data" / program).iterdir())
        now = manifests(work)
        assert {k: v for k, v in now.items() if k.startswith(f"data/{program}/")} == \
            {k: v for k, v in before.items() if k.startswith(f"data/{program}/")}
    # Every downstream partition has a new key directory; the old outputs are still there. A
    # switched-off program has neither.
    for program in PROGRAMS:
        if not after.spec.partitions(program):
            assert not (data / program).exists(), program
            continue
        old = {k for (p, _), k in old_keys.items() if p == program}
        new = {k for (p, _), k in new_keys.items() if p == program}
        assert {d.name for d in (data / program).iterdir()} == old | new, program
    assert_counts(after.report()["sources"], EXPECTED["without_lorem_rule"]["counts"])


@pytest.mark.slow  # a second run of every re-keyed partition through Dagster
def test_only_the_heuristic_stage(base: Workdir, scratch: Path) -> None:
    work = copy_workdir(base, scratch / "work")
    out = run(work, write_config(scratch / "curate.json"), "--stages", "heuristic")
    after = Workdir(work)
    assert_reran_only_changed(out, base.spec, after.spec)
    for s in SOURCES:  # ingestion and the heuristic filters are reused
        label = f"{after.spec.crawl}|{s}"
        assert f"= raw_documents[{label}] up to date" in out and f"= filtered_documents[{label}] up to date" in out
    assert after.spec.stages == ("heuristic",)
    report = after.report()
    for row in report["sources"].values():
        assert row["removed"].get("exact", 0) == 0
    assert_counts(report["sources"], EXPECTED["heuristic_only"]["counts"])
    assert {r["stage"] for r in after.ledger()} == {QUARANTINE, "heuristic"}


# --- failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["news=/nonexistent/dir/*.jsonl", "../x=/tmp", "news"])
def test_bad_source_fails_with_one_line(tmp_path: Path, source: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "curation_dagster.cli", "run", "--workdir", str(tmp_path / "w"), "--crawl", "c1",
         "--source", source, "--quiet"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("curate: error: ")
    assert "Traceback" not in proc.stderr
    if source.startswith("news="):
        assert "/nonexistent/dir/*.jsonl" in lines[0] and "raw_documents[c1|news]" in lines[0]


# --- Dagster Pipes ------------------------------------------------------------------------------------


def test_pipes_mode_gives_the_in_process_ledger(base: Workdir, scratch: Path) -> None:
    """Partitions recomputed by ``python -m stages`` subprocesses speaking Dagster Pipes (through
    ``run_crawl``, which finds every other partition up to date) give the in-process tables."""
    work = copy_workdir(base, scratch / "work")
    copy = Workdir(work)
    redo = [("curated_documents", "news"), ("removal_ledger", None)]
    want = {}
    for program, source in redo:
        pdir = Path(output_dir(copy.store, copy.spec, program, source))
        table = "documents" if program == "curated_documents" else "ledger"
        want[program] = read(copy.store, copy.spec, program, table, source)
        shutil.rmtree(pdir)
    resource = CurationResource(workdir=str(work), mode="pipes")
    report = run_crawl(work, work / "dagster", copy.spec, quiet=True, resource=resource)
    assert counts(report) == counts({"sources": base.report()["sources"]})
    for program, source in redo:
        table = "documents" if program == "curated_documents" else "ledger"
        assert read(copy.store, copy.spec, program, table, source).equals(want[program]), program
    # The instance holds the Pipes-reported materialization, with the same metadata keys.
    instance = DagsterInstance.from_config(str(work / "dagster"))
    records = instance.fetch_materializations(AssetKey("removal_ledger"), limit=5).records
    assert len(records) == 2  # the in-process one, then the Pipes one
    piped, local = (r.event_log_entry.asset_materialization for r in records)
    assert piped is not None and local is not None
    assert piped.metadata["params_key"].value == local.metadata["params_key"].value
    assert piped.metadata["data_version"].value == local.metadata["data_version"].value
    assert set(piped.metadata) == set(local.metadata)
    assert piped.metadata["report"].value["sources"] == local.metadata["report"].value["sources"]


def test_bad_execution_section_fails_with_one_line(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "curate.yaml").write_text("execution:\n  text_block_bytes: 0\n  bogus: 1\n")
    code, _, err = curate("run", "--workdir", str(work), "--crawl", CRAWL, "--source", "a=/nowhere")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "text_block_bytes" in err and "bogus" in err


def test_source_fields_on_the_command_line(tmp_path: Path) -> None:
    """``--text-field/--id-field/--url-field`` name the fields of the ``--source`` sources, so a
    crawl needs no config file for records that keep their text elsewhere or carry ids."""
    src = tmp_path / "in.jsonl"
    body = "A paragraph of ordinary prose that is long enough to be a document of its own. " * 3
    records = [{"key": f"r{i}", "body": body if i < 2 else f"{body} {i}", "link": f"u{i}"} for i in range(4)]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    work = tmp_path / "w"
    code, _, err = curate("run", "--workdir", str(work), "--crawl", "c9", "--source", f"a={src}", "--stages", "exact",
                          "--text-field", "body", "--id-field", "key", "--url-field", "link", "--quiet")
    assert code == 0, err
    source = load_spec(work, "c9").sources["a"]
    assert (source.text_field, source.id_field, source.url_field) == ("body", "key", "link")
    ledger = tmp_path / "ledger.parquet"
    assert curate("ledger", "--workdir", str(work), "--crawl", "c9", "--out", str(ledger))[0] == 0
    rows = pq.read_table(ledger).to_pylist()
    assert len(rows) == 1 and rows[0]["stage"] == "exact"  # r0 and r1 share the body; the keep rule picks
    assert {rows[0]["record_id"], rows[0]["duplicate_of_record_id"]} == {"r0", "r1"}
    # without --source the fields have nothing to apply to
    code, _, err = curate("run", "--workdir", str(work), "--crawl", "c9", "--id-field", "key")
    assert code == 1 and "--id-field applies to the sources given with --source" in err
