"""`curate deploy` and `curate submit`: the production-shaped deployment on this machine.

One deployment is started from the test exactly as an operator starts it (PostgreSQL, daemon,
webserver and gRPC code server as separate processes; runs queued and launched as processes;
partitions served by warm Pipes workers, the stage pod's entry point, several at once) on an S3
data root served by moto on 127.0.0.1. A 3-source crawl submitted with `curate submit --wait` is
one run of the crawl job (plus its retry) and gives the same report and ledger as `curate run` of
the same sources, every asset partition materialized once and only after its inputs, although
mid-crawl the stage worker running a partition is SIGKILLed (its step launches it again), then a run
worker is SIGKILLed while its stage worker runs a partition (the run is retried from its failed step) and
then the daemon is SIGKILLed (`curate deploy` starts it again); no two attempts ever execute one
asset partition at once (the step windows in the event log); the run's page, in headless
Chromium, shows a materialization of every partition; a failing source fails `submit --wait` with
one line naming the asset partition and the reason; SIGTERM to `curate deploy` mid-run leaves no
process behind. The deployment's curate.yaml turns the automation sensor off, so that every run
is the crawl's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from curation_dagster.defs.launchers import k8s
from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops import k8s_spec
from curation_dagster.ops.deploy import (
    PG_PASSWORD_ENV,
    DeployError,
    Deployment,
    RunAs,
    free_port,
    graphql_post,
    postgres_bindir,
)
from stages.catalog import PROGRAMS
from stages.lease import TTL_ENV
from stages.spec import CrawlSpec
from tests.support import tiny_corpus as T
from tests.support.browser import CHROMIUM, Browser

BUCKET = "curation-deploy"
KEY_ID = "AKIADEPLOYTEST"
SECRET = "deploy-secret-never-written"
STAGES = "heuristic,exact,fuzzy"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LEASE_TTL_S = "10"  # the retry of the killed run waits for its partition's lease to expire (default 60 s)


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


def test_a_warm_worker_runs_the_stage_pods_command_line() -> None:
    """What a warm worker of the deployment (python -m stages serve) runs is what the stage pod
    runs (this machine's python for the image's), its options but the program and source (each
    request names them) and workers (each request's: the pod's CPU request), with the pod's thread
    settings for the widest program."""
    resource = CurationResource(workdir="/w", data_root="s3://bucket/root", mode="pipes")
    served, env = resource.serve_command("c1")
    for program, source in (("minhash_signatures", "web"), ("lsh_buckets", None)):
        container = k8s.pod_manifest(k8s_spec.K8sSettings(), resource, program, "c1", source)["spec"]["containers"][0]
        pod = container["command"]
        assert pod[0] == "python" and pod[1:4] == ["-m", "stages", program]
        threads = {e["name"]: e["value"] for e in container["env"]
                   if e["name"] in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
        assert pod[pod.index("--workers") + 1] == threads["OMP_NUM_THREADS"] == threads["NUMBA_NUM_THREADS"] == str(
            k8s_spec.threads(PROGRAMS[program].resources)) == str(resource.stage_workers(program))
        if source is None:
            assert served[:3] == [sys.executable, "-m", "stages"] and served[3] == "serve"
            at = pod.index("--workers")
            assert served[4:] == [*pod[4:at + 1], "0", *pod[at + 2:]]
    widest = max(k8s_spec.threads(p.resources) for p in PROGRAMS.values())
    assert env["OMP_NUM_THREADS"] == env["NUMBA_NUM_THREADS"] == str(widest) and env["PYTHONUNBUFFERED"] == "1"
    assert env["CURATE_PARENT_PID"] == str(os.getpid())


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
    assert ref.storage_data is not None and ref.storage_data.class_name == "PooledPostgresStorage"
    assert ref.storage_data.module_name == "curation_dagster.ops.pg_storage"  # its connections held open
    db = yaml.safe_load(ref.storage_data.config_yaml)["postgres_db"]
    assert db["password"] == {"env": PG_PASSWORD_ENV} and db["port"] == 54321 and db["hostname"] == "127.0.0.1"
    assert ref.run_coordinator_data is not None and ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    assert yaml.safe_load(ref.run_coordinator_data.config_yaml)["max_concurrent_runs"] == 3
    assert ref.run_launcher_data is not None and ref.run_launcher_data.class_name == "DefaultRunLauncher"
    assert ref.settings["run_retries"] == {"enabled": True, "max_retries": 1, "retry_on_asset_or_op_failure": False}
    assert ref.settings["run_monitoring"]["enabled"] is True
    grpc = yaml.safe_load(workspace.read_text())["load_from"][0]["grpc_server"]
    assert grpc == {"host": "127.0.0.1", "port": 4321, "location_name": "curation"}


def test_the_helm_charts_postgres_storage_uses_the_driver_the_images_carry(tmp_path: Path) -> None:
    """k8s/values.yaml's postgresql section as the chart (1.13.27, templates/helpers/instance/
    _postgresql.tpl) renders it into dagster.yaml: valid for Dagster, and its URL names psycopg2,
    the driver dagster-postgres brings into the images (SQLAlchemy 2.1 reads a plain
    ``postgresql://`` as psycopg 3, which none carries)."""
    import importlib.metadata

    import yaml
    from dagster._core.instance.config import dagster_instance_config
    from dagster_postgres.utils import get_conn_string
    from sqlalchemy.engine import make_url

    values = yaml.safe_load((Path(__file__).resolve().parents[3] / "k8s" / "values.yaml").read_text())["postgresql"]
    db = {"username": values["postgresqlUsername"], "password": {"env": "DAGSTER_PG_PASSWORD"},
          "hostname": values["postgresqlHost"] or "dagster-postgresql", "db_name": values["postgresqlDatabase"],
          "port": values["service"]["port"], "params": values.get("postgresqlParams", {}),
          **({"scheme": values["postgresqlScheme"]} if values.get("postgresqlScheme") else {})}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"postgres": {"postgres_db": db}}}))
    dagster_instance_config(str(tmp_path))  # raises on a config the schema refuses
    url = get_conn_string(db["username"], "x", db["hostname"], db["db_name"], str(db["port"]),
                          scheme=db.get("scheme", "postgresql"))
    assert make_url(url).get_dialect().driver == "psycopg2"
    assert any(r.startswith("psycopg2") for r in importlib.metadata.requires("dagster-postgres") or [])
    assert make_url("postgresql://u@h/d").get_dialect().driver != "psycopg2"  # why the scheme is needed


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


