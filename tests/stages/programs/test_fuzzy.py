"""Fuzzy dedup against an exact brute-force Jaccard oracle on real text with planted near-duplicates.

The oracle shingles every document with Python string slicing (independent of the kernel's
hashing), computes every pair's exact Jaccard through a sparse document x shingle matrix, and
dedups perfectly: connected components over pairs with Jaccard >= 0.8, one survivor each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.spec import CrawlSpec


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), min_size=1, max_size=80),
    size=st.lists(st.integers(0, 50), min_size=30, max_size=30),
    groups=st.integers(1, 4),
    budget=st.integers(1, 400),
)
def test_pack_blocks_respects_the_budget(pairs: list[tuple[int, int]], size: list[int], groups: int,
                                         budget: int) -> None:
    """Each block's distinct documents fit the byte budget (or the block is one pair), a group
    that fits is never split (one over the budget only
    for a single pair), and the plan does not depend on the order of the pairs."""
    from stages.kernels.lsh import pack_blocks

    src = np.array([p[0] for p in pairs], np.int64)
    dst = np.array([p[1] for p in pairs], np.int64)
    group = (src + dst) % groups
    nbytes = np.array(size, np.int64)
    order, packed, count = pack_blocks(src, dst, group, nbytes, budget)
    assert (np.diff(packed) >= 0).all()  # non-decreasing in the packing order
    block = np.empty_like(packed)
    block[order] = packed  # each pair's, in the order given
    assert set(block.tolist()) == set(range(count))
    for b in range(count):
        mine = block == b
        docs = np.unique(np.concatenate([src[mine], dst[mine]]))
        largest_pair = max(nbytes[s] + (nbytes[d] if d != s else 0) for s, d in zip(src[mine], dst[mine], strict=True))
        assert nbytes[docs].sum() <= max(budget, largest_pair)
    for g in range(groups):
        mine = group == g
        docs = np.unique(np.concatenate([src[mine], dst[mine]]))
        if mine.any() and nbytes[docs].sum() <= budget:
            assert len(set(block[mine].tolist())) == 1
    perm = np.random.default_rng(len(pairs)).permutation(len(pairs))
    order, packed, _ = pack_blocks(src[perm], dst[perm], group[perm], nbytes, budget)
    again = np.empty_like(packed)
    again[order] = packed
    assert (again == block[perm]).all()


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.text(max_size=6), unique=True, max_size=30), probe=st.lists(st.text(max_size=7), max_size=30))
def test_id_index_finds_what_index_in_finds(ids: list[str], probe: list[str]) -> None:
    """The binary-search id lookup agrees with Arrow's hash lookup on any strings (non-ASCII,
    NUL characters, prefixes of each other) and the fallback path for non-ASCII sets."""
    import pyarrow as pa

    from stages.pair_texts import IdIndex

    values = pa.array(probe + ids[:3], pa.string())
    want = pc.fill_null(pc.index_in(values, value_set=pa.array(ids, pa.string())), -1).to_numpy(zero_copy_only=False)
    assert IdIndex(pa.array(ids, pa.string())).find(values).tolist() == np.asarray(want, np.int64).tolist()


_HEX = st.text("0123456789abcdef", min_size=32, max_size=32)


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(st.one_of(_HEX, st.sampled_from(["0" * 32, "f" * 32])), max_size=40),
    odd=st.one_of(st.none(), st.text("0123456789abcdef", max_size=34)),
    probe=st.lists(st.one_of(_HEX, st.integers(0, 39), st.none()), max_size=40),
)
def test_nodes_of_answers_as_index_in(nodes: list[str], odd: str | None, probe: list[str | int | None]) -> None:
    """lsh_buckets gives every id the node ``pc.index_in`` gives it (the first row where an id
    repeats, null where none), on the nodes sorted as _canonical_nodes sorts them, with repeated
    ids, ids of other lengths, ids not among the nodes and nulls."""
    import pyarrow as pa

    from stages.pair_texts import IdIndex
    from stages.programs.lsh_buckets import _nodes_of

    nodes = nodes + ([odd] if odd is not None else [])  # an id of another length
    ids = pc.sort_indices(pa.array(nodes, pa.string()))
    node_ids = pc.take(pa.array(nodes, pa.string()), ids)  # ascending, as Table.sort_by("doc_id")
    # a probe is a fresh id, a node's own id (by position), or a null
    wanted = pa.array([nodes[p % len(nodes)] if isinstance(p, int) and nodes else (p if isinstance(p, str) else None)
                       for p in probe], pa.string())
    want = pc.index_in(wanted, value_set=node_ids).cast(pa.int64())
    for chunks in ([wanted], [wanted[: len(wanted) // 2], wanted[len(wanted) // 2:]]):
        got = _nodes_of(IdIndex(node_ids), pa.chunked_array(chunks, pa.string()) if len(chunks) > 1 else chunks[0])
        assert got.to_pylist() == want.to_pylist()


def _small_sources(tmp_path: Path) -> CrawlSpec:
    """A fuzzy-only crawl of 6 sources of 5 documents, near-duplicates across sources."""
    from stages.spec import CrawlSpec

    sources = {}
    for k in range(6):
        folder = tmp_path / "in" / f"s{k}"
        folder.mkdir(parents=True)
        lines = [json.dumps({"id": f"s{k}-{i}", "text": f"a shared paragraph, number {i % 3}, " * 6 + f"from {k}"})
                 for i in range(5)]
        (folder / "part.jsonl").write_text("\n".join(lines) + "\n")
        sources[f"s{k}"] = {"url": str(folder), "id_field": "id"}
    return CrawlSpec(crawl="c1", sources=sources, stages=("fuzzy",))  # type: ignore[arg-type]


def test_lsh_buckets_signs_small_sources_in_blocks_that_span_them(tmp_path: Path) -> None:
    """lsh_buckets reads the signatures of many small sources in blocks of up to ``batch_rows``
    rows across sources: one ``band_keys`` part per block, not per source, and the same bucket
    index and edges whatever the block size (one row a block is the old per-batch layout)."""
    from stages.dataroot import DataRoot
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams
    from stages.store import Store

    spec = _small_sources(tmp_path)
    parts, tables = {}, {}
    for rows in (20_000, 12, 1):
        store = Store(str(tmp_path / f"data-{rows}"))
        execute_crawl(store, spec, ExecutionParams(workers=1, batch_rows=rows))
        root = DataRoot(store)
        manifest = root.manifest(spec, "lsh_buckets", None)
        assert manifest is not None
        parts[rows] = len(manifest.tables["band_keys"])
        pdir = root.output_dir(spec, "lsh_buckets", None)
        tables[rows] = [store.read_table(pdir, t) for t in ("nodes", "band_keys", "edges")]
    assert parts == {20_000: 1, 12: 3, 1: 30}  # blocks of 10 rows at 12: two sources each
    assert tables[20_000][2].num_rows > 0
    assert tables[20_000] == tables[12] == tables[1]



def test_duplicate_components_that_fails_stops_its_gather_of_texts(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates' texts are gathered on a helper thread while the distinct pairs are made:
    where that fails, the program's own error is raised, the gather stops at its next block (it
    does not read the rest of raw_documents first) and leaves no spill folder."""
    import os
    import tempfile
    import threading
    import time

    import stages.programs.duplicate_components as components
    from stages.execute import execute, execute_crawl
    from stages.pair_texts import IdIndex
    from stages.params import ExecutionParams
    from stages.store import Store

    spec = _small_sources(tmp_path)
    store = Store(str(tmp_path / "data"))
    execution = ExecutionParams(workers=1, batch_rows=1)  # a block a document: 30 of them
    execute_crawl(store, spec, execution)
    reading, blocks = threading.Event(), []
    real_find = IdIndex.find

    def slow_find(self: IdIndex, values: pa.Array) -> np.ndarray:  # a block of the gather's scan
        blocks.append(len(values))
        reading.set()
        time.sleep(0.02)
        return real_find(self, values)

    def fails(*args: object, **kwargs: object) -> None:
        assert reading.wait(30)
        raise RuntimeError("the distinct pairs failed")

    monkeypatch.setattr(IdIndex, "find", slow_find)
    monkeypatch.setattr(components, "verify_stream", fails)
    with pytest.raises(RuntimeError, match="the distinct pairs failed"):
        execute(store, spec, "duplicate_components", None, execution, force=True)
    assert 1 <= len(blocks) < 30
    assert not [p for p in os.listdir(tempfile.gettempdir()) if f"pair-texts-{os.getpid()}-" in p]

