"""The ``curate`` CLI as a package: one module per group of commands, each with its parser; the
commands that need no run (``register``, ``report`` of a crawl without a ledger, errors) answer in
one line. Whole crawls through the CLI: tests/e2e."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from curation_dagster import cli
from curation_dagster.cli import common, crawl, deployment, outputs, prepare, sizing
from stages.dataroot import DataRoot

ROOT = Path(__file__).resolve().parents[3]
GROUPS = {
    crawl: {"run", "register"},
    outputs: {"report", "ledger", "explain", "decontam-report", "semantic-audit", "profile"},
    prepare: {"sample", "train-quality"},
    sizing: {"size", "lsh-curve"},
    deployment: {"ui", "deploy", "submit", "status", "k8s"},
}


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_each_command_is_parsed_and_run_by_its_groups_module() -> None:
    assert cli.GROUPS == tuple(GROUPS)
    for group, names in GROUPS.items():
        p = argparse.ArgumentParser()
        group.add_commands(p.add_subparsers())
        assert set(_commands(p)) == names, group.__name__
    every = _commands(cli.parser())
    assert set(every) == set().union(*GROUPS.values())
    for group, names in GROUPS.items():
        for name in names - {"k8s"}:
            fn = every[name].get_default("fn")
            assert fn.__module__ == group.__name__, (name, fn.__module__)


def _source(folder: Path, n: int = 5) -> Path:
    folder.mkdir(parents=True)
    (folder / "p.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": f"document number {i}"}) + "\n"
                                            for i in range(n)))
    return folder


def test_register_then_report_without_a_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    src = _source(tmp_path / "web")
    assert cli.main(["register", "--data-root", str(data), "--crawl", "c1", "--source", f"web={src}",
                     "--stages", "exact"]) == 0
    out = capsys.readouterr().out
    assert out == f"crawl c1 registered in {data} (#1, sources web)\n"
    spec = DataRoot.open(str(data)).spec("c1")
    assert spec.stages == ("exact",) and spec.sources["web"].url == str(src)
    assert cli.main(["report", "--data-root", str(data), "--crawl", "c1"]) == 1
    err = capsys.readouterr().err
    assert err == ("curate: error: crawl 'c1' has no removal ledger for its current parameters; run `curate run`\n")


def test_a_switched_off_stages_report_says_so_without_an_output(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A crawl without decontamination or semantic dedup has no partition of theirs (nothing ran,
    nothing was written): their commands say the stage is switched off, not "run `curate run`"."""
    data = tmp_path / "data"
    assert cli.main(["register", "--data-root", str(data), "--crawl", "c1", "--source",
                     f"web={_source(tmp_path / 'web')}", "--stages", "exact"]) == 0
    capsys.readouterr()
    assert cli.main(["decontam-report", "--data-root", str(data), "--crawl", "c1"]) == 0
    assert capsys.readouterr().out == "crawl c1: stage decontam was not run (switched off)\n"
    assert cli.main(["semantic-audit", "--data-root", str(data), "--crawl", "c1", "--out", str(tmp_path / "a.md")]) == 1
    assert capsys.readouterr().err == "curate: error: stage 'semantic' is not enabled for crawl 'c1' (see --stages)\n"
    assert not (tmp_path / "a.md").exists() and not list(data.glob("contaminated_documents*"))


@pytest.mark.parametrize(("args", "message"), [
    (["--source", "web"], "--source expects NAME=URL, got 'web'"),
    ([], "crawl 'c9' is new: give its sources with --source NAME=URL"),
    (["--text-field", "body"], "--text-field applies to the sources given with --source"),
])
def test_a_crawl_spec_the_options_cannot_make_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert cli.main(["register", "--data-root", str(tmp_path / "data"), "--crawl", "c9", *args]) == 1
    assert capsys.readouterr().err == f"curate: error: {message}\n"


def test_read_config_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(common.CliError, match=r"config file .*nope\.yaml does not exist"):
        common.read_config(str(tmp_path / "nope.yaml"))
    assert common.read_config(None) == {}


