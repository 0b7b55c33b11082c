"""The warm pool's packs: a step's short partitions go to a worker a few at a time (as many as run
in about ``_PACK_S``, by the step's pace so far; guided self-scheduling, down to one each at the
step's end, or to what runs in ``_PACK_LEAST_S`` where partitions are shorter; a long partition
alone), each pack's commits published together
(``stages.store.commits_together``) and the crawl's keys derived once for it, every partition
described as if it ran alone."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from curation_dagster.defs.resources import CurationResource
from curation_dagster.run import pool as pool_module
from curation_dagster.run.done import TIMINGS, Done
from curation_dagster.run.partition import finish, step_judge
from curation_dagster.run.pool import _PACK, _PACK_LEAST_S, _PACK_S, PartitionPool, _pack_size
from stages import store as store_module
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.counting import count_params_validations
from tests.support.pools import many_sources, registered
from tests.support.tiny_corpus import CRAWL, EXPECTED, fast_tmp, source_config


@pytest.mark.parametrize("at_once", [1, 2, 4])
@pytest.mark.parametrize("seconds", [None, 1e-5, 0.002, 0.005, _PACK_LEAST_S, 0.05, _PACK_S / 3, _PACK_S, 30.0])
def test_a_pack_holds_what_runs_in_its_time_and_shrinks_toward_the_end(seconds: float | None, at_once: int) -> None:
    sizes = []
    remaining = 1000
    while remaining:
        sizes.append(_pack_size(remaining, at_once, seconds))
        remaining -= sizes[-1]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) <= _PACK
    if seconds is None or seconds >= _PACK_S / 2:  # before the pace is known, or too long to share
        assert set(sizes) == {1}
        return
    assert sizes[0] == min(_PACK, int(_PACK_S / seconds)) > 1
    # the step's end: down to one each where a partition is worth a pack's hand-over on its own,
    # else never under what runs in ``_PACK_LEAST_S`` (the last pack: what remains)
    least = min(_PACK, math.ceil(_PACK_LEAST_S / seconds))
    if least <= 1:
        assert sizes[-4 * at_once:] == [1] * (4 * at_once)
    else:
        assert min(sizes[:-1]) >= least and sizes[-1] <= least
        assert len(sizes) <= math.ceil(1000 / least)


def test_what_remains_of_a_step_of_tiny_partitions_goes_in_one_pack() -> None:
    assert _pack_size(7, 2, 1e-5) == 7
    assert _pack_size(7, 2, 0.1) == 1  # fewer than eight a worker of long partitions: one each
    assert _pack_size(7, 1, 1e-5, least_s=0.0) == 1  # packs run in this process: no hand-over to wait for


def _as_worker(work: Path, crawl: CrawlSpec, monkeypatch: pytest.MonkeyPatch) -> CurationResource:
    """This process set up as a pool worker of ``crawl`` in workdir ``work`` (``pool._work`` runs
    here); the resource it was made from."""
    resource = CurationResource(workdir=str(work))
    resource.dataroot().register(crawl)
    place = resource.place()
    for key, value in {"resource": place, "store": place.store(), "spec": crawl}.items():
        monkeypatch.setitem(pool_module._WORKER, key, value)
    monkeypatch.delitem(pool_module._WORKER, "judge", raising=False)
    return resource


def _described(done: Done) -> tuple[Any, ...]:
    """What the recorder makes of a partition, its timings aside."""
    assert done.error is None and done.outcome is not None, done.trace
    meta = {k: v for k, v in done.meta.items() if k not in TIMINGS and k != "report"}
    return (done.source, done.outcome.manifest.data_version, done.outcome.manifest.rows, meta,
            [(name, blocking, v.passed, v.description) for name, blocking, v in done.verdicts])


def test_a_pack_is_described_as_its_partitions_alone_and_published_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's pack: each partition run in turn and described from its staged commit (its
    checks read its manifest before it is published), as the same partitions one by one in another
    workdir; the pack's commits published together (two syncs: before the renames and after), and
    on disk once it returns. Where publishing fails, its partitions fail, the earlier commits stay."""
    crawl = many_sources(5)
    sources = crawl.partitions("raw_documents")
    syncs: list[list[str]] = []
    real_sync, real_params = store_module._sync, CrawlSpec.program_params
    monkeypatch.setattr(store_module, "_sync", lambda paths, fd: (syncs.append(paths), real_sync(paths, fd))[1])
    alone: dict[str, list[tuple[Any, ...]]] = {}
    with fast_tmp(tmp_path / "alone") as work:
        resource = CurationResource(workdir=str(work))
        resource.dataroot().register(crawl)
        store, execution = resource.store(), resource.execution()
        for program in ("raw_documents", "document_languages"):
            judge = step_judge(resource, crawl.crawl)
            alone[program] = [_described(finish(resource, store, crawl, program, s, execution, False, judge=judge))
                              for s in sources]
    assert syncs == []  # one at a time: no pack
    with fast_tmp(tmp_path / "packed") as work:
        resource = _as_worker(work, crawl, monkeypatch)
        for step, program in enumerate(("raw_documents", "document_languages")):
            syncs.clear()
            validated = count_params_validations(monkeypatch)
            done = pool_module._work(program, sources, resource.execution(), False, step)
            monkeypatch.setattr(CrawlSpec, "program_params", real_params)
            assert validated.count("removal_ledger") == 1, validated  # the crawl's keys: once for the pack
            assert [_described(d) for d in done] == alone[program]
            assert len(syncs) == 2 and all(d.busy > 0 for d in done)
            fresh = Store(resource.store().root)
            for d in done:
                assert d.outcome is not None
                committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, program, d.source))
                assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()

        def refuse(paths: list[str], fd: int | None) -> None:
            raise OSError("disk gone")

        def committed_now() -> dict[str | None, str]:
            fresh = Store(resource.store().root)
            found = {s: fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", s))
                     for s in sources[:2]}
            return {s: m.to_json() for s, m in found.items() if m is not None}

        before = committed_now()
        monkeypatch.setattr(store_module, "_sync", refuse)
        done = pool_module._work("raw_documents", sources[:2], resource.execution(), True, 9)
        assert [d.error for d in done] == ["its commit failed: publishing 2 partitions' commits: disk gone"] * 2
        assert committed_now() == before and len(before) == 2


