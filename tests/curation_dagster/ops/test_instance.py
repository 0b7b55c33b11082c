"""One instance per workdir, created exactly once whatever runs at the same time (issue 30).

Two processes opening a fresh workdir's instance at the same moment used to leave a SQLite
storage with two alembic heads in about half the trials (every later ``curate run`` then failed
with "Version table 'alembic_version' has more than one head present"), or one of them failed on
``UNIQUE constraint failed: dynamic_partitions``. Each trial here is a fresh instance home opened
by two processes released at the same instant; 20 trials catch a 50% failure with probability
1 - 2^-20.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from curation_dagster.defs.partitions import CRAWL, SOURCE
from curation_dagster.ops.instance import (
    LOCK_FILE,
    STORAGES,
    add_partitions,
    instance_lock,
    open_instance,
    template_home,
)

TRIALS = 20
LEAD_S = 0.2  # a trial's instant, this long after the test sends it: both processes are waiting by then
SPIN_S = 0.005  # the last of the wait spun, not slept: a wake-up can be late by a scheduler tick
DEADLINE_S = 300  # both processes are killed after this: a trial that hangs fails, not the suite

# One process of each pair: imports what `curate run` imports to open an instance (as
# curation_dagster.run.in_process.run_crawl does), says "ready", then for each line it reads (a
# trial's instant, time.time()) opens the next home at that instant and prints one JSON line: how
# late it left the wait (s), and "ok" or the error. The test sends the next instant once both have
# answered, so a trial takes as long as opening an instance, and the processes spin only for the
# last few milliseconds of each wait (20 trials of two processes spinning through fixed
# one-second slots held both cores for ~28 s).
WORKER = """
import json, sys, time
from curation_dagster.ops.instance import add_partitions, open_instance
from curation_dagster.defs.partitions import CRAWL, SOURCE
homes, spin = json.loads(sys.argv[1]), float(sys.argv[2])
print(json.dumps("ready"), flush=True)
for home, line in zip(homes, sys.stdin):
    instant = float(line)
    time.sleep(max(0.0, instant - time.time() - spin))
    while time.time() < instant:
        pass  # spin: both processes leave the wait within microseconds of each other
    late = time.time() - instant
    try:
        instance = open_instance(home)
        add_partitions(instance, {CRAWL: ["c1"], SOURCE: ["news", "wiki", "forum"]})
        instance.get_runs(limit=1)
        print(json.dumps([late, "ok"]), flush=True)
    except Exception as exc:
        print(json.dumps([late, f"{type(exc).__name__}: {exc}"[:300]]), flush=True)
"""


def alembic_heads(home: Path) -> dict[str, int]:
    """Rows of ``alembic_version`` in each SQLite database of the instance (one = one head)."""
    out = {}
    for db in sorted(home.rglob("*.db")):
        with sqlite3.connect(db) as con:
            try:
                out[str(db.relative_to(home))] = con.execute("select count(*) from alembic_version").fetchone()[0]
            except sqlite3.OperationalError:  # no alembic table (the event log's own index shards)
                continue
    return out


@pytest.mark.slow  # 20 trials of two processes: ~10 s
def test_two_processes_on_a_fresh_workdir_create_one_instance(tmp_path: Path) -> None:
    homes = [str(tmp_path / f"w{i}" / "dagster") for i in range(TRIALS)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    errs = [tmp_path / f"stderr{i}.txt" for i in range(2)]  # files: a pipe read only at the end can fill up
    procs = []
    for path in errs:
        with path.open("w") as err:
            cmd = [sys.executable, "-c", WORKER, json.dumps(homes), str(SPIN_S)]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                          env=env))
    deadline = threading.Timer(DEADLINE_S, lambda: [proc.kill() for proc in procs])
    deadline.start()
    answers: list[list[Any]] = [[], []]
    try:
        ready = [json.loads(proc.stdout.readline() or "null") for proc in procs]
        for _ in homes if ready == ["ready"] * 2 else ():
            instant = time.time() + LEAD_S
            for proc in procs:
                proc.stdin.write(f"{instant!r}\n")
                proc.stdin.flush()
            for proc, got in zip(procs, answers, strict=True):
                got.append(json.loads(proc.stdout.readline() or "null"))
    finally:
        deadline.cancel()
        for proc in procs:
            proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    stderr = [path.read_text()[-3000:] for path in errs]
    assert ready == ["ready"] * 2 and [proc.returncode for proc in procs] == [0, 0], stderr
    assert [[a and a[1] for a in got] for got in answers] == [["ok"] * TRIALS] * 2, stderr
    # the trials were simultaneous: in most, both processes left the wait within 10 ms of the instant
    together = sum(max(a[0], b[0]) < 0.010 for a, b in zip(*answers, strict=True))
    assert together >= TRIALS // 2, answers
    for home in homes:
        heads = alembic_heads(Path(home))
        assert heads and all(n <= 1 for n in heads.values()), (home, heads)
        assert {"runs.db", "schedules/schedules.db"} <= set(heads) or any(n == 1 for n in heads.values())
        instance = open_instance(home)  # and it opens again, with each partition once
        assert instance.get_dynamic_partitions(CRAWL) == ["c1"]
        assert sorted(instance.get_dynamic_partitions(SOURCE)) == ["forum", "news", "wiki"]
        assert instance.get_runs(limit=1) == []


def test_adding_partitions_twice_adds_each_once(tmp_path: Path) -> None:
    instance = open_instance(tmp_path / "dagster")
    add_partitions(instance, {SOURCE: ["b", "a", "a"]})
    add_partitions(instance, {SOURCE: ["a", "c"], CRAWL: ["c1"]})
    assert sorted(instance.get_dynamic_partitions(SOURCE)) == ["a", "b", "c"]
    assert instance.get_dynamic_partitions(CRAWL) == ["c1"]
    assert (tmp_path / "dagster" / LOCK_FILE).exists()


def test_the_instance_lock_excludes_another_process(tmp_path: Path) -> None:
    """While one process holds the lock, another waits for it (and gets it once it is released)."""
    home = tmp_path / "dagster"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    code = ("import sys, time; from curation_dagster.ops.instance import instance_lock\n"
            "t = time.time()\nwith instance_lock(sys.argv[1]): print(time.time() - t)")
    with instance_lock(home):
        proc = subprocess.Popen([sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(3)
        assert proc.poll() is None  # still waiting
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and float(out) > 0.5


# Rows of alembic_version as Dagster leaves a new instance: its consolidated event log stamps none.
AS_DAGSTER_STAMPS = {"history/event_log.db": 0, "history/runs.db": 1, "schedules/schedules.db": 1}


def schema(home: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Every table and index (type, name, SQL) of each database of an instance."""
    out = {}
    for name in STORAGES:
        with sqlite3.connect(home / name) as con:
            out[name] = con.execute("select type, name, sql from sqlite_master order by name").fetchall()
        con.close()
    return out


