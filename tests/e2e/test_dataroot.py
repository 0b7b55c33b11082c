"""The data root as the only shared state, through ``curate`` and the Dagster definitions: crawls on a
non-default or S3 data root, one resolution, old workdirs migrated, reruns of an earlier crawl.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from curation_dagster.defs.assets import ASSETS
from curation_dagster.defs.checks import CHECKS, blocking_failures
from curation_dagster.defs.resources import CurationResource, load_spec, save_spec
from stages.dataroot import CRAWLS_DIR, DATA_ROOT_FILE, DataRoot, NoDataRoot, data_root_url
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.store import Store

# The s3 fixture (tests/conftest.py) reads the bucket and the keys it plants from this module.
from tests.stages.test_dataroot import BUCKET, KEY_ID, SECRET  # noqa: F401
from tests.support import tiny_corpus as T

STOP_WORDS = ["the", "and", "of", "to", "with"]

WORDS = ("river stone garden window letter market winter summer engine bridge pocket silver "
         "candle forest ladder mirror basket thunder harbor meadow violin orchard lantern pillow "
         "compass quarry saddle tunnel velvet walnut anchor blanket cactus dolphin falcon glacier").split()

def curate(*args: str) -> tuple[int, str, str]:
    """``curate ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()

def documents(n: int, seed: int = 0, stop_words: bool = False) -> list[dict[str, str]]:
    """``n`` documents of 80 random words each: no two are near-duplicates of each other. With
    ``stop_words`` they pass every default heuristic; without, they fail ``min_stop_words``."""
    rng = random.Random(seed)
    vocabulary = WORDS + STOP_WORDS if stop_words else WORDS
    return [{"id": f"s{seed}-{i}", "text": " ".join(rng.choice(vocabulary) for _ in range(80)) + "."}
            for i in range(n)]