def test_a_partition_that_fails_in_a_pack_leaves_the_others_published(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack's partition whose program fails is that partition's error; the rest of the pack runs
    and is published."""
    first = next(iter(source_config().values()))
    missing = {**first, "url": str(tmp_path / "no-such-source")}
    crawl = CrawlSpec(crawl=CRAWL, sources={"a": first, "b": missing, "c": first}, keep=EXPECTED["keep"],
                      stages=("fuzzy",))
    with fast_tmp(tmp_path / "w") as work:
        resource = _as_worker(work, crawl, monkeypatch)
        done = pool_module._work("raw_documents", ["a", "b", "c"], resource.execution(), False, 0)
        assert [d.source for d in done] == ["a", "b", "c"]
        assert done[0].error is None and done[2].error is None and "no-such-source" in str(done[1].error)
        fresh = Store(resource.store().root)
        committed = {s: fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", s)) for s in "abc"}
        assert committed["b"] is None and committed["a"] is not None and committed["c"] is not None


def test_many_sources_run_in_packs_on_a_real_pool(tmp_path: Path) -> None:
    """40 sources on two workers: one partition a worker until the first ends, then packs (of the
    crawl's short partitions), the last smaller than the largest; every partition ends once,
    committed."""
    crawl = many_sources(40)
    with registered(tmp_path / "w", crawl) as resource:
        with PartitionPool(resource, crawl) as pool:
            assert pool._pool is not None
            real_submit = pool._pool.submit
            packs: list[list[str | None]] = []
            def submit(fn: Any, program: str, pack: list[str | None], *rest: Any) -> Any:
                packs.append(pack)
                return real_submit(fn, program, pack, *rest)

            pool._pool.submit = submit  # type: ignore[assignment, method-assign]
            for program in ("raw_documents", "document_languages", "filtered_documents"):
                packs.clear()
                done = [d for finished in pool.run(program, crawl.partitions(program)) for d in finished]
                assert sorted(d.source or "" for d in done) == sorted(s or "" for s in crawl.partitions(program))
                assert [s for p in packs for s in p] == crawl.partitions(program)
                sizes = [len(p) for p in packs]
                # Each pack is sized at the step's pace so far, which changes as partitions end (a
                # faster pace raises a pack's floor of ``_PACK_LEAST_S``), so the sizes need not
                # fall one by one (CI saw ``[..., 2, 1, 1, 2]``); the shape at one pace is the test
                # above. Here: one a worker first, then packs, the last smaller than the largest.
                assert sizes[:2] == [1, 1] and 1 < max(sizes) <= _PACK and sizes[-1] < max(sizes), sizes
                assert all(d.error is None and d.outcome is not None for d in done), [d.trace for d in done]
                fresh = Store(resource.store().root)
                for d in done:
                    committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, program, d.source))
                    assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()  # type: ignore[union-attr]
                    if program == "raw_documents":
                        assert committed.rows["documents"] == done[0].outcome.manifest.rows["documents"] > 0  # type: ignore[union-attr]
            if _resident_known():  # each worker knows what it held at its start (``_release``'s base)
                bases = [real_submit(_worker_base).result() for _ in range(4)]
                assert all(isinstance(b, int) and b > 10 << 20 for b in bases), bases


def _resident_known() -> bool:
    return Path("/proc/self/statm").exists()


def _worker_base() -> Any:
    """In a pool worker: the resident memory its memory releases count growth from."""
    return pool_module._WORKER.get("resident")


def test_partitions_run_in_this_process_go_in_packs_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without workers (one core, a GPU step) the step's partitions run here in packs sized the
    same way, each published together: two syncs a pack of more than one; a step whose
    partitions take longer than a pack's time runs them one by one."""
    crawl = many_sources(12)
    syncs: list[list[str]] = []
    real_sync = store_module._sync
    monkeypatch.setattr(store_module, "_sync", lambda paths, fd: (syncs.append(paths), real_sync(paths, fd))[1])
    with registered(tmp_path / "w", crawl, workers=1) as resource:
        with PartitionPool(resource, crawl) as pool:
            assert pool._pool is None
            lists = list(pool.run("raw_documents", crawl.partitions("raw_documents")))
            packs = [[d.source for d in done] for done in lists]
            assert [s for p in packs for s in p] == crawl.partitions("raw_documents")
            assert len(packs[0]) == 1 and max(map(len, packs)) > 1 and len(packs[-1]) == 1, packs
            assert len(syncs) == 2 * sum(len(p) > 1 for p in packs)
            fresh = Store(resource.store().root)
            for done in lists:
                for d in done:
                    assert d.error is None and d.outcome is not None, d.trace
                    committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", d.source))
                    assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()
            monkeypatch.setattr(pool_module, "_PACK_S", 1e-9)  # every partition longer than a pack's time
            syncs.clear()
            lists = list(pool.run("document_languages", crawl.partitions("document_languages")))
            assert [len(done) for done in lists] == [1] * 12 and syncs == []


def test_partitions_run_ahead_are_handed_to_their_step_once(tmp_path: Path) -> None:
    """``run_ahead`` starts some of a step's partitions before it asks; its ``run`` hands over
    those first, then runs the rest: every partition once, committed. The next step (``then_ahead``)
    starts once all of them have ended, not when those run ahead have. A pool closed before its
    step asked ends the thread that ran them."""
    crawl = many_sources(12)
    sources = crawl.partitions("raw_documents")
    with registered(tmp_path / "w", crawl) as resource:
        with PartitionPool(resource.place(), crawl, execution=resource.execution()) as pool:
            pool.then_ahead("raw_documents", lambda step: step == "document_languages")
            pool.run_ahead("raw_documents", sources[:8])
            assert pool.ahead == {("raw_documents", s) for s in sources[:8]}
            pool._threads[0].join(60)  # all eight ended before their step asks for them
            assert pool.ahead == {("raw_documents", s) for s in sources[:8]}  # a part ended: nothing next
            started: list[set[str | None]] = []  # the partitions that had ended, at the hand-over
            lists = list(pool.run("raw_documents", sources, started=started.append))
            done = [d for finished in lists for d in finished]
            assert started == [set(sources[:8])] and sorted(d.source or "" for d in done) == sources
            assert {d.source for d in lists[0]} <= set(sources[:8])  # those run ahead come first
            fresh = Store(resource.store().root)
            for d in done:
                assert d.error is None and d.outcome is not None, d.trace
                committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", d.source))
                assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()
            # every partition ended: the next step's started, and its step takes them
            assert ("document_languages", sources[0]) in pool.ahead
            assert len([d for f in pool.run("document_languages", sources) for d in f]) == 12
        with PartitionPool(resource.place(), crawl, force=True, execution=resource.execution()) as pool:
            pool.run_ahead("raw_documents", sources)
            (thread,) = pool._threads
        assert not thread.is_alive()


def test_only_a_crawls_first_or_forced_run_starts_ahead(tmp_path: Path) -> None:
    """``ahead_of_run``: the first program's partitions start at once where none of them is
    committed for the crawl's parameters (or the run is forced); not on a rerun (the run's planner
    decides those), nor on one core, nor with Ray; for one source, only in a process of the
    command's own with no other thread (its worker is forked from it: ``test_in_process`` runs
    one)."""
    crawl = many_sources(4)
    with registered(tmp_path / "w", crawl) as resource:
        place, execution = resource.place(), resource.execution()
        first = PartitionPool.ahead_of_run(place, execution, crawl, force=False)
        assert first is not None and first.ahead == {("raw_documents", s) for s in crawl.partitions("raw_documents")}
        with first:
            assert all(d.error is None for f in first.run("raw_documents", crawl.partitions("raw_documents"))
                       for d in f)
        assert PartitionPool.ahead_of_run(place, execution, crawl, force=False) is None  # a rerun
        forced = PartitionPool.ahead_of_run(place, execution, crawl, force=True)
        assert forced is not None
        forced.close()
        one = resource.model_copy(update={"workers": 1}).execution()
        assert PartitionPool.ahead_of_run(place, one, crawl, force=True) is None
        ray = execution.model_copy(update={"executor": "ray"})
        assert PartitionPool.ahead_of_run(place, ray, crawl, force=True) is None
        # One source: its worker would be forked from this process: only where the caller says
        # it is the command's own (``fork``), and never beside another thread.
        alone = many_sources(1)
        resource.dataroot().register(alone)
        assert PartitionPool.ahead_of_run(place, execution, alone, force=True) is None
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            assert PartitionPool.ahead_of_run(place, execution, alone, force=True, fork=True) is None
        finally:
            stop.set()
            other.join()


def test_a_pool_closed_while_its_packs_run_ahead_ends(tmp_path: Path) -> None:
    """Closed once the pace is set and packs are handed over beyond what the workers hold (a run
    that fails before its first step, say): what was handed over ends or is dropped, and the
    thread that ran them ends; close does not wait for the thread forever."""
    crawl = many_sources(40)
    with registered(tmp_path / "w", crawl) as resource:
        pool = PartitionPool(resource.place(), crawl, execution=resource.execution())
        pool.run_ahead("raw_documents", crawl.partitions("raw_documents"))
        ahead = pool._ahead["raw_documents"]
        while ahead.lists.empty():  # the first partition ended: the rest are handed over in packs
            time.sleep(0.005)
        closer = threading.Thread(target=pool.close, daemon=True)
        closer.start()
        closer.join(60)
        assert not closer.is_alive()
        assert not any(thread.is_alive() for thread in pool._threads)


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def test_the_next_steps_partitions_start_before_this_steps_last_list_is_taken(tmp_path: Path) -> None:
    """``then_ahead``: the next step's partitions start on the workers once every partition of
    this step has finished, before its last list reaches the step (which records it meanwhile),
    and the step after that one's as they end, while no step has taken any of them; each step
    then takes its partitions as run ahead: every partition once, committed. The chain ends at
    the first step ``ready`` says no to, and after a step with a failed partition nothing starts."""
    crawl = many_sources(12)
    sources = crawl.partitions("raw_documents")
    asked: list[str] = []

    def ready(step: str) -> bool:  # the chain's steps: two, then no
        asked.append(step)
        return step in ("document_languages", "filtered_documents")

    with registered(tmp_path / "w", crawl) as resource:
        with PartitionPool(resource, crawl) as pool:
            pool.then_ahead("raw_documents", ready)
            seen: list[bool] = []  # at each list taken: had the next step's partitions started?
            taken = 0
            for finished in pool.run("raw_documents", sources):
                taken += len(finished)
                seen.append(("document_languages", sources[0]) in pool.ahead)
            assert taken == 12 and seen[-1] and not any(seen[:-1]), seen
            _until(lambda: "minhash_signatures" in asked)  # document_languages' step took nothing yet
            # past the switched-off exact_duplicates, which has no partition
            assert asked == ["document_languages", "filtered_documents", "minhash_signatures"]
            assert ("filtered_documents", sources[0]) in pool.ahead
            assert ("minhash_signatures", sources[0]) not in pool.ahead
            fresh = Store(resource.store().root)
            for program in ("document_languages", "filtered_documents"):
                done = [d for f in pool.run(program, sources) for d in f]
                assert sorted(d.source or "" for d in done) == sources
                for d in done:
                    assert d.error is None and d.outcome is not None, d.trace
                    committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, program, d.source))
                    assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()
            assert pool._then == {}
    with fast_tmp(tmp_path / "u") as work:
        resource = CurationResource(workdir=str(work), workers=2)
        resource.dataroot().register(crawl)
        with PartitionPool(resource, crawl) as pool:  # the head start's chain, from its own thread
            pool.then_ahead("raw_documents", lambda step: step == "document_languages")
            pool.run_ahead("raw_documents", sources)
            _until(lambda: ("document_languages", sources[0]) in pool.ahead)  # no list taken yet
            assert sum(len(f) for f in pool.run("raw_documents", sources)) == 12
            assert len([d for f in pool.run("document_languages", sources) for d in f]) == 12
            assert ("filtered_documents", sources[0]) not in pool.ahead
    broken = crawl.model_copy(update={"sources": {**crawl.sources, "c05": crawl.sources["c05"].model_copy(
        update={"url": str(tmp_path / "missing.jsonl")})}})
    with fast_tmp(tmp_path / "v") as work:
        resource = CurationResource(workdir=str(work), workers=2)
        resource.dataroot().register(broken)
        with PartitionPool(resource, broken) as pool:
            pool.then_ahead("raw_documents", lambda step: True)
            done = [d for f in pool.run("raw_documents", sources) for d in f]
            assert [d.source for d in done if d.error is not None] == ["c05"]
            assert not pool.ahead and pool._then == {}
            # A run that failed or was stopped starts no further step ahead (its pool open)
            pool.stop_ahead()
            pool.then_ahead("document_languages", lambda step: True)
            pool._then_start("document_languages", True)
            assert not pool.ahead
        with PartitionPool(resource, broken, force=True) as pool:
            # Run ahead and ended before their step begins: the step plans none of those committed
            # (recorded done at once), but the failed one (Dagster counts it failed by its plan).
            pool.run_ahead("raw_documents", sources)
            pool._threads[0].join(60)
            started: list[set[str | None]] = []
            done = [d for f in pool.run("raw_documents", sources, started=started.append) for d in f]
            assert started == [set(sources) - {"c05"}] and len(done) == 12


