"""The warm pool's packs: many small partitions of a step go to a worker a few at a time
(guided self-scheduling, down to one each at the step's end), each pack's commits published
together (``stages.store.commits_together``) and the crawl's keys derived once for it, every
partition described as if it ran alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from curation_dagster.defs.resources import CurationResource
from curation_dagster.run import pool as pool_module
from curation_dagster.run.done import TIMINGS, Done
from curation_dagster.run.partition import finish, step_judge
from curation_dagster.run.place import Place
from curation_dagster.run.pool import _PACK, PartitionPool, _packs
from stages import store as store_module
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.counting import count_params_validations
from tests.support.tiny_corpus import CRAWL, EXPECTED, fast_tmp, source_config


@pytest.mark.parametrize("at_once", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 7, 8, 16, 17, 200, 1000])
def test_packs_shrink_to_single_partitions_and_keep_the_order(n: int, at_once: int) -> None:
    sources: list[str | None] = [f"s{i:04d}" for i in range(n)]
    packs = _packs(list(sources), at_once)
    sizes = [len(p) for p in packs]
    assert [s for p in packs for s in p] == sources
    assert sizes == sorted(sizes, reverse=True) and max(sizes) <= _PACK
    assert sizes[-min(len(sizes), 4 * at_once):] == [1] * min(len(sizes), 4 * at_once)
    if n < 8 * at_once:
        assert set(sizes) == {1}
    else:
        assert sizes[0] == min(_PACK, n // (4 * at_once))


def _many(n: int) -> CrawlSpec:
    """The tiny corpus's first source, as ``n`` sources."""
    first = next(iter(source_config().values()))
    return CrawlSpec(crawl=CRAWL, sources={f"c{i:02d}": first for i in range(n)}, keep=EXPECTED["keep"],
                     stages=("fuzzy",))


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
    crawl = _many(5)
    sources = crawl.partitions("raw_documents")
    syncs: list[list[str]] = []
    real_sync, real_params = store_module._sync, CrawlSpec.program_params
    monkeypatch.setattr(store_module, "_sync", lambda paths: (syncs.append(paths), real_sync(paths))[1])
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
        resource = CurationResource(workdir=str(work))
        resource.dataroot().register(crawl)
        place = Place(resource.workdir, resource.root(), resource.options())
        for key, value in {"resource": place, "store": place.store(), "spec": crawl}.items():
            monkeypatch.setitem(pool_module._WORKER, key, value)
        monkeypatch.delitem(pool_module._WORKER, "judge", raising=False)
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

        def refuse(paths: list[str]) -> None:
            raise OSError("disk gone")

        def committed_now() -> dict[str | None, str]:
            fresh = Store(resource.store().root)
            found = {s: fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", s))
                     for s in sources[:2]}
            return {s: m.to_json() for s, m in found.items() if m is not None}

        before = committed_now()
        monkeypatch.setattr(store_module, "_sync", refuse)
        done = pool_module._work("raw_documents", sources[:2], resource.execution(), True, 9)
        assert [d.error for d in done] == ["its commit failed: disk gone"] * 2
        assert committed_now() == before and len(before) == 2


def test_many_sources_run_in_packs_on_a_real_pool(tmp_path: Path) -> None:
    """18 sources on two workers (packs of two, then one each): every partition ends once,
    committed, with what it would have alone."""
    crawl = _many(18)
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work), workers=2)
        resource.dataroot().register(crawl)
        assert [len(p) for p in _packs(crawl.partitions("raw_documents"), 2)][:3] == [2, 2, 1]
        with PartitionPool(resource, crawl) as pool:
            for program in ("raw_documents", "document_languages", "filtered_documents"):
                done = [d for finished in pool.run(program, crawl.partitions(program)) for d in finished]
                assert sorted(d.source or "" for d in done) == sorted(s or "" for s in crawl.partitions(program))
                assert all(d.error is None and d.outcome is not None for d in done), [d.trace for d in done]
                fresh = Store(resource.store().root)
                for d in done:
                    committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, program, d.source))
                    assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()  # type: ignore[union-attr]
                    if program == "raw_documents":
                        assert committed.rows["documents"] == done[0].outcome.manifest.rows["documents"] > 0  # type: ignore[union-attr]


def test_partitions_run_in_this_process_go_in_packs_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without workers (one core, a GPU step) the step's partitions run here in the same packs,
    each published together: two syncs a pack of more than one, every partition committed."""
    crawl = _many(12)
    syncs: list[list[str]] = []
    real_sync = store_module._sync
    monkeypatch.setattr(store_module, "_sync", lambda paths: (syncs.append(paths), real_sync(paths))[1])
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work), workers=1)
        resource.dataroot().register(crawl)
        with PartitionPool(resource, crawl) as pool:
            assert pool._pool is None
            lists = list(pool.run("raw_documents", crawl.partitions("raw_documents")))
        packs = _packs(crawl.partitions("raw_documents"), 1)
        assert [[d.source for d in done] for done in lists] == packs and len(packs) < 12
        assert len(syncs) == 2 * sum(len(p) > 1 for p in packs)
        fresh = Store(resource.store().root)
        for done in lists:
            for d in done:
                assert d.error is None and d.outcome is not None, d.trace
                committed = fresh.read_manifest(resource.dataroot().output_dir(crawl, "raw_documents", d.source))
                assert committed is not None and committed.to_json() == d.outcome.manifest.to_json()