# Two paragraphs of plain prose that every default heuristic keeps.
PROSE = (
    "The river runs past the old mill and under the stone bridge before it reaches the town. In the "
    "spring the water is high and fast, and the children are told to stay away from the banks. By the "
    "end of the summer it is slow and warm, and the same children swim in it every afternoon until the "
    "light begins to fade over the hills.",
    "Our library opens at nine in the morning and closes at six in the evening on every weekday. "
    "Members may borrow up to ten books at a time, and they can keep each one for three weeks. A book "
    "that comes back late costs a small fee for every day it is overdue, which goes towards buying new "
    "titles for the shelves.",
)


def test_removal_ledger_reads_no_empty_removal_list_but_the_first(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger of a crawl of many sources reads each source-level stage's removal list where it
    holds rows, and one empty list of a stage for its columns: a stage that removed nothing has
    lists empty at every source (200 sources: 200 part files a stage otherwise), and a
    switched-off stage has none. Same ledger."""
    from stages.dataroot import DataRoot
    from stages.execute import execute, execute_crawl
    from stages.params import ExecutionParams
    from stages.spec import CrawlSpec
    from stages.store import Store

    sources = {}
    for k in range(4):
        folder = tmp_path / "in" / f"s{k}"
        folder.mkdir(parents=True)
        lines = [json.dumps({"id": f"s{k}-{i}", "text": PROSE[i % 2]}) for i in range(4)]
        (folder / "part.jsonl").write_text("\n".join(lines) + "\n")
        sources[f"s{k}"] = {"url": str(folder), "id_field": "id"}
    spec = CrawlSpec(crawl="c1", sources=sources, stages=("heuristic", "exact"))  # type: ignore[arg-type]
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    root = DataRoot(store)
    ledger = store.read_table(root.output_dir(spec, "removal_ledger", None), "ledger")
    assert ledger.num_rows == 14  # exact dedup: 2 distinct texts of 16
    read: list[str] = []
    real = Store.read_parts

    def counted(self: Store, pdir: str, names: list[str], columns: list[str] | None = None,
                schema: object = None) -> object:
        read.append(pdir.removeprefix(store.root + "/").split("/")[0])
        return real(self, pdir, names, columns, schema)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "read_parts", counted)
    execute(store, spec, "removal_ledger", None, ExecutionParams(workers=1), force=True)
    assert read.count("filtered_documents") == 1  # heuristic: kept every document, empty at every source
    assert read.count("document_languages") == 0  # language: switched off, no partition
    assert read.count("raw_documents") == 0  # (record ids are streamed, not read whole)
    monkeypatch.undo()
    assert store.read_table(root.output_dir(spec, "removal_ledger", None), "ledger") == ledger


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(1, 40), st.integers(0, 5), st.integers(1, 4))
def test_stored_signatures_read_back_as_the_matrix_they_were(n: int, num_perm: int, skip: int, chunks: int) -> None:
    import io

    import pyarrow.parquet as pq

    from stages.programs.minhash_signatures import signature_matrix, signature_table

    sigs = np.random.default_rng(n * 41 + num_perm).integers(0, 2**32, (n, num_perm), dtype=np.uint64).astype(np.uint32)
    table = signature_table(pa.array([f"{i:032x}" for i in range(n)]), sigs)
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=max(1, n // chunks))
    column = pq.read_table(io.BytesIO(buf.getvalue()))["signature"]  # one chunk per row group
    got = signature_matrix(column, num_perm)
    assert got.dtype == np.uint32 and got.flags.writeable and (got == sigs).all()
    part = column.combine_chunks().slice(min(skip, n))  # a chunk with an offset
    assert (signature_matrix(part, num_perm) == sigs[min(skip, n):]).all()
    old = pa.FixedSizeListArray.from_arrays(pa.array(sigs.reshape(-1), pa.uint32()), num_perm)  # SIGNATURE_FORMAT 1
    assert (signature_matrix(old, num_perm) == sigs).all()


def test_signatures_of_the_list_format_beside_new_ones_give_the_same_candidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data root written before signatures were fixed-size binary keeps its parts (the values
    are the same, nothing is re-keyed): a crawl whose sources hold both formats finds the same
    candidate edges as one of the new format alone."""
    import pyarrow as pa

    import stages.programs.minhash_signatures as mh
    from stages.catalog import PROGRAMS
    from stages.execute import execute
    from stages.store import Store
    from tests.support.tiny_corpus import SOURCES, read, spec

    crawl = spec(stages=("fuzzy",))
    new_format = mh.signature_table

    def list_format(doc_id: pa.Array, sigs: np.ndarray) -> pa.Table:
        flat = pa.array(sigs.reshape(-1), pa.uint32())
        return pa.table({"doc_id": doc_id, "signature": pa.FixedSizeListArray.from_arrays(flat, sigs.shape[1])})

    edges = {}
    for name, old_sources in {"new": (), "mixed": SOURCES[::2]}.items():
        store = Store(str(tmp_path / name))
        for program in list(PROGRAMS)[:list(PROGRAMS).index("minhash_signatures")]:
            for part in crawl.partitions(program):
                execute(store, crawl, program, part)
        for source in SOURCES:
            with monkeypatch.context() as m:
                m.setattr(mh, "signature_table", list_format if source in old_sources else new_format)
                execute(store, crawl, "minhash_signatures", source)
        execute(store, crawl, "lsh_buckets", None)
        edges[name] = read(store, crawl, "lsh_buckets", "edges").sort_by([("src", "ascending"), ("dst", "ascending")])
    assert edges["mixed"].num_rows > 0 and edges["mixed"].equals(edges["new"])