def write_source(folder: Path, docs: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder

def report(*where: str, crawl: str) -> dict[str, dict[str, int]]:
    code, out, err = curate("report", *where, "--crawl", crawl, "--json")
    assert code == 0, err
    return json.loads(out)["sources"]  # type: ignore[no-any-return]

def test_second_crawl_on_a_non_default_data_root_is_deduplicated_against_the_first(tmp_path: Path) -> None:
    """Issue 16: 200 identical documents in crawl 2 are all removed as duplicates of crawl 1's,
    on a data root given with --data-root exactly as on the default one."""
    src = write_source(tmp_path / "in" / "web", documents(200))
    work, root = tmp_path / "w", tmp_path / "elsewhere"
    for crawl in ("c1", "c2"):
        code, _, err = curate("run", "--workdir", str(work), "--data-root", str(root), "--crawl", crawl,
                              "--source", f"web={src}", "--stages", "fuzzy", "--quiet")
        assert code == 0, err
    assert report("--workdir", str(work), crawl="c1")["web"]["kept"] == 200
    second = report("--workdir", str(work), crawl="c2")["web"]
    assert (second["input"], second["kept"], second["removed"]["fuzzy"]) == (200, 0, 200)
    # The data root alone answers, in a fresh process, once the workdir is gone.
    shutil.rmtree(work)
    empty = tmp_path / "cwd"
    empty.mkdir()
    done = fresh(sys.executable, "-m", "curation_dagster.cli", "report", "--data-root", str(root), "--crawl", "c2",
                 "--json", cwd=empty)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"]["web"] == second
    assert list(empty.iterdir()) == []

def test_the_data_root_is_resolved_in_one_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CURATE_DATA_ROOT", raising=False)
    work = tmp_path / "w"
    work.mkdir()
    assert data_root_url(workdir=work) == str(work / "data")
    (work / DATA_ROOT_FILE).write_text("s3://recorded/root\n")
    assert data_root_url(workdir=work) == "s3://recorded/root"
    monkeypatch.setenv("CURATE_DATA_ROOT", "s3://from/env")
    assert data_root_url(workdir=work) == "s3://from/env" == data_root_url()
    assert data_root_url("s3://given", work) == "s3://given"
    monkeypatch.delenv("CURATE_DATA_ROOT")
    with pytest.raises(NoDataRoot):
        data_root_url()
    code, _, err = curate("report", "--crawl", "c1")
    assert code == 1 and err.strip() == "curate: error: no data root: give --data-root URL (or set " \
                                        "$CURATE_DATA_ROOT) or --workdir DIR"
    # The resource and the stage command agree: the pod gets the data root, never the workdir.
    resource = CurationResource(workdir=str(work))
    assert resource.root() == resource.dataroot().url == "s3://recorded/root"
    (work / "curate.yaml").write_text("execution:\n  text_block_bytes: 1000\n")
    cmd = resource.command("filtered_documents", "c1", "web")
    assert "--workdir" not in cmd and cmd[cmd.index("--data-root") + 1] == "s3://recorded/root"
    assert json.loads(cmd[cmd.index("--tuning") + 1]) == {"text_block_bytes": 1000}

def test_specs_of_an_old_workdir_are_migrated(tmp_path: Path) -> None:
    """``<workdir>/crawls/<crawl>.json`` (before the registry): read when the data root has no
    record, registered there in the old order (file time), and published crawls still count."""
    work = tmp_path / "w"
    (work / "crawls").mkdir(parents=True)
    old = {"c1": T.spec(crawl="c1", stages=("exact",)), "c2": T.spec(crawl="c2")}
    for age, (crawl, spec) in enumerate(sorted(old.items(), reverse=True)):  # c2 written first
        path = work / "crawls" / f"{crawl}.json"
        path.write_text(spec.model_dump_json())
        os.utime(path, (1e9 + age, 1e9 + age))
    execute_crawl(Store(str(work / "data")), old["c1"], ExecutionParams(workers=1))
    code, out, err = curate("report", "--workdir", str(work), "--crawl", "c1", "--json")
    assert code == 0, err
    assert json.loads(out)["sources"] == T.counts(T.table_report(Store(str(work / "data")), old["c1"]))
    root = DataRoot.open(workdir=work)
    assert [(r.crawl, r.sequence) for r in root.records()] == [("c2", 1), ("c1", 2)]
    assert (work / "data" / CRAWLS_DIR / "c1.json").exists() and (work / "crawls" / "c1.json").exists()
    assert root.earlier_crawls("c3") == ["c1"]
    assert load_spec(work, "c2") == old["c2"]  # the test helpers' API keeps working
    save_spec(work, T.spec(crawl="c3"))
    assert [r.crawl for r in DataRoot.open(workdir=work).records()] == ["c2", "c1", "c3"]

def fresh(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A command in a fresh process, in an empty folder, with no CURATE_* setting but ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CURATE_")}
    return subprocess.run(list(argv), cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=300, check=False)

def test_report_ledger_explain_and_a_stage_from_an_s3_data_root_alone(s3: dict[str, Any], tmp_path: Path) -> None:
    """A crawl published on S3 is read by `curate report|ledger|explain --data-root` and rerun by
    `python -m stages --data-root` in fresh processes that have no workdir: the bucket holds the
    spec and the outputs; the endpoint comes from $CURATE_STORAGE_OPTIONS, the keys from AWS_*."""
    url = f"s3://{BUCKET}/published"
    root = DataRoot.open(url, options=s3)
    spec = T.spec(crawl="c1")
    root.register(spec)
    execute_crawl(root.store, spec, ExecutionParams(workers=1))
    ledger = root.store.read_table(DataRoot(root.store).output_dir(spec, "removal_ledger", None), "ledger")
    removed = ledger.filter(pc.equal(ledger["stage"], "exact")).to_pylist()[0]
    empty = tmp_path / "cwd"
    empty.mkdir()
    env = {"CURATE_STORAGE_OPTIONS": json.dumps(s3)}
    curate_cmd = [sys.executable, "-m", "curation_dagster.cli"]
    done = fresh(*curate_cmd, "report", "--data-root", url, "--crawl", "c1", "--json", cwd=empty, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"] == T.counts(T.table_report(root.store, spec))
    out = tmp_path / "ledger.parquet"
    done = fresh(*curate_cmd, "ledger", "--data-root", url, "--crawl", "c1", "--out", str(out), cwd=empty, env=env)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).equals(ledger)
    done = fresh(*curate_cmd, "explain", "--data-root", url, "--crawl", "c1", removed["doc_id"], cwd=empty, env=env)
    assert done.returncode == 0, done.stderr
    assert "removed by stage 'exact'" in done.stdout and removed["duplicate_of"] in done.stdout
    # $CURATE_DATA_ROOT alone is enough too, and the stage entry point finds the spec there.
    done = fresh(sys.executable, "-m", "stages", "filtered_documents", "--crawl", "c1", "--source", "news",
                 cwd=empty, env={**env, "CURATE_DATA_ROOT": url})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["skipped"] is True
    done = fresh(sys.executable, "-m", "stages", "filtered_documents", "--crawl", "c9", "--source", "news",
                 "--data-root", url, cwd=empty, env=env)
    assert done.returncode == 2 and f"crawl 'c9' is not registered in {url}" in done.stderr
    assert list(empty.iterdir()) == []  # nothing written where they ran

PLANTED_KEY, PLANTED_SECRET = "AKIAPLANTEDSTORAGEOPT", "planted/storage-options-secret+9f3"

def test_storage_options_never_persist_after_a_real_crawl_on_s3(
    s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys given in $CURATE_STORAGE_OPTIONS (as curate.yaml-less deployments do) open the data
    root and the sources on S3, and are never written: not in any object under the data root
    (parts, manifests, crawl specs), not in any file of the workdir (the Dagster instance's run and
    event storage, logs), not in the materialization metadata, not in what `curate` prints."""
    fs = Store(f"s3://{BUCKET}", s3).fs
    body = "".join(json.dumps(d) + "\n" for d in documents(30, stop_words=True) * 2)
    fs.pipe_file(f"{BUCKET}/planted-src/web/part.jsonl", body.encode())
    fs.pipe_file(f"{BUCKET}/planted-src/copy/part.jsonl", body.encode())
    monkeypatch.setenv("CURATE_STORAGE_OPTIONS", json.dumps({**s3, "key": PLANTED_KEY, "secret": PLANTED_SECRET}))
    work, url = tmp_path / "w", f"s3://{BUCKET}/planted-root"
    # Two sources: the partitions run on the warm pool, whose workers open the data root with the
    # options the pool resolved (run/place.Place), the keys among them.
    code, out, err = curate("run", "--workdir", str(work), "--data-root", url, "--crawl", "c1",
                            "--source", f"web=s3://{BUCKET}/planted-src/web/",
                            "--source", f"copy=s3://{BUCKET}/planted-src/copy/", "--stages", "exact,fuzzy")
    assert code == 0, err
    counts = report("--workdir", str(work), crawl="c1")  # it really ran
    assert counts["web"]["removed"]["exact"] + counts["copy"]["removed"]["exact"] == 90  # 30 distinct of 120
    planted = (PLANTED_KEY.encode(), PLANTED_SECRET.encode())
    written = {p: fs.cat_file(p) for p in fs.find(f"{BUCKET}/planted-root")}
    assert any(p.endswith("_manifest.json") for p in written) and any(f"/{CRAWLS_DIR}/" in p for p in written)
    written.update({str(p): p.read_bytes() for p in work.rglob("*") if p.is_file()})
    assert len(written) > 20
    assert [p for p, blob in written.items() if any(s in blob for s in planted)] == []
    assert not [s for s in (PLANTED_KEY, PLANTED_SECRET) if s in out + err]
    with dg.DagsterInstance.from_config(str(work / "dagster")) as instance:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_documents")),
                                                  limit=10).records
        metadata = [str(r.asset_materialization.metadata) for r in records if r.asset_materialization]
    assert metadata and "planted-src" in metadata[0]
    assert not [m for m in metadata if PLANTED_KEY in m or PLANTED_SECRET in m]

def run(work: Path, crawl: str, *args: str) -> str:
    code, out, err = curate("run", "--workdir", str(work), "--crawl", crawl, "--quiet", *args)
    assert code == 0, err
    return out

def kept_texts(work: Path, crawl: str) -> set[str]:
    resource = CurationResource(workdir=str(work))
    store, spec = resource.store(), resource.spec(crawl)
    return {text for s in spec.sources
            for text in T.read(store, spec, "curated_documents", "documents", s)["text"].to_pylist()}

def failed_prior_checks(work: Path, crawl: str) -> set[str]:
    """Assets whose latest ``prior_crawls_current`` evaluation for ``crawl`` in the workdir's
    instance failed."""
    out = set()
    with dg.DagsterInstance.from_config(str(work / "dagster")) as instance:
        for program in ("fuzzy_duplicates", "removal_ledger"):
            key = dg.AssetCheckKey(dg.AssetKey(program), "prior_crawls_current")
            for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=20):
                evaluation = record.event.dagster_event.event_specific_data if record.event else None
                if isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.partition == crawl:
                    if not evaluation.passed:
                        out.add(program)
                    break  # the latest one
    return out

def test_a_rerun_earlier_crawl_never_loses_a_document_from_both(tmp_path: Path) -> None:
    """c2 is deduplicated against c1's kept documents; c1 is rerun with the heuristics on and
    removes 20 of them. c2's removals of those 20 are then wrong: its check fails naming c1
    (a deployment where nobody reruns c2), and `curate run` of c2 dedups it against c1's current
    outputs, keeping exactly those 20."""
    docs = documents(40, stop_words=True) + documents(20, seed=1)  # the 20 fail min_stop_words
    src = write_source(tmp_path / "in" / "web", docs)
    work = tmp_path / "w"
    run(work, "c1", "--source", f"web={src}", "--stages", "fuzzy")
    run(work, "c2", "--source", f"web={src}", "--stages", "fuzzy")
    assert report("--workdir", str(work), crawl="c2")["web"]["kept"] == 0  # all 60 are c1's
    run(work, "c3", "--source", f"web={src}", "--stages", "exact")  # against c1 and c2, fuzzy dedup off
    out = run(work, "c1", "--stages", "heuristic,fuzzy")  # rerun: 20 of c1's documents go
    assert report("--workdir", str(work), crawl="c1")["web"]["kept"] == 40
    assert "crawl(s) c2, c3 were deduplicated against crawl c1's earlier outputs" in out
    assert failed_prior_checks(work, "c2") == {"fuzzy_duplicates", "removal_ledger"}  # red in the UI at once
    # c3 has no fuzzy_duplicates partition: no failure recorded there, which no run would clear
    assert failed_prior_checks(work, "c3") == {"removal_ledger"}
    lost = {d["text"] for d in docs} - kept_texts(work, "c1") - kept_texts(work, "c2")
    assert len(lost) == 20  # what c2's stale dedup would lose, were it published as it is

    # Nobody reruns c2: its blocking check fails, naming both crawls, in Dagster as directly.
    resource = CurationResource(workdir=str(work), workers=1)
    for program in ("fuzzy_duplicates", "removal_ledger"):
        ((name, verdict),) = blocking_failures(resource, program, "c2", None)
        assert name == "prior_crawls_current" and not verdict.passed and verdict.severity == "ERROR"
        assert verdict.description.startswith("crawl c2 was deduplicated against outputs of earlier crawl(s) c1 ")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("crawl", ["c2"])
        result = dg.materialize([*ASSETS, *CHECKS], selection=["fuzzy_duplicates"], partition_key="c2",
                                instance=instance, resources={"curation": resource}, raise_on_error=False)
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "prior_crawls_current"]
    assert not evaluation.passed and evaluation.blocking and "earlier crawl(s) c1" in (evaluation.description or "")

    # `curate run` of c2 refreshes its dedup against c1, says so, and keeps what c1 removed.
    out = run(work, "c2")
    assert "crawl c2: deduplicated against crawl c1's current outputs now" in out
    second = report("--workdir", str(work), crawl="c2")["web"]
    assert (second["kept"], second["removed"]["fuzzy"]) == (20, 40)
    assert {d["text"] for d in docs} == kept_texts(work, "c1") | kept_texts(work, "c2")  # nothing lost
    assert blocking_failures(resource, "removal_ledger", "c2", None) == []
    assert failed_prior_checks(work, "c2") == set()  # its run evaluated them again, and they passed
    run(work, "c3")
    assert failed_prior_checks(work, "c3") == set()
    assert DataRoot.open(workdir=work).stale_dependents("c1") == []
