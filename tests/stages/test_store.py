"""stages.store (atomic, manifest-last commits) and stages.params / CrawlSpec keys."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stages.store
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.errors import DamagedFile
from stages.execute import execute
from stages.params import (
    ExactDuplicatesParams,
    ExecutionParams,
    FilteredDocumentsParams,
    KeepParams,
    RawDocumentsParams,
    params_key,
)
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Manifest, Store
from tests.support.tiny_corpus import downstream


def manifest(**report: Any) -> Manifest:
    return Manifest(program="p", params_key="k", data_version="v", crawl="c", source="s", params={}, report=report)


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"x": pa.array(range(start, start + n), pa.int64())})


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``Store.read_text`` reads from now on (manifests), in order."""
    reads: list[str] = []
    real = Store.read_text

    def counted(self: Store, path: str) -> str | None:
        reads.append(path)
        return real(self, path)

    monkeypatch.setattr(Store, "read_text", counted)
    return reads


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "root"))
    return Store(f"memory://store-{uuid.uuid4().hex}")  # no atomic rename: the manifest is one PUT


def listing(store: Store, pdir: str) -> set[str]:
    return {p.rstrip("/").rsplit("/", 1)[-1] for p in store.fs.ls(pdir, detail=False)}


# --- commits ------------------------------------------------------------------------------------------


def test_commit_publishes_parts_with_the_manifest(store: Store) -> None:
    pdir = store.partition_dir("p", "k", "c", "s")
    w = store.writer(pdir)
    w.write("t", table(3))
    w.write("t", table(2, 3))
    w.write("empty", table(0))
    assert store.read_manifest(pdir) is None
    m = w.commit(manifest(n=5))
    assert m.rows == {"t": 5, "empty": 0} and len(m.tables["t"]) == 2
    again = store.read_manifest(pdir)
    assert again is not None and again.report == {"n": 5} and again.tables == m.tables
    assert store.read_table(pdir, "t")["x"].to_pylist() == [0, 1, 2, 3, 4]
    assert [b.num_rows for b in store.iter_batches(pdir, "t", batch_rows=2)] == [2, 1, 2]
    empty = store.read_table(pdir, "empty")
    assert empty.num_rows == 0 and empty.schema.names == ["x"]  # an empty table keeps its schema
    assert store.read_table(pdir, "never-written").num_rows == 0
    assert listing(store, pdir) == {MANIFEST, *m.tables["t"], *m.tables["empty"]}


