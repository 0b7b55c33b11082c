"""``curate run``'s run: one Dagster run for the crawl, with a step per program and a
materialization and check evaluations per partition (switched-off stages included), outputs equal
to those of the executor alone (no Dagster); a failed partition fails the run once the others are
recorded, and the rerun runs it alone."""

from __future__ import annotations

import gc
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.instance import ensure_instance_config
from curation_dagster.run.crawl_job import CRAWL_JOB
from curation_dagster.run.in_process import run_crawl
from curation_dagster.run.recorder import DATA_VERSION_TAG
from stages.catalog import PROGRAMS, waves
from stages.checks import CHECK_KINDS
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec
from stages.store import Manifest, Store
from tests.support.counting import count_params_validations
from tests.support.tiny_corpus import CRAWL, fast_tmp, read, run_all, spec


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("doc_id", "ascending"), ("source", "ascending")])


def test_one_run_materializes_and_checks_every_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crawl = spec(stages=["fuzzy"])
    off = {p for p in PROGRAMS if not getattr(crawl.program_params(p, crawl.all_partitions(p)[0]), "enabled", True)}
    assert {"document_languages", "filtered_documents", "exact_duplicates", "document_embeddings",
            "semantic_clusters", "semantic_duplicates", "quality_scores", "contaminated_documents"} == off
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        # quiet: no line per partition (the tiny crawl has no failure or failed check to tell)
        assert "fuzzy_duplicates[" not in capsys.readouterr().out
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        runs = instance.get_runs()
        # One run for the crawl, with a step per program in dependency order and a
        # materialization per partition of each, none of a switched-off stage (no partition).
        (run,) = runs
        assert run.job_name == CRAWL_JOB and run.tags["curate/crawl"] == CRAWL
        steps = [e.step_key for e in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)]
        assert steps == [p for wave in waves() for p in wave]
        ran = sorted((e.asset_materialization.asset_key.to_user_string(), e.asset_materialization.partition)
                     for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                     if e.asset_materialization is not None)
        assert ran == sorted((p, str(partition_key(CRAWL, s))) for p in PROGRAMS for s in crawl.partitions(p))
        assert {p for p, _ in ran} == set(PROGRAMS) - off
        for program in off:  # nothing of it is written either
            assert crawl.partitions(program) == []
            assert DataRoot(resource.store()).manifest(crawl, program, crawl.all_partitions(program)[0]) is None
        want_checks: set[tuple[str, str, str]] = set()
        for program in PROGRAMS:
            for source in crawl.partitions(program):
                key = str(partition_key(CRAWL, source))
                records = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=AssetKey(program), asset_partitions=[key]), limit=10).records
                assert len(records) == 1, (program, source)
                entry = records[0].event_log_entry
                assert entry.run_id == run.run_id, program
                mat = entry.asset_materialization
                assert mat is not None
                enabled = mat.metadata.get("enabled")
                assert enabled is None or enabled.value is True, program
                # Both kinds carry the data version under the tag Dagster reads it from.
                tags = mat.tags or {}
                assert tags.get(DATA_VERSION_TAG) == _manifest(resource, crawl, program, source).data_version
                overhead = mat.metadata.get("overhead_s")  # what `curate profile` reports for it
                assert overhead is not None and 0.0 <= overhead.value < 60.0, (program, source)
                want_checks |= {(program, kind.name, key) for kind in CHECK_KINDS if kind.applies(PROGRAMS[program])}
        # Every check of every partition was evaluated: in its run, or without one.
        evaluated = {(ev.asset_key.to_user_string(), ev.check_name, ev.partition)
                     for run_id in ["", *(r.run_id for r in runs)]
                     for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
                     if e.dagster_event is not None
                     for ev in [e.dagster_event.event_specific_data]}
        assert want_checks and want_checks <= evaluated
        # The same outputs as the executor alone writes.
        alone = Store(str(tmp_path / "alone"))
        run_all(alone, crawl)
        mine = resource.store()
        assert _sorted(read(mine, crawl, "removal_ledger", "ledger")).equals(
            _sorted(read(alone, crawl, "removal_ledger", "ledger")))


