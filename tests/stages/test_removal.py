"""``kept_rows``: the rows a removal list keeps, as zero-copy slices where removals are few; and
``removed_ids``: a source's removed documents, a crawl-wide list read once per commit and process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stages.removal import kept_rows, removal_table, removed_ids, split_by_source, survivor_count, survivors
from stages.store import Manifest, Store
from stages.task import Inputs


def _table(n: int) -> pa.Table:
    return pa.table({"doc_id": pa.array([f"{i:032x}" for i in range(n)]),
                     "text": pa.array([f"text {i} " * 8 for i in range(n)], pa.large_string())})


@pytest.mark.parametrize("removed", [0.0, 0.001, 0.05, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("n", [0, 1, 17, 3000])
def test_kept_rows_are_the_filtered_rows(n: int, removed: float) -> None:
    table = _table(n)
    keep = np.random.default_rng(n).random(n) >= removed
    got = kept_rows(table, keep)
    assert got.schema == table.schema
    assert got.equals(table.filter(pa.array(keep, pa.bool_())))


def test_few_removals_keep_the_texts_where_they_are() -> None:
    table = _table(3000)
    keep = np.ones(3000, bool)
    keep[[5, 1000, 2999]] = False
    got = kept_rows(table, keep)
    assert got.num_rows == 2997
    data = table["text"].chunk(0).buffers()[2].address
    assert {c.buffers()[2].address for c in got["text"].chunks} == {data}  # slices, not copies


def _commit_removed(store: Store, pdir: str, rows: list[tuple[str, str]], version: str = "v1") -> None:
    """Commit a crawl-wide ``removed`` table of (doc_id, source) rows at ``pdir``."""
    full = removal_table(np.array([d for d, _ in rows], object), np.array([s for _, s in rows], object),
                         "fuzzy_duplicate", None, None, None)
    writer = store.writer(pdir)
    writer.write("removed", full)
    writer.commit(Manifest(program="fuzzy_duplicates", params_key="k", data_version=version, crawl="c",
                           source=None, params={}))
    writer.close()


def test_a_crawl_wide_list_committed_again_is_read_again(tmp_path: Path) -> None:
    """The crawl-wide lists are held per process between partitions; a new commit of one (a rerun
    with other parameters: same folder, even the same data version) is never served from the old."""
    store = Store(str(tmp_path))
    pdir = store.partition_dir("fuzzy_duplicates", "k", "c")
    inputs = Inputs(store, {"fuzzy_duplicates": {None: pdir}})
    _commit_removed(store, pdir, [("a", "s1"), ("b", "s2"), ("c", "s1")])
    assert removed_ids(inputs, "fuzzy_duplicates", "s1").to_pylist() == ["a", "c"]
    assert removed_ids(inputs, "fuzzy_duplicates", "s2").to_pylist() == ["b"]
    _commit_removed(store, pdir, [("d", "s1"), ("e", "s2"), ("f", "s2")])
    assert removed_ids(inputs, "fuzzy_duplicates", "s1").to_pylist() == ["d"]
    assert removed_ids(inputs, "fuzzy_duplicates", "s2").to_pylist() == ["e", "f"]
    _commit_removed(store, pdir, [])
    assert removed_ids(inputs, "fuzzy_duplicates", "s2").to_pylist() == []
    assert removed_ids(inputs, "fuzzy_duplicates", "s3").to_pylist() == []


def test_a_crawl_wide_list_is_read_once_for_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path))
    pdir = store.partition_dir("fuzzy_duplicates", "k", "c")
    inputs = Inputs(store, {"fuzzy_duplicates": {None: pdir}})
    _commit_removed(store, pdir, [(f"d{i}", f"s{i % 7}") for i in range(50)], version="once")
    reads = []
    read_parts = Store.read_parts
    monkeypatch.setattr(Store, "read_parts", lambda self, *a, **k: reads.append(a) or read_parts(self, *a, **k))
    got = {f"s{j}": removed_ids(inputs, "fuzzy_duplicates", f"s{j}").to_pylist() for j in range(7)}
    assert got == {f"s{j}": [f"d{i}" for i in range(50) if i % 7 == j] for j in range(7)}
    assert len(reads) == 1


def test_split_by_source_is_the_filter_of_each_source() -> None:
    rng = np.random.default_rng(3)
    names = np.array(["s1", "s2", "s3", None], dtype=object)
    t = pa.table({"doc_id": [f"{i:x}" for i in range(500)], "source": list(names[rng.integers(0, 4, 500)])})
    t = pa.concat_tables([t.slice(0, 200), t.slice(200)])  # chunked, as a list of several parts reads
    split = split_by_source(t)
    assert sorted(split) == ["s1", "s2", "s3"]
    for name, ids in split.items():
        assert ids.equals(t.filter(pc.equal(t["source"], name))["doc_id"].combine_chunks())


def test_the_survivor_count_is_the_rows_survivors_yields(tmp_path: Path) -> None:
    """A switched-off stage reports its input from the manifests (``survivor_count``), without
    reading the documents: the same number as reading them, with and without removals."""
    store = Store(str(tmp_path))
    raw = store.partition_dir("raw_documents", "k", "c", "s1")
    writer = store.writer(raw)
    for a in range(0, 250, 100):
        writer.write("documents", _table(250).slice(a, 100))
    writer.commit(Manifest(program="raw_documents", params_key="k", data_version="v", crawl="c", source="s1",
                           params={}))
    writer.close()
    ids = _table(250)["doc_id"].to_pylist()
    for removed in ([], ids[3:40:7], ids[:250]):
        pdir = store.partition_dir("fuzzy_duplicates", f"k{len(removed)}", "c")
        _commit_removed(store, pdir, [(d, "s1") for d in removed] + [(f"{i:032x}x", "s2") for i in range(5)])
        inputs = Inputs(store, {"raw_documents": {"s1": raw}, "fuzzy_duplicates": {None: pdir}})
        got = survivor_count(inputs, "s1")
        assert got == sum(t.num_rows for t in survivors(inputs, "s1", ["doc_id"], 64)) == 250 - len(removed)


def test_a_switched_off_heuristic_stage_judges_nothing_and_counts_its_input(tmp_path: Path) -> None:
    """``filtered_documents`` of a crawl without the heuristic stage: no partition in the crawl;
    run on its own (as the UI may), an empty decisions table and removal list (no part file: the
    schemas are in the manifest), and its input, every document that survives the stages before
    it, counted from their manifests."""
    import json

    from stages.dataroot import DataRoot
    from stages.execute import execute, execute_crawl
    from stages.params import ExecutionParams, RawDocumentsParams
    from stages.programs.filtered_documents import DECISIONS
    from stages.spec import CrawlSpec

    folder = tmp_path / "in" / "s0"
    folder.mkdir(parents=True)
    lines = [json.dumps({"id": f"d{i}", "text": f"text {i % 3} of a source " * 5}) for i in range(7)]
    (folder / "part.jsonl").write_text("\n".join(lines) + "\n")
    spec = CrawlSpec(crawl="c1", sources={"s0": RawDocumentsParams(url=str(folder), id_field="id")}, stages=("exact",))
    store = Store(str(tmp_path / "data"))
    assert set(execute_crawl(store, spec, ExecutionParams(workers=1))) == {
        ("raw_documents", "s0"), ("exact_duplicates", None), ("curated_documents", "s0"), ("removal_ledger", None)}
    curated = store.read_table(DataRoot(store).output_dir(spec, "curated_documents", "s0"), "documents")
    assert curated.num_rows == 3  # exact dedup alone removed: 3 distinct texts of 7
    pdir = DataRoot(store).output_dir(spec, "filtered_documents", "s0")
    assert store.read_manifest(pdir) is None
    for program in ("document_languages", "filtered_documents"):  # what it reads, switched off too
        execute(store, spec, program, "s0", ExecutionParams(workers=1))
    manifest = store.read_manifest(pdir)
    assert manifest is not None and manifest.parts() == []
    decisions = store.read_table(pdir, "decisions")
    assert decisions.num_rows == 0 and decisions.schema == DECISIONS
    assert store.read_table(pdir, "removed").num_rows == 0
    report = manifest.report
    assert (report["enabled"], report["input"], report["kept"], report["removed"]) == (False, 7, 7, 0)


def test_raw_dirs_lists_the_partitions_that_hold_the_documents_wanted(tmp_path: Path) -> None:
    """Every raw_documents partition a task reads, its crawl's first, then the earlier crawls'
    (not their other programs'); with ``holding``, only those of the (crawl, source) pairs named."""
    from stages.removal import raw_dirs

    inputs = Inputs(Store(str(tmp_path)), {"raw_documents": {"a": "A", "b": "B"}},
                    {"c0": {"raw_documents/b": "P-B", "raw_documents/x": "P-X", "minhash_signatures/b": "P-M"}})
    assert raw_dirs(inputs) == ["A", "B", "P-B", "P-X"]
    assert raw_dirs(inputs, {("c1", "b"), ("c0", "x")}, "c1") == ["B", "P-X"]
    assert raw_dirs(inputs, {("c0", "b")}, "c1") == ["P-B"]  # the earlier crawl's b, not this one's
    assert raw_dirs(inputs, set(), "c1") == []
