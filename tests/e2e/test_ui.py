"""The real Dagster UI on a recrawled workdir: ``curate ui`` (``dagster dev``: webserver + daemon)
on 127.0.0.1, driven over its GraphQL API like a person in the browser, and the asset graph
rendered by headless Chromium.

The backfill is launched first, as soon as the code location is loaded: the backfill daemon
works in 30 s iterations (a fixed Dagster constant), so it submits the runs at the next one and
marks the backfill complete one later; the other tests run meanwhile. Screenshots are kept in
``tests/artifacts/`` (ignored by git).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS
from tests.support import ops_workdir
from tests.support.browser import CHROMIUM, Browser

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
LOCATION = "curation_dagster"  # curate ui serves the code location by its name (curation_dagster.ops.location)
REPOSITORY = "__repository__"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        out = json.load(resp)
    assert "errors" not in out, out["errors"]
    return out["data"]


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    workdir: Path
    backfill_id: str = ""
    run_id: str = ""

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


WORKSPACE = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def wait_loaded(server: Server, deadline_s: float = 150) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if server.proc.poll() is not None:
            pytest.fail(f"curate ui exited with {server.proc.returncode}:\n{server.tail()}")
        try:
            entries = gql(server.port, WORKSPACE)["workspaceOrError"]["locationEntries"]
        except OSError:
            entries = []
        for e in entries:
            kind = (e["locationOrLoadError"] or {}).get("__typename")
            if kind == "PythonError":
                pytest.fail(f"code location failed to load: {e['locationOrLoadError']['message']}")
            if e["loadStatus"] == "LOADED" and kind == "RepositoryLocation":
                return
        time.sleep(1)
    pytest.fail(f"the UI did not load the code location in {deadline_s}s:\n{server.tail()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group (webserver, daemon, code servers, run workers), then
    SIGKILL whatever is left after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


BACKFILL = """mutation($b: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $b) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
LAUNCH = """mutation($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on InvalidSubsetError { message } } }"""
ADD_PARTITION = """mutation($r: RepositorySelector!, $d: String!, $k: String!) {
  addDynamicPartition(repositorySelector: $r, partitionsDefName: $d, partitionKey: $k) { __typename } }"""


@pytest.fixture(scope="module")
def server(prepared: ops_workdir.Prepared, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ui")
    workdir = root / "workdir"
    shutil.copytree(prepared.workdir, workdir)
    # No eager automation here: a re-materialized partition would otherwise set off the whole
    # downstream graph as background runs (tests/curation_dagster/defs/test_recrawl.py covers the automation).
    cfg = yaml.safe_load((workdir / "curate.yaml").read_text())
    cfg["automation"] = {"enabled": False}
    (workdir / "curate.yaml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = root / "dagster-dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "curation_dagster.cli", "ui", "--workdir", str(workdir), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    srv = Server(port, proc, log, workdir)
    try:
        wait_loaded(srv)
        repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        # A source that is not part of crawl "tiny": the backfill's range includes tiny|blog.
        assert gql(port, ADD_PARTITION, {"r": repo, "d": "source", "k": "blog"})["addDynamicPartition"]["__typename"] \
            == "AddDynamicPartitionSuccess"
        out = gql(port, BACKFILL, {"b": {
            "assetSelection": [{"path": ["raw_documents"]}, {"path": ["filtered_documents"]}],
            "partitionNames": ["tiny|blog", "tiny|wiki"], "fromFailure": False,
        }})["launchPartitionBackfill"]
        assert out["__typename"] == "LaunchBackfillSuccess", out
        srv.backfill_id = out["backfillId"]
        tags = [{"key": "dagster/partition", "value": "tiny|news"}, {"key": "dagster/partition/crawl", "value": "tiny"},
                {"key": "dagster/partition/source", "value": "news"}]
        out = gql(port, LAUNCH, {"p": {
            "selector": {**repo, "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": ["raw_documents"]}]},
            "mode": "default", "executionMetadata": {"tags": tags},
        }})["launchPipelineExecution"]
        assert out["__typename"] == "LaunchRunSuccess", out
        srv.run_id = out["run"]["runId"]
        yield srv
    finally:
        stop(proc)
    # A code server notices its parent is gone on its next heartbeat, so give it a while.
    deadline = time.monotonic() + 90
    while True:
        ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(proc.pid)],
                            capture_output=True, text=True).stdout
        leftover = [line for line in ps.splitlines() if not line.split()[1].startswith("Z")]  # zombies are gone
        if not leftover or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not leftover, "processes left behind by curate ui:\n" + "\n".join(leftover)


REPO_QUERY = """query($r: RepositorySelector!) { repositoryOrError(repositorySelector: $r) { ... on Repository {
  schedules { name cronSchedule scheduleState { status } }
  sensors { name sensorState { status } } } } }"""
ASSETS_QUERY = """{ assetNodes { assetKey { path } groupName kinds description opVersion
  owners { ... on TeamAssetOwner { team } }
  assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }"""


def test_graphql_lists_assets_checks_schedules_and_sensors(server: Server) -> None:
    nodes = {n["assetKey"]["path"][0]: n for n in gql(server.port, ASSETS_QUERY)["assetNodes"]}
    assert set(nodes) == set(PROGRAMS)
    for name, program in PROGRAMS.items():
        node = nodes[name]
        assert node["groupName"] == program.group
        assert set(node["kinds"]) == {"python", "parquet", "gpu" if program.resources.gpu else "cpu"}
        assert node["owners"] == [{"team": "curation"}]
        assert node["opVersion"] == str(program.params.version)
        assert node["description"].startswith(program.description)
        expected = {k.name: k.blocking for k in CHECK_KINDS if k.applies(program)}
        assert {c["name"]: c["blocking"] for c in node["assetChecksOrError"]["checks"]} == expected, name
    assert nodes["filtered_documents"]["assetChecksOrError"]["checks"] == [{"name": "over_deletion", "blocking": True}]
    repo = gql(server.port, REPO_QUERY, {"r": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}})
    repo = repo["repositoryOrError"]
    assert repo["schedules"] == []  # no recrawl.cron in this workdir's curate.yaml: no schedule listed
    assert {s["name"]: s["sensorState"]["status"] for s in repo["sensors"]} == {
        "recrawl_sensor": "RUNNING", "curation_automation": "STOPPED"}


