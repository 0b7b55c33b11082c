"""Partitions run ahead are held back from their step while this run's workers fill the cores and
have them to themselves (``curation_dagster.run.pool._Hold``): the run's process records them
once a core is free, a hold has lasted ``_HOLD_S``, or the workers are seen waiting for a core
(another program's), and never loses or repeats one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from curation_dagster.run import pool as pool_module
from curation_dagster.run.done import Done
from curation_dagster.run.pool import PartitionPool, _Ahead, _Hold, _waited_s
from stages.store import Store
from tests.support.pools import many_sources, registered

pytestmark = pytest.mark.skipif(not Path("/proc/self/schedstat").exists(),
                                reason="a process's waits for a core are read from /proc/PID/schedstat")


class _Pool:
    """What a hold asks of its pool: whether the workers' packs fill the cores, the workers, and
    when a hold last found them contended."""

    def __init__(self, busy: int, pids: list[int], cores: int = 2) -> None:
        self.busy, self.pids, self.cores = busy, pids, cores
        self._contended_at: float | None = None

    def _full(self) -> bool:
        return self.busy >= self.cores

    def _worker_pids(self) -> list[int]:
        return self.pids


@contextmanager
def _processes(code: str, n: int = 2) -> Iterator[list[int]]:
    """``n`` Python processes running ``code`` once each has started (its start, a wait for a core
    on a loaded machine, is behind it: it prints a line first)."""
    procs = [subprocess.Popen([sys.executable, "-c", f"print(flush=True)\n{code}"], stdout=subprocess.PIPE)
             for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def sleeping() -> Iterator[list[int]]:
    """Two processes that never want a core: they wait for none."""
    with _processes("import time; time.sleep(120)") as pids:
        yield pids


@pytest.fixture
def spinning_on_one_core() -> Iterator[list[int]]:
    """Two busy processes on one core: each waits for it about half the time, whatever else runs."""
    with _processes("while True: pass") as pids:
        core = min(os.sched_getaffinity(0))
        for pid in pids:
            os.sched_setaffinity(pid, {core})
        yield pids


def _done(source: str) -> Done:
    return Done("raw_documents", source, error="held")


def test_what_is_held_waits_while_the_workers_fill_the_cores(sleeping: list[int],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _Pool(busy=2, pids=sleeping)
    hold = _Hold(pool)  # type: ignore[arg-type]
    assert not hold.holds()  # nothing held
    hold.add([_done("a")])
    assert hold.holds()  # the first look at the workers' waits: not known yet
    time.sleep(0.15)
    assert hold.holds()  # a window seen: they waited for no core
    hold.add([_done("b")])
    pool.busy = 1  # a core free of this run's packs: held on while the next step may be handed over
    assert hold.holds()
    pool.busy = 2  # it was: the cores full again
    assert hold.holds()
    pool.busy = 1
    assert hold.holds()
    time.sleep(pool_module._FREE_S + 0.01)  # free that long: recorded now
    assert not hold.holds()
    assert [d.source for d in hold.take()] == ["a", "b"] and hold.done == [] and not hold.holds()
    pool.busy = 2
    monkeypatch.setattr(pool_module, "_HOLD_S", 0.0)  # held as long as a hold may be
    hold.add([_done("c")])
    assert not hold.holds()
    monkeypatch.setattr(pool_module, "_HOLD_S", 60.0)
    pool.pids = []  # no worker started: nothing to look at
    assert not hold.holds()


def test_workers_waiting_for_a_core_are_contended_and_nothing_is_held(spinning_on_one_core: list[int]) -> None:
    waited = _waited_s(spinning_on_one_core)
    time.sleep(0.3)
    later = _waited_s(spinning_on_one_core)
    assert waited is not None and later is not None and later - waited > 0.1  # ~0.3 s between them
    hold = _Hold(_Pool(busy=2, pids=spinning_on_one_core))  # type: ignore[arg-type]
    hold.add([_done("a")])
    assert hold.holds()  # not known yet
    time.sleep(0.3)
    assert hold.contended()  # the window just seen
    assert not hold.holds()  # and until the next says otherwise
    assert [d.source for d in hold.take()] == ["a"]
    hold.add([_done("b")])  # a hold begun just after: held by no first window
    assert hold.contended() and not hold.holds()


def test_a_worker_gone_is_read_as_contended() -> None:
    assert _waited_s([2**22 + 12345]) is None  # above Linux's default pid_max: no such process
    hold = _Hold(_Pool(busy=2, pids=[2**22 + 12345]))  # type: ignore[arg-type]
    hold.add([_done("a")])
    assert hold.contended() and not hold.holds()


def test_a_step_held_back_gets_every_partition_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 sources run ahead on two workers, their step taking them while they run, and the next
    step's started ahead as they end; the workers taken as always full and uncontended, so every
    hold lasts ``_HOLD_S``, the step's last one too (after its partitions have all ended): each
    partition once and committed."""
    monkeypatch.setattr(_Hold, "contended", lambda self: False)
    monkeypatch.setattr(PartitionPool, "_full", lambda self: True)
    monkeypatch.setattr(pool_module, "_HOLD_S", 0.3)
    verdicts: list[bool] = []
    holds = _Hold.holds

    def seen(self: _Hold) -> bool:
        verdicts.append(holds(self))
        return verdicts[-1]

    monkeypatch.setattr(_Hold, "holds", seen)
    crawl = many_sources(40)
    sources = crawl.partitions("raw_documents")
    with registered(tmp_path / "w", crawl) as resource:
        with PartitionPool(resource.place(), crawl, execution=resource.execution()) as pool:
            assert pool.cores == 2
            pool.then_ahead("raw_documents", lambda step: step == "document_languages")
            pool.run_ahead("raw_documents", sources)
            busy = [pool._busy()]
            while busy[-1] == 0 and len(busy) < 1000:  # the hand-over thread's first packs
                time.sleep(0.005)
                busy.append(pool._busy())
            assert 1 <= busy[-1] <= 40
            fresh = Store(resource.store().root)
            for program in ("raw_documents", "document_languages"):
                verdicts.clear()
                lists = list(pool.run(program, sources))
                assert True in verdicts  # held (let go: the step's partitions all came, below)
                done = [d for finished in lists for d in finished]
                assert sorted(d.source or "" for d in done) == sources
                for d in done:
                    assert d.error is None and d.outcome is not None, d.trace
                    committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, program, d.source))
                    assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()
            # what the hold looks at, on a real pool: its workers' processes, their waits, no pack left
            assert len(pool._worker_pids()) == pool.workers == 2
            assert _waited_s(pool._worker_pids()) is not None and pool._busy() == 0


