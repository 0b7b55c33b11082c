"""Scale-out: a real local Ray cluster and a real S3-compatible server give the local run's outputs.

One Ray cluster (2 CPUs, started by ``stages.parallel.ray_init`` on
127.0.0.1) and one moto S3 server (``ThreadedMotoServer`` on 127.0.0.1, a free port) serve the
whole module; both are stopped by their own handles. The tiny corpus runs heuristic, exact and
fuzzy dedup locally (the reference), on Ray, on S3 (data root and source URLs), and through
``curate run --ray-address --data-root s3://`` with Dagster; every table must be identical.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from curation_dagster.defs.resources import CurationResource
from stages import parallel
from stages.catalog import PROGRAMS
from stages.credentials import STORAGE_OPTIONS_ENV
from stages.dataroot import DATA_ROOT_FILE, DataRoot
from stages.execute import execute_crawl
from stages.parallel import map_ordered, ray_init
from stages.params import ExecutionParams, RawDocumentsParams
from stages.programs.lsh_buckets import BANDS_PER_TASK
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Manifest, Store, is_transient, retry, use_storage_options
from tests.support.moto_s3 import moto_s3
from tests.support.tiny_corpus import TINY, config, counts, fast_tmp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CRAWL = "c1"
STAGES = ("heuristic", "exact", "fuzzy")
BUCKET = "curation-test"
KEY_ID = "AKIACURATETEST"
SECRET = "s3cr3t-curate-never-written-anywhere"
# Small batches, so every source's raw documents, scores and signatures are several Ray tasks.
LOCAL = ExecutionParams(workers=2, batch_rows=8)
RAY = ExecutionParams(workers=2, batch_rows=8, executor="ray")
TIMING = {"seconds", "kernel_seconds", "kernel_mb_per_s", "timing"}


def tiny_spec(root: str = str(TINY)) -> CrawlSpec:
    cfg = config()
    sources = {k: {**v, "url": v["url"].replace(str(TINY), root)} for k, v in cfg["sources"].items()}
    return CrawlSpec.model_validate({"crawl": CRAWL, "sources": sources, "keep": cfg["keep"], "stages": STAGES})


def outputs(store: Store, spec: CrawlSpec) -> dict[tuple[str, str | None, str], Any]:
    """Every committed table of every partition, and each partition's row counts."""
    out: dict[tuple[str, str | None, str], Any] = {}
    for program in PROGRAMS:
        for source in spec.partitions(program):
            pdir = DataRoot(store).output_dir(spec, program, source)
            manifest = store.read_manifest(pdir)
            assert manifest is not None, (program, source)
            out[(program, source, "_rows")] = manifest.rows
            for table in manifest.tables:
                out[(program, source, table)] = store.read_table(pdir, table)
    return out


def assert_same(got: dict[tuple[str, str | None, str], Any], want: dict[tuple[str, str | None, str], Any]) -> None:
    assert got.keys() == want.keys()
    for key, table in want.items():
        if key[2] == "_rows":
            assert got[key] == table, key
        else:
            assert got[key].schema == table.schema, key
            assert got[key].equals(table), key


def ledger_report(store: Store, spec: CrawlSpec) -> dict[str, Any]:
    manifest = DataRoot(store).manifest(spec, "removal_ledger", None)
    assert manifest is not None
    return {k: v for k, v in manifest.report.items() if k not in TIMING}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, CrawlSpec, dict[Any, Any]]:
    """The tiny corpus on the local executor (process pools of 2), on a local folder."""
    store, spec = Store(str(tmp_path_factory.mktemp("local") / "data")), tiny_spec()
    execute_crawl(store, spec, LOCAL)
    return store, spec, outputs(store, spec)


@dataclass
class S3:
    options: dict[str, Any]
    fs: Any

    def url(self, path: str) -> str:
        return f"s3://{BUCKET}/{path}"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    """A moto S3 server on 127.0.0.1 with the tiny corpus under ``s3://BUCKET/corpus``;
    credentials in the standard AWS environment variables, the endpoint in storage options."""
    with moto_s3(BUCKET, KEY_ID, SECRET) as (options, fs):
        for path in sorted(TINY.rglob("*")):
            if path.is_file():
                fs.put_file(str(path), f"{BUCKET}/corpus/{path.relative_to(TINY).as_posix()}")
        yield S3(options, fs)