ASSET_NAMES_DOM_MIN = 4  # a label shortened in the middle keeps at least this much of each end


def shown(name: str, dom: str) -> bool:
    """The graph shows long names shortened in the middle (``contami…_documents``)."""
    if name in dom:
        return True
    return any(name.startswith(a) and name.endswith(b) and len(a) >= ASSET_NAMES_DOM_MIN
               for a, b in re.findall(r"([a-z_]+)…([a-z_]+)", dom))


CHART_LOADED = """(() => {
  const img = document.querySelector('img[src^="data:image/png;base64,"]');
  return img && img.complete && img.naturalWidth > 200 ? img.naturalWidth : 0;
})()"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make chromium)")
def test_asset_graph_and_waterfall_render_in_headless_chromium(server: Server, tmp_path: Path) -> None:
    assert gql(server.port, "mutation { setNuxSeen }")["setNuxSeen"] is True  # no "join the community" dialog
    ARTIFACTS.mkdir(exist_ok=True)
    browser = Browser(tmp_path / "chrome", 1920, 1080)
    try:
        # The whole graph: everything upstream of the ledger, by group.
        browser.open(f"http://127.0.0.1:{server.port}/assets/removal_ledger?view=lineage&lineageScope=upstream"
                     "&lineageDepth=20")
        deadline = time.monotonic() + 90
        missing: list[str] = list(PROGRAMS)
        while missing and time.monotonic() < deadline:
            time.sleep(1)
            dom = browser.dom()
            missing = [name for name in PROGRAMS if not shown(name, dom)]
        assert not missing, f"the asset graph does not show {missing}"
        time.sleep(1)  # let the edges settle
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'asset_graph.png')}")

        # Why sources shrank: the ledger's waterfall table inline, the chart one click away.
        browser.open(f"http://127.0.0.1:{server.port}/assets/removal_ledger?view=events&partition=tiny")
        browser.show_markdown("waterfall_chart", timeout=90)
        width = browser.wait_for(CHART_LOADED, timeout=30)
        assert width >= 600  # the 8-inch chart at 90 dpi, decoded by the browser
        dom = browser.dom()
        assert "where each source's documents went" in dom  # the chart's alt text
        assert all(f"<td>{s}</td>" in dom or f">{s}<" in dom for s in ("forum", "news", "wiki"))
        print(f"screenshot: {browser.screenshot(ARTIFACTS / 'removal_ledger_waterfall.png')}")
        # Chromium's own temporary folders (its singleton socket) are under the browser's, not /tmp
        assert [p.name[:len("org.chromium.Chromium.")] for p in Path(browser.tmp).iterdir()] == \
            ["org.chromium.Chromium."]
    finally:
        browser.close()
    assert not Path(browser.tmp).exists()  # and gone with it


RUN_STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  status runs { runId status tags { key value } } } } }"""
PARTITION_MATERIALIZATIONS = """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) { ... on Asset {
  assetMaterializations(partitions: $p) { partition runId } } } }"""
DONE = {"SUCCESS", "FAILURE", "CANCELED"}
STEP_FAILURES = """query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events { __typename
  ... on ExecutionStepFailureEvent { error { message } } } } } }"""


def test_partitioned_run_and_backfill_succeed(server: Server) -> None:
    deadline = time.monotonic() + 200
    run_status: Any = None
    backfill: Any = None
    while time.monotonic() < deadline:
        run_status = gql(server.port, RUN_STATUS, {"id": server.run_id})["runOrError"]["status"]
        backfill = gql(server.port, BACKFILL_STATUS, {"id": server.backfill_id})["partitionBackfillOrError"]
        if run_status in DONE and backfill["status"] not in ("REQUESTED",):
            break
        time.sleep(2)
    assert run_status == "SUCCESS", server.tail()
    # blog is no source of crawl tiny: its pair fails, naming tiny's sources, and records nothing;
    # the backfill still materializes the pair that is tiny's (docs/operations.md, Backfills).
    assert backfill["status"] == "COMPLETED_FAILED", (backfill, server.tail())
    by_partition = {next(t["value"] for t in r["tags"] if t["key"] == "dagster/partition"): r
                    for r in backfill["runs"]}
    assert {p: r["status"] for p, r in by_partition.items()} == {"tiny|blog": "FAILURE", "tiny|wiki": "SUCCESS"}
    failures = gql(server.port, STEP_FAILURES, {"id": by_partition["tiny|blog"]["runId"]})
    messages = [e["error"]["message"] for e in failures["logsForRun"]["events"] if e.get("error")]
    assert any("raw_documents[tiny|blog]: source 'blog' is not part of crawl 'tiny', whose sources are forum, "
               "news, wiki; nothing materialized" in m for m in messages), messages
    for asset in ("raw_documents", "filtered_documents"):
        mats = gql(server.port, PARTITION_MATERIALIZATIONS, {"k": {"path": [asset]}, "p": ["tiny|blog", "tiny|wiki"]})
        assert {e["partition"] for e in mats["assetOrError"]["assetMaterializations"]} == {"tiny|wiki"}, asset