def test_a_partition_with_a_failed_blocking_check_is_not_clean() -> None:
    from curation_dagster.run.pool import _clean
    from stages.checks import Verdict
    from stages.execute import Outcome
    from stages.store import Manifest

    ok = Outcome(Manifest("p", "k", "v", "c", "s", {}), False, 0.1)
    assert _clean([Done("p", "s", ok, verdicts=[("counts", True, Verdict(True, "fine"))])])
    assert _clean([Done("p", "s", ok, verdicts=[("size", True, Verdict(False, "small", severity="WARN"))])])
    assert _clean([Done("p", "s", ok, verdicts=[("counts", False, Verdict(False, "off"))])])  # not blocking
    assert not _clean([Done("p", "s", ok, verdicts=[("counts", True, Verdict(False, "off"))])])
    assert not _clean([Done("p", "s", error="boom")])


@pytest.mark.skipif(not _resident_known(), reason="no /proc: a worker releases after each partition")
def test_a_worker_gives_memory_back_only_after_it_grew(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_release`` after each partition: where the worker's resident memory grew by less than
    ``_RELEASE_BYTES`` since its last release nothing is given back (the next small partition
    would fault its buffers in again); from that growth on it is, and the new level is the base."""
    import pyarrow as pa

    resident = pool_module._resident_bytes()
    status = Path("/proc/self/status").read_text()
    vm_rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024
    assert resident is not None and 10 << 20 < resident and abs(resident - vm_rss) < 8 << 20
    level = [100 << 20]
    monkeypatch.setattr(pool_module, "_resident_bytes", lambda: level[0])
    monkeypatch.setitem(pool_module._WORKER, "resident", 100 << 20)
    released: list[int] = []
    real_pool = pa.default_memory_pool()

    class CountingPool:
        def release_unused(self) -> None:
            released.append(1)
            real_pool.release_unused()

    monkeypatch.setattr(pa, "default_memory_pool", CountingPool)
    level[0] += pool_module._RELEASE_BYTES - 1
    pool_module._release()
    assert not released and pool_module._WORKER["resident"] == 100 << 20
    level[0] += 1
    pool_module._release()
    assert released == [1] and pool_module._WORKER["resident"] == level[0]
    pool_module._release()  # no growth since: kept
    assert released == [1]
    monkeypatch.setitem(pool_module._WORKER, "resident", None)  # not known (no /proc): always
    pool_module._release()
    assert released == [1, 1]


def test_a_forked_workers_chain_runs_the_next_steps_and_the_pool_ends_with_it(tmp_path: Path) -> None:
    """A pool whose worker was forked for the head start (``fork``: one source) starts the next
    steps on it down the chain, as a wider pool does; it stays open while a chained step is
    still to be taken, and closes once the last is: a step not chained runs in this process."""
    crawl = many_sources(2)
    sources = crawl.partitions("raw_documents")
    with registered(tmp_path / "w", crawl) as resource:
        pool = PartitionPool(resource, crawl)
        pool._ahead_only = True  # as ``ahead_of_run(fork=True)`` makes it (one partition at a time)
        pool.then_ahead("raw_documents", lambda step: step in ("document_languages", "filtered_documents"))
        pool.run_ahead("raw_documents", sources)
        for program in ("raw_documents", "document_languages", "filtered_documents"):
            assert pool._pool is not None, program  # open: this step was chained
            done = [d for f in pool.run(program, sources) for d in f]
            assert sorted(d.source or "" for d in done) == sources
            assert all(d.error is None and d.outcome is not None for d in done), [d.trace for d in done]
        assert pool._pool is None and not pool._ahead  # the chain ended at minhash_signatures
        assert pool.side_by_side("minhash_signatures", 2) == 0  # here
        pool.close()


def test_a_forked_workers_chain_stops_at_a_gpu_program_or_one_whose_memory_does_not_fit(tmp_path: Path) -> None:
    """``_forked_fits``: a one-source crawl's worker forked from the command's process runs the
    steps after its head start as this process would run them, but a GPU program (unless the
    backend is the CPU) or one that asks for more memory than is available ends the chain (this
    process runs it)."""
    crawl = many_sources(1)
    with_semantic = crawl.model_copy(update={"stages": ("fuzzy", "semantic")})
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work), workers=1)  # no worker started: the rule alone
        for spec, backend, memory, program, fits in [
            (crawl, "auto", 2**34, "duplicate_components", True),  # 8 GiB asked, 16 available
            (crawl, "auto", 2**32, "duplicate_components", False),  # 4 GiB available
            (crawl, "auto", None, "duplicate_components", True),  # unknown: as ``side_by_side``
            (with_semantic, "auto", 2**36, "document_embeddings", False),  # a GPU program
            (with_semantic, "gpu", 2**36, "document_embeddings", False),
            (with_semantic, "cpu", 2**36, "document_embeddings", True),  # on the CPU, it fits
        ]:
            execution = resource.execution().model_copy(update={"backend": backend})
            pool = PartitionPool(resource.place(), spec, execution=execution)
            pool.memory = memory
            assert pool._forked_fits(program) is fits, (program, backend, memory)
            pool.close()