def test_the_manifest_is_written_last(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part is complete and readable at the moment the manifest appears."""
    pdir = store.partition_dir("p", "k", "c")
    events: list[str] = []

    def check_parts() -> None:
        for name in w.tables["t"]:
            with store.fs.open(f"{pdir}/{name}", "rb") as fh:
                assert pq.read_table(fh).num_rows == 4
        events.append("manifest")

    if store.is_local:
        real_replace = os.replace

        def replace(src: str, dst: str) -> None:
            if dst.endswith(MANIFEST):
                assert store.read_manifest(pdir) is None  # not visible before the rename
                check_parts()
            real_replace(src, dst)

        monkeypatch.setattr(stages.store.os, "replace", replace)
    else:
        real_open = store.fs.open

        def fs_open(path: str, mode: str = "rb", **kw: Any) -> Any:
            if "w" in mode:
                if path.endswith(MANIFEST):
                    check_parts()
                else:
                    events.append(path.rsplit("/", 1)[-1])
            return real_open(path, mode, **kw)

        monkeypatch.setattr(store.fs, "open", fs_open)

    w = store.writer(pdir)
    w.write("t", table(4))
    w.write("t", table(4))
    w.commit(manifest())
    assert events[-1] == "manifest"
    assert store.read_manifest(pdir) is not None


def test_blocks_span_partitions_in_order_and_hold_at_most_batch_rows(store: Store) -> None:
    """``iter_blocks``: every row of every partition once, in the partitions' order; a block
    spans partitions up to ``batch_rows`` rows, a longer batch stands alone, and a block ends
    where the schema changes (a table of other columns is never joined to the one before)."""
    pdirs = []
    for i, (sizes, typ) in enumerate([([2], pa.int64()), ([1, 3], pa.int64()), ([0], pa.int64()),
                                       ([5], pa.int64()), ([1], pa.int32()), ([2], pa.int32())]):
        pdir = store.partition_dir("p", "k", "c", f"s{i}")
        w = store.writer(pdir)
        start = 10 * i
        for n in sizes:
            w.write("t", table(n, start).cast(pa.schema([("x", typ)])))
            start += n
        w.commit(manifest())
        pdirs.append(pdir)
    blocks = list(store.iter_blocks(pdirs, "t", batch_rows=4))
    assert [b.num_rows for b in blocks] == [3, 3, 4, 1, 3]  # 2+1 | 3 | 4+1 over 4 (4, then 1) | int32: 1+2
    assert [b.schema.field("x").type for b in blocks][-1] == pa.int32()
    rows = [x for b in blocks for x in b["x"].to_pylist()]
    assert rows == [0, 1, 10, 11, 12, 13, 30, 31, 32, 33, 34, 40, 50, 51]


def test_blocks_are_read_ahead_within_the_partitions_manifests_and_clock(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``iter_blocks`` reads the next block on a helper thread: it reads the manifests the
    partition holds (not again), the caller's waits count on the partition's clock as reads (the
    bytes of every block it got), a failed read reaches the caller, and a caller that stops early
    leaves no thread behind."""
    import threading

    from stages.store import manifests_held
    from stages.timing import measure

    pdirs = []
    for i in range(5):
        pdir = store.partition_dir("p", "k", "c", f"s{i}")
        w = store.writer(pdir)
        w.write("t", table(3, 10 * i))
        w.commit(manifest())
        pdirs.append(pdir)
    reads = counted_reads(monkeypatch)
    threads = threading.active_count()
    with manifests_held(), measure() as clock:
        for pdir in pdirs:
            store.read_manifest(pdir)
        held = len(reads)
        blocks = list(store.iter_blocks(pdirs, "t", batch_rows=6))
        assert len(reads) == held  # the helper read none again
        assert [x for b in blocks for x in b["x"].to_pylist()] == [10 * i + j for i in range(5) for j in range(3)]
        assert clock.read_bytes == sum(b.nbytes for b in blocks) and clock.read_s > 0
        first = next(iter(store.iter_blocks(pdirs, "t", batch_rows=3)))  # one block, then the caller stops
        assert first["x"].to_pylist() == [0, 1, 2]
    assert threading.active_count() == threads
    w = store.writer(pdirs[3])
    w.write("t", table(2))
    w.commit(manifest())
    name = store.read_manifest(pdirs[3]).tables["t"][0]  # type: ignore[union-attr]
    store.fs.pipe(f"{pdirs[3]}/{name}", b"not parquet")
    with pytest.raises(DamagedFile, match="not whole Parquet"):
        list(store.iter_blocks(pdirs, "t", batch_rows=6))
    assert threading.active_count() == threads


def test_within_manifests_held_a_manifest_is_read_once_and_a_commit_read_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manifests_held``: a partition's repeated reads of a manifest (none committed, or one)
    read the data root once; a manifest committed in the block (by this process) is read again,
    once, and nothing is held beyond the block (another process may commit meanwhile)."""
    from stages.store import manifests_held

    pdir = store.partition_dir("p", "k", "c", "s")
    reads = counted_reads(monkeypatch)
    with manifests_held():
        assert store.read_manifest(pdir) is None and store.read_manifest(pdir) is None
        assert len(reads) == 1
        w = store.writer(pdir)
        w.write("t", table(2))
        w.commit(manifest(n=2))
        read = len(reads)  # the writer reads it again under its lock (local), and after
        first = store.read_manifest(pdir)
        assert first is not None and first.report == {"n": 2} and len(reads) == read + 1
        assert store.read_manifest(pdir) is first and len(reads) == read + 1
    w = store.writer(pdir)  # a commit outside the block, as another process's
    w.write("t", table(3))
    w.commit(manifest(n=3))
    again = store.read_manifest(pdir)
    assert again is not None and again.report == {"n": 3}


def test_a_manifest_read_again_unchanged_is_not_parsed_again(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside ``manifests_held`` a manifest is read every time, but parsed again only where its
    text changed: a commit by another process is seen, an unchanged one is the same object."""
    pdir = store.partition_dir("p", "k", "c", "s")
    parsed: list[str] = []
    real = Manifest.from_json

    def counted(blob: str, path: str = MANIFEST) -> Manifest:
        parsed.append(path)
        return real(blob, path)

    monkeypatch.setattr(Manifest, "from_json", staticmethod(counted))
    stages.store._parsed.cache_clear()
    w = store.writer(pdir)
    w.write("t", table(2))
    w.commit(manifest(n=2))
    first = store.read_manifest(pdir)
    assert first is not None and first.report == {"n": 2}
    assert store.read_manifest(pdir) is first and Store(store.url(store.root)).read_manifest(pdir) is first
    assert len(parsed) == 1
    w = store.writer(pdir)  # as another process: the text changes under the same path
    w.write("t", table(3))
    w.commit(manifest(n=3))
    again = store.read_manifest(pdir)
    assert again is not None and again.report == {"n": 3} and len(parsed) == 2
    if store.is_local:  # damaged since: its text is parsed again, and refused
        (Path(pdir) / MANIFEST).write_text("{")
        with pytest.raises(DamagedFile, match="not JSON"):
            store.read_manifest(pdir)


def test_an_uncommitted_writer_leaves_nothing_visible(store: Store) -> None:
    pdir = store.partition_dir("p", "k", "c", "s")
    dead = store.writer(pdir)
    dead.write("t", table(10))  # the process dies here: no commit
    dead.close()  # (and the kernel drops its partition lock with it)
    assert store.read_manifest(pdir) is None
    with pytest.raises(FileNotFoundError):
        store.read_table(pdir, "t")
    with pytest.raises(FileNotFoundError):
        list(store.iter_batches(pdir, "t"))
    stale = set(dead.tables["t"])
    assert stale <= listing(store, pdir)
    # The rerun commits; the dead attempt's parts are cleaned up.
    w = store.writer(pdir)
    w.write("t", table(3))
    w.commit(manifest())
    assert not stale & listing(store, pdir)
    assert listing(store, pdir) == {MANIFEST, *w.tables["t"]}
    assert store.read_table(pdir, "t").num_rows == 3


def test_sizes_are_a_partitions_entries_and_their_bytes(store: Store) -> None:
    """``Store.sizes`` (the one listing behind a commit's sizes and the planner's whole-partition
    check): every entry by name, a file's bytes, None for a folder; no folder is an error."""
    pdir = store.partition_dir("p", "k", "c", "s")
    with pytest.raises(FileNotFoundError):
        store.sizes(pdir)
    w = store.writer(pdir)
    w.write("t", table(3))
    m = w.commit(manifest())
    store.fs.makedirs(f"{pdir}/sub", exist_ok=True)
    store.fs.pipe_file(f"{pdir}/sub/x", b"x")
    found = store.sizes(pdir)
    assert found == {**{n: store.fs.size(f"{pdir}/{n}") for n in [MANIFEST, *m.tables["t"]]}, "sub": None}
    assert m.sizes == {n: found[n] for n in m.tables["t"]} and all(v > 0 for v in m.sizes.values())


def test_a_commit_removes_a_leftover_folder_and_a_link_not_what_it_points_to(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    keep = tmp_path / "elsewhere"
    keep.mkdir()
    (keep / "f").write_text("mine")
    w = store.writer(pdir)
    os.makedirs(f"{pdir}/left/deeper")  # left while this attempt runs: its commit removes them
    os.symlink(keep, f"{pdir}/link")
    w.write("t", table(2))
    w.commit(manifest())
    assert listing(store, pdir) == {MANIFEST, *w.tables["t"]}
    assert (keep / "f").read_text() == "mine"


@pytest.mark.parametrize(("report", "writer"), [
    ({"kept_fraction": 0.25, "tiny": 1e-05, "one": 1.0, "zero": -0.0, "n": 2**63 - 1, "flags": [True, 1, None],
      "nested": {"b": [1, None, True], "a": "x"}}, "orjson"),
    ({"text": "é ü 中 \U0001F600", "ключ": 1}, "orjson"),  # written as UTF-8 whatever the locale
    ({"big": 2**70}, "json"),  # beyond 64 bits (orjson refuses)
    ({"mean": float("nan"), "max": float("inf")}, "json"),  # orjson would write null
    ({"lone": "\ud800"}, "json"),  # not UTF-8 (orjson refuses): escaped by the json module
    ({1: "an int key"}, "json"),  # orjson refuses it: the json module writes "1"
])
def test_a_manifest_reads_back_as_written(tmp_path: Path, report: dict[str, Any], writer: str) -> None:
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    w = store.writer(pdir)
    w.write("t", table(1))
    w.commit(Manifest("p", "k", "v", "c", "s", {}, report=report))
    blob = (Path(pdir) / MANIFEST).read_bytes().decode("utf-8")
    assert blob.startswith('{\n  "' if writer == "orjson" else '{\n "')  # orjson indents by 2, json by 1
    got = Manifest.from_json(blob).report
    expected = {str(k): v for k, v in report.items()}
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)  # NaN == NaN here
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}  # 1.0 stays a float


