"""``curate deploy``: the Kubernetes deployment minus Kubernetes, on one machine, in the foreground.

    PostgreSQL (instance storage)  <- dagster-webserver (UI, GraphQL)  -- workspace.yaml --+
                                   <- dagster-daemon (run queue, backfills, sensors,        |
                                      run retries and monitoring)     -- workspace.yaml --+
                                   <- gRPC code server (curation_dagster.ops.deploy:definitions)
                                        '- run worker per run (DefaultRunLauncher)
                                             '- `python -m stages ...` per asset partition (Pipes)

Every process is started here, each in its own process group, and stopped here: Ctrl-C or SIGTERM
stops the Dagster processes (SIGTERM to their groups, SIGKILL after a timeout), then PostgreSQL
(fast shutdown), then reaps what was orphaned (this process is a child subreaper). Meanwhile it
supervises them: a daemon or webserver that dies is started again (and logged), anything else
that exits stops the deployment. The state lives in ``<workdir>/deploy/``: the PostgreSQL cluster
(``postgres/``, created with ``initdb`` and run as a non-root user: root cannot run postgres), the
Dagster home (``dagster/``: ``dagster.yaml``, ``workspace.yaml``, compute logs), one log per
process (``logs/``) and, while it runs, ``deployment.json`` (URLs, pids). Outputs and crawl specs
live in the data root only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster import Definitions

DEPLOY_DIR = "deploy"
LOCATION = "curation"  # the code location's name, as on Kubernetes (k8s/values.yaml)
PG_USER = "dagster"  # the database role and database of the instance
PG_PASSWORD_ENV = "CURATE_DEPLOY_PG_PASSWORD"  # read by dagster.yaml; never written into it
STOP_TIMEOUT_S = 20.0
# Services holding no state of their own (it is all in PostgreSQL): one that dies is started again.
# The code server is not among them (its run workers die with it), nor PostgreSQL (the state).
RESTARTABLE = ("daemon", "webserver")
RESTART_WINDOW_S, MAX_RESTARTS = 300.0, 5  # more restarts than this within the window: a crash loop

DAGSTER_YAML = """\
# Written by `curate deploy` at every start (the ports change): edit curation_dagster/ops/deploy.py.
telemetry:
  enabled: false
storage:  # dagster-postgres's, its connections held open (curation_dagster/ops/pg_storage.py)
  custom:
    module: curation_dagster.ops.pg_storage
    class: PooledPostgresStorage
    config:
      postgres_db:
        username: {user}
        password: {{env: {password_env}}}
        hostname: 127.0.0.1
        port: {port}
        db_name: {user}
        scheme: postgresql+psycopg2  # SQLAlchemy 2.1 defaults to psycopg 3; dagster-postgres brings psycopg2
run_coordinator:  # runs wait in a queue; at most max_concurrent_runs at once
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: {max_runs}
    dequeue_interval_seconds: 1
run_launcher:  # each run in its own process, started by the code server
  module: dagster.core.launcher
  class: DefaultRunLauncher
run_retries:  # a run that fails outside its steps (its worker died) is retried
  enabled: true
  max_retries: {retries}
  retry_on_asset_or_op_failure: false  # a stage's own error would fail again: not retried
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  max_resume_run_attempts: 0  # DefaultRunLauncher cannot resume a run; run_retries relaunch it
  poll_interval_seconds: 10
"""

WORKSPACE_YAML = """\
load_from:
  - grpc_server:
      host: 127.0.0.1
      port: {port}
      location_name: {location}
"""


class DeployError(RuntimeError):
    """A deployment that cannot start or stopped on its own; the message is one line."""


def definitions() -> Definitions:
    """The code location of ``curate deploy`` (``dagster api grpc -m curation_dagster.ops.deploy -a
    definitions``): every asset partition runs on a warm ``python -m stages serve`` worker
    speaking Pipes, the stage pod's command line; outputs under ``$CURATE_DATA_ROOT``. A run's steps run in its
    worker process (the in-process executor): the work is in the stage subprocess already, and
    Dagster's default, a process per step and per check, would start two Pythons per step."""
    from dagster import in_process_executor

    from curation_dagster.defs.definitions import build_definitions

    # The workdir and data root from CURATE_WORKDIR and CURATE_DATA_ROOT (resources.resource_for).
    return build_definitions(run_executor=in_process_executor, mode="pipes")


