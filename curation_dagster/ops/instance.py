"""The workdir's Dagster instance: ``<workdir>/dagster/dagster.yaml``, written for a new workdir.

A new workdir's storages are copied from a template (``seed_storages``): a SQLite instance that
Dagster created and migrated once per Dagster version, kept in the user's cache folder. Creating
one from nothing runs ~60 DDL statements and Dagster's data migrations, each committed on its own:
~1.4 s of a fresh ``curate run`` on an idle 2-core machine, against milliseconds to copy.

The embedded default is SQLite in that folder with runs in-process, and one event-log database
for all runs on pooled connections (``curation_dagster.ops.event_log.PooledSqliteEventLogStorage``):
Dagster's default opens a new database per run (~0.4 s each), and its consolidated one a new
connection per statement (~12 ms per stored event). That storage takes an absolute path, so a
workdir that was copied or moved gets its file pointed at its own folder again, and a file an
earlier version wrote gets this version's storage (only a file this module wrote; an edited one
is left alone).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

HEADER = "# The embedded default: SQLite storage in this folder, runs in-process (written by curate)."
DAGSTER_YAML = HEADER + """
telemetry:
  enabled: false
# One event-log database for all runs, on pooled connections: the default opens a new database
# per run (~0.4 s), Dagster's consolidated storage a new connection per statement (~12 ms an event).
event_log_storage:
  module: curation_dagster.ops.event_log
  class: PooledSqliteEventLogStorage
  config:
    base_dir: {history}
"""
# The package path of this storage before curation_dagster's modules moved into folders by role
# (event_log.py into ops/): a workdir made before then names it so, a module no longer there.
PRE_LAYOUT_MODULE = "curation_dagster" + ".event_log"  # two literals: no path rewrite touches it
# What earlier versions wrote: recognized as ours, and rewritten with this version's storage.
EARLIER_YAML = (DAGSTER_YAML.replace("module: curation_dagster.ops.event_log", f"module: {PRE_LAYOUT_MODULE}"),
                HEADER + """
telemetry:
  enabled: false
# One event-log database for all runs: the default opens a new database per run, which costs
# ~0.4 s per run, and a crawl is dozens of short runs (one per asset partition).
event_log_storage:
  module: dagster._core.storage.event_log
  class: ConsolidatedSqliteEventLogStorage
  config:
    base_dir: {history}
""",)
_BASE_DIR = re.compile(r"^    base_dir: (.*)$", re.MULTILINE)


def _render(home: Path) -> str:
    return DAGSTER_YAML.format(history=json.dumps(str(home / "history")))  # a YAML double-quoted string


LOCK_FILE = ".curate-instance.lock"


@contextmanager
def instance_lock(home: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive ``flock`` of the instance in ``home`` (``<home>/.curate-instance.lock``).

    Creating the instance (writing ``dagster.yaml``, the SQLite storages stamping their alembic
    version) and adding dynamic partitions are each a check-then-write: two processes doing one
    at once leave a database with two alembic heads (every later run on the workdir fails) or
    fail on a UNIQUE constraint. The kernel drops the lock when its holder dies."""
    folder = Path(home)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks: the holder's work takes well under a second
        yield
    finally:
        os.close(fd)  # drops the lock


def ensure_instance_config(home: Path) -> Path:
    """Create ``home`` and its ``dagster.yaml`` if missing, or re-point a copied one; returns home.
    Under the instance lock, and the file replaced whole: a process starting at the same time
    never reads half of it."""
    home = Path(home).resolve()
    with instance_lock(home):
        path = home / "dagster.yaml"
        want = _render(home)
        if not path.exists():
            _write_whole(path, want)
            seed_storages(home)
            return home
        text = path.read_text()
        found = _BASE_DIR.search(text)
        ours = found is not None and any(text == t.format(history=found.group(1))
                                         for t in (DAGSTER_YAML, *EARLIER_YAML))
        if text != want and ours:
            _write_whole(path, want)  # ours, for another folder (the workdir was copied or moved) or version
    return home


# The SQLite databases of the embedded instance, relative to its home: what a template holds.
STORAGES = ("history/runs.db", "history/event_log.db", "schedules/schedules.db")
# The schema of our own storages (``curation_dagster.ops.event_log``'s tables and indexes): part of
# the template's cache key, raised with any change to them, so no template built before is used.
STORAGE_SCHEMA = 1


