"""``curate profile``: the read/compute/write split every partition records (``stages.timing``),
the orchestration overhead from the Dagster event log, and ``curate size`` checked against it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from curation_dagster.defs.partitions import partition_key
from curation_dagster.tools.profile import measured_sizing, partition_profile, print_profile, profile
from stages import cli as stages_cli
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.execute import Outcome, metadata
from stages.sizing import Crawl, Setting, size
from stages.store import Manifest, Store
from stages.timing import measure, timed, timed_iter
from tests.support.tiny_corpus import CRAWL, curate, fast_tmp, spec, write_config

FIGURES = ("wall_s", "cpu_s", "read_s", "compute_s", "write_s")
ROW = {"documents": int, "bytes": int, "wall_s": float, "cpu_s": float, "read_s": float, "compute_s": float,
       "write_s": float, "overhead_s": float}
FUZZY = ["heuristic", "exact", "fuzzy"]


def test_clock_counts_outermost_reads_and_writes_per_table(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    table = pa.table({"x": pa.array(range(1000), pa.int64())})
    pdir = store.partition_dir("p", "k", "c")
    with measure() as clock:
        writer = store.writer(pdir)
        writer.write("t", table)
        writer.write("t", table)
        writer.commit(Manifest("p", "k", "v", "c", None, {}))
        assert clock.written_bytes == {"t": 2 * table.nbytes}
        assert clock.write_s > 0 and clock.read_bytes == 0
        got = store.read_table(pdir, "t")  # its manifest read is inside the table read: one read
        assert clock.read_bytes == got.nbytes >= 2 * table.nbytes  # as read (with a validity bitmap)
        before, batches = clock.read_bytes, 0
        for batch in store.iter_batches(pdir, "t", batch_rows=100):
            batches += batch.nbytes
            time.sleep(0.001)  # the consumer's time is not a read
        assert clock.read_bytes == before + batches
        report = clock.report()
    assert report["wall_s"] >= report["read_s"] + report["write_s"]
    assert report["compute_s"] == pytest.approx(report["wall_s"] - report["read_s"] - report["write_s"], abs=1e-3)
    assert report["compute_s"] >= 0.01  # the sleeps: 20 batches x 1 ms


BUSY = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\n"


def test_cpu_seconds_count_work_not_waiting_and_a_child_waited_for() -> None:
    """``cpu_s``: a partition that waits (a sleep here; a core taken by another process in a
    crawl) has CPU seconds short of its wall time; its own work and that of a child process it
    waited for (its worker pool) count."""
    with measure() as clock:
        time.sleep(0.2)
        waited = clock.report()
        exec(BUSY)  # 0.2 s of this process's CPU
        subprocess.run([sys.executable, "-c", BUSY], check=True)  # 0.2 s of a child's, and its start
        worked = clock.report()
    assert waited["wall_s"] >= 0.2 and waited["cpu_s"] < 0.1
    assert worked["cpu_s"] - waited["cpu_s"] >= 0.38


def test_no_clock_no_counting_and_nested_clocks_are_separate() -> None:
    with timed("read") as outside:
        assert outside is None
    with measure() as outer:
        with measure() as inner:
            with timed("write", 10, "t"):
                pass
        assert inner.written_bytes == {"t": 10} and outer.written_bytes == {}
        assert list(timed_iter(iter([1, 2]))) == [1, 2]


def test_python_m_stages_records_the_split_without_dagster(tmp_path: Path) -> None:
    """The Dagster-free path: every partition's manifest carries ``timing``; no step, no overhead."""
    root = DataRoot.open(str(tmp_path / "data"))
    crawl_spec = spec(stages=FUZZY)
    root.register(crawl_spec)
    for program in PROGRAMS:
        for source in crawl_spec.partitions(program):
            args = [program, "--crawl", CRAWL, "--data-root", root.url, "--workers", "1"]
            assert stages_cli.main(args + (["--source", source] if source else [])) == 0
    result = profile(root, CRAWL)
    assert set(result["programs"]) == {p for p in PROGRAMS if crawl_spec.partitions(p)}  # the crawl's (fuzzy)
    raw = result["programs"]["raw_documents"]
    assert all(row["documents"] > 0 and row["bytes"] > 0 for row in raw.values())  # its source files' bytes
    for parts in result["programs"].values():
        for row in parts.values():
            assert row["overhead_s"] is None
            assert row["read_s"] + row["compute_s"] + row["write_s"] == pytest.approx(row["wall_s"], abs=2e-3)
    sig = result["programs"]["minhash_signatures"]
    assert all(row["read_s"] > 0 and row["write_s"] > 0 and row["bytes"] > 0 for row in sig.values())


def test_partition_profile_gpu_time_only_where_a_gpu_ran() -> None:
    timing = {"wall_s": 2.0, "read_s": 0.5, "compute_s": 1.0, "write_s": 0.5, "read_bytes": 10}
    cpu = partition_profile("minhash_signatures", {"documents": 4, "backend": "cpu", "kernel_seconds": 0.8,
                                                   "timing": timing}, 0.25)
    assert cpu == {"documents": 4, "bytes": 10, "wall_s": 2.0, "cpu_s": None, "read_s": 0.5, "compute_s": 1.0,
                   "write_s": 0.5, "overhead_s": 0.25}
    gpu = partition_profile("document_embeddings", {"input": 4, "device": "cuda:0", "embed_seconds": 0.7,
                                                    "timing": timing}, None)
    assert gpu["gpu_s"] == 0.7 and gpu["overhead_s"] is None