# --- PostgreSQL ------------------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """Debian's server binaries (``/usr/lib/postgresql/<version>/bin``, the newest), else the
    ``pg_config --bindir`` of the PATH's PostgreSQL."""
    base = Path("/usr/lib/postgresql")
    found = sorted((p / "bin" for p in base.glob("*") if (p / "bin" / "initdb").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0) if base.is_dir() else []
    if found:
        return found[-1]
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        bindir = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                     check=True).stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    raise DeployError("the PostgreSQL server is not installed: `make postgres` (Debian: apt-get install postgresql)")


@dataclass(frozen=True)
class RunAs:
    """The user PostgreSQL runs as: this one, or the ``postgres`` system user under root."""

    uid: int
    gid: int
    name: str

    @classmethod
    def for_postgres(cls) -> RunAs:
        if os.geteuid() != 0:
            entry = pwd.getpwuid(os.geteuid())
        else:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise DeployError("root cannot run PostgreSQL and there is no `postgres` user to run it as: "
                                  "`make postgres` (Debian's package creates it)") from None
        return cls(entry.pw_uid, entry.pw_gid, entry.pw_name)

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def can_enter(self, path: Path) -> Path | None:
        """The first folder on the way to ``path`` this user may not enter, or None."""
        for folder in [*reversed(path.parents), path]:
            if not folder.exists():
                break
            st = folder.stat()
            bit = stat.S_IXUSR if st.st_uid == self.uid else stat.S_IXGRP if st.st_gid == self.gid else stat.S_IXOTH
            if self.uid != 0 and not st.st_mode & bit:
                return folder
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the webserver binds: TIME_WAIT is no conflict
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# --- the deployment --------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    stop_signal: int = signal.SIGTERM
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    restarts: list[float] = field(default_factory=list)  # time.monotonic() of each restart

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])


