"""Why did a source shrink? Crawl c1, then c2 with planted verbatim copies of c1's documents
(``tests/support/recrawl_copies.py``), answered from what ``curate run`` recorded: which stage
(the waterfall), because of what (the earlier-crawl column naming c1) and which documents (an
example pair whose kept document is in c1), through the CLI, the materialization's metadata and
the real Dagster UI in headless Chromium (docs/operations.md, "Why did a source shrink?").
Screenshots are kept in ``tests/artifacts/`` (ignored by git)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import recrawl_copies as R
from tests.support.browser import CHROMIUM, Browser
from tests.support.tiny_corpus import curate

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WIDTH = 1280  # an ordinary laptop's window


@pytest.fixture(scope="module")
def recrawl(tmp_path_factory: pytest.TempPathFactory) -> R.Recrawl:
    return R.build(tmp_path_factory.mktemp("why"))


def ledger_metadata(workdir: Path, crawl: str) -> dict[str, Any]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(workdir / "dagster")) as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("removal_ledger"), asset_partitions=[crawl]), limit=1).records
        mat = records[0].asset_materialization
        assert mat is not None
        return dict(mat.metadata)


def test_the_report_counts_the_copies_apart_and_names_c1(recrawl: R.Recrawl) -> None:
    code, out, err = curate("report", "--workdir", str(recrawl.workdir), "--crawl", "c2", "--json")
    assert code == 0, err
    docstrings = json.loads(out)["sources"]["docstrings"]
    assert docstrings["earlier_crawl_duplicates"] == {"fuzzy": {"c1": R.COPIES}}
    assert docstrings["removed"]["fuzzy"] >= R.COPIES
    assert "↳ earlier crawl c1" in recrawl.c2_run  # curate run's table
    code, out, _ = curate("report", "--workdir", str(recrawl.workdir), "--crawl", "c1", "--json")
    assert code == 0 and "earlier_crawl_duplicates" not in json.loads(out)["sources"]["docstrings"]


def test_the_materialization_answers_which_stage_why_and_which_documents(recrawl: R.Recrawl) -> None:
    meta = ledger_metadata(recrawl.workdir, "c2")
    rows = {r.data["source"]: dict(r.data) for r in meta["waterfall_table"].value.records}
    assert rows["docstrings"]["fuzzy:earlier_crawls"] == R.COPIES
    column = next(c for c in meta["waterfall_table"].value.schema.columns if c.name == "fuzzy:earlier_crawls")
    assert "earlier crawl(s) c1" in (column.description or "")
    assert "| fuzzy | ↳ c1 |" in meta["waterfall"].value
    assert "`↳ c1`: fuzzy removals that copy documents earlier crawl c1 kept." in meta["waterfall"].value
    examples = [dict(r.data) for r in meta["removal_examples"].value.records]
    copies = {c["id"]: c["text"] for c in recrawl.copies}
    pairs = [e for e in examples if e["source"] == "docstrings" and e["reason"] == "near_duplicate_of_earlier_crawl"]
    assert pairs and all(e["kept_crawl"] == "c1" and e["kept_source"] == "docstrings" for e in pairs)
    assert all(e["excerpt"] == e["kept_excerpt"] and e["score"] == 1.0 for e in pairs)  # verbatim copies
    assert any(" ".join(t.split()).startswith(pairs[0]["excerpt"].rstrip("…")) for t in copies.values())
    # crawl over crawl: c2 against c1, per source
    compared = {r.data["source"]: dict(r.data) for r in meta["crawl_over_crawl"].value.records}
    assert compared["docstrings"]["previous_crawl"] == "c1"
    c1_table = ledger_metadata(recrawl.workdir, "c1")["waterfall_table"].value
    c1 = {r.data["source"]: dict(r.data) for r in c1_table.records}
    assert compared["docstrings"]["input_before"] == c1["docstrings"]["input"]
    assert compared["docstrings"]["fuzzy_change"] == rows["docstrings"]["fuzzy"] - c1["docstrings"]["fuzzy"]
    assert compared["docstrings"]["kept_change"] == rows["docstrings"]["kept"] - c1["docstrings"]["kept"]
    assert "crawl_over_crawl" not in ledger_metadata(recrawl.workdir, "c1")  # nothing before c1
    # a table asset's row count and column schema, as Dagster's catalog reads them
    assert meta["dagster/row_count"].value == sum(r["input"] - r["kept"] for n, r in rows.items() if n != "total")
    names = [c.name for c in meta["dagster/column_schema"].schema.columns]
    assert names[:2] == ["doc_id", "record_id"] and "duplicate_of_crawl" in names


def test_explain_names_c1_as_the_crawl_of_the_kept_copy(recrawl: R.Recrawl) -> None:
    meta = ledger_metadata(recrawl.workdir, "c2")
    pair = next(dict(r.data) for r in meta["removal_examples"].value.records
                if r.data["reason"] == "near_duplicate_of_earlier_crawl" and r.data["source"] == "docstrings")
    code, out, err = curate("explain", "--workdir", str(recrawl.workdir), "--crawl", "c2", pair["doc_id"])
    assert code == 0, err
    assert "(near_duplicate_of_earlier_crawl)" in out
    assert "source docstrings, crawl c1 (an earlier crawl, which kept it)" in out


# --- the real UI ----------------------------------------------------------------------------------

WATERFALL_SHOWN = """(() => {
  const cells = [...document.querySelectorAll('th, td')].map(c => c.innerText.trim());
  return cells.includes('fuzzy:earlier_crawls') || cells.includes('↳ c1');
})()"""
# The tables of the page as arrays of rows of cell texts (a metadata table, or a Markdown one).
TABLES = """(() => [...document.querySelectorAll('table')].map(t =>
  [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th, td')].map(c => c.innerText.trim()))))()"""
# The right edge of the Markdown waterfall (the table whose heading names the earlier crawl) and
# of the pane that clips it (its nearest ancestor that does not let content overflow), CSS px.
WATERFALL_RIGHT = """(() => {
  const t = [...document.querySelectorAll('table')]
    .find(t => t.rows.length && [...t.rows[0].cells].some(c => c.innerText.trim() === '↳ c1'));
  if (!t) return null;
  let p = t.parentElement;
  while (p && getComputedStyle(p).overflowX === 'visible') p = p.parentElement;
  const clip = p ? Math.min(p.getBoundingClientRect().right, window.innerWidth) : window.innerWidth;
  return [Math.round(t.getBoundingClientRect().right), Math.round(clip)];
})()"""


@pytest.fixture(scope="module")
def ui(recrawl: R.Recrawl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from tests.e2e.test_ui import Server, free_port, gql, stop, wait_loaded

    # No eager automation: a partition materialized from the UI would set off its downstream
    # partitions as background runs and record them again (test_recrawl.py covers the automation).
    (recrawl.workdir / "curate.yaml").write_text("automation:\n  enabled: false\n")
    port = free_port()
    log = tmp_path_factory.mktemp("why-ui") / "dagster-dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "curation_dagster.cli", "ui", "--workdir", str(recrawl.workdir),
             "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    try:
        wait_loaded(Server(port, proc, log, recrawl.workdir))
        assert gql(port, "mutation { setNuxSeen }")["setNuxSeen"] is True
        yield port
    finally:
        stop(proc)


def _table_with(tables: list[list[list[str]]], heading: str) -> list[dict[str, str]]:
    """The rows (as heading -> cell) of the first table whose heading row (its first) has
    ``heading`` (the page's metadata table holds the others: its rows hold their cells too)."""
    found = [t for t in tables if t and heading in t[0]]
    if found:
        table = min(found, key=lambda t: len(t[0]))  # the innermost: its heading row is only its own
        return [dict(zip(table[0], row, strict=True)) for row in table[1:] if len(row) == len(table[0])]
    raise AssertionError(f"no table with a column {heading!r}: {[t[:1] for t in tables]}")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make chromium)")
def test_why_a_source_shrank_in_the_ui(ui: int, recrawl: R.Recrawl, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    browser = Browser(tmp_path / "chrome", WIDTH, 2400)
    try:
        browser.open(f"http://127.0.0.1:{ui}/assets/removal_ledger?view=events&partition=c2")
        browser.wait_for(WATERFALL_SHOWN, timeout=90)
        browser.show_markdown("waterfall", timeout=30)
        time.sleep(1)
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'why_shrank_c2.png')}")
        tables = browser.eval(TABLES)
        (ARTIFACTS / "why_shrank_c2_tables.json").write_text(json.dumps(tables, indent=1))
        right, clip = browser.eval(WATERFALL_RIGHT)
        assert right <= clip, f"the waterfall ends at {right} px, its pane at {clip}: not readable at {WIDTH} px"
        # which stage: the waterfall's docstrings row, fuzzy took the most
        waterfall = {r["source"]: r for r in _table_with(tables, "fuzzy:earlier_crawls")}
        docstrings = waterfall["docstrings"]
        steps = {s: int(docstrings[s].replace(",", "")) for s in ("heuristic", "exact", "fuzzy")}
        assert max(steps, key=lambda s: steps[s]) == "fuzzy"
        # because of what: the earlier-crawl column, naming c1 (the Markdown waterfall's heading)
        assert int(docstrings["fuzzy:earlier_crawls"]) == R.COPIES
        md = _table_with(tables, "↳ c1")
        assert any(r["source"] == "docstrings" and r["↳ c1"] == f"−{R.COPIES}" for r in md)
        legend = "↳ c1: fuzzy removals that copy documents earlier crawl c1 kept."
        assert browser.eval(f"document.body.innerText.includes({json.dumps(legend)})")
        # which documents: an example pair whose kept document is in c1
        examples = _table_with(tables, "kept_crawl")
        pairs = [e for e in examples
                 if e["source"] == "docstrings" and e["reason"] == "near_duplicate_of_earlier_crawl"]
        assert pairs, examples[:3]
        assert all(e["kept_crawl"] == "c1" and e["excerpt"] == e["kept_excerpt"] for e in pairs)
        code, out, _ = curate("explain", "--workdir", str(recrawl.workdir), "--crawl", "c2", pairs[0]["doc_id"])
        assert code == 0 and "crawl c1 (an earlier crawl, which kept it)" in out
    finally:
        browser.close()


# Click the button labelled LABEL (a toggle of the asset page's Metadata section).
CLICK = """(() => {
  const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === LABEL);
  if (b) b.click();
  return !!b;
})()"""
# The first cell of each row of the page's tables with N cells a row: 3, the metadata table (key,
# timestamp, value) and the columns table; 2, a Markdown table of counts shown inline in a value.
ROW_KEYS = """[...document.querySelectorAll('tr')].filter(r => r.cells.length === N)
  .map(r => r.cells[0].innerText.trim())"""


def _shows(text: str) -> str:
    """A condition: the page (once it has a body) shows ``text``."""
    return f"!!document.body && document.body.innerText.includes({json.dumps(text)})"


def _click(browser: Browser, label: str, timeout: float = 60) -> None:
    browser.wait_for(CLICK.replace("LABEL", json.dumps(label)), timeout=timeout)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make chromium)")
def test_timeline_automation_and_metadata_plots_read_right(ui: int, tmp_path: Path) -> None:
    """curate run's runs are on the Overview timeline; Automation lists no schedule while
    curate.yaml sets no recrawl.cron; a per-source asset's counts are one table, so its Plots draw
    no line through every source x crawl partition; its description shows the output path."""
    browser = Browser(tmp_path / "chrome", WIDTH, 1600)
    base = f"http://127.0.0.1:{ui}"
    try:
        browser.open(f"{base}/overview/activity/timeline")
        browser.wait_for(_shows("curate_run"), timeout=90)
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'overview_timeline.png')}")

        browser.open(f"{base}/automation")
        browser.wait_for(_shows("recrawl_sensor"), timeout=90)
        text = browser.eval("document.body.innerText")
        assert "curation_automation" in text and "recrawl_schedule" not in text and "Scheduled At" not in text

        browser.open(f"{base}/assets/curated_documents?view=overview")
        browser.wait_for(_shows("rows/documents"), timeout=90)
        keys = browser.eval(ROW_KEYS.replace("N", "3"))
        assert "counts" in keys and "wall_s" in keys and not {"input", "kept", "kept_fraction"} & set(keys), keys
        assert {"input", "kept", "kept_fraction", "rows/documents"} <= set(browser.eval(ROW_KEYS.replace("N", "2")))
        text = browser.eval("document.body.innerText")
        assert "Output: {data root}/curated_documents/{params_key}/{crawl}/{source}/" in text
        _click(browser, "Plots")
        browser.wait_for(_shows("When graphing values by partition"), timeout=60)
        time.sleep(1)
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'curated_documents_plots.png')}")
        plotted = browser.eval("document.body.innerText")
        plots = plotted[plotted.index("Plots"):plotted.index("When graphing values by partition")]
        assert "wall_s" in plots and not {"input", "kept", "kept_fraction", "quarantined"} & set(plots.split()), plots
    finally:
        browser.close()


