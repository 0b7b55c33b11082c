"""Dagster's own tools in the repository root: `dagster definitions validate`, `dg check defs` and
`dg list defs` find the code location from pyproject.toml with no flags; the instance they use
(DAGSTER_HOME); no private `dagster._...` import outside the one pinned, tested reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from curation_dagster.defs.checks import CHECKS
from curation_dagster.defs.definitions import default_workdir
from curation_dagster.ops.instance import DAGSTER_YAML, ensure_instance_config, workdir_of
from stages.catalog import PROGRAMS

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    """This environment as an activated venv would have it, without a workdir or instance chosen."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "CURATE_WORKDIR", "DAGSTER_IS_DEV_CLI")}
    return {**env, "VIRTUAL_ENV": sys.prefix, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **extra}


def _tool(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A Dagster command line run in the repository root; fails the test with its output if it fails."""
    done = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=ROOT, env=_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_dagster_definitions_validate_finds_the_code_location() -> None:
    done = _tool("dagster", "definitions", "validate")
    log = done.stdout + done.stderr
    assert "Validation successful for code location curation_dagster." in log
    assert "All code locations passed validation." in log


def test_dg_check_and_list_defs_find_every_asset() -> None:
    if not (BIN / "dg").exists():
        pytest.skip("dg is not installed (dagster-dg-cli, the dev extra)")
    assert "All definitions loaded successfully." in _tool("dg", "check", "defs").stdout
    listed = json.loads(_tool("dg", "list", "defs", "--json").stdout)
    assert {a["asset_key"] for a in listed["assets"]} == set(PROGRAMS)
    expected = {f"{k.asset_key.to_user_string()}:{k.name}" for c in CHECKS for k in c.check_keys}
    assert {c["key"] for c in listed["asset_checks"]} == expected
    assert "removal_ledger:doc_id_unique" in expected


def test_the_kubernetes_code_location_loads_with_dagsters_loader() -> None:
    # k8s/values.yaml: `dagster api grpc -m curation_dagster.defs.definitions -a k8s_definitions` (a function).
    log = _tool("dagster", "definitions", "validate", "-m", "curation_dagster.defs.definitions",
                "-a", "k8s_definitions", CURATE_DATA_ROOT="s3://bucket/curation")
    assert "Validation successful" in log.stdout + log.stderr


def test_dagster_home_is_the_workdirs_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "wd"
    home = ensure_instance_config(work / "dagster")
    assert workdir_of(home) == work.resolve()
    assert workdir_of(tmp_path) is None  # no dagster.yaml of ours
    other = tmp_path / "dagster"
    other.mkdir()
    (other / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # someone else's instance
    assert workdir_of(other) is None
    monkeypatch.delenv("CURATE_WORKDIR", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert default_workdir() == str(work.resolve())
    monkeypatch.setenv("CURATE_WORKDIR", str(tmp_path / "chosen"))
    assert default_workdir() == str(tmp_path / "chosen")
    monkeypatch.delenv("CURATE_WORKDIR")
    monkeypatch.setenv("DAGSTER_HOME", str(other))
    assert default_workdir() == "workdir"
    # The tools use that instance, not a temporary one.
    log = _tool("dagster", "definitions", "validate", DAGSTER_HOME=str(home))
    assert "temporary directory" not in log.stdout + log.stderr


def test_dagster_dev_without_dagster_home_says_the_instance_is_empty() -> None:
    # dagster dev sets DAGSTER_IS_DEV_CLI for the processes it starts; the code location reads it.
    log = _tool("dagster", "definitions", "validate", DAGSTER_IS_DEV_CLI="1")
    assert "DAGSTER_HOME is not set: this is a temporary, empty instance" in log.stdout + log.stderr


def test_the_instance_storage_on_a_private_base_loads_and_upgrades_earlier_files(tmp_path: Path) -> None:
    """The one private name kept (curation_dagster/ops/event_log.py): Dagster exports none for the
    consolidated SQLite event log it extends. If a Dagster upgrade moves it, this fails before a
    user does. A dagster.yaml an earlier version wrote gets the pooled storage."""
    from curation_dagster.ops.event_log import PooledSqliteEventLogStorage
    from curation_dagster.ops.instance import EARLIER_YAML

    config = yaml.safe_load(DAGSTER_YAML.format(history='"x"'))["event_log_storage"]
    assert (config["module"], config["class"]) == ("curation_dagster.ops.event_log", "PooledSqliteEventLogStorage")
    # the file of the version before the layout by role (its storage at curation_dagster.ops.event_log)
    # and the one of the version before the pooled storage
    assert yaml.safe_load(EARLIER_YAML[0].format(history='"x"'))["event_log_storage"]["module"] == \
        "curation_dagster" + ".event_log"
    for i, earlier in enumerate(EARLIER_YAML):
        home = tmp_path / f"dagster{i}"
        home.mkdir()
        (home / "dagster.yaml").write_text(earlier.format(history=json.dumps(str(home / "history"))))
        home = ensure_instance_config(home)
        assert (home / "dagster.yaml").read_text() == DAGSTER_YAML.format(history=json.dumps(str(home / "history")))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.event_log_storage) is PooledSqliteEventLogStorage
        for i in range(3):
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="a", metadata={"i": i}))
    with dg.DagsterInstance.from_config(str(home)) as again:  # committed: another instance reads them
        records = again.fetch_materializations(dg.AssetKey("a"), limit=10).records
        assert [r.asset_materialization.metadata["i"].value for r in records if r.asset_materialization] == [2, 1, 0]
    assert (home / "history").is_dir()


def test_no_private_dagster_imports() -> None:
    # An import, or a module path Dagster would import (a YAML ``module:``); not the text of one
    # of Dagster's error messages that a test compares.
    private = re.compile(r"^\s*(from|import)\s+dagster\._|module:\s*dagster\._")
    allowed = {
        # the event-log storage above, extending Dagster's (pinned and tested above)
        "curation_dagster/ops/event_log.py",
        # the YAML earlier versions wrote, which it recognizes to upgrade (it names that storage)
        "curation_dagster/ops/instance.py",
        # dagster_instance_config / InstanceRef validate the deployment's dagster.yaml, whose
        # PostgreSQL storage cannot be built without a server; Dagster has no public validator
        # (test_the_deployments_instance_config fails if they move)
        "tests/curation_dagster/ops/test_deploy.py",
        # a planned-materialization event before a crawl step's partition starts (Dagster logs
        # them for asset steps only, with no public constructor; test_runner.py counts them)
        "curation_dagster/run/crawl_job.py",
        # the code location's origin on curate run's runs, so the UI re-executes them (no public
        # constructor; test_why_shrank.py re-executes one from the UI)
        "curation_dagster/ops/location.py",
        # what a current partition's new check evaluation judged, its latest materialization: the
        # check state the UI and the automation read ignores an evaluation without it (no public
        # name; test_checks.py's raised-bound test reads that state)
        "curation_dagster/run/recorder.py",
    }
    found = sorted(
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("curation_dagster", "stages", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if str(path.relative_to(ROOT)) not in allowed
        for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)
    )
    assert found == []


def test_the_event_log_wakes_a_watcher_when_another_process_writes(tmp_path: Path) -> None:
    """The UI streams a run's logs from ``watch`` callbacks: with pooled connections a commit
    changes only the write-ahead log, which must wake them as the database file does."""
    import threading
    import time

    home = ensure_instance_config(tmp_path / "dagster")
    seen: list[str] = []
    woke = threading.Event()

    def callback(entry: Any, _cursor: str) -> None:
        seen.append(entry.user_message)
        woke.set()

    with dg.DagsterInstance.from_config(str(home)) as watcher:
        watcher.event_log_storage.store_event(_entry("before"))  # the watcher's own connection is open
        watcher.event_log_storage.watch("r1", None, callback)
        time.sleep(0.5)
        code = ("import sys, time, dagster as dg\n"
                "from dagster._core.events.log import EventLogEntry\n"
                f"i = dg.DagsterInstance.from_config({str(home)!r})\n"
                "i.event_log_storage.store_event(dg.EventLogEntry(error_info=None, level=20, user_message='from B',"
                " run_id='r1', timestamp=time.time(), step_key=None, job_name=None, dagster_event=None))\n")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        assert woke.wait(20), "no callback after another process wrote"
        assert "from B" in seen


def _entry(message: str) -> Any:
    import time

    return dg.EventLogEntry(error_info=None, level=20, user_message=message, run_id="r1", timestamp=time.time(),
                         step_key=None, job_name=None, dagster_event=None)


def test_the_deployments_storage_sets_what_dagster_postgres_sets() -> None:
    """``PooledPostgresStorage`` does ``DagsterPostgresStorage.__init__``'s work itself (so as to build
    one event log, not two): a dagster-postgres upgrade that sets another attribute fails here."""
    import inspect

    pytest.importorskip("dagster_postgres")
    from dagster_postgres import DagsterPostgresStorage

    from curation_dagster.ops.pg_storage import PooledPostgresStorage

    def assigned(init: Any) -> set[str]:
        return set(re.findall(r"^\s+self\.(\w+)\s*=", inspect.getsource(init), re.M))

    theirs = assigned(DagsterPostgresStorage.__init__)
    assert theirs == {"postgres_url", "should_autocreate_tables", "_inst_data", "_run_storage",
                      "_event_log_storage", "_schedule_storage"}
    assert assigned(PooledPostgresStorage.__init__) == theirs