def template_home() -> Path:
    """Where this Dagster version's template instance lives: ``$XDG_CACHE_HOME`` (else
    ``~/.cache``) ``/curation-dagster/instance-<dagster version>-<digest of dagster.yaml and
    STORAGE_SCHEMA>``, so another Dagster, another storage configuration or another schema of our
    own storage never gets a template built for this one. The version is the installed
    distribution's: importing ``dagster.version`` imports all of Dagster (0.5-0.7 s), which a
    crawl's first ``curate run`` would wait for before its first partition started."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        dagster_version = version("dagster")
    except PackageNotFoundError:  # importable without its distribution's metadata (a source tree)
        from dagster.version import __version__ as dagster_version
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(f"{DAGSTER_YAML}\nschema {STORAGE_SCHEMA}".encode()).hexdigest()[:12]
    return cache / "curation-dagster" / f"instance-{dagster_version}-{digest}"


def _template() -> Path | None:
    """The template instance's home, built first when missing; None where it cannot be (a
    read-only cache folder): the caller then lets Dagster create its storages as usual.

    Built in a folder of its own and renamed into place whole, so a process that finds the
    folder finds every database in it, checkpointed (no write-ahead log beside it). A folder found
    incomplete (an older version's, a hand-edited one) is moved aside for the new build, not
    rebuilt beside by every new workdir."""
    folder = template_home()
    if all((folder / name).is_file() for name in STORAGES):
        return folder
    from dagster import DagsterInstance

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    except OSError:
        return None
    try:
        (build / "dagster.yaml").write_text(_render(build))
        DagsterInstance.from_config(str(build)).dispose()
        for name in STORAGES:
            with sqlite3.connect(build / name) as con:  # the WAL's pages into the database file
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            con.close()
        (build / "dagster.yaml").unlink()  # it names the build folder; only the databases are copied
        if folder.exists() and not all((folder / name).is_file() for name in STORAGES):
            aside = Path(tempfile.mkdtemp(prefix=".incomplete-", dir=folder.parent))
            try:
                os.rename(folder, aside / "instance")
            except OSError:  # another process moved it first
                pass
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(build, folder)
        except OSError:  # another process renamed its own first: use that one
            pass
        return folder if all((folder / name).is_file() for name in STORAGES) else None
    except Exception:  # a template is an optimisation: without one, Dagster creates the databases
        return None
    finally:
        shutil.rmtree(build, ignore_errors=True)


def seed_storages(home: Path) -> None:
    """Copy the template's databases into a new instance ``home`` (none of them there yet); the
    caller holds the instance lock. Each file is copied to a temporary name and renamed, so a
    database is there whole or not at all; where no template can be had, nothing is copied."""
    if any((home / name).exists() for name in STORAGES):
        return
    template = _template()
    if template is None:
        return
    for name in STORAGES:
        target = home / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copyfile(template / name, tmp)
        os.replace(tmp, target)


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def open_instance(home: str | os.PathLike[str]) -> DagsterInstance:
    """The Dagster instance in ``home`` (its ``dagster.yaml`` written first when missing), created
    exactly once whatever else opens it at the same time: the storages are built (their databases
    created and stamped) under the instance lock."""
    from dagster import DagsterInstance

    folder = ensure_instance_config(Path(home))
    with instance_lock(folder):
        try:
            return DagsterInstance.from_config(str(folder))
        except Exception as exc:  # a dagster.yaml edited into nonsense, a database file that is not one
            raise _damaged(folder, exc) from exc


def _damaged(folder: Path, exc: Exception) -> Exception:
    """``exc`` from opening the instance in ``folder`` as a ``DamagedFile`` naming where it came
    from: the folder for a storage error (a database file that is not one), else ``dagster.yaml``
    (YAML, config and import errors of the classes it names)."""
    from stages.errors import DamagedFile

    name = type(exc).__name__
    if type(exc).__module__.split(".")[0] in ("sqlalchemy", "sqlite3", "alembic"):
        return DamagedFile(str(folder), "Dagster instance storage", f"{name}: {exc}")
    return DamagedFile(str(folder / "dagster.yaml"), "Dagster instance config", f"{name}: {exc}")


def add_partitions(instance: DagsterInstance, keys: Mapping[str, Sequence[str]]) -> None:
    """Add each dynamic partitions definition's ``keys`` (name -> partition keys) that the instance
    does not hold yet, under the lock of its home: Dagster's ``add_dynamic_partitions`` reads
    then inserts, and two processes adding the same key at once fail on a UNIQUE constraint."""
    with instance_lock(instance.root_directory):
        for name, wanted in keys.items():
            known = set(instance.get_dynamic_partitions(name))
            new = [key for key in dict.fromkeys(wanted) if key not in known]
            if new:
                instance.add_dynamic_partitions(name, new)


def workdir_of(home: str | Path) -> Path | None:
    """The workdir whose instance ``home`` is (``<workdir>/dagster`` with a ``dagster.yaml`` that
    ``ensure_instance_config`` wrote), else None."""
    path = Path(home) / "dagster.yaml"
    try:
        written = path.read_text().startswith(HEADER)
    except OSError:
        return None
    return Path(home).resolve().parent if written and Path(home).name == "dagster" else None