def test_the_supervisor_restarts_a_daemon_that_died_and_stops_on_a_crash_loop_or_a_code_server_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon (or webserver) that exits is started again with its command line, logged, and
    deployment.json names the new pid; one that keeps exiting, or a code server that exits, stops
    the deployment with one line."""
    import curation_dagster.ops.deploy as deploy_module

    monkeypatch.setattr(deploy_module, "MAX_RESTARTS", 2)
    lines: list[str] = []
    dep = Deployment(tmp_path, str(tmp_path / "data"), log=lines.append)
    (dep.base / "logs").mkdir(parents=True)
    dep.spawn("daemon", [sys.executable, "-c", "print('daemon gone'); raise SystemExit(3)"])
    try:
        with pytest.raises(DeployError) as exc:
            dep.supervise()
        restarted = r"daemon exited with code 3: daemon gone( \| daemon gone)* \(log: .*/logs/daemon\.log\): " \
                    r"restarted it \(pid \d+\)"
        assert len(lines) == 2 and all(re.fullmatch(restarted, line) for line in lines)
        assert str(exc.value).startswith("daemon exited with code 3: daemon gone") and \
            str(exc.value).endswith("; restarted 2 times in 300s already")
        (daemon,) = dep.children
        assert lines[-1].endswith(f"(pid {daemon.proc.pid})")
        assert json.loads((dep.base / "deployment.json").read_text())["processes"] == {"daemon": daemon.proc.pid}

        dep.stop()
        lines.clear()
        dep.spawn("code-server", [sys.executable, "-c", "raise SystemExit(4)"])
        with pytest.raises(DeployError, match=r"^code-server exited with code 4: "):
            dep.supervise()
        assert lines == []
    finally:
        dep.stop()


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


def comm(p: Proc) -> str:
    """The process's name now (a warm stage worker's: the program it runs), "" once it is gone."""
    try:
        return Path(f"/proc/{p.pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(p: Proc) -> bool:
    """Still running (an exited process not yet reaped, a zombie, is not)."""
    try:
        stat = Path(f"/proc/{p.pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]) == p.start and fields[0] != "Z"


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


def crawl_runs(url: str, crawl: str) -> list[dict[str, Any]]:
    """Every run of the crawl (``curate submit``'s and the daemon's retries), newest first."""
    query = """query($crawl: String!) { runsOrError(filter: {tags: [{key: "curate/crawl", value: $crawl}]}) {
        ... on Runs { results { runId jobName status startTime endTime tags { key value } } } } }"""
    return graphql_post(url, query, {"crawl": crawl})["runsOrError"]["results"]  # type: ignore[no-any-return]


RUN_EVENTS = """query($id: ID!, $after: String) { logsForRun(runId: $id, afterCursor: $after, limit: 5000) {
    __typename ... on EventConnection { cursor hasMore events { __typename
      ... on MessageEvent { timestamp stepKey message }
      ... on MaterializationEvent { assetKey { path } partition } } } } }"""


def run_events(url: str, run_id: str) -> list[dict[str, Any]]:
    """Every event of a run, oldest first."""
    events: list[dict[str, Any]] = []
    after = None
    while True:
        page = graphql_post(url, RUN_EVENTS, {"id": run_id, "after": after})["logsForRun"]
        assert page["__typename"] == "EventConnection", page
        events += page["events"]
        if not page["hasMore"]:
            return events
        after = page["cursor"]


@dataclass(frozen=True)
class Step:
    """One attempt at one asset partition, as the event log records it: the step of its program
    in one run, from the step's start (the step logs the partitions it is about to run) to the
    partition's materialization, else to the step's end, else to the end of its run (whose worker
    died)."""

    run_id: str
    asset: str
    partition: str
    start: float  # seconds since the epoch
    end: float
    materialized: bool


TO_RUN = re.compile(r"^(\w+): \d+ stale partition\(s\) to run \[([^\]]*)\]")


def steps(url: str, runs: list[dict[str, Any]]) -> list[Step]:
    out = []
    for run in runs:
        started: dict[str, float] = {}
        ended: dict[str, float] = {}
        planned: dict[str, list[str]] = {}
        materialized: dict[tuple[str, str], float] = {}
        for event in run_events(url, run["runId"]):
            key, at = event.get("stepKey"), float(event.get("timestamp") or 0) / 1000
            if event["__typename"] == "ExecutionStepStartEvent" and key in PROGRAMS:
                started[key] = at
            elif event["__typename"] in ("ExecutionStepSuccessEvent", "ExecutionStepFailureEvent") and key in PROGRAMS:
                ended[key] = at
            elif event["__typename"] == "LogMessageEvent" and (m := TO_RUN.match(event.get("message") or "")):
                planned[m[1]] = [k for k in m[2].split(", ") if k]
            elif event["__typename"] == "MaterializationEvent":
                program = event["assetKey"]["path"][0]
                assert event["partition"] in planned.get(program, []), event  # only what its step planned
                materialized[(program, event["partition"])] = at
        for program, partitions in planned.items():
            for partition in partitions:
                end = materialized.get((program, partition), ended.get(program, run["endTime"]))
                assert end is not None and end >= started[program], (run, program, partition)
                out.append(Step(run["runId"], program, partition, started[program], end,
                                (program, partition) in materialized))
    return out


def assert_one_writer_at_a_time(executed: list[Step]) -> None:
    """No two runs ever executed one asset partition at once (a killed run's step lasts until
    its run was failed: its stage subprocess died with its worker before that)."""
    by_partition: dict[tuple[str, str], list[Step]] = {}
    for step in executed:
        by_partition.setdefault((step.asset, step.partition), []).append(step)
    for (asset, partition), group in by_partition.items():
        group.sort(key=lambda step: step.start)
        for a, b in pairwise(group):
            assert a.end <= b.start, f"{asset}[{partition}] executed by runs {a.run_id} and {b.run_id} at once"


def assert_dependency_order(executed: list[Step], spec: CrawlSpec) -> None:
    """Every asset partition of the crawl materialized exactly once (in whichever run, a retry
    included), none of a switched-off stage's, and each only after every one of its inputs
    (across the source x crawl / crawl levels) was."""
    by_partition: dict[tuple[str, str], Step] = {}
    for step in executed:
        if step.materialized:
            key = (step.asset, step.partition)
            assert key not in by_partition, f"{step.asset}[{step.partition}] materialized twice"
            by_partition[key] = step
    want = {(p, str(partition_key(spec.crawl, s))) for p in PROGRAMS for s in spec.partitions(p)}
    assert set(by_partition) == want and len(want) < sum(len(spec.all_partitions(p)) for p in PROGRAMS)
    for (program, partition), step in by_partition.items():
        source = partition.split("|")[1] if "|" in partition else None
        for dep, s in spec.upstream(program, source):
            key = str(partition_key(spec.crawl, s))
            assert by_partition[(dep, key)].end <= step.start, f"{program}[{partition}] before {dep}[{key}]"


RUNS_STARTED = """{ runsOrError(filter: {statuses: [STARTED]}) { ... on Runs { results { runId } } } }"""
RUN_STATUS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""
RUN_TAGS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { tags { key value } } } }"""