KILLED_ATTEMPT = """
import os, signal, sys
import pyarrow as pa
from stages.store import Store
store = Store(sys.argv[1])
w = store.writer(sys.argv[2])
w.write("t", pa.table({"x": pa.array(range(5), pa.int64())}))  # a whole part
with open(os.path.join(sys.argv[2], f"t-{w.attempt}-00001.parquet"), "wb") as fh:
    fh.write(b"PAR1 half a part")  # the process dies mid-write
    fh.flush()
with open(os.path.join(sys.argv[2], ".manifest-tmp"), "w") as fh:
    fh.write("{")
os.replace(os.path.join(sys.argv[2], ".manifest-tmp"), os.path.join(sys.argv[2], "._manifest.json.0123456789ab"))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_attempts_leftovers_are_removed_when_the_next_attempt_starts(tmp_path: Path) -> None:
    """A SIGKILLed attempt leaves a part, half a part and a manifest temporary; the next attempt
    of the partition removes them as it starts (under the partition lock), before it writes, and
    keeps every part the committed manifest names."""
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    first = store.writer(pdir)
    first.write("t", table(3))
    committed = first.commit(manifest())
    for _ in range(2):  # killed twice: leftovers never pile up
        done = subprocess.run([sys.executable, "-c", KILLED_ATTEMPT, store.root, pdir], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == -9, done.stderr
    left = listing(store, pdir) - {MANIFEST, *committed.tables["t"]}
    assert len(left) == 3 and any(n.startswith(f".{MANIFEST}.") for n in left)  # the last attempt's only
    w = store.writer(pdir)
    assert w.leftovers == sorted(left)
    assert listing(store, pdir) == {MANIFEST, *committed.tables["t"]}  # before this attempt wrote anything
    assert store.read_table(pdir, "t").num_rows == 3  # the committed partition stays readable meanwhile
    w.write("t", table(4))
    w.commit(manifest())
    assert store.read_table(pdir, "t").num_rows == 4 and listing(store, pdir) == {MANIFEST, *w.tables["t"]}


def test_parts_and_their_names_are_fsynced_before_the_manifest_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local data root: each part's bytes, then the partition folder (the parts' names), are
    fsynced before the manifest is renamed into place, and the folder again after it."""
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    w = store.writer(pdir)
    w.write("t", table(3))
    w.write("t", table(2, 3))
    m = w.commit(manifest())
    published = events.index(("replace", f"{pdir}/{MANIFEST}"))
    synced = [path for kind, path in events[:published] if kind == "fsync"]
    assert [p.rsplit("/", 1)[-1] for p in synced[:2]] == m.tables["t"]  # each part, as it is written
    assert synced[2] == pdir  # the folder with the parts' names
    assert synced[3].rsplit("/", 1)[-1].startswith(f".{MANIFEST}.")  # the manifest's own bytes
    assert events[published + 1] == ("fsync", pdir)  # the rename