def test_materializing_a_partition_re_runs_its_checks(ui: int, recrawl: R.Recrawl) -> None:
    """The Checks tab's Execute is disabled for partitioned assets; what works (docs/operations.md)
    is Materialize on the partition: its checks run with it, with the bounds as they are now, and
    the current output is not recomputed."""
    from tests.e2e.test_ui import LAUNCH, LOCATION, REPOSITORY, gql

    asset = {"path": ["filtered_documents"]}
    tags = [{"key": "dagster/partition", "value": "c2|licenses"}, {"key": "dagster/partition/crawl", "value": "c2"},
            {"key": "dagster/partition/source", "value": "licenses"}]
    out = gql(ui, LAUNCH, {"p": {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": "__ASSET_JOB",
                     "assetSelection": [asset], "assetCheckSelection": [{"assetKey": asset, "name": "over_deletion"}]},
        "mode": "default", "executionMetadata": {"tags": tags}}})["launchPipelineExecution"]
    assert out["__typename"] == "LaunchRunSuccess", out
    run_id, deadline, status = out["run"]["runId"], time.monotonic() + 240, None
    while time.monotonic() < deadline:
        status = gql(ui, STATUS, {"id": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert status == "SUCCESS", status
    import dagster as dg

    with dg.DagsterInstance.from_config(str(recrawl.workdir / "dagster")) as instance:
        (check,) = [e.dagster_event.event_specific_data for e in
                    instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
        (mat,) = [e.asset_materialization for e in
                  instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)]
    assert (check.check_name, check.partition, check.passed) == ("over_deletion", "c2|licenses", True)
    assert check.description == ("NOT JUDGED: stage heuristic: every source is too small; not judged (under "
                                 "min_documents 1,000): licenses (40 documents)")
    assert mat is not None and mat.metadata["cached"].value is True  # current: not recomputed


RUNS = """query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { runId status
  repositoryOrigin { repositoryLocationName repositoryName } } } } }"""
REEXECUTE = """mutation($p: ReexecutionParams!) { launchRunReexecution(reexecutionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }"""
STATUS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""


def test_curate_runs_are_runs_of_the_code_location_and_re_execute_from_the_ui(ui: int, recrawl: R.Recrawl) -> None:
    """curate run's run carries the code location's origin, so the UI finds its job (not "not
    available in your definitions") and re-executes it: the new run plans every step again and,
    the crawl being current, succeeds without recomputing."""
    from tests.e2e.test_ui import LOCATION, REPOSITORY, gql

    runs = gql(ui, RUNS, {"f": {"pipelineName": "curate_run", "tags": [{"key": "curate/crawl", "value": "c2"}]}})
    (run,) = runs["runsOrError"]["results"]  # one run made the crawl
    assert run["status"] == "SUCCESS"
    assert run["repositoryOrigin"] == {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
    before = ledger_materializations(recrawl.workdir, "c2")
    out = gql(ui, REEXECUTE, {"p": {"parentRunId": run["runId"], "strategy": "ALL_STEPS"}})["launchRunReexecution"]
    assert out["__typename"] == "LaunchRunSuccess", out
    child, deadline, status = out["run"]["runId"], time.monotonic() + 240, None
    while time.monotonic() < deadline:
        status = gql(ui, STATUS, {"id": child})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert status == "SUCCESS", status
    assert ledger_materializations(recrawl.workdir, "c2") == before  # current: nothing recorded again


def ledger_materializations(workdir: Path, crawl: str) -> int:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(workdir / "dagster")) as instance:
        return len(instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("removal_ledger"), asset_partitions=[crawl]),
            limit=100).records)