def test_a_new_home_gets_the_templates_databases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first new home builds the template (in the cache folder), every later one copies it:
    the same migrated databases, one alembic head each, and an instance that works."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = template_home()
    assert template.parent == tmp_path / "cache" / "curation-dagster"
    first = open_instance(tmp_path / "a" / "dagster")
    assert sorted(str(p.relative_to(template)) for p in template.rglob("*") if p.is_file()) == sorted(STORAGES)
    assert [p.name for p in template.parent.iterdir()] == [template.name]  # no build folder left
    built = {name: (template / name).stat().st_mtime_ns for name in STORAGES}
    second = open_instance(tmp_path / "b" / "dagster")
    assert {name: (template / name).stat().st_mtime_ns for name in STORAGES} == built  # copied, not rebuilt
    for home in (tmp_path / "a" / "dagster", tmp_path / "b" / "dagster"):
        assert alembic_heads(home) == AS_DAGSTER_STAMPS
        assert schema(home) == schema(template)
    add_partitions(second, {CRAWL: ["c1"]})
    assert second.get_dynamic_partitions(CRAWL) == ["c1"] and first.get_dynamic_partitions(CRAWL) == []
    assert second.get_runs(limit=1) == []


def test_an_incomplete_template_is_replaced_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template folder found without all its databases is moved aside and the new build put in
    its place: the next new home copies it, and its key holds our storages' schema."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = template_home()
    (template / "history").mkdir(parents=True)
    (template / "history" / "runs.db").write_bytes(b"")  # the others missing
    open_instance(tmp_path / "a" / "dagster")
    assert all((template / name).is_file() for name in STORAGES)
    assert [p.name for p in template.parent.iterdir()] == [template.name]  # nothing left aside
    assert all((tmp_path / "a" / "dagster" / name).is_file() for name in STORAGES)
    built = {name: (template / name).stat().st_mtime_ns for name in STORAGES}
    open_instance(tmp_path / "b" / "dagster")
    assert {name: (template / name).stat().st_mtime_ns for name in STORAGES} == built  # copied, not rebuilt
    monkeypatch.setattr("curation_dagster.ops.instance.STORAGE_SCHEMA", 2)
    assert template_home() != template


def test_without_a_template_dagster_creates_the_databases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder that cannot be written (here: a file where the folder should be) costs the
    template, not the instance."""
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    instance = open_instance(tmp_path / "dagster")
    add_partitions(instance, {SOURCE: ["a"]})
    assert instance.get_dynamic_partitions(SOURCE) == ["a"]
    assert alembic_heads(tmp_path / "dagster") == AS_DAGSTER_STAMPS
    # and what Dagster created is what a template holds, table for table, index for index
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    open_instance(tmp_path / "seeded")
    assert schema(tmp_path / "dagster") == schema(tmp_path / "seeded") == schema(template_home())