@pytest.fixture(scope="module")
def ray_cluster(s3: S3) -> Iterator[str]:
    """A local Ray cluster: 2 CPUs, listening on 127.0.0.1.
    Started after the S3 fixture, so its workers inherit the AWS environment."""
    import ray

    if ray.is_initialized():  # a connection another test module left open: this one needs its own
        ray.shutdown()
    ray_init(ExecutionParams(executor="ray", workers=2))
    # Ray workers cannot import this test module: its helpers travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


# --- Ray ------------------------------------------------------------------------------------------


def _listening(pids: set[int]) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of the TCP listeners of ``pids``."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append(fields[1].split(":")[0])
    return out


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc")
def test_local_ray_cluster_listens_on_loopback_only(ray_cluster: str) -> None:
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    addresses = _listening(_descendants(os.getpid()))
    assert len(addresses) >= 3  # GCS, raylet, object manager, workers' gRPC servers
    assert set(addresses) <= loopback, addresses
    assert ray_cluster.startswith("127.0.0.1:")


def _probe(x: int) -> tuple[int, int]:
    import numba

    return x * x, numba.get_num_threads()


def test_map_ordered_on_ray_keeps_order_and_limits_kernel_threads(ray_cluster: str) -> None:
    assert list(map_ordered(_probe, range(12), RAY)) == [(x * x, 1) for x in range(12)]
    assert list(map_ordered(_probe, range(3), RAY, num_cpus=2)) == [(x * x, 2) for x in range(3)]