def failure(url: str, run_id: str) -> str:
    """Why a run failed, on one line: its engine events from the first error on, shortened."""
    messages = [f"{e['__typename']}: {' '.join((e.get('message') or '').split())[:160]}"
                for e in run_events(url, run_id) if e["__typename"] in
                ("EngineEvent", "RunFailureEvent", "ExecutionStepFailureEvent")]
    return " | ".join(messages[-4:])


class Faults(threading.Thread):
    """Beside ``curate submit --wait``, mid-crawl: SIGKILL the stage subprocess of one
    ``raw_documents`` partition (its step launches it again); SIGKILL the run worker while a
    ``target`` partition's stage subprocess runs (found in the process table, confirmed by the
    run's ``Started process for run (pid: N)`` event); as soon as the run is failed, SIGKILL the
    daemon (its run-retry pass runs every 5 s, so this is mostly before it launched the retry:
    then the new daemon that ``curate deploy`` starts launches it)."""

    def __init__(self, root: int, url: str, deploy_log: Path, target: str = "minhash_signatures") -> None:
        super().__init__(daemon=True)
        self.root, self.url, self.deploy_log, self.target = root, url, deploy_log, target
        self.killed_stage = ""
        self.killed_run = ""
        self.stage = ""
        self.daemon_pid = 0
        self.retried_by = ""  # the daemon that launched the retry: the killed one, or the new one
        self.error: str | None = None

    def run(self) -> None:
        try:
            os.kill(self._stage("raw_documents").pid, signal.SIGKILL)
            self.killed_stage = "raw_documents"
            self._kill_a_run_worker()
            self._kill_the_daemon()
        except BaseException as exc:  # reported by the test's thread
            self.error = f"{type(exc).__name__}: {exc}"

    def _stage(self, program: str) -> Proc:
        """A stage subprocess that a run worker started (a warm ``python -m stages serve`` worker),
        running a partition of ``program`` now: it is named after the program meanwhile."""
        deadline = time.monotonic() + 600
        while True:
            assert time.monotonic() < deadline, f"no {program} stage subprocess seen"
            procs = tree(self.root)
            stage = next((p for p in procs.values() if role(p, procs, self.root) == "stage subprocess"
                          and "-m stages serve " in p.cmd and comm(p) == program[:15] and p.ppid in procs
                          and role(procs[p.ppid], procs, self.root) == "run worker"), None)
            if stage is not None:
                self.procs = procs
                return stage
            time.sleep(0.05)

    def _kill_a_run_worker(self) -> None:
        stage = self._stage(self.target)
        worker = self.procs[stage.ppid]
        for run in graphql_post(self.url, RUNS_STARTED)["runsOrError"]["results"]:
            messages = [e.get("message") or "" for e in run_events(self.url, run["runId"])]
            if f"Started process for run (pid: {worker.pid})." in messages:
                self.killed_run = run["runId"]
                break
        assert self.killed_run, f"no started run has worker pid {worker.pid}"
        os.kill(worker.pid, signal.SIGKILL)
        self.stage = stage.cmd
        deadline = time.monotonic() + 10
        while alive(stage):  # PR_SET_PDEATHSIG: the stage subprocess dies with its run worker
            assert time.monotonic() < deadline, f"the stage subprocess outlived its run worker: {stage.cmd}"
            time.sleep(0.1)

    def _kill_the_daemon(self) -> None:
        deadline = time.monotonic() + 120
        while graphql_post(self.url, RUN_STATUS, {"id": self.killed_run})["runOrError"]["status"] != "FAILURE":
            assert time.monotonic() < deadline, f"run {self.killed_run} not failed after its worker was killed"
            time.sleep(0.2)
        procs = tree(self.root)
        (daemon,) = [p for p in procs.values() if role(p, procs, self.root) == "daemon"]
        os.kill(daemon.pid, signal.SIGKILL)
        self.daemon_pid = daemon.pid
        tags = graphql_post(self.url, RUN_TAGS, {"id": self.killed_run})["runOrError"]["tags"]
        self.retried_by = "the new daemon" if not any(t["key"] == "dagster/auto_retry_run_id" for t in tags) \
            else "the killed daemon"
        deadline = time.monotonic() + 60
        while "daemon exited with code -9" not in self.deploy_log.read_text():
            assert time.monotonic() < deadline, "curate deploy did not restart its daemon"
            time.sleep(0.2)