def test_a_second_attempt_on_a_busy_partition_fails_at_once(store: Store) -> None:
    """A concurrent attempt on the same local partition is refused (its commit would delete the
    running attempt's parts); the lock goes with the commit, and with the process."""
    pdir = store.partition_dir("p", "k", "c", "s")
    first = store.writer(pdir)
    first.write("t", table(2))
    if store.is_local:
        with pytest.raises(stages.store.PartitionBusy, match="another attempt"):
            store.writer(pdir)
        store.writer(store.partition_dir("p", "k", "c", "other")).close()  # other partitions are free
    first.commit(manifest())
    again = store.writer(pdir)  # released by the commit
    again.close()
    if store.is_local:  # a process killed while holding the lock releases it
        script = (f"import os, sys; sys.path.insert(0, {str(Path(stages.store.__file__).parents[1])!r}); "
                  f"from stages.store import Store; w = Store({store.root!r}).writer({pdir!r}); "
                  "print('held', flush=True); os.kill(os.getpid(), 9)")
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert proc.stdout.strip() == "held" and proc.returncode == -9
        assert len(os.listdir(f"{store.root}/.locks")) == 1  # the killed attempt's lock file stays
        store.writer(pdir).close()
        assert os.listdir(f"{store.root}/.locks") == []  # until the next attempt released the partition
    assert store.read_table(pdir, "t").num_rows == 2


