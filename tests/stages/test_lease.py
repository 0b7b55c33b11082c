"""One writer per partition on S3 too: the lease of ``stages.lease`` on moto's S3 server (which
checks If-None-Match and If-Match as S3 does), through ``PartitionWriter`` and ``execute``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import stages.execute
import stages.store
from stages import params as P
from stages.dataroot import DataRoot
from stages.execute import execute
from stages.resolve import load_program, resolve_task
from stages.spec import CrawlSpec
from stages.store import Manifest, PartitionBusy, Store
from tests.support.moto_s3 import moto_s3

TTL = 2.0  # seconds: a live writer renews every 0.5 s


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, dict[str, Any]]]:
    """A Store on a fresh bucket (moto keeps buckets across servers of one process)."""
    monkeypatch.setenv("CURATE_LEASE_TTL_S", str(TTL))
    bucket = f"lease-{uuid.uuid4().hex[:12]}"
    with moto_s3(bucket, "lease-key", "lease-secret") as (options, _fs):
        yield Store(f"s3://{bucket}/root", options), options


def manifest(note: str) -> Manifest:
    return Manifest(program="p", params_key="k", data_version=note, crawl="c", source="s", params={},
                    report={"note": note})


def rows(n: int) -> pa.Table:
    return pa.table({"x": pa.array(range(n), pa.int64())})


def test_a_second_writer_of_a_live_partition_is_refused_then_admitted(s3: tuple[Store, dict[str, Any]]) -> None:
    store, _ = s3
    pdir = store.partition_dir("p", "k", "c", "s")
    first = store.writer(pdir)
    first.write("t", rows(3))
    started = time.monotonic()
    with pytest.raises(PartitionBusy, match=r"being written by another attempt.*lease held by"):
        store.writer(pdir)
    assert time.monotonic() - started < TTL  # refused after one renewal period, not at expiry
    store.writer(store.partition_dir("p", "k", "c", "other")).close()  # other partitions are free
    time.sleep(TTL * 1.5)  # past the first lease's original expiry: it is renewed, still held
    with pytest.raises(PartitionBusy):
        store.writer(pdir)
    first.commit(manifest("first"))
    again = store.writer(pdir)  # released with the commit: admitted at once
    again.write("t", rows(5))
    again.commit(manifest("second"))
    assert store.read_table(pdir, "t").num_rows == 5 and store.read_manifest(pdir).report == {"note": "second"}
    store.fs.invalidate_cache()
    assert store.fs.find(f"{store.root}/.locks") == []  # every lease released


HOLD_AND_DIE = """
import os, sys
from stages.store import Store
store = Store(sys.argv[1], {"endpoint_url": sys.argv[2]})
w = store.writer(sys.argv[3])
w.write("t", __import__("pyarrow").table({"x": [1, 2]}))
print("held", flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_killed_writers_lease_is_taken_over_once_expired(s3: tuple[Store, dict[str, Any]], tmp_path: Path) -> None:
    """SIGKILLed mid-partition (a lost pod): its retry waits out the lease (at most its TTL)
    instead of failing, and commits whole; the dead attempt's parts are not in the manifest."""
    store, options = s3
    pdir = store.partition_dir("p", "k", "c", "s")
    env = {"CURATE_LEASE_TTL_S": str(TTL), "AWS_ACCESS_KEY_ID": "lease-key", "AWS_SECRET_ACCESS_KEY": "lease-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(stages.store.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, f"s3://{store.root}", options["endpoint_url"], pdir],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "held" and proc.returncode == -9, proc.stderr[-2000:]
    started = time.monotonic()
    retry = store.writer(pdir)
    waited = time.monotonic() - started
    assert 0 < waited <= TTL * 1.5 + 1.0, waited
    retry.write("t", rows(4))
    retry.commit(manifest("retry"))
    m = store.read_manifest(pdir)
    assert m is not None and m.report == {"note": "retry"} and store.read_table(pdir, "t").num_rows == 4
    assert all(retry.attempt in name for name in m.tables["t"])
    assert len(retry.leftovers) == 1  # the dead attempt's part, removed when the retry took over
    assert set(store.fs.ls(pdir, detail=False)) == {f"{pdir}/{n}" for n in ["_manifest.json", *m.tables["t"]]}


def test_a_writer_that_lost_its_lease_never_publishes(s3: tuple[Store, dict[str, Any]]) -> None:
    """A writer stalled past its expiry (its renewals stopped) loses the partition to a taker;
    its commit then fails and the taker's output is what the partition holds."""
    store, _ = s3
    pdir = store.partition_dir("p", "k", "c", "s")
    stalled = store.writer(pdir)
    stalled.write("t", rows(7))
    assert stalled._lease is not None
    stalled._lease._stop.set()  # the renewal thread stops, as in a process frozen for > TTL
    stalled._lease._thread.join()  # type: ignore[union-attr]
    taker = store.writer(pdir)  # waits out the stalled lease, then takes it over
    taker.write("t", rows(2))
    with pytest.raises(PartitionBusy, match="lease expired and another attempt took the partition over"):
        stalled.commit(manifest("stalled"))
    assert store.read_manifest(pdir) is None  # nothing published by the stalled attempt
    taker.commit(manifest("taker"))
    m = store.read_manifest(pdir)
    assert m is not None and m.report == {"note": "taker"} and store.read_table(pdir, "t").num_rows == 2


def test_two_concurrent_attempts_of_one_partition_commit_once(
    s3: tuple[Store, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``execute`` of one ingestion partition at once (automation and ``curate submit`` on one
    crawl): one commits, the other is refused with PartitionBusy; the partition reads whole."""
    store, options = s3
    src = tmp_path / "web"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} " + "word " * 20}) + "\n"
                                         for i in range(2000)))
    spec = CrawlSpec(crawl="c1", sources={"web": P.RawDocumentsParams(url=str(src))}, stages=("exact",))
    DataRoot.open(f"s3://{store.root}", options=options).register(spec)
    outcomes: list[str] = []
    # The first attempt holds the partition (inside its program) until the second has tried.
    real, entered, tried = load_program("raw_documents"), threading.Event(), threading.Event()

    class Held:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def run(self, *args: Any) -> dict[str, Any]:
            entered.set()
            tried.wait(60)
            return real.run(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(stages.execute, "load_program", lambda name: Held())

    def attempt() -> None:
        try:
            execute(store, spec, "raw_documents", "web", P.ExecutionParams(workers=1))
            outcomes.append("committed")
        except PartitionBusy:
            outcomes.append("busy")
        finally:
            tried.set()

    first = threading.Thread(target=attempt)
    first.start()
    assert entered.wait(60)
    attempt()  # the second, while the first runs
    first.join(timeout=120)
    assert sorted(outcomes) == ["busy", "committed"], outcomes
    task = resolve_task(store, spec, "raw_documents", "web")
    m = store.read_manifest(task.output_dir)
    assert m is not None and m.report["documents"] == 2000
    assert store.read_table(task.output_dir, "documents").num_rows == 2000


def test_a_store_that_ignores_preconditions_gets_no_lease(
    s3: tuple[Store, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3-compatible store that ignored If-None-Match would grant every attempt the lease, and
    each would remove the other's parts as leftovers: probed once per bucket, it gets none."""
    store, _ = s3
    real = store.fs.pipe_file

    def ignoring(path: str, data: bytes, **kwargs: Any) -> Any:
        kwargs.pop("IfNoneMatch", None)
        kwargs.pop("IfMatch", None)
        return real(path, data, **kwargs)

    monkeypatch.setattr(store.fs, "pipe_file", ignoring)
    pdir = store.partition_dir("p", "k", "c", "s")
    first, second = store.writer(pdir), store.writer(pdir)
    assert first._lease is None and second._lease is None and first.leftovers == second.leftovers == []
    first.write("t", rows(1))
    second.close()
    first.commit(manifest("first"))
    assert store.read_table(pdir, "t").num_rows == 1