def test_the_cpu_total_only_where_every_partition_has_its_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    timing = {"wall_s": 2.0, "cpu_s": 1.5, "read_s": 0.5, "compute_s": 1.0, "write_s": 0.5}
    new = partition_profile("curated_documents", {"input": 4, "timing": timing}, 0.1)
    old = partition_profile("curated_documents", {"input": 4, "timing": {**timing, "cpu_s": None}}, 0.1)
    assert old["cpu_s"] is None and new["cpu_s"] == 1.5
    print_profile({"crawl": "c", "programs": {"curated_documents": {"a": new, "b": new}}})
    total = next(line for line in capsys.readouterr().out.splitlines() if "TOTAL" in line)
    assert "4.000" in total and "3.000" in total  # wall, CPU
    print_profile({"crawl": "c", "programs": {"curated_documents": {"a": new, "b": old}}})
    total = next(line for line in capsys.readouterr().out.splitlines() if "TOTAL" in line)
    assert "4.000" in total and "3.000" not in total and "1.500" not in total and " - " in total


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tiny corpus through ``curate run`` (heuristic, exact and fuzzy) on a real instance."""
    with fast_tmp(tmp_path_factory.mktemp("profile")) as folder:
        config = write_config(folder / "curate.json", stages=FUZZY)
        work = folder / "work"
        frozen = gc.get_freeze_count()
        code, out, err = curate("run", "--workdir", str(work), "--crawl", CRAWL, "--config", str(config), "--quiet")
        assert code == 0, err + out
        # gc.freeze is the console script's alone: a caller's process keeps collecting its cycles
        assert gc.get_freeze_count() == frozen
        yield work


def test_profile_json_has_every_partition_with_its_overhead(workdir: Path) -> None:
    code, out, err = curate("profile", "--workdir", str(workdir), "--crawl", CRAWL, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result) == {"crawl", "programs"} and result["crawl"] == CRAWL
    crawl_spec = DataRoot.open(workdir=workdir).spec(CRAWL)
    assert set(result["programs"]) == {p for p in PROGRAMS if crawl_spec.partitions(p)}
    for program, parts in result["programs"].items():
        assert set(parts) == {s or CRAWL for s in crawl_spec.partitions(program)}, program
        for partition, row in parts.items():
            assert set(row) == set(ROW), (program, partition)  # no GPU here: no gpu_s
            for key, kind in ROW.items():
                assert type(row[key]) is kind, (program, partition, key)
            assert row["overhead_s"] >= 0.0
            assert row["read_s"] + row["compute_s"] + row["write_s"] == pytest.approx(row["wall_s"], abs=2e-3)
    docs = result["programs"]["raw_documents"]
    assert all(row["documents"] > 0 for row in docs.values())
    assert result["programs"]["removal_ledger"][CRAWL]["documents"] == sum(r["documents"] for r in docs.values())
    # A data root alone has no event log: the same figures, the overhead unknown.
    code, out, err = curate("profile", "--data-root", str(workdir / "data"), "--crawl", CRAWL, "--json")
    assert code == 0, err
    alone = json.loads(out)["programs"]
    assert all(row["overhead_s"] is None for parts in alone.values() for row in parts.values())
    assert alone["minhash_signatures"] == {p: {**row, "overhead_s": None}
                                           for p, row in result["programs"]["minhash_signatures"].items()}


def test_materializations_carry_the_figures_as_floats(workdir: Path) -> None:
    instance = DagsterInstance.from_config(str(workdir / "dagster"))
    source = sorted(DataRoot.open(workdir=workdir).spec(CRAWL).sources)[0]
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("minhash_signatures"),
                           asset_partitions=[str(partition_key(CRAWL, source))]), limit=1).records
    meta = records[0].asset_materialization.metadata  # type: ignore[union-attr]
    for name in (*FIGURES, "overhead_s"):
        assert isinstance(meta[name].value, float), name  # FloatMetadataValue: the UI plots it
    code, out, _ = curate("profile", "--workdir", str(workdir), "--crawl", CRAWL)
    assert code == 0
    for words in ("PROGRAM", "OVERHEAD", "minhash_signatures", "TOTAL"):
        assert words in out


def test_a_cached_step_records_no_figures() -> None:
    m = Manifest("exact_duplicates", "k", "v", "c", None, {}, report={"timing": {"wall_s": 1.0, "read_s": 0.1}})
    assert metadata(Outcome(m, skipped=False, seconds=1.0))["wall_s"] == 1.0
    assert "wall_s" not in metadata(Outcome(m, skipped=True, seconds=0.01))


def test_plan_predicts_what_the_profiled_run_measured_within_2x(workdir: Path) -> None:
    """``curate size`` with the run's measured documents and mean length: its signature-table
    bytes, band keys and band-key bytes within 2x of what the run wrote (bench/size_vs_profile.py
    does the same at any size)."""
    root = DataRoot.open(workdir=workdir)
    got = measured_sizing(root, CRAWL)
    assert got["documents"] > 0
    lsh = root.spec(CRAWL).program_params("lsh_buckets")
    want = size(Crawl(int(got["documents"]), got["mean_chars"]),
                Setting(bands=lsh.bands, rows=lsh.rows))  # type: ignore[attr-defined]
    for predicted, measured in ((want.signatures["bytes"], got["signature_bytes"]),
                                (want.band_keys["keys"], got["band_keys"]),
                                (want.band_keys["bytes"], got["band_key_bytes"])):
        assert measured / 2 <= predicted <= measured * 2, (predicted, measured)