def test_lock_files_go_with_their_locks(tmp_path: Path) -> None:
    """``.locks`` holds a file for each partition being written, not one for each ever written."""
    store = Store(str(tmp_path / "root"))
    writers = [store.writer(store.partition_dir("p", "k", "c", f"s{i}")) for i in range(3)]
    assert len(os.listdir(f"{store.root}/.locks")) == 3
    for w in writers[:2]:
        w.write("t", table(1))
        w.commit(manifest())
    writers[2].close()  # abandoned
    with stages.store.commits_together(store):
        for i in range(3):
            w = store.writer(store.partition_dir("p", "k", "c", f"s{i}"))
            w.commit(manifest(), together=True)
        assert len(os.listdir(f"{store.root}/.locks")) == 3  # held until the pack is published
    assert os.listdir(f"{store.root}/.locks") == []


def test_a_filesystem_without_locks_keeps_no_lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "no locks here")

    monkeypatch.setattr(fcntl, "flock", flock)
    store = Store(str(tmp_path / "root"))
    w = store.writer(store.partition_dir("p", "k", "c", "s"))
    assert w._lock is None and os.listdir(f"{store.root}/.locks") == []
    w.write("t", table(1))
    w.commit(manifest())


def test_a_lock_on_a_file_removed_meanwhile_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt before releases the partition (removes its lock file, then unlocks) between
    this attempt's open of the file and its lock: this attempt locks a file no other attempt will
    open, so it opens the name again and holds the lock on the file there."""
    import fcntl

    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    other = Path(store.root, ".locks", hashlib.sha256(os.path.abspath(pdir).encode()).hexdigest()[:32])
    other.parent.mkdir(parents=True)
    other.touch()  # the other attempt's lock file
    real_flock, calls = fcntl.flock, []

    def flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the other attempt's release, just before this lock
            other.unlink()
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    w = store.writer(pdir)
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert len(calls) == 2  # locked twice: the removed file, then the one named now
    assert w._lock is not None and os.fstat(w._lock).st_ino == os.stat(w._lock_path).st_ino
    with pytest.raises(stages.store.PartitionBusy):
        store.writer(pdir)  # the lock excludes: it is on the file the name gives
    w.close()
    assert os.listdir(f"{store.root}/.locks") == []


KILLED_WITH_WORKERS = """
import os, sys, time
from stages.params import ExecutionParams
from stages.parallel import map_ordered
from stages.store import Store