def test_ray_executor_outputs_identical_to_local(
    ray_cluster: str, reference: tuple[Store, CrawlSpec, dict[Any, Any]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref_store, spec, want = reference
    store = Store(str(tmp_path / "data"))
    sent: dict[str, int] = {}
    real = parallel._ray_map

    def counting(fn: Any, items: Any, *args: Any) -> Any:
        module = getattr(fn, "func", fn).__module__  # a functools.partial's function
        def count(items: Any) -> Any:
            for item in items:
                sent[module] = sent.get(module, 0) + 1
                yield item

        return real(fn, count(items), *args)

    monkeypatch.setattr(parallel, "_ray_map", counting)
    execute_crawl(store, spec, RAY)
    # Scoring chunks, one task per batch of 8 signatures, one per group of BANDS_PER_TASK bands.
    assert sent["stages.programs.minhash_signatures"] >= 4 and sent["stages.programs.filtered_documents"] >= 3
    bands = spec.program_params("lsh_buckets").bands  # type: ignore[attr-defined]
    assert sent["stages.programs.lsh_buckets"] == -(-bands // BANDS_PER_TASK)
    assert_same(outputs(store, spec), want)
    assert ledger_report(store, spec) == ledger_report(ref_store, spec)
    assert ledger_report(store, spec)["sources"]["news"]["removed_per_stage"]["fuzzy"] == 1


# --- object storage -------------------------------------------------------------------------------


def test_s3_data_root_and_sources_identical_to_local(
    s3: S3, reference: tuple[Store, CrawlSpec, dict[Any, Any]]
) -> None:
    ref_store, ref_spec, want = reference
    spec = tiny_spec(s3.url("corpus"))
    store = Store(s3.url("local-exec"), s3.options)

    use_storage_options(s3.url("local-exec"), s3.options)  # source URLs: the same endpoint
    execute_crawl(store, spec, LOCAL)
    assert_same(outputs(store, spec), want)
    assert ledger_report(store, spec) == ledger_report(ref_store, ref_spec)
    # Atomic commits left nothing behind: every object is a manifest or a part it names.
    named: set[str] = set()
    manifests = [p for p in s3.fs.find(f"{BUCKET}/local-exec") if p.endswith(f"/{MANIFEST}")]
    for path in manifests:
        m = Manifest.from_json(s3.fs.cat_file(path).decode())
        named |= {path.rsplit("/", 1)[0] + "/" + n for names in m.tables.values() for n in names}
    assert set(s3.fs.find(f"{BUCKET}/local-exec")) == named | set(manifests)
    # A rerun on unchanged inputs (same ETags) recomputes nothing.
    assert all(o.skipped for o in execute_crawl(store, spec, LOCAL).values())


def test_raw_documents_fingerprint_follows_s3_etags(s3: S3) -> None:
    from stages.programs.raw_documents import fingerprint

    # The source URL opens with the process's fsspec defaults, as in a pod: set here, not left to
    # whichever test of the module ran before (in a full run one did not, and it asked AWS).
    use_storage_options(s3.url(""), s3.options)
    s3.fs.put_file(str(TINY / "news" / "news-2024-05.jsonl"), f"{BUCKET}/fp/news/a.jsonl")
    params = RawDocumentsParams.model_validate({"url": s3.url("fp/news")})
    first = fingerprint(params)
    assert fingerprint(params) == first
    s3.fs.pipe_file(f"{BUCKET}/fp/news/a.jsonl", (TINY / "news" / "news-2024-05.jsonl").read_bytes())
    s3.fs.invalidate_cache()
    assert fingerprint(params) == first  # same bytes, same ETag: nothing to recompute
    s3.fs.pipe_file(f"{BUCKET}/fp/news/a.jsonl", b'{"text": "changed"}\n')
    s3.fs.invalidate_cache()
    assert fingerprint(params) != first


def test_s3_manifest_written_by_another_process_is_read_whole(s3: S3) -> None:
    """A listing cached by one store never makes it read a newer, longer manifest short."""
    reader = Store(s3.url("fresh"), s3.options)
    writer = Store(s3.url("fresh"), {**s3.options, "skip_instance_cache": True})  # as another process
    pdir = reader.partition_dir("p", "k", "c")
    w = reader.writer(pdir)
    w.commit(Manifest("p", "k", "v1", "c", None, {}))
    reader.fs.ls(pdir)  # the listing (with the manifest's old size) is now cached
    w2 = writer.writer(pdir)
    w2.commit(Manifest("p", "k", "v2", "c", None, {"long": "x" * 500}, report={"note": "y" * 500}))
    got = reader.read_manifest(pdir)
    assert got is not None and got.data_version == "v2" and got.report == {"note": "y" * 500}


class _Flaky:
    """Wraps a filesystem's ``open``: the first ``failures`` calls raise ``error``."""

    def __init__(self, open_: Any, failures: int, error: Exception) -> None:
        self.open_, self.failures, self.error, self.raised = open_, failures, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.raised < self.failures:
            self.raised += 1
            raise self.error
        return self.open_(*args, **kwargs)


def test_manifest_reads_and_commits_retry_transient_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stages.store.time.sleep", lambda s: None)
    store = Store("memory://curate-retry", {"skip_instance_cache": True})
    pdir = store.partition_dir("p", "k", "c")
    flaky = _Flaky(store.fs.open, 2, ConnectionResetError("reset by peer"))
    monkeypatch.setattr(store.fs, "open", flaky)
    store.writer(pdir).commit(Manifest("p", "k", "v", "c", None, {}))
    assert flaky.raised == 2
    flaky.raised, flaky.failures = 0, 4  # retry() makes 5 attempts
    got = store.read_manifest(pdir)
    assert flaky.raised == 4 and got is not None and got.data_version == "v"
    flaky.raised, flaky.failures = 0, 5
    with pytest.raises(ConnectionResetError):
        store.read_manifest(pdir)
    flaky.raised, flaky.failures, flaky.error = 0, 2, PermissionError("denied")
    with pytest.raises(PermissionError):
        store.read_manifest(pdir)
    assert flaky.raised == 1  # permanent: not retried
    flaky.failures = 0
    assert store.read_manifest(store.partition_dir("p", "k", "other")) is None
    assert not is_transient(FileNotFoundError()) and is_transient(TimeoutError())
    calls: list[int] = []

    def always() -> None:
        calls.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        retry(always, attempts=3)
    assert len(calls) == 3


# --- curate run -----------------------------------------------------------------------------------


def test_resource_passes_ray_settings_on_the_command_line_and_credentials_only_by_environment(tmp_path: Path) -> None:
    resource = CurationResource(workdir=str(tmp_path), data_root="s3://b/p", executor="ray",
                                ray_address="ray://head:10001", storage_options={"secret": SECRET})
    cmd = resource.command("lsh_buckets", CRAWL, None)
    assert cmd[cmd.index("--executor") + 1] == "ray" and cmd[cmd.index("--ray-address") + 1] == "ray://head:10001"
    assert not [arg for arg in cmd if SECRET in arg]
    execution = resource.execution()
    assert (execution.executor, execution.ray_address) == ("ray", "ray://head:10001")
    assert "--executor" not in CurationResource(workdir=str(tmp_path)).command("lsh_buckets", CRAWL, None)



def curate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_curate_run_with_ray_address_and_s3_data_root_matches_local(
    ray_cluster: str, s3: S3, reference: tuple[Store, CrawlSpec, dict[Any, Any]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref_store, ref_spec, _ = reference
    # The key pair in storage options too (resource config path): it must never be written.
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps({**s3.options, "key": KEY_ID, "secret": SECRET}))
    spec = tiny_spec(s3.url("corpus"))
    with fast_tmp(tmp_path / "work") as work:
        conf = work / "curate.json"
        conf.write_text(json.dumps({"sources": {k: v.model_dump() for k, v in spec.sources.items()},
                                    "keep": config()["keep"], "stages": list(STAGES)}))
        data_root = s3.url("dagster-run")
        # Its own process, as a user would run it: it joins the cluster by address, and gets the
        # bucket's endpoint and keys from nothing but its environment.
        run = [sys.executable, "-m", "curation_dagster.cli", "run", "--workdir", str(work), "--crawl", CRAWL,
               "--config", str(conf), "--quiet", "--data-root", data_root, "--ray-address", ray_cluster]
        done = subprocess.run(run, capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Connecting to existing Ray cluster" in done.stderr
        # Again: every partition is up to date (inputs fingerprinted by ETag, before any stage).
        done = subprocess.run([a for a in run if a != "--quiet"], capture_output=True, text=True, timeout=240,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        partitions = sum(len(spec.partitions(name)) for name in PROGRAMS)
        assert done.stdout.count(" up to date") == partitions, done.stdout
        assert (work / DATA_ROOT_FILE).read_text().strip() == data_root
        store = CurationResource(workdir=str(work)).store()  # finds the recorded root
        assert store.root == f"{BUCKET}/dagster-run" and not store.is_local
        assert ledger_report(store, spec) == ledger_report(ref_store, ref_spec)
        code, out, err = curate("report", "--workdir", str(work), "--crawl", CRAWL, "--json")
        assert code == 0, err
        assert counts(json.loads(out)) == counts(ledger_report(ref_store, ref_spec))
        code, _, err = curate("ledger", "--workdir", str(work), "--crawl", CRAWL, "--out", str(work / "l.parquet"))
        assert code == 0, err
        want = ref_store.read_table(DataRoot(ref_store).output_dir(ref_spec, "removal_ledger", None), "ledger")
        assert pq.read_table(work / "l.parquet").equals(want)
        for source in spec.sources:
            got = store.read_table(DataRoot(store).output_dir(spec, "curated_documents", source), "documents")
            ref = ref_store.read_table(
                DataRoot(ref_store).output_dir(ref_spec, "curated_documents", source), "documents")
            assert got["doc_id"].to_pylist() == ref["doc_id"].to_pylist() and got.num_rows > 0
        # Credentials never reach a manifest, a part, the Dagster instance or the workdir.
        written = [s3.fs.cat_file(p) for p in s3.fs.find(f"{BUCKET}/dagster-run")]
        written += [p.read_bytes() for p in work.rglob("*") if p.is_file()]
        assert written and not [b for b in written if SECRET.encode() in b]