def test_a_config_with_an_unknown_key_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "crawl.yaml"
    config.write_text("sources:\n  web: {url: /nowhere}\nstage: [fuzzy]\nparam: {}\n")
    known = "known: sources, stages, params, keep, allow_damaged_files"
    with pytest.raises(common.CliError, match=rf"config file .*crawl\.yaml: unknown key\(s\) stage, param; {known}"):
        common.read_config(str(config))
    for args in (["register", "--data-root", str(tmp_path / "data"), "--crawl", "c9"],
                 ["size", "--docs", "1000", "--mean-chars", "2000"]):
        assert cli.main([*args, "--config", str(config)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("curate: error: config file ") and "unknown key(s) stage, param" in err, err
        assert err.count("\n") == 1
    config.write_text("sources:\n  web: {url: /nowhere}\nstages: [fuzzy]\nparams: {}\nkeep: {}\n"
                      "allow_damaged_files: false\n")
    assert set(common.read_config(str(config))) == set(common.CONFIG_KEYS)


def test_python_m_curation_dagster_cli_is_the_curate_command() -> None:
    done = subprocess.run([sys.executable, "-m", "curation_dagster.cli", "lsh-curve", "--preset", "seed",
                           "--points", "2"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "bands=20 rows=13 hashes=260  threshold (1/b)^(1/r) = 0.7942"


def test_curate_run_starts_the_pools_fork_server_first_only_for_a_pooled_crawl(tmp_path: Path) -> None:
    """``curate run`` starts the warm pool's fork server before its own imports (they run side by
    side) where its arguments name two sources or more and nothing else rules the pool out; the
    console script's lenient look at its arguments (``wanted``) agrees with the CLI's parse."""
    from curation_dagster.run.forkserver import pooled, wanted

    config = tmp_path / "crawl.json"
    config.write_text(json.dumps({"sources": {"a": {"url": "x"}, "b": {"url": "y"}}}))
    bad = tmp_path / "bad.json"
    bad.write_text("{")

    def told(*extra: str) -> bool:
        argv = ["run", "--workdir", str(tmp_path), "--crawl", "c", *extra]
        args = cli.parser().parse_args(argv)
        decision = pooled(args.config, args.source, args.executor, args.ray_address)
        assert wanted(argv) is decision
        return decision

    from stages.parallel import usable_cores

    cores = usable_cores() >= 2
    assert told("--source", "a=x", "--source", "b=y") is cores
    assert told("--config", str(config)) is cores
    assert told("--config", str(config), "--source", "c=z") is cores
    assert told("--stages", "fuzzy", "--config", str(config), "--quiet") is cores
    assert not told("--source", "a=x")  # one source runs in the process
    assert not told()  # the registered crawl's: the pool starts it when it is made
    assert not told("--config", str(config), "--executor", "ray")
    assert not told("--config", str(config), "--ray-address", "auto")
    assert not told("--config", str(bad))  # its error is told in its turn, not here
    assert not wanted(["run", "--config"])  # malformed: the CLI says so
    assert not wanted(["run", "--crawl", "c", "--config", str(config)])  # no --workdir: the CLI's usage error
    assert not wanted(["run", "--workdir", "w", "--crawl", "c", "--config", str(config), "--help"])
    assert not wanted(["run", "--workdir", "w", "--crawl", "c", "--conf", str(config)])  # the CLI's to resolve
    assert not wanted(["report", "--config", str(config)])
    assert not wanted([])
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"sources": 5}))  # the CLI tells what is wrong with it, not a traceback here
    assert not told("--config", str(odd))
    assert not pooled("/dev/null", ["a=x"], None, None)  # a file that is no config: one source named


def test_the_console_script_starts_the_fork_server_before_importing_dagster(tmp_path: Path) -> None:
    """The console script's process starts the fork server before the CLI's imports (Dagster's),
    so that the two import side by side."""
    config = tmp_path / "crawl.json"
    config.write_text(json.dumps({"sources": {"a": {"url": "x"}, "b": {"url": "y"}}}))
    probe = """
import sys
from multiprocessing import forkserver
from curation_dagster import console

def seen(argv):
    started = forkserver._forkserver._forkserver_pid is not None
    print(started, "dagster" in sys.modules)
    return 0

console._main = seen
sys.argv = ["curate", "run", "--workdir", sys.argv[1], "--crawl", "c", "--config", sys.argv[2]]
console.main()
"""
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "w"), str(config)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    from stages.parallel import usable_cores

    assert done.stdout.split() == [str(usable_cores() >= 2), "False"]


def test_the_console_script_ends_the_fork_server_it_started_when_the_command_stops_early(tmp_path: Path) -> None:
    """A pooled ``curate run`` that stops at its usage error ends the fork server it started
    with it (``forkserver.stop``), at once: the server's imports would otherwise hold the
    command's output open, a reader of it (a pipe) waiting on them."""
    from stages.parallel import usable_cores

    if usable_cores() < 2:
        pytest.skip("no fork server where the crawl runs in one process")
    config = tmp_path / "crawl.json"
    config.write_text(json.dumps({"sources": {"a": {"url": "x"}, "b": {"url": "y"}}}))
    probe = """
import os, sys, time
from multiprocessing import forkserver
from curation_dagster import console
from curation_dagster.run import forkserver as ours

real = ours.stop

def stop():
    pid = forkserver._forkserver._forkserver_pid
    t0 = time.monotonic()
    real()
    print(pid is not None, os.path.exists(f"/proc/{pid}"), time.monotonic() - t0 < 0.5, flush=True)

def failing(argv):
    raise SystemExit(2)  # as argparse does at a usage error

ours.stop, console._main = stop, failing
sys.argv = ["curate", "run", "--workdir", sys.argv[1], "--crawl", "c", "--config", sys.argv[2]]
console.main()
"""
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "w"), str(config)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 2, done.stderr
    # It had started; it is gone, reaped, within half a second: killed, not waited for (its
    # imports take a second or more).
    assert done.stdout.split() == ["True", "False", "True"], done.stdout + done.stderr


def test_the_fork_servers_one_preload_imports_every_program_and_no_pandas_nor_dagster() -> None:
    """``run/worker_imports`` (the fork server's preload, whose ImportError multiprocessing would
    swallow): the executor and every program imported, pyarrow's pandas shim settled without pandas
    (a conversion of Python objects then imports none),
    the collector on and what they made frozen, numba's CPU target loaded; no Dagster (the
    workers describe their partitions without it, ``curation_dagster.run.values``)."""
    probe = """
import gc, sys
import curation_dagster.run.worker_imports
from stages.catalog import PROGRAMS
from tests.support.probes import dagster_modules
print(all(f"stages.programs.{name}" in sys.modules for name in PROGRAMS), "curation_dagster.run.pool" in sys.modules,
      "pandas" not in sys.modules, gc.isenabled(), gc.get_freeze_count() > 0, not dagster_modules()[1],
      "numba.np.arraymath" in sys.modules, (__import__("pyarrow").array(["a"]), "pandas" not in sys.modules)[1])
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] * 8