class _Stub:
    """A pool whose workers always fill the cores, uncontended, for ``run``'s ahead branch alone."""

    def __init__(self, ahead: _Ahead) -> None:
        self._lock = threading.RLock()
        self._ahead = {"raw_documents": ahead}
        self._then: dict[str, Any] = {}
        self._ahead_only = False
        self._contended_at: float | None = None

    def _full(self) -> bool:
        return True

    def _worker_pids(self) -> list[int]:
        return [os.getpid()]

    def _then_start(self, program: str, clean: bool) -> None:
        pass


def test_partitions_held_when_the_thread_that_ran_them_fails_reach_their_step_first() -> None:
    """The thread running a step ahead fails after some partitions ended: those go to the step
    (held or not), then its failure is raised."""
    ahead = _Ahead(["a", "b"])
    ahead.lists.put([_done("a")])
    stub = _Stub(ahead)
    got: list[list[str | None]] = []
    steps = PartitionPool.run(stub, "raw_documents", ["a", "b"])  # type: ignore[arg-type]
    ahead.lists.put(RuntimeError("the hand-over thread failed"))
    ahead.lists.put(None)
    with pytest.raises(RuntimeError, match="hand-over thread failed"):
        for done in steps:
            got.append([d.source for d in done])
    assert got == [["a"]]