def work(_: int) -> None:  # a pool worker: says it runs, then outlives its parent
    open(os.path.join(sys.argv[3], str(os.getpid())), "w").close()
    time.sleep(120)

w = Store(sys.argv[1]).writer(sys.argv[2])
for _ in map_ordered(work, range(4), ExecutionParams(workers=2)):
    pass
"""


def test_an_attempt_killed_with_pool_workers_frees_its_partition(tmp_path: Path) -> None:
    """SIGKILL to an attempt whose pool workers are busy: the workers die with it (they would wait
    on the dead pool's queue forever), and even before they do the partition is free for the retry
    (forked workers close their inherited copy of the lock)."""
    import signal
    import time

    root, pids = tmp_path / "root", tmp_path / "pids"
    pids.mkdir()
    pdir = str(root / "p" / "k" / "c")
    script = tmp_path / "attempt.py"
    script.write_text(KILLED_WITH_WORKERS)
    env = {**os.environ, "PYTHONPATH": str(Path(stages.store.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), str(root), pdir, str(pids)], env=env)
    deadline = time.monotonic() + 60
    while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [int(p) for p in os.listdir(pids)]
    assert len(workers) == 2, "the pool never started"
    with pytest.raises(stages.store.PartitionBusy):
        Store(str(root)).writer(pdir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    Store(str(root)).writer(pdir).close()  # free at once

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, workers)), "pool workers outlived their killed parent"


def test_a_busy_score_cache_is_skipped_not_fatal(tmp_path: Path) -> None:
    """While another attempt holds the heuristic score cache, filtered_documents scores without
    it (same output, no cache written); the next run fills the cache."""
    from stages.programs import filtered_documents as fd

    src = tmp_path / "src.jsonl"
    prose = "The quick brown fox jumps over the lazy dog near the river bank today. "
    src.write_text("".join(json.dumps({"id": i, "text": prose * (i + 3) if i % 2 else "#### " * 30}) + "\n"
                           for i in range(30)))
    crawl = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(src), id_field="id")})
    store = Store(str(tmp_path / "data"))
    execute(store, crawl, "raw_documents", "s")
    execute(store, crawl, "document_languages", "s")
    raw = DataRoot(store).manifest(crawl, "raw_documents", "s")
    assert raw is not None
    key = hashlib.sha256(f"{fd.H.SCORER_VERSION}/{raw.data_version}".encode()).hexdigest()[:16]
    cache = store.partition_dir(fd.SCORES, key, "c1", "s")
    holder = store.writer(cache)  # the other attempt
    out = DataRoot(store).output_dir(crawl, "filtered_documents", "s")
    busy = execute(store, crawl, "filtered_documents", "s")
    removed = store.read_table(out, "removed")
    assert store.read_manifest(cache) is None and busy.manifest.report["removed"] > 0
    holder.close()
    free = execute(store, crawl, "filtered_documents", "s", force=True)
    assert store.read_manifest(cache) is not None
    assert free.manifest.report["removed"] == busy.manifest.report["removed"]
    assert store.read_table(out, "removed").equals(removed)


def test_a_failed_rewrite_keeps_the_committed_partition(store: Store) -> None:
    pdir = store.partition_dir("p", "k", "c")
    first = store.writer(pdir)
    first.write("t", table(2))
    first.commit(manifest(v=1))
    crashed = store.writer(pdir)
    crashed.write("t", table(50))  # never committed
    crashed.close()
    m = store.read_manifest(pdir)
    assert m is not None and m.report == {"v": 1}
    assert store.read_table(pdir, "t").num_rows == 2
    # A later commit supersedes both: the old manifest's parts go too.
    third = store.writer(pdir)
    third.write("t", table(1))
    third.commit(manifest(v=3))
    assert listing(store, pdir) == {MANIFEST, *third.tables["t"]}
    assert store.read_table(pdir, "t").num_rows == 1


def test_partition_dirs_follow_the_layout(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    assert store.partition_dir("raw_documents", "abc", "c1", "news") == f"{tmp_path}/raw_documents/abc/c1/news"
    assert store.partition_dir("exact_duplicates", "abc", "c1") == f"{tmp_path}/exact_duplicates/abc/c1"


# --- keys ---------------------------------------------------------------------------------------------


def test_params_key_changes_with_params_and_version_only() -> None:
    base = FilteredDocumentsParams()
    key = params_key("filtered_documents", base)
    assert len(key) == 16 and int(key, 16) >= 0
    assert params_key("filtered_documents", FilteredDocumentsParams()) == key
    assert params_key("filtered_documents", FilteredDocumentsParams(min_words=40)) != key
    assert params_key("filtered_documents", FilteredDocumentsParams(max_lorem_ipsum=None)) != key
    assert params_key("other_program", base) != key

    class Bumped(FilteredDocumentsParams):
        version: ClassVar[int] = FilteredDocumentsParams.version + 1

    assert params_key("filtered_documents", Bumped()) != key
    up = {"raw_documents/a": "1", "raw_documents/b": "2"}
    assert params_key("p", base, up) == params_key("p", base, dict(reversed(up.items())))
    assert params_key("p", base, up) != params_key("p", base, {**up, "raw_documents/b": "3"})


def two_sources(tmp_path: Path, **extra: Any) -> CrawlSpec:
    return CrawlSpec(crawl="c1", sources={
        "a": RawDocumentsParams(url=str(tmp_path / "a")), "b": RawDocumentsParams(url=str(tmp_path / "b"))}, **extra)


def changed(a: CrawlSpec, b: CrawlSpec) -> set[tuple[str, str | None]]:
    ka, kb = a.keys(), b.keys()
    assert ka.keys() == kb.keys()
    return {part for part in ka if ka[part] != kb[part]}


def test_a_changed_param_rekeys_that_program_and_everything_downstream(tmp_path: Path) -> None:
    base = two_sources(tmp_path)
    every = set(base.keys())
    thresholds = two_sources(tmp_path, params={"filtered_documents": {"min_words": 10}})
    assert {p for p, _ in changed(base, thresholds)} == downstream("filtered_documents")
    assert changed(base, thresholds) == {part for part in every if part[0] in downstream("filtered_documents")}
    assert not {part for part in changed(base, thresholds) if part[0] == "raw_documents"}

    lowercase = two_sources(tmp_path, params={"exact_duplicates": {"lowercase": True}})
    assert {p for p, _ in changed(base, lowercase)} == downstream("exact_duplicates")

    keep = two_sources(tmp_path, keep=KeepParams(source_priority={"a": 0, "b": 1}))
    assert {p for p, _ in changed(base, keep)} == downstream(*(n for n, p in PROGRAMS.items() if p.uses_keep_rule))

    no_exact = two_sources(tmp_path, stages=tuple(s for s in base.stages if s != "exact"))
    assert {p for p, _ in changed(base, no_exact)} == downstream("exact_duplicates")


def test_a_changed_source_rekeys_only_its_partitions_and_the_crawl_level(tmp_path: Path) -> None:
    base = two_sources(tmp_path)
    moved = CrawlSpec(crawl="c1", sources={
        "a": RawDocumentsParams(url=str(tmp_path / "a2")), "b": RawDocumentsParams(url=str(tmp_path / "b"))})
    diff = changed(base, moved)
    assert ("raw_documents", "a") in diff and ("filtered_documents", "a") in diff
    assert ("raw_documents", "b") not in diff and ("filtered_documents", "b") not in diff
    assert ("exact_duplicates", None) in diff and ("removal_ledger", None) in diff
    assert ("curated_documents", "b") in diff  # it reads the crawl-wide removal lists


def test_execution_params_change_neither_keys_nor_results(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text("".join(f'{{"id": {i}, "text": "document number {i}"}}\n' for i in range(25)))
    crawl = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(src), id_field="id")})
    store = Store(str(tmp_path / "data"))
    first = execute(store, crawl, "raw_documents", "s", ExecutionParams(batch_rows=4))
    assert not first.skipped and len(first.manifest.tables["documents"]) == 7
    again = execute(store, crawl, "raw_documents", "s", ExecutionParams(batch_rows=1000, workers=3))
    assert again.skipped and again.manifest.params_key == first.manifest.params_key
    pdir = DataRoot(store).output_dir(crawl, "raw_documents", "s")
    small = store.read_table(pdir, "documents")
    forced = execute(store, crawl, "raw_documents", "s", ExecutionParams(batch_rows=1000), force=True)
    assert not forced.skipped and forced.manifest.params_key == first.manifest.params_key
    assert forced.manifest.data_version == first.manifest.data_version
    assert store.read_table(pdir, "documents").equals(small)
    assert "batch_rows" not in first.manifest.params
    assert set(ExecutionParams.model_fields) & set(RawDocumentsParams.model_fields) == set()


def test_a_changed_input_file_changes_the_data_version_not_the_key(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text('{"text": "one"}\n')
    crawl = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(src))})
    store = Store(str(tmp_path / "data"))
    first = execute(store, crawl, "raw_documents", "s")
    src.write_text('{"text": "one"}\n{"text": "two"}\n')
    second = execute(store, crawl, "raw_documents", "s")
    assert not second.skipped and second.manifest.params_key == first.manifest.params_key
    assert second.manifest.data_version != first.manifest.data_version
    assert second.manifest.report["documents"] == 2


def test_params_are_strict_and_frozen() -> None:
    with pytest.raises(ValueError):
        ExactDuplicatesParams(unknown=1)  # type: ignore[call-arg]  # a typo must not be ignored
    with pytest.raises(ValueError):
        ExactDuplicatesParams().lowercase = True  # type: ignore[misc]


@pytest.mark.parametrize(("first", "named", "expected"), [
    ("stages", None, "jemalloc"),  # the environment names it before pyarrow's import
    ("pyarrow", None, "jemalloc"),  # pyarrow imported first: its default pool set
    ("stages", "system", "system"),  # a pool the environment names stays
    ("pyarrow", "system", "system"),
])
def test_importing_stages_makes_arrow_allocate_from_jemalloc(first: str, named: str | None, expected: str) -> None:
    """``stages._arrow_allocator``, in a fresh process: pyarrow's default pool after ``stages``
    is imported, and the environment its child processes inherit."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    if sys.platform != "linux" and first == "stages" and named is None:
        pytest.skip("named in the environment on Linux only")
    probe = (f"import os, {first}, stages, pyarrow as pa; "
             "print(pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if named:
        env["ARROW_DEFAULT_MEMORY_POOL"] = named
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected, expected]


@pytest.mark.parametrize(("name", "default"), [("OMP_WAIT_POLICY", "PASSIVE"), ("OPENBLAS_THREAD_TIMEOUT", "4")])
@pytest.mark.parametrize("named", [None, "7"])
def test_importing_stages_puts_idle_kernel_threads_to_sleep(name: str, default: str, named: str | None) -> None:
    """``stages._openmp_waits`` and ``_openblas_waits``, in a fresh process: the setting named in
    the environment before numpy's import (OpenBLAS reads it as it loads) and inherited by the
    processes started from it, unless the environment names one already."""
    child = f"import os; print(os.environ[{name!r}])"
    probe = (f"import os, sys, subprocess, stages; loaded = 'numpy' in sys.modules; import numpy; "
             f"child = subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout; "
             f"print(loaded, os.environ[{name!r}], child.strip())")
    env = {k: v for k, v in os.environ.items() if k != name}
    if named:
        env[name] = named
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", named or default, named or default]