@dataclass
class Deployment:
    """The processes of one ``curate deploy`` and where their state lives."""

    workdir: Path
    data_root: str
    port: int = 3000
    max_concurrent_runs: int = 4
    max_retries: int = 2
    log: Callable[[str], None] = print
    children: list[Child] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    subreaper: bool = False
    owns_state: bool = False  # deployment.json is this one's (a refused second start must not remove it)
    pg_port: int = 0
    grpc_port: int = 0

    @property
    def base(self) -> Path:
        return self.workdir / DEPLOY_DIR

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, password: str) -> dict[str, str]:
        return {**os.environ, "DAGSTER_HOME": str(self.base / "dagster"), "CURATE_WORKDIR": str(self.workdir),
                "CURATE_DATA_ROOT": self.data_root, PG_PASSWORD_ENV: password, "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, stop_signal: int = signal.SIGTERM,
              **kwargs: Any) -> Child:
        """Start ``argv`` in a process group of its own (Ctrl-C reaches only this process, which
        stops the children in order), output appended to ``logs/<name>.log``."""
        self._check_stop()
        log = self.base / "logs" / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, cwd=self.workdir,
                                    preexec_fn=_stoppable(stop_signal), **kwargs)
        child = Child(name, proc, log, stop_signal, argv, env)
        self.children.append(child)
        self._write_state()  # from the first child on: a SIGKILLed deploy's successor finds them all
        return child

    def _check_stop(self) -> None:
        if self.stopping.is_set():
            raise KeyboardInterrupt

    def wait_for(self, what: str, ready: Callable[[], bool], child: Child | None, timeout: float) -> None:
        """Poll ``ready`` until it holds; fail naming ``what`` when ``child`` exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            self._check_stop()
            if child is not None and child.proc.poll() is not None:
                raise DeployError(f"{child.name} exited with code {child.proc.returncode} while starting: "
                                  f"{child.tail()} (log: {child.log})")
            if time.monotonic() > deadline:
                raise DeployError(f"{what} not ready after {timeout:.0f}s (logs: {self.base / 'logs'})")
            self.stopping.wait(0.25)

    # --- PostgreSQL ---

    def _password(self) -> str:
        path = self.base / "pg_password"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(24))
        return path.read_text().strip()

    def start_postgres(self, password: str) -> int:
        bindir = postgres_bindir()
        user = RunAs.for_postgres()
        pgdata = self.base / "postgres"
        blocked = user.can_enter(self.base)
        if blocked is not None:
            raise DeployError(f"PostgreSQL runs as user {user.name}, who cannot enter {blocked}: choose a --workdir "
                              f"that user can reach (or `chmod o+x {blocked}`)")
        if not (pgdata / "PG_VERSION").exists():
            pgdata.mkdir(mode=0o700, exist_ok=True)
            os.chown(pgdata, user.uid, user.gid)
            pwfile = self.base / ".pg_pwfile"
            pwfile.write_text(password + "\n")
            os.chown(pwfile, user.uid, user.gid)
            pwfile.chmod(0o600)
            try:
                done = subprocess.run(
                    [str(bindir / "initdb"), "-D", str(pgdata), "-U", PG_USER, "--auth=scram-sha-256",
                     f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C"],
                    capture_output=True, text=True, check=False, cwd=self.base, **user.popen_kwargs())
            finally:
                pwfile.unlink(missing_ok=True)
            if done.returncode != 0:
                raise DeployError(f"initdb failed: {' '.join(done.stderr.split())[-300:]}")
            self.log(f"PostgreSQL cluster created in {pgdata} (initdb, user {user.name})")
        port = free_port()
        child = self.spawn("postgres", [
            str(bindir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(port),
            "-c", "unix_socket_directories=", "-c", "logging_collector=off", "-c", "max_connections=200",
        ], env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}, stop_signal=signal.SIGINT,  # fast shutdown
            **user.popen_kwargs())

        def accepting() -> bool:
            return subprocess.run([str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)],
                                  check=False).returncode == 0

        self.wait_for("PostgreSQL", accepting, child, 60)
        self._create_database(port, password)
        return port

    @staticmethod
    def _create_database(port: int, password: str) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, password=password, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_USER,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{PG_USER}"')
        finally:
            conn.close()

    # --- Dagster ---

    def write_config(self, pg_port: int, grpc_port: int) -> Path:
        home = self.base / "dagster"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(DAGSTER_YAML.format(
            user=PG_USER, password_env=PG_PASSWORD_ENV, port=pg_port, max_runs=self.max_concurrent_runs,
            retries=self.max_retries))
        workspace = home / "workspace.yaml"
        workspace.write_text(WORKSPACE_YAML.format(port=grpc_port, location=LOCATION))
        return workspace

    def start(self) -> None:
        """Start every process, in dependency order, and wait until the UI serves the code location."""
        self._refuse_second()
        self._stop_leftovers()
        if not port_free(self.port):
            raise DeployError(f"port {self.port} on 127.0.0.1 is in use: choose another with --port")
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        self.subreaper = _subreaper()
        password = self._password()
        pg_port = self.start_postgres(password)
        grpc_port = free_port()
        workspace = self.write_config(pg_port, grpc_port)
        env = self.env(password)
        bindir = Path(sys.executable).parent
        code = self.spawn("code-server", [
            sys.executable, "-m", "dagster", "api", "grpc", "-m", "curation_dagster.ops.deploy", "-a", "definitions",
            "-h", "127.0.0.1", "-p", str(grpc_port), "--location-name", LOCATION,
        ], env)

        def serving() -> bool:
            # Listening is enough here: the webserver's wait below proves the location loads.
            import socket

            try:
                socket.create_connection(("127.0.0.1", grpc_port), timeout=2).close()
            except OSError:
                return False
            return True

        self.wait_for("the code server", serving, code, 180)
        self.spawn("daemon", [_script(bindir, "dagster-daemon"), "run", "-w", str(workspace)], env)
        web = self.spawn("webserver", [_script(bindir, "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1",
                                       "-p", str(self.port)], env)
        self.wait_for("the webserver", lambda: _location_loaded(self.url), web, 180)
        self.pg_port, self.grpc_port = pg_port, grpc_port
        self._write_state()

    def _refuse_second(self) -> None:
        """One deployment per workdir: a second would share its PostgreSQL cluster."""
        try:
            old = json.loads((self.base / "deployment.json").read_text())
            cmdline = Path(f"/proc/{int(old['pid'])}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            return  # none, or its process is gone
        if b"deploy" in cmdline:
            raise DeployError(f"a deployment of {self.workdir} is running already (pid {old['pid']}, "
                              f"{old.get('url')}): stop it first")

    def _write_state(self) -> None:
        state = {"url": self.url, "data_root": self.data_root, "workdir": str(self.workdir),
                 "postgres_port": self.pg_port, "grpc_port": self.grpc_port, "pid": os.getpid(),
                 "processes": {c.name: c.proc.pid for c in self.children},
                 "commands": {c.name: c.argv for c in self.children},
                 "stop_signals": {c.name: int(c.stop_signal) for c in self.children}}
        path = self.base / "deployment.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path)  # whole: a successor never reads half of it
        self.owns_state = True

    def _stop_leftovers(self) -> list[str]:
        """Stop what a deployment of this workdir killed with SIGKILL left running (its children
        die with it where the platform allows, ``_stoppable``; this is for the others): each
        process its ``deployment.json`` names that still runs the command it recorded, then a
        PostgreSQL server still serving this workdir's cluster (``postmaster.pid``, in case it
        was killed before the state named it). Returns what was stopped, as ``name (pid N)``."""
        stopped: list[str] = []
        path = self.base / "deployment.json"
        try:
            old = json.loads(path.read_text())
            processes = dict(old.get("processes") or {})
            commands, signals = dict(old.get("commands") or {}), dict(old.get("stop_signals") or {})
        except (OSError, ValueError, TypeError, AttributeError):
            processes, commands, signals = {}, {}, {}
        leftovers = [(name, int(pid), signals.get(name, signal.SIGTERM), commands.get(name))
                     for name, pid in processes.items()]
        pg = _postmaster_pid(self.base / "postgres")
        if pg is not None and all(pid != pg for _, pid, _, _ in leftovers):
            leftovers.append(("postgres", pg, signal.SIGINT, None))
        for name, pid, sig, argv in leftovers:
            if _runs(pid, argv, self.base) and _stop_process(pid, int(sig)):
                stopped.append(f"{name} (pid {pid})")
        if stopped:
            self.log(f"stopped what a killed deployment of {self.workdir} left running: {', '.join(stopped)}")
        path.unlink(missing_ok=True)
        return stopped

    def supervise(self) -> None:
        """Until asked to stop: a daemon or webserver that exits on its own is started again (and
        that is logged); any other process that exits, or one of those in a crash loop, stops the
        deployment."""
        ticks = 0
        while not self.stopping.wait(0.5):
            ticks += 1
            if self.subreaper and ticks % 10 == 0:
                _reap_exited_orphans({c.proc.pid for c in self.children})
            for child in list(self.children):
                if child.proc.poll() is None:
                    continue
                why = f"{child.name} exited with code {child.proc.returncode}: {child.tail()} (log: {child.log})"
                now = time.monotonic()
                recent = [t for t in child.restarts if now - t < RESTART_WINDOW_S]
                if child.name not in RESTARTABLE or len(recent) >= MAX_RESTARTS:
                    raise DeployError(why if child.name not in RESTARTABLE else
                                      f"{why}; restarted {len(recent)} times in {RESTART_WINDOW_S:.0f}s already")
                new = self.restart(child, [*recent, now])
                self.log(f"{why}: restarted it (pid {new.proc.pid})")

    def restart(self, child: Child, restarts: list[float]) -> Child:
        """Start ``child``'s command again in place of the exited one (whose group is killed
        first: nothing of the old one may run beside the new one)."""
        _kill_group(child)
        self.children.remove(child)
        new = self.spawn(child.name, child.argv, child.env, child.stop_signal)
        new.restarts = restarts
        self._write_state()
        return new

    def stop(self) -> None:
        """Stop the Dagster processes (their whole groups: run workers and stage subprocesses too),
        then PostgreSQL; what does not stop in time is killed. Idempotent."""
        if self.owns_state:
            (self.base / "deployment.json").unlink(missing_ok=True)
        dagster = [c for c in self.children if c.name != "postgres"]
        postgres = [c for c in self.children if c.name == "postgres"]
        for group in (dagster, postgres):
            for child in group:
                _signal_group(child, child.stop_signal)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for child in group:
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.log(f"{child.name} did not stop in {STOP_TIMEOUT_S:.0f}s: killed")
            for child in group:  # the leader is gone; members of its group may not be
                _kill_group(child)
        if self.subreaper:
            _reap_orphans()
        self.children.clear()


def _stoppable(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child whose stop signal is ``sig``: ``sig``, SIGINT and SIGTERM at
    their default action in it, whatever this process does with them. An ignored signal stays
    ignored across exec: a process started as a shell's background job ignores SIGINT, Dagster
    then maps SIGTERM to that (its interrupt handling), and a child of such a process could be
    stopped by SIGKILL alone. On Linux the kernel also sends the child ``sig`` (its own stop
    signal: PostgreSQL's fast shutdown, Dagster's SIGTERM) when the deploy process dies, SIGKILL
    included (``PR_SET_PDEATHSIG``; set after the child changed user, which would clear it);
    elsewhere ``_stop_leftovers`` of the next deploy is the only clean-up. None off POSIX (no
    ``preexec_fn`` there)."""
    if os.name != "posix":
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # looked up here: the child only calls it
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]  # libc's, not Python's: any thread may spawn
    linux = sys.platform.startswith("linux")
    parent = os.getpid()
    stops = sorted({int(sig), int(signal.SIGINT), int(signal.SIGTERM)})

    def preexec() -> None:
        for stop in stops:
            libc.signal(stop, None)  # SIG_DFL
        if linux:
            libc.prctl(1, sig)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)

    return preexec


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid in ``<pgdata>/postmaster.pid`` (PostgreSQL's own lock file: first line), or None."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _runs(pid: int, argv: list[str] | None, base: Path) -> bool:
    """Process ``pid`` is alive and runs ``argv`` (as recorded), or, when none was recorded, a
    command naming a path under ``base``: never a stranger that reused the pid."""
    try:
        cmdline = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return False
    if argv:  # a script started through its #! line runs as [interpreter, script, args...]
        want = [str(a) for a in argv]
        return want[0] in cmdline[:2] and cmdline[len(cmdline) - len(want) + 1:] == want[1:]
    return any(str(base) in a for a in cmdline)


def _stop_process(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``'s process group (the process itself when it leads none), wait up to
    ``STOP_TIMEOUT_S``, then SIGKILL what is left. True when it was running."""
    try:
        group = os.getpgid(pid) == pid
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not _zombie(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    return True


def _zombie(pid: int) -> bool:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat_line[stat_line.rindex(")") + 2:].startswith("Z")


def _script(bindir: Path, name: str) -> str:
    """A console script of this environment (beside its python), else the PATH's."""
    path = bindir / name
    return str(path) if path.exists() else name


def _location_loaded(url: str) -> bool:
    """The webserver answers GraphQL and has loaded the code location."""
    query = '{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus ' \
            'locationOrLoadError { __typename } } } } }'
    try:
        data = graphql_post(url, query, timeout=5)
    except (OSError, ValueError):
        return False
    entries = data.get("workspaceOrError", {}).get("locationEntries", [])
    for entry in entries:
        if entry["name"] == LOCATION and entry["loadStatus"] == "LOADED":
            if entry["locationOrLoadError"]["__typename"] != "RepositoryLocation":
                raise DeployError(f"the webserver could not load code location {LOCATION!r} (see the UI)")
            return True
    return False


def graphql_post(url: str, query: str, variables: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
    """POST a GraphQL query to ``<url>/graphql``; its ``data`` (errors raise ValueError)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        payload = json.loads(resp.read())
    if payload.get("errors"):
        raise ValueError("GraphQL: " + "; ".join(str(e.get("message", e)) for e in payload["errors"]))
    return payload["data"]  # type: ignore[no-any-return]


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if child.proc.poll() is None:
            if sig == signal.SIGINT:  # PostgreSQL: the postmaster shuts its backends down itself
                os.kill(child.proc.pid, sig)
            else:
                os.killpg(child.proc.pid, sig)


def _kill_group(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.proc.wait(5)


def _subreaper() -> bool:
    """Become the child subreaper (Linux): processes orphaned below this one (a run worker whose
    code server died) are reparented here and reaped on stop, not left to PID 1."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _reap_exited_orphans(own: set[int]) -> None:
    """Reap the orphans reparented here that have exited (the stage subprocess of a run worker
    that was killed), leaving this process's own children to ``Popen``, which reads their exit
    codes: no zombies pile up in a long-running deployment."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in own:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if state == "Z" and int(ppid) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(entry), os.WNOHANG)


def _reap_orphans() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def deploy(workdir: Path, data_root: str, port: int, max_concurrent_runs: int, max_retries: int,
           out: IO[str] | None = None) -> int:
    """``curate deploy``: start everything, print the UI's address, run until Ctrl-C or SIGTERM."""
    try:
        import dagster_postgres  # noqa: F401
    except ImportError:
        raise DeployError("curate deploy needs dagster-postgres: pip install 'curation-dagster[deploy]'") from None
    stream = out or sys.stdout

    def log(msg: str) -> None:
        print(msg, file=stream, flush=True)

    dep = Deployment(workdir.resolve(), data_root, port, max_concurrent_runs, max_retries, log)
    previous = {sig: signal.signal(sig, lambda *_: dep.stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        t0 = time.monotonic()
        dep.start()
        log(f"Dagster deployment ready in {time.monotonic() - t0:.1f}s: {dep.url} (data root {data_root}; "
            f"instance: PostgreSQL in {dep.base / 'postgres'}; logs: {dep.base / 'logs'})")
        log(f"submit a crawl: curate submit --dagster {dep.url} --crawl NAME --source NAME=URL ... --wait")
        dep.supervise()
        log("stopping")
        return 0
    except KeyboardInterrupt:
        log("stopping")
        return 0
    finally:
        dep.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
