"""A SIGKILLed ``curate deploy`` leaves nothing running (issue 30): its children die with it
(``PR_SET_PDEATHSIG``, each with its own stop signal), and the next ``curate deploy`` on the workdir
stops whatever its predecessor's ``deployment.json`` or PostgreSQL's ``postmaster.pid`` still
names, never a process that merely reused a pid. Real processes throughout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from curation_dagster.ops.deploy import DEPLOY_DIR, Deployment
from tests.support.tiny_corpus import fast_tmp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc: Linux")
ROOT = str(Path(__file__).resolve().parents[3])
SLEEPER = [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(0)); "
           "print('ready', flush=True); time.sleep(600)"]


def default_signals() -> None:
    """A ``preexec_fn``: SIGINT and SIGTERM at their default action in a process this test starts
    as a deployment's would be (``deploy._stoppable``), whatever pytest's process does with them
    (started as a shell's background job it ignores SIGINT, and after a test's in-process Dagster
    run SIGTERM too: an ignored signal stays ignored across exec)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def gone(pid: int, within: float = 10.0) -> bool:
    """``pid`` exits (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_children_die_with_a_sigkilled_deploy_process(tmp_path: Path) -> None:
    """A process that spawned children as ``curate deploy`` does is SIGKILLed: each child gets its
    stop signal from the kernel and exits (SIGINT for the PostgreSQL-like one, SIGTERM otherwise),
    though the process ignored both (a shell's background job ignores SIGINT, and Dagster's
    interrupt handling maps SIGTERM to that): its children do not inherit that."""
    work = tmp_path / "w"
    (work / DEPLOY_DIR / "logs").mkdir(parents=True)
    script = (
        "import json, signal, sys, time\n"
        "from pathlib import Path\n"
        "from curation_dagster.ops.deploy import Deployment\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"dep = Deployment(Path({str(work)!r}), 'unused')\n"
        f"a = dep.spawn('postgres', {SLEEPER!r}, stop_signal=signal.SIGINT)\n"
        f"b = dep.spawn('code-server', {SLEEPER!r})\n"
        "print(json.dumps([a.proc.pid, b.proc.pid]), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True)
    assert parent.stdout is not None
    children = json.loads(parent.stdout.readline())
    state = json.loads((work / DEPLOY_DIR / "deployment.json").read_text())
    assert state["processes"] == {"postgres": children[0], "code-server": children[1]}  # recorded as started
    try:
        assert not gone(children[0], 0.5) and not gone(children[1], 0.5)
        parent.kill()
        parent.wait()
        assert gone(children[0]) and gone(children[1])
    finally:
        for pid in children:
            if not gone(pid, 0):
                os.kill(pid, signal.SIGKILL)


def test_the_next_deploy_stops_what_a_killed_one_left_and_nothing_else(tmp_path: Path) -> None:
    work = tmp_path / "w"
    base = work / DEPLOY_DIR
    (base / "postgres").mkdir(parents=True)
    leftover = subprocess.Popen([*SLEEPER, "code-server"], start_new_session=True, preexec_fn=default_signals)
    stranger = subprocess.Popen([*SLEEPER, "someone else's"], start_new_session=True,  # reused a recorded pid
                                preexec_fn=default_signals)
    # A postmaster the state does not name (killed before it was recorded): found by its own pid file.
    postmaster = subprocess.Popen([*SLEEPER, "-D", str(base / "postgres")], start_new_session=True,
                                  stdout=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert postmaster.stdout is not None
    # Its SIGINT handler in place before it is stopped: a SIGINT during the interpreter's start
    # (a loaded machine) ends it by the signal, not by its fast shutdown.
    assert postmaster.stdout.readline() == "ready\n"
    (base / "postgres" / "postmaster.pid").write_text(f"{postmaster.pid}\n{base / 'postgres'}\n")
    (base / "deployment.json").write_text(json.dumps({
        "pid": dead_pid(), "processes": {"code-server": leftover.pid, "daemon": stranger.pid},
        "commands": {"code-server": [*SLEEPER, "code-server"], "daemon": [*SLEEPER, "daemon"]},
        "stop_signals": {"code-server": int(signal.SIGTERM), "daemon": int(signal.SIGTERM)},
    }))
    logged: list[str] = []
    try:
        stopped = Deployment(work, "unused", log=logged.append)._stop_leftovers()
        assert sorted(stopped) == sorted([f"code-server (pid {leftover.pid})", f"postgres (pid {postmaster.pid})"])
        assert leftover.wait(10) == -signal.SIGTERM
        assert postmaster.wait(10) == 0  # SIGINT: its fast shutdown
        assert stranger.poll() is None  # not the process the state recorded
        assert len(logged) == 1 and "stopped what a killed deployment" in logged[0]
        assert not (base / "deployment.json").exists()
        assert Deployment(work, "unused", log=logged.append)._stop_leftovers() == []  # nothing left
    finally:
        for proc in (leftover, stranger, postmaster):
            proc.kill()
            proc.wait()


@pytest.mark.slow  # two deployments started (PostgreSQL, code server, daemon, webserver): ~1-3 min
def test_a_sigkilled_curate_deploy_leaves_nothing_and_the_next_one_starts() -> None:
    from curation_dagster.ops.deploy import DeployError, RunAs, free_port, postgres_bindir

    try:
        postgres_bindir()
        RunAs.for_postgres()
        import dagster_postgres  # noqa: F401
    except (DeployError, ImportError) as exc:
        pytest.skip(str(exc))
    fallback = Path(tempfile.mkdtemp(prefix="curate-deploy-"))  # pytest's tmp folders are private to root
    try:
        with fast_tmp(fallback) as tmp_path:
            tmp_path.chmod(0o711)  # PostgreSQL runs as its own user under root: it must enter the workdir
            _sigkill_and_restart(tmp_path, free_port)
    finally:
        shutil.rmtree(fallback, ignore_errors=True)  # fast_tmp removes only the folder it made itself


def _sigkill_and_restart(tmp_path: Path, free_port: Callable[[], int]) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "curate.yaml").write_text("automation:\n  enabled: false\n")

    def start() -> subprocess.Popen[str]:
        out = open(tmp_path / "deploy.out", "w")  # kept open for the process's life
        proc = subprocess.Popen([sys.executable, "-m", "curation_dagster.cli", "deploy", "--workdir", str(work),
                                 "--data-root", str(tmp_path / "root"), "--port", str(free_port())],
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True)
        deadline = time.monotonic() + 400
        while "deployment ready" not in (tmp_path / "deploy.out").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"curate deploy did not start: {(tmp_path / 'deploy.out').read_text()[-2000:]}")
            time.sleep(0.5)
        return proc

    first = start()
    state = json.loads((work / DEPLOY_DIR / "deployment.json").read_text())
    assert set(state["processes"]) == {"postgres", "code-server", "daemon", "webserver"}
    first.kill()
    first.wait()
    left = [name for name, pid in state["processes"].items() if not gone(pid, 60)]
    assert left == [], f"still running after the deploy was SIGKILLed: {left}"
    second = start()  # the workdir's ports, cluster and state are free again
    try:
        assert "is running already" not in (tmp_path / "deploy.out").read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0