# The run page's split button: its primary "Re-execute …" and, right after it, the arrow that
# opens its menu. Clicks the menu's item LABEL once it is there and enabled, else opens the menu
# (again, until the page is ready for it: a click before it is hydrated does nothing).
RE_EXECUTE = """(() => {
  const item = [...document.querySelectorAll('[role=menuitem]')].find(e => e.innerText.trim() === LABEL);
  if (item && item.getAttribute('aria-disabled') !== 'true') { item.click(); return true; }
  if (item || document.querySelector('[role=menuitem]')) return false;
  const buttons = [...document.querySelectorAll('button')];
  const i = buttons.findIndex(b => b.innerText.trim().startsWith('Re-execute'));
  if (i >= 0 && buttons[i + 1]) buttons[i + 1].click();
  return false;
})()"""
RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status tags { key value } stepKeysToExecute
  stepStats { stepKey status } } } }"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make chromium)")
def test_re_execute_from_failure_clicked_in_the_browser(ui: int, recrawl: R.Recrawl, tmp_path: Path) -> None:
    """A curate run stopped by a blocking check (crawl c3, heuristic bound 0.1 %), the bound set
    back, then the run page's Re-execute → From failure clicked: the new run re-executes the
    failed one from its failed step, records the check's new verdict and completes the crawl."""
    import dagster as dg

    from stages.catalog import waves
    from tests.e2e.test_ui import gql

    config = recrawl.workdir / "curate.yaml"
    fixed = config.read_text()
    config.write_text(fixed + "checks:\n  over_deletion:\n    per_stage: {heuristic: 0.001}\n    min_documents: 0\n")
    sources = recrawl.workdir.parent / "c2"
    code, _, err = curate("run", "--workdir", str(recrawl.workdir), "--crawl", "c3", "--stages", R.STAGES,
                          "--id-field", "id", "--quiet", "--source", f"docstrings={sources / 'docstrings'}",
                          "--source", f"licenses={sources / 'licenses'}")
    assert code == 1 and "filtered_documents[c3|docstrings]: check over_deletion failed" in err, err
    config.write_text(fixed)  # the default bounds: the sources are too small to judge
    (failed,) = gql(ui, RUNS, {"f": {"tags": [{"key": "curate/crawl", "value": "c3"}]}})["runsOrError"]["results"]
    assert failed["status"] == "FAILURE"
    ARTIFACTS.mkdir(exist_ok=True)
    browser = Browser(tmp_path / "chrome", WIDTH, 1000)
    try:
        browser.open(f"http://127.0.0.1:{ui}/runs/{failed['runId']}")
        browser.wait_for(RE_EXECUTE.replace("LABEL", json.dumps("From failure")), timeout=90)
        # the UI opens the new run's page
        path = browser.wait_for(f"location.pathname.startsWith('/runs/') && !location.pathname.includes("
                                f"{json.dumps(failed['runId'])}) && location.pathname", timeout=60)
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'reexecuted_from_failure.png')}")
    finally:
        browser.close()
    child, deadline, run = str(path).split("/")[2], time.monotonic() + 240, None
    while time.monotonic() < deadline:
        run = gql(ui, RUN, {"id": child})["runOrError"]
        if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert run is not None and run["status"] == "SUCCESS", run
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["dagster/parent_run_id"] == failed["runId"] and tags["dagster/is_resume_retry"] == "true"
    steps = [program for wave in waves() for program in wave]
    after = steps[steps.index("filtered_documents"):]  # the failed step and every one after it
    assert run["stepKeysToExecute"] == after
    assert [s["stepKey"] for s in run["stepStats"]] == after and {s["status"] for s in run["stepStats"]} == {"SUCCESS"}
    with dg.DagsterInstance.from_config(str(recrawl.workdir / "dagster")) as instance:
        assert "c3" in instance.get_materialized_partitions(dg.AssetKey("removal_ledger"))
        assert instance.get_materialized_partitions(dg.AssetKey("curated_documents")) >= {"c3|docstrings",
                                                                                          "c3|licenses"}
        verdicts = {(e.partition, e.passed) for e in (r.dagster_event.event_specific_data for r in instance.all_logs(
            child, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)) if e.check_name == "over_deletion"
            and e.asset_key == dg.AssetKey("filtered_documents")}
    assert verdicts == {("c3|docstrings", True), ("c3|licenses", True)}  # the new verdicts of current partitions
