"""Tampered outputs and hostile names (issue 30): a partition whose parts are missing or not whole
is recomputed, never served; a damaged manifest or crawl record is an error naming its file; a
name with a trailing newline is refused like any other unsafe name."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from stages.dataroot import DataRoot
from stages.errors import DamagedFile
from stages.execute import execute
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Manifest, Store, UnsafeNameError, check_name
from tests.support.tiny_corpus import CRAWL, output_dir, read, run_all, spec


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "root"))
    return Store(f"memory://tamper-{uuid.uuid4().hex}")


def committed(store: Store, rows: int = 3) -> tuple[str, Manifest]:
    pdir = store.partition_dir("p", "k", "c", "s")
    w = store.writer(pdir)
    w.write("t", pa.table({"x": pa.array(range(rows), pa.int64())}))
    w.write("t", pa.table({"x": pa.array(range(rows), pa.int64())}))
    m = w.commit(Manifest(program="p", params_key="k", data_version="v", crawl="c", source="s", params={}))
    w.close()
    return pdir, m


# --- whole parts ---------------------------------------------------------------------------------


def test_commit_records_each_parts_size_and_a_whole_partition_is_current(store: Store) -> None:
    pdir, m = committed(store)
    assert sorted(m.sizes) == sorted(m.parts()) and len(m.parts()) == 2
    for name, size in m.sizes.items():
        assert store.fs.size(f"{pdir}/{name}") == size > 0
    assert store.read_manifest(pdir) == m
    assert store.is_whole(pdir, m)
    assert store.current_manifest(pdir, "v") == m
    assert store.current_manifest(pdir, "other version") is None
    assert store.current_manifest(pdir, lambda: "v") == m


def test_a_partition_never_committed_asks_no_data_version(store: Store) -> None:
    """The planner passes the data version as a function: a crawl's first run reads no input's
    manifest for a partition with no manifest of its own."""
    asked = []
    assert store.current_manifest(f"{store.root}/never", lambda: asked.append(1) or "v") is None
    assert asked == []


def test_a_deleted_part_is_not_whole(store: Store) -> None:
    pdir, m = committed(store)
    store.fs.rm(f"{pdir}/{m.parts()[1]}")
    assert store.damaged_parts(pdir, m) == [m.parts()[1]]
    assert store.current_manifest(pdir, "v") is None


def test_a_truncated_part_is_not_whole(store: Store) -> None:
    pdir, m = committed(store)
    path = f"{pdir}/{m.parts()[0]}"
    data = store.fs.cat_file(path)
    store.fs.pipe_file(path, data[: len(data) // 2])
    assert store.damaged_parts(pdir, m) == [m.parts()[0]]
    assert store.current_manifest(pdir, "v") is None


def test_a_manifest_without_sizes_checks_that_its_parts_exist(store: Store) -> None:
    pdir, m = committed(store)
    old = json.loads(m.to_json())
    del old["sizes"]  # as written before sizes were recorded
    store.write_atomic(f"{pdir}/{MANIFEST}", json.dumps(old))
    legacy = store.read_manifest(pdir)
    assert legacy is not None and legacy.sizes == {} and store.is_whole(pdir, legacy)
    store.fs.rm(f"{pdir}/{m.parts()[0]}")
    assert not store.is_whole(pdir, legacy)


@pytest.mark.parametrize("damage", ["delete curated part", "truncate raw part", "delete every part"])
def test_a_damaged_partition_is_recomputed_never_served(tmp_path: Path, damage: str) -> None:
    store, crawl = Store(str(tmp_path / "root")), spec()
    want = run_all(store, crawl)
    source = crawl.partitions("raw_documents")[0]
    program = "curated_documents" if "curated" in damage or "every" in damage else "raw_documents"
    pdir = output_dir(store, crawl, program, source)
    before = read(store, crawl, program, "documents", source)
    m = store.read_manifest(pdir)
    assert m is not None
    for name in m.parts() if "every" in damage else m.tables["documents"][:1]:
        if "truncate" in damage:
            data = Path(pdir, name).read_bytes()
            Path(pdir, name).write_bytes(data[: len(data) // 2])
        else:
            os.unlink(Path(pdir, name))
    outcome = execute(store, crawl, program, source)
    assert not outcome.skipped  # recomputed: not "up to date" on the strength of its manifest
    assert read(store, crawl, program, "documents", source).equals(before)
    assert store.is_whole(pdir, outcome.manifest)
    assert run_all(store, crawl) == want  # the rest was current and the ledger the same


# --- damaged manifests and records ---------------------------------------------------------------


@pytest.mark.parametrize("blob", [
    '{"program": "p", "params_key": "k", "data_ver',  # truncated
    "{}",
    "[1, 2]",
    "\x00\x01garbage",
    '{"program": "p", "params_key": "k", "data_version": "v", "crawl": "c", "source": "s", "params": {},'
    ' "tables": {"t": "not a list"}}',
    '{"program": "p", "params_key": "k", "data_version": "v", "crawl": "c", "source": "s", "params": {},'
    ' "rows": {"t": "3"}}',
    '{"program": 1, "params_key": "k", "data_version": "v", "crawl": "c", "source": "s", "params": {}}',
])
def test_a_damaged_manifest_is_one_error_naming_its_file(store: Store, blob: str) -> None:
    pdir, _ = committed(store)
    store.write_atomic(f"{pdir}/{MANIFEST}", blob)
    with pytest.raises(DamagedFile) as err:
        store.read_manifest(pdir)
    assert f"{pdir}/{MANIFEST}" in str(err.value) and "\n" not in str(err.value)


def test_a_manifest_of_bytes_that_are_not_text_names_its_file(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    pdir, _ = committed(store)
    Path(pdir, MANIFEST).write_bytes(b"\xff\xfe\x80garbage")
    with pytest.raises(DamagedFile, match=f"{pdir}/{MANIFEST}"):
        store.read_manifest(pdir)


@pytest.mark.parametrize("blob", ['{"crawl": "c1", "seq', "{}", "null"])
def test_a_damaged_crawl_record_names_its_file(tmp_path: Path, blob: str) -> None:
    root = DataRoot.open(str(tmp_path / "root"))
    root.register(spec())
    path = root.record_path(CRAWL)
    Path(path).write_text(blob)
    for read_it in (lambda: root.record(CRAWL), root.records):
        with pytest.raises(DamagedFile) as err:
            read_it()
        assert path in str(err.value) and "\n" not in str(err.value)


# --- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["c1\n", "c1\r\n", "\nc1", "c1\n\n", "a b", "../../x", "a/b", "a|b", "a,b", "",
                                  "..", "c1\x00", "é"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(UnsafeNameError):
        check_name("crawl", name)
    with pytest.raises(ValueError):
        CrawlSpec(crawl=name, sources={"s": {"url": "/x"}})
    with pytest.raises(ValueError):
        CrawlSpec(crawl="c1", sources={name: {"url": "/x"}})


def test_a_filter_name_with_a_trailing_newline_is_refused() -> None:
    from stages.filters import NAME

    assert NAME.fullmatch("digit_ratio") and not NAME.fullmatch("digit_ratio\n")
