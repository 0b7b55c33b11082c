"""`curate deploy` and `curate submit`: the production-shaped deployment on this machine.

One deployment is started from the test exactly as an operator starts it (PostgreSQL, daemon,
webserver and gRPC code server as separate processes; runs queued and launched as processes;
each asset partition a Pipes subprocess with the stage pod's command line) on an S3 data root
served by moto on 127.0.0.1. A 3-source crawl submitted with `curate submit --wait` gives the same
report and ledger as `curate run` of the same sources, every asset partition materialized once
and only after its inputs; a failing source fails `submit --wait` with one line naming the asset
partition and the reason; SIGTERM to `curate deploy` mid-run leaves no process behind. The
deployment's curate.yaml turns the automation sensor off, so that every run is the backfill's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from curation_dagster import cli, k8s_spec
from curation_dagster.deploy import (
    PG_PASSWORD_ENV,
    DeployError,
    Deployment,
    RunAs,
    free_port,
    graphql_post,
    postgres_bindir,
)
from curation_dagster.launchers import k8s
from curation_dagster.resources import CurationResource
from stages.catalog import PROGRAMS
from tests.support import tiny_corpus as T

BUCKET = "curation-deploy"
KEY_ID = "AKIADEPLOYTEST"
SECRET = "deploy-secret-never-written"
STAGES = "heuristic,exact,fuzzy"


def _postgres_or_skip() -> None:
    try:
        postgres_bindir()
        RunAs.for_postgres()
    except DeployError as exc:
        pytest.skip(str(exc))


def curate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


# --- without a deployment -------------------------------------------------------------------------


def test_a_pipes_partition_runs_the_stage_pods_command_line() -> None:
    """What a Pipes subprocess of the deployment runs is what the stage pod runs (this machine's
    python for the image's), with the pod's thread settings."""
    resource = CurationResource(workdir="/w", data_root="s3://bucket/root", mode="pipes")
    for program, source in (("minhash_signatures", "web"), ("lsh_buckets", None)):
        command, env = resource.pod_command(program, "c1", source)
        container = k8s.pod_manifest(k8s_spec.K8sSettings(), resource, program, "c1", source)["spec"]["containers"][0]
        assert container["command"][0] == "python" and command == [sys.executable, *container["command"][1:]]
        assert env == {e["name"]: e["value"] for e in container["env"]
                       if e["name"] in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "PYTHONUNBUFFERED")}
        assert command[command.index("--workers") + 1] == env["OMP_NUM_THREADS"] == str(
            k8s_spec.threads(PROGRAMS[program].resources))


def test_the_deployments_instance_config(tmp_path: Path) -> None:
    """dagster.yaml as Dagster reads it (schema-validated): PostgreSQL storage with the password
    from the environment, the queue with its limit, runs as processes, run retries and monitoring."""
    import yaml
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.instance.ref import InstanceRef

    dep = Deployment(tmp_path, "s3://bucket/root", max_concurrent_runs=3, max_retries=1)
    dep.base.mkdir()
    workspace = dep.write_config(pg_port=54321, grpc_port=4321)
    home = str(dep.base / "dagster")
    dagster_instance_config(home)  # raises on a config the schema refuses
    ref = InstanceRef.from_dir(home)
    assert ref.storage_data is not None and ref.storage_data.class_name == "DagsterPostgresStorage"
    db = yaml.safe_load(ref.storage_data.config_yaml)["postgres_db"]
    assert db["password"] == {"env": PG_PASSWORD_ENV} and db["port"] == 54321 and db["hostname"] == "127.0.0.1"
    assert ref.run_coordinator_data is not None and ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    assert yaml.safe_load(ref.run_coordinator_data.config_yaml)["max_concurrent_runs"] == 3
    assert ref.run_launcher_data is not None and ref.run_launcher_data.class_name == "DefaultRunLauncher"
    assert ref.settings["run_retries"] == {"enabled": True, "max_retries": 1, "retry_on_asset_or_op_failure": False}
    assert ref.settings["run_monitoring"]["enabled"] is True
    grpc = yaml.safe_load(workspace.read_text())["load_from"][0]["grpc_server"]
    assert grpc == {"host": "127.0.0.1", "port": 4321, "location_name": "curation"}


def test_submit_and_deploy_mistakes_are_one_line(tmp_path: Path) -> None:
    port = free_port()
    code, out, err = curate("submit", "--dagster", f"http://127.0.0.1:{port}", "--crawl", "c1", "--source", "a=b")
    assert (code, out) == (1, "") and err == f"curate: error: cannot reach Dagster at http://127.0.0.1:{port}: " \
                                             "[Errno 111] Connection refused\n"
    code, out, err = curate("status", "--dagster", f"http://127.0.0.1:{port}", "--crawl", "c1")
    assert code == 1 and err.count("\n") == 1 and "cannot reach Dagster" in err
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        code, out, err = curate("deploy", "--workdir", str(tmp_path / "w"), "--data-root", str(tmp_path / "d"),
                                "--port", str(taken))
    assert code == 1 and err == f"curate: error: port {taken} on 127.0.0.1 is in use: choose another with --port\n"
    assert not (tmp_path / "w").exists()  # nothing started, nothing written


# --- the process tree ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: with the pid, names one process (pids are reused)
    rss_kib: int
    cmd: str


def processes() -> dict[int, Proc]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            rss = next((int(line.split()[1]) for line in Path(f"/proc/{entry}/status").read_text().splitlines()
                        if line.startswith("VmRSS:")), 0)
        except (OSError, ValueError, StopIteration):
            continue  # gone meanwhile
        out[int(entry)] = Proc(int(entry), int(fields[1]), int(fields[19]), rss, cmd)
    return out


def tree(root: int) -> dict[int, Proc]:
    """``root`` and its descendants now."""
    procs = processes()
    keep = {root} if root in procs else set()
    grew = True
    while grew:
        grew = False
        for p in procs.values():
            if p.pid not in keep and p.ppid in keep:
                keep.add(p.pid)
                grew = True
    return {pid: procs[pid] for pid in keep}


def role(p: Proc, procs: dict[int, Proc], root: int) -> str:
    if p.pid == root:
        return "curate deploy"
    if "bin/postgres" in p.cmd or p.cmd.startswith("postgres:"):
        return "postgres (all processes)"
    if "api grpc" in p.cmd:
        return "code server"
    if "dagster-daemon" in p.cmd:
        return "daemon"
    if "dagster-webserver" in p.cmd:
        return "webserver"
    if "-m stages " in p.cmd:
        return "stage subprocess"
    parent = procs.get(p.ppid)
    while parent is not None:
        if "api grpc" in parent.cmd:
            return "run worker"
        parent = procs.get(parent.ppid)
    return "other"


class Sampler:
    """Samples the deployment's process tree every second: every process seen, peak RSS per role."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], Proc] = {}
        self.peak: dict[str, int] = {}
        self.count: dict[str, set[tuple[int, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> dict[int, Proc]:
        procs = tree(self.root)
        totals: dict[str, int] = {}
        for p in procs.values():
            self.seen[(p.pid, p.start)] = p
            r = role(p, procs, self.root)
            self.count.setdefault(r, set()).add((p.pid, p.start))
            if r.startswith("postgres"):
                totals[r] = totals.get(r, 0) + p.rss_kib
            else:
                self.peak[r] = max(self.peak.get(r, 0), p.rss_kib)
        for r, kib in totals.items():
            self.peak[r] = max(self.peak.get(r, 0), kib)
        return procs

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def table(self) -> str:
        return "\n".join(f"  {r:<26} peak RSS {kib / 1024:7.1f} MiB  ({len(self.count[r])} processes seen)"
                         for r, kib in sorted(self.peak.items()))


def alive(p: Proc) -> bool:
    try:
        stat = Path(f"/proc/{p.pid}/stat").read_text()
    except OSError:
        return False
    return int(stat[stat.rindex(")") + 2:].split()[19]) == p.start


# --- the deployment --------------------------------------------------------------------------------


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the PostgreSQL user can enter (pytest's own tmp folders are private to root)."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30 else None
    path = Path(tempfile.mkdtemp(prefix="curate-deploy-", dir=parent))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_deploy(workdir: Path, data_root: str, env: dict[str, str], port: int) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True)
    (workdir / "curate.yaml").write_text("automation:\n  enabled: false\n")
    log = open(workdir.parent / "deploy.out", "w")  # kept open for the process's life
    proc = subprocess.Popen([sys.executable, "-m", "curation_dagster.cli", "deploy", "--workdir", str(workdir),
                             "--data-root", data_root, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    while "deployment ready" not in (workdir.parent / "deploy.out").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"curate deploy did not start: {(workdir.parent / 'deploy.out').read_text()[-2000:]}")
        time.sleep(0.5)
    return proc


def backfill_runs(url: str, backfill_id: str) -> list[dict[str, Any]]:
    query = """query($id: String!) { runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
        ... on Runs { results { runId status startTime endTime tags { key value } assetSelection { path } } } } }"""
    return graphql_post(url, query, {"id": backfill_id})["runsOrError"]["results"]  # type: ignore[no-any-return]


def assert_dependency_order(runs: list[dict[str, Any]], crawl: str, sources: tuple[str, ...]) -> None:
    """Every asset partition of the crawl materialized by exactly one successful run, which
    started after the runs of all its inputs (across the source x crawl / crawl levels) ended."""
    by_partition: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        assert run["status"] == "SUCCESS", run
        partition = next(t["value"] for t in run["tags"] if t["key"] == "dagster/partition")
        for key in run["assetSelection"]:
            assert (key["path"][0], partition) not in by_partition, f"{key['path'][0]}[{partition}] ran twice"
            by_partition[(key["path"][0], partition)] = run
    want = {(p, f"{crawl}|{s}" if prog.level == "source" else crawl)
            for p, prog in PROGRAMS.items() for s in (sources if prog.level == "source" else ("",))}
    assert set(by_partition) == want
    for (program, partition), run in by_partition.items():
        for dep in PROGRAMS[program].deps:
            if PROGRAMS[dep].level == PROGRAMS[program].level:
                inputs = [partition]
            elif PROGRAMS[dep].level == "crawl":
                inputs = [crawl]
            else:
                inputs = [f"{crawl}|{s}" for s in sources]
            for key in inputs:
                parent = by_partition[(dep, key)]
                if parent is not run:
                    assert parent["endTime"] <= run["startTime"], f"{program}[{partition}] before {dep}[{key}]"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_crawl_submitted_to_the_deployment_equals_curate_run_and_sigterm_leaves_nothing(
    s3: dict[str, Any], base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _postgres_or_skip()
    options = json.dumps(s3)
    monkeypatch.setenv("CURATE_STORAGE_OPTIONS", options)
    config = T.write_config(base / "tiny.json")
    deployed, local = f"s3://{BUCKET}/deployed", f"s3://{BUCKET}/local"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    deploy = start_deploy(base / "work", deployed, {**os.environ, "CURATE_STORAGE_OPTIONS": options}, port)
    started = time.monotonic() - t0
    try:
        code, _, err = curate("deploy", "--workdir", str(base / "work"), "--data-root", deployed, "--port",
                              str(free_port()))
        assert code == 1 and "is running already (pid " in err and err.count("\n") == 1
        with Sampler(deploy.pid) as sampler:
            t0 = time.monotonic()
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--config", str(config),
                                    "--stages", STAGES, "--wait", "--timeout", "720")
            submitted = time.monotonic() - t0
            assert code == 0, out + err
            assert f"{url}/runs/b/" in out  # the UI link of the backfill
            backfill_id = out.split(f"{url}/runs/b/")[1].split("?")[0]
            assert_dependency_order(backfill_runs(url, backfill_id), T.CRAWL, T.SOURCES)

            code, out, err = curate("status", "--dagster", url, "--crawl", T.CRAWL)
            assert code == 0, err
            assert "COMPLETED_SUCCESS" in out and "removal ledger committed" in out
            assert f"{'removal_ledger':<26}{1:>11}{1:>7}{0:>9}{0:>8}" in out

            # A source that does not exist: one line naming the asset partition and why.
            code, out, err = curate("submit", "--dagster", url, "--crawl", "broken", "--source",
                                    f"web={base / 'nowhere'}", "--stages", STAGES, "--wait", "--timeout", "300")
            assert code == 1
            assert err.count("\n") == 1 and err.startswith("curate: error: raw_documents[broken|web]: source URL ")
            assert "matches no JSONL or Parquet file" in err

            # Resubmitted (every partition up to date): SIGTERM once its first run is under way.
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--stages", STAGES)
            assert code == 0, err
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--stages", STAGES)
            assert code == 1 and f"crawl {T.CRAWL} has a backfill in progress" in err and err.count("\n") == 1
            deadline = time.monotonic() + 180
            while not any(role(p, procs, deploy.pid) == "run worker" for procs in [sampler.sample()]
                          for p in procs.values()):
                assert time.monotonic() < deadline, "no run worker started"
                time.sleep(0.3)
            sampler.sample()
        state = json.loads((base / "work" / "deploy" / "deployment.json").read_text())
        t0 = time.monotonic()
        deploy.send_signal(signal.SIGTERM)
        assert deploy.wait(90) == 0
        stopped = time.monotonic() - t0
    finally:
        if deploy.poll() is None:  # the test failed first: stop it as an operator would, then by force
            deploy.send_signal(signal.SIGTERM)
            try:
                deploy.wait(90)
            except subprocess.TimeoutExpired:
                for p in [*tree(deploy.pid).values()]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)
    left = [p for p in sampler.seen.values() if alive(p)]
    assert not left, f"left behind: {left}"
    for pid in state["processes"].values():  # nor any member of their process groups
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not (base / "work" / "deploy" / "deployment.json").exists()
    assert {"run worker", "stage subprocess", "code server", "daemon", "webserver"} <= set(sampler.peak)

    # The same sources through `curate run`: the same report and the same ledger.
    t0 = time.monotonic()
    code, _, err = curate("run", "--workdir", str(base / "run"), "--data-root", local, "--crawl", T.CRAWL,
                          "--config", str(config), "--stages", STAGES, "--quiet")
    ran = time.monotonic() - t0
    assert code == 0, err
    reports = []
    for root in (deployed, local):
        code, out, err = curate("report", "--json", "--data-root", root, "--crawl", T.CRAWL)
        assert code == 0, err
        reports.append(json.loads(out))
    assert reports[0] == reports[1]
    assert sum(r["removed"]["exact"] for r in reports[0]["sources"].values()) == 7  # the planted duplicates
    ledgers = []
    for i, root in enumerate((deployed, local)):
        path = base / f"ledger{i}.parquet"
        code, _, err = curate("ledger", "--data-root", root, "--crawl", T.CRAWL, "--out", str(path))
        assert code == 0, err
        ledgers.append(pq.read_table(path).sort_by([("doc_id", "ascending"), ("stage", "ascending")]))
    assert ledgers[0].num_rows > 0 and ledgers[0].equals(ledgers[1])
    with capsys.disabled():
        print(f"\ncurate deploy: ready in {started:.1f}s, stopped in {stopped:.1f}s; crawl {T.CRAWL} "
              f"({STAGES}): curate submit --wait {submitted:.1f}s, curate run {ran:.1f}s\n{sampler.table()}")