class Background(threading.Thread):
    """``fn(*args)`` in a thread; ``result`` waits for it and raises what it raised."""

    def __init__(self, fn: Any, *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn.__name__} still running after {timeout:.0f}s"
        if self.error is not None:
            raise self.error


def assert_the_ui_shows_the_run(url: str, run_id: str, partitions: list[str], user_data: Path) -> None:
    """Headless Chromium on the webserver: the crawl's run page shows its steps and a
    materialization of every partition (its log, filtered to materializations), the runs page the
    run; screenshots of both in tests/artifacts/."""
    graphql_post(url, "mutation { setNuxSeen }")  # no "join the community" dialog
    ARTIFACTS.mkdir(exist_ok=True)
    browser = Browser(user_data, 1600, 1400)

    def shows(page: str, wanted: list[str]) -> None:
        """Wait until the page's DOM holds every string in ``wanted``."""
        browser.open(page)
        missing, dom = wanted, ""
        deadline = time.monotonic() + 90
        while missing and time.monotonic() < deadline:
            time.sleep(1)
            with contextlib.suppress(RuntimeError):  # no document yet while the page loads
                dom = browser.dom()
            missing = [w for w in wanted if w not in dom]
        assert not missing, f"{page} does not show {missing}"

    try:
        # The run's page, its log filtered to materializations: one per partition, each naming it.
        shows(f"{url}/runs/{run_id}?logs=type%3AASSET_MATERIALIZATION",
              [run_id[:8], "curate_run", "removal_ledger", "minhash_signatures", *partitions])
        browser.screenshot(ARTIFACTS / "deploy_run.png")
        shows(f"{url}/runs", [f"/runs/{run_id}", "curate_run"])
        browser.screenshot(ARTIFACTS / "deploy_runs.png")
    finally:
        browser.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_crawl_submitted_to_the_deployment_survives_faults_equals_curate_run_and_sigterm_leaves_nothing(
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
    deploy = start_deploy(base / "work", deployed, {**os.environ, "CURATE_STORAGE_OPTIONS": options,
                                                    TTL_ENV: LEASE_TTL_S}, port)
    started = time.monotonic() - t0
    deploy_log = base / "deploy.out"
    try:
        code, _, err = curate("deploy", "--workdir", str(base / "work"), "--data-root", deployed, "--port",
                              str(free_port()))
        assert code == 1 and "is running already (pid " in err and err.count("\n") == 1
        with Sampler(deploy.pid) as sampler:
            faults = Faults(deploy.pid, url, deploy_log)
            faults.start()
            t0 = time.monotonic()
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--config", str(config),
                                    "--stages", STAGES, "--wait", "--timeout", "900")
            submitted = time.monotonic() - t0
            faults.join(60)
            assert faults.error is None, faults.error
            assert code == 0, out + err
            assert f"{url}/runs/" in out  # the UI link of the run
            submitted_run = out.split(f"{url}/runs/")[1].split()[0]

            # One run for the crawl: the killed one, retried from its failed step (so was any other
            # run that failed: one the killed daemon was launching, failed by run monitoring); each
            # retry chain ends in success.
            runs = crawl_runs(url, T.CRAWL)
            assert {r["jobName"] for r in runs} == {"curate_run"} and runs[-1]["runId"] == submitted_run
            tags = {run["runId"]: {t["key"]: t["value"] for t in run["tags"]} for run in runs}
            status = {run["runId"]: run["status"] for run in runs}
            retries = [r["runId"] for r in runs if tags[r["runId"]].get("dagster/parent_run_id")]
            assert len(runs) == 1 + len(retries) and len(retries) <= 2
            failed = {r: failure(url, r) for r, s in status.items() if s == "FAILURE"}
            assert faults.killed_run == submitted_run and faults.killed_run in failed
            assert "SIGKILL" in failed[faults.killed_run]
            assert set(status.values()) <= {"SUCCESS", "FAILURE"}
            for run_id, why in failed.items():
                chain = [run_id]
                while status[chain[-1]] == "FAILURE":
                    assert tags[chain[-1]].get("dagster/auto_retry_run_id") in status, f"{chain[-1]} not retried: {why}"
                    chain.append(tags[chain[-1]]["dagster/auto_retry_run_id"])
                assert tags[chain[1]]["dagster/parent_run_id"] == run_id and status[chain[-1]] == "SUCCESS"
            restarted = [line for line in deploy_log.read_text().splitlines() if "daemon exited with code -9" in line]
            assert len(restarted) == 1 and "restarted it (pid " in restarted[0]
            # The killed stage subprocess: its step launched the partition again, in the same run.
            messages = [e.get("message") or "" for e in run_events(url, submitted_run)]
            assert any(m.startswith("raw_documents[") and "killed by signal 9" in m and "launching it again" in m
                       for m in messages), messages
            executed = steps(url, runs)
            assert_one_writer_at_a_time(executed)
            assert_dependency_order(executed, T.spec(stages=STAGES.split(",")))
            killed = [s for s in executed if s.run_id == faults.killed_run and s.asset == faults.target]
            assert killed and not all(s.materialized for s in killed)  # it was killed mid-step
            # The UI, in the browser while the next crawl runs.
            partitions = [f"{T.CRAWL}|{s}" for s in T.SOURCES]
            ui = Background(assert_the_ui_shows_the_run, url, runs[0]["runId"], partitions,
                            base / "chrome") if CHROMIUM is not None else None  # Debian's chromium: make chromium

            code, out, err = curate("status", "--dagster", url, "--crawl", T.CRAWL)
            assert code == 0, err
            assert f"run {runs[0]['runId']} SUCCESS" in out and "removal ledger committed" in out
            assert f"{'raw_documents':<26}{len(T.SOURCES):>11}{len(T.SOURCES):>10}  success" in out
            assert f"{'removal_ledger':<26}{1:>11}{1:>10}  success" in out

            # A source that does not exist: one line naming the asset partition and why.
            code, out, err = curate("submit", "--dagster", url, "--crawl", "broken", "--source",
                                    f"web={base / 'nowhere'}", "--stages", STAGES, "--wait", "--timeout", "300")
            assert code == 1
            assert err.count("\n") == 1 and err.startswith("curate: error: raw_documents[broken|web]: source URL "), err
            assert "matches no JSONL or Parquet file" in err
            if ui is not None:
                ui.result(120)

            # Resubmitted (every partition up to date): SIGTERM once its run is under way.
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--stages", STAGES)
            assert code == 0, err
            code, out, err = curate("submit", "--dagster", url, "--crawl", T.CRAWL, "--stages", STAGES)
            assert code == 1 and f"crawl {T.CRAWL} has a run in progress" in err and err.count("\n") == 1
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
        # The deployment's logs outlive the test's folder: tests/artifacts/deploy-logs/.
        shutil.rmtree(ARTIFACTS / "deploy-logs", ignore_errors=True)
        with contextlib.suppress(OSError):
            shutil.copytree(base / "work" / "deploy" / "logs", ARTIFACTS / "deploy-logs")
            shutil.copy(deploy_log, ARTIFACTS / "deploy-logs" / "curate-deploy.log")
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
              f"({STAGES}): curate submit --wait {submitted:.1f}s (a stage worker, a run worker and the daemon "
              f"SIGKILLed, "
              f"{len(runs)} runs, {len(retries)} retries, the killed run's by {faults.retried_by}), curate run "
              f"{ran:.1f}s\n{sampler.table()}\nfailed runs:\n" + "\n".join(f"  {r}: {w}" for r, w in failed.items()))