def _manifest(resource: CurationResource, crawl: CrawlSpec, program: str, source: str | None) -> Manifest:
    store = resource.store()
    manifest = DataRoot(store).manifest(crawl, program, source)
    assert manifest is not None
    return manifest


def test_a_failed_partition_fails_the_run_once_the_others_are_recorded(tmp_path: Path) -> None:
    """The step's other partitions run to the end and stay materialized, the next steps do not
    run, and the rerun after the fix runs only the failed one."""
    import shutil

    from curation_dagster.run.in_process import RunFailed
    from tests.support.tiny_corpus import SOURCES, TINY

    root = tmp_path / "corpus"
    shutil.copytree(TINY, root)
    crawl = spec(root, stages=["fuzzy"])
    broken = crawl.sources["news"].url
    shutil.move(broken, tmp_path / "away")
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        with pytest.raises(RunFailed) as err:
            run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        assert str(err.value) == (f"raw_documents[{crawl.crawl}|news]: source URL {broken!r} matches no JSONL or "
                                  "Parquet file")
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        (run,) = instance.get_runs()
        assert run.job_name == CRAWL_JOB and not run.is_success

        def recorded(program: str) -> set[str]:
            return {str(r.partition_key) for r in instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(program)), limit=100).records}

        others = {str(partition_key(CRAWL, s)) for s in SOURCES if s != "news"}
        assert recorded("raw_documents") == others
        assert recorded("minhash_signatures") == set()  # the next step of a fuzzy-only crawl did not run
        shutil.move(tmp_path / "away", broken)
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        (second,) = [r for r in instance.get_runs() if r.run_id != run.run_id]
        ran = {(e.asset_materialization.asset_key.to_user_string(), e.asset_materialization.partition)
               for e in instance.all_logs(second.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
               if e.asset_materialization is not None}
        assert {part for p, part in ran if p == "raw_documents"} == {str(partition_key(CRAWL, "news"))}
        assert recorded("removal_ledger") == {CRAWL}


def test_force_recomputes_every_partition(tmp_path: Path) -> None:
    from tests.support.tiny_corpus import curate, write_config

    with fast_tmp(tmp_path / "w") as work:
        config = write_config(tmp_path / "c.json", stages=["fuzzy"])
        args = ["run", "--workdir", str(work), "--crawl", CRAWL, "--config", str(config)]
        assert curate(*args)[0] == 0
        code, out, _ = curate(*args)
        partitions = sum(len(spec(stages=["fuzzy"]).partitions(p)) for p in PROGRAMS)
        assert code == 0 and out.count(" up to date") == partitions and " + " not in out
        store = CurationResource(workdir=str(work)).store()
        crawl = spec(stages=["fuzzy"])
        before = _manifest(CurationResource(workdir=str(work)), crawl, "minhash_signatures", "news")
        code, out, _ = curate(*args, "--force")
        assert code == 0 and " up to date" not in out and out.count(" + ") == partitions
        after = DataRoot(store).manifest(crawl, "minhash_signatures", "news")
        assert after is not None and after.data_version == before.data_version and after.report != before.report


def test_a_changed_parameter_reruns_only_what_reads_it(tmp_path: Path) -> None:
    """A step finds a partition stale when an input it reads changed: a new LSH setting reruns the
    LSH buckets and everything after them in one run, nothing before them."""
    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        changed = crawl.model_copy(update={"params": {"lsh_buckets": {"bands": 13, "rows": 20}}})
        run_crawl(work, work / "dagster", changed, quiet=True, resource=resource)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        second, first = instance.get_runs()  # newest first
        # Every step starts and plans its program; only the LSH buckets and what reads them run.
        steps = [e.step_key for e in instance.all_logs(second.run_id, of_type=DagsterEventType.STEP_START)]
        after = [p for wave in waves() for p in wave]
        assert steps == after
        after = [p for p in after[after.index("lsh_buckets"):] if crawl.partitions(p)]  # those the crawl runs
        ran = [e.asset_materialization.asset_key.to_user_string()
               for e in instance.all_logs(second.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
               if e.asset_materialization is not None]
        assert list(dict.fromkeys(ran)) == after
        keys_before, keys_after = crawl.keys(), changed.keys()
        for program in after:
            for source in crawl.partitions(program):
                records = instance.fetch_materializations(AssetRecordsFilter(
                    asset_key=AssetKey(program), asset_partitions=[str(partition_key(CRAWL, source))]), limit=5).records
                assert [r.run_id for r in records] == [second.run_id, first.run_id], (program, source)
        assert keys_before[("minhash_signatures", "news")] == keys_after[("minhash_signatures", "news")]
        assert keys_before[("lsh_buckets", None)] != keys_after[("lsh_buckets", None)]


def test_the_crawl_job_on_pipes_subprocesses_records_what_the_pool_does(tmp_path: Path) -> None:
    """The code location's crawl job with ``mode="pipes"`` (``curate deploy``'s launcher: warm
    ``python -m stages serve`` workers, the pod's entry point, several at once): one run, every
    partition materialized once with its checks and ``overhead_s``, the same ledger as ``curate
    run``'s pool; launched again, it runs nothing and records nothing. Pods (``mode="k8s"``) pack
    small partitions two to a pod."""
    import dagster as dg

    from curation_dagster.ops.deploy import definitions
    from curation_dagster.run.crawl_job import CRAWL_JOB_DEF

    dg.Definitions.validate_loadable(definitions())  # the deployment's code location, the job in it
    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work), mode="pipes", fan_out=2, pack_documents=1000)
        resource.dataroot().register(crawl)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        for _ in range(2):
            result = CRAWL_JOB_DEF.execute_in_process(run_config={"crawl": CRAWL}, instance=instance,
                                                      resources={"curation": resource}, raise_on_error=False)
            assert result.success
        second, first = instance.get_runs()  # newest first
        mats = [e.asset_materialization for e in instance.all_logs(first.run_id,
                                                                  of_type=DagsterEventType.ASSET_MATERIALIZATION)]
        got = sorted((m.asset_key.to_user_string(), str(m.partition)) for m in mats if m is not None)
        assert got == sorted((p, str(partition_key(CRAWL, s))) for p in PROGRAMS for s in crawl.partitions(p))
        assert all(m is not None and 0.0 < m.metadata["overhead_s"].value < 60.0 for m in mats)
        planned = instance.all_logs(first.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
        assert len(planned) == len(got)
        checks = instance.all_logs(first.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        assert len(checks) == sum(len(crawl.partitions(p)) for p in PROGRAMS for k in CHECK_KINDS
                                  if k.applies(PROGRAMS[p]))
        assert instance.all_logs(second.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION) == []
        # Packed: as many as fit the documents bound, at most an even share of the processes each.
        from curation_dagster.run.crawl_job import Fanout

        sources = crawl.partitions("minhash_signatures")
        fanout = Fanout(None, resource, crawl)  # type: ignore[arg-type]  # packs() needs no context
        assert fanout.packs("minhash_signatures", sources) == [sources[:2], sources[2:]]
        assert fanout.packs("lsh_buckets", [None]) == [[None]]
        small = resource.model_copy(update={"pack_documents": 5})  # fewer than one source holds
        assert Fanout(None, small, crawl).packs("minhash_signatures", sources) == [[s] for s in sources]  # type: ignore[arg-type]
        alone = Store(str(tmp_path / "alone"))
        run_all(alone, crawl)
        assert _sorted(read(resource.store(), crawl, "removal_ledger", "ledger")).equals(
            _sorted(read(alone, crawl, "removal_ledger", "ledger")))


def test_only_a_warm_pool_starts_a_worker_before_it_is_used(tmp_path: Path) -> None:
    """``curate run``'s pool (the whole run's) starts its fork server and a first worker at once;
    a step's own pool (a crawl run launched from the UI) starts nothing it may never use."""
    from curation_dagster.run.pool import PartitionPool

    crawl = spec(stages=["fuzzy"])
    resource = CurationResource(workdir=str(tmp_path), workers=2)
    with PartitionPool(resource, crawl) as cold:
        assert cold._pool is not None and not cold._pool._processes
    with PartitionPool(resource, crawl, warm=True) as warm:
        assert warm._pool is not None and warm._pool._processes
        # what the fork server imported is out of the worker's cyclic collector's reach
        assert warm._pool.submit(gc.get_freeze_count).result() > 100_000


def test_a_crawl_wide_partition_runs_on_a_pool_worker_and_tells_its_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition alone (a crawl-wide program's) runs on the pool, whose workers have the programs
    imported and their kernels loaded, with every core (``lsh_buckets`` forks its band pass's
    pool from the worker), its progress lines passed on as they come. A switched-off stage's
    steps run nothing."""
    import curation_dagster.run.pool as pool_module
    from curation_dagster.run.pool import PartitionPool

    crawl = spec(stages=["fuzzy"])
    steps = [p for wave in waves() for p in wave]
    with fast_tmp(tmp_path / "w") as work:
        (work / "curate.yaml").write_text("execution: {progress_interval_s: 0.000001}\n")
        resource = CurationResource(workdir=str(work), workers=2)
        resource.dataroot().register(crawl)
        with PartitionPool(resource, crawl) as pool:
            assert pool.side_by_side("lsh_buckets", 1) == 1
            on = PartitionPool(resource, spec(stages=["fuzzy", "semantic"]))
            assert on.side_by_side("document_embeddings", len(crawl.sources)) == 0  # backend auto: a GPU's
            on.close()
            # a pool narrower than the cores: its partitions fork pools of their own, so no worker
            # runs a crawl-wide program's OpenMP kernels before them
            with PartitionPool(resource.model_copy(update={"workers": 2 * len(crawl.sources)}), crawl) as narrow:
                assert narrow.workers < narrow.cores and narrow.side_by_side("lsh_buckets", 1) == 0

            def here(*args: object, **kwargs: object) -> None:
                raise AssertionError("ran in the pool's process")

            monkeypatch.setattr(pool_module, "finish", here)  # not in the workers, forked before
            told: dict[str, list[str]] = {}
            for program in steps[:steps.index("lsh_buckets") + 1]:
                if crawl.switched_off(program):  # no partition: its step runs nothing
                    continue
                told[program] = []
                done = [d for finished in pool.run(program, crawl.partitions(program), emit=told[program].append)
                        for d in finished]
                assert sorted(d.source or "" for d in done) == sorted(s or "" for s in crawl.partitions(program)) != []
                assert all(d.error is None for d in done), [d.trace for d in done]
            # The workers described every partition (their metadata is Dagster's here) without
            # importing Dagster (curation_dagster.run.values), each of them: one call per worker at once.
            assert pool._pool is not None
            from tests.support.probes import dagster_modules
            found = [f.result() for f in [pool._pool.submit(dagster_modules, 0.5) for _ in range(pool.workers)]]
            assert len({pid for pid, _ in found}) == pool.workers and all(not mods for _, mods in found), found
    # the partitions side by side tell nothing (as before); the one alone its lines, then its end
    assert told["minhash_signatures"] == [] and told["lsh_buckets"], told
    assert told["lsh_buckets"][-1].startswith(f"lsh_buckets[{CRAWL}]: done, "), told["lsh_buckets"]


def test_a_first_runs_plan_reads_no_inputs_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition with no manifest of its own is stale whatever its inputs' versions, so planning
    it works none out (each reads every input's manifest, ingestion's lists its source's files:
    0.6 s of a 200-source crawl's first run); a committed partition's is, where the instance
    recorded the partition; one it never recorded is stale unread."""
    from curation_dagster.run import planner

    crawl = spec(stages=["fuzzy"])
    asked: list[str] = []
    real = planner.data_version
    monkeypatch.setattr(planner, "data_version", lambda store, task: asked.append(task.program) or real(store, task))
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        resource.dataroot().register(crawl)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        plan = planner.Planner(instance, resource, crawl).step("minhash_signatures")
        assert plan.stale == sorted(crawl.sources) and asked == []
        plan = planner.Planner(instance, resource, crawl).step("raw_documents")
        assert plan.stale == sorted(crawl.sources) and asked == []
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        asked.clear()
        plan = planner.Planner(instance, resource, crawl).step("minhash_signatures")
        assert plan.current == sorted(crawl.sources) and asked == ["minhash_signatures"] * len(crawl.sources)
        # Committed, and never recorded by this instance (a head start's outputs as its run plans
        # them): stale, and neither their manifests nor their inputs' are read.
        other = DagsterInstance.from_config(str(ensure_instance_config(work / "other")))
        looked: list[str] = []
        monkeypatch.setattr(Store, "current_manifest", lambda self, pdir, version: looked.append(pdir))
        asked.clear()
        for program in ("raw_documents", "minhash_signatures"):
            plan = planner.Planner(other, resource, crawl).step(program)
            assert plan.stale == sorted(crawl.sources) and looked == [] and asked == []


def test_a_steps_plan_derives_the_crawls_keys_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning a step resolves each of its partitions; the crawl's keys they are named by are
    derived once for the whole step (checking that cached keys still hold validates every
    program's params again: at 200 sources, 200 times a step), with the same plan."""
    from curation_dagster.run.planner import Planner

    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        validated = count_params_validations(monkeypatch)
        plan = Planner(instance, resource, crawl).step("minhash_signatures")
        assert plan.current == sorted(crawl.sources) and not plan.stale
        # one key_map (each program's params once but ingestion's, which differ by source), then
        # each partition's own params
        assert len(validated) == len(PROGRAMS) - 1 + len(crawl.sources)


def test_a_reruns_plan_reads_each_manifest_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition current: a partition's manifest is read for itself and again for the data
    version of each partition that reads it (a crawl-wide one by every source's); within one plan
    each is read once, the plan the same (a rerun of 200 sources planned in 0.31 s, 0.80-0.90 s
    before)."""
    from curation_dagster.run.planner import Planner

    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work:
        resource = CurationResource(workdir=str(work))
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=resource)
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        read: list[str] = []
        real = Store.read_text
        monkeypatch.setattr(Store, "read_text", lambda self, path: read.append(path) or real(self, path))
        plans, held = Planner(instance, resource, crawl).crawl()
        assert held is None and not any(p.stale for p in plans.values())
        assert sum(len(p.current) for p in plans.values()) == sum(len(crawl.partitions(p)) for p in PROGRAMS)
        manifests = [path for path in read if path.endswith("/_manifest.json")]
        assert len(manifests) == len(set(manifests)) == sum(len(crawl.partitions(p)) for p in PROGRAMS)
        read.clear()
        plan = Planner(instance, resource, crawl).step("minhash_signatures")  # one step's plan too
        assert plan.current == sorted(crawl.sources)
        manifests = [path for path in read if path.endswith("/_manifest.json")]
        assert len(manifests) == len(set(manifests))


def test_a_partition_committed_but_not_recorded_is_recorded_by_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition is current only where the instance recorded its committed output's data
    version (``Planner.current``). ``curate run``'s head start (``PartitionPool.ahead_of_run``)
    commits the first program's partitions before the run plans, here every one of them: in a new
    data root beside an instance that recorded the old one's, after one source changed. That
    source's partition has a new data version, and the run records it; the others' are the
    versions recorded before, current (a planner that asked only whether the partition was ever
    recorded would have taken the changed one for current too)."""
    import shutil

    from curation_dagster.run.pool import PartitionPool
    from tests.support.tiny_corpus import TINY, curate, write_config

    made: list[frozenset[tuple[str, str | None]]] = []
    real = PartitionPool.ahead_of_run.__func__  # type: ignore[attr-defined]

    def committed_first(cls: type[PartitionPool], *args: object, **kwargs: object) -> PartitionPool | None:
        pool = real(cls, *args, **kwargs)
        if pool is not None:
            made.append(pool.ahead)
            for thread in pool._threads:  # every partition run ahead ends before the run plans
                thread.join()
        return pool

    monkeypatch.setattr(PartitionPool, "ahead_of_run", classmethod(committed_first))
    root = tmp_path / "corpus"
    shutil.copytree(TINY, root)
    crawl = spec(root, stages=["fuzzy"])
    first = {("raw_documents", s) for s in crawl.partitions("raw_documents")}
    with fast_tmp(tmp_path / "w") as work:
        args = ["run", "--workdir", str(work), "--crawl", CRAWL, "--config",
                str(write_config(tmp_path / "c.json", root, stages=["fuzzy"])), "--quiet"]
        assert curate(*args)[0] == 0
        shutil.rmtree(work / "data")
        changed = sorted(Path(crawl.sources["news"].url).rglob("*.jsonl"))[0]
        with changed.open("ab") as f:
            f.write(b'\n{"id": "late", "text": "a document added since"}\n')
        assert curate(*args)[0] == 0
        assert made == [first, first]
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        runs = instance.get_runs()  # newest first
        assert len(runs) == 2
        resource = CurationResource(workdir=str(work))
        for source in crawl.partitions("raw_documents"):
            records = instance.fetch_materializations(AssetRecordsFilter(
                asset_key=AssetKey("raw_documents"), asset_partitions=[str(partition_key(CRAWL, source))]),
                limit=10).records
            want = [runs[0].run_id, runs[1].run_id] if source == "news" else [runs[1].run_id]
            assert [r.run_id for r in records] == want, source
            mat = records[0].event_log_entry.asset_materialization
            assert mat is not None and (mat.tags or {}).get(DATA_VERSION_TAG) == \
                _manifest(resource, crawl, "raw_documents", source).data_version


def test_a_one_source_crawls_first_step_runs_on_a_worker_forked_before_its_run(tmp_path: Path) -> None:
    """``curate run`` in a process of its own (``python -m curation_dagster.cli``'s): a one-source
    crawl's first partition runs ahead on one worker forked from it (``PartitionPool``'s
    ``fork``), and every later one on that worker too, down the chain (``_forked_fits``), and
    the run records each; the outputs are those of the same crawl run in this process
    (``cli.main(argv)``: no head start for one source). The command's process writes its id, and
    each ``stages.execute.execute`` call its program and process id."""
    import subprocess
    import sys

    from tests.support.tiny_corpus import SOURCES, curate, write_config

    config = write_config(tmp_path / "c.json", sources=SOURCES[:1], stages=["fuzzy"])
    crawl = spec(sources=SOURCES[:1], stages=["fuzzy"])
    calls = tmp_path / "calls.txt"
    traced = ("import os, stages.execute as ex\n"
              f"open({str(calls)!r}, 'w').write(f'curate {{os.getpid()}}\\n')\n"
              "real = ex.execute\n"
              "def execute(store, spec, program, *args, **kwargs):\n"
              f"    with open({str(calls)!r}, 'a') as f: f.write(f'{{program}} {{os.getpid()}}\\n')\n"
              "    return real(store, spec, program, *args, **kwargs)\n"
              "ex.execute = execute\n"
              # every program's memory request fits, whatever this machine has (``_forked_fits``)
              "import curation_dagster.run.pool as pool; pool._memory_bytes = lambda: 2**40\n"
              "import runpy; runpy.run_module('curation_dagster.cli', run_name='__main__')\n")
    with fast_tmp(tmp_path / "w") as work, fast_tmp(tmp_path / "here") as here:
        proc = subprocess.run([sys.executable, "-c", traced, "run", "--workdir", str(work), "--crawl", CRAWL,
                               "--config", str(config), "--quiet"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        pids = {program: int(pid) for program, pid in (line.split() for line in calls.read_text().splitlines())}
        running = [p for p in PROGRAMS if crawl.partitions(p)]
        assert set(pids) == {"curate", *running}
        here_pid = pids.pop("curate")
        assert len(set(pids.values())) == 1 and here_pid not in pids.values(), pids
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        (run,) = instance.get_runs()
        resource = CurationResource(workdir=str(work))
        for program in running:
            (partition,) = crawl.partitions(program)
            (mat,) = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(program)),
                                                     limit=10).records
            assert mat.run_id == run.run_id and (mat.event_log_entry.asset_materialization.tags or {}).get(  # type: ignore[union-attr]
                DATA_VERSION_TAG) == _manifest(resource, crawl, program, partition).data_version, program
        assert curate("run", "--workdir", str(here), "--crawl", CRAWL, "--config", str(config), "--quiet")[0] == 0
        theirs = CurationResource(workdir=str(here)).store()
        assert _sorted(read(resource.store(), crawl, "removal_ledger", "ledger")).equals(
            _sorted(read(theirs, crawl, "removal_ledger", "ledger")))
