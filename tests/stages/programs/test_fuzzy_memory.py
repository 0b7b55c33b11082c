"""fuzzy_duplicates' memory per document (issue 30): its removal list used to be built in one
piece through object arrays and a unicode copy of every removed and kept doc_id; it is now built
from the numpy buffers a part at a time (``stages.programs.fuzzy_duplicates.removals``). Both the
result and the bound are tested: the same removal table as the row-by-row construction it
replaces (with documents kept by an earlier crawl), and a peak of at most ``BOUND`` bytes a
document over the components table for 1M documents in near-duplicate components."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stages.keep import fixed_ids, pick_survivors, source_priorities
from stages.programs.fuzzy_duplicates import removals
from stages.removal import REMOVED, kept_where, removal_table
from tests.support.peak_rss import PEAK, bytes_per_document

BOUND = 230  # bytes a document over the components table at 1M documents (measured 170; the old way 631)

COMPONENTS = """
import numpy as np
import pyarrow as pa
def components(n, seed=0, crawls=("c2",), component_size=4, chunk=1 << 16):
    # Built a chunk at a time (as a table read from Parquet is), so that making it costs little
    # beyond the table: its transients would otherwise hide the peak being measured.
    rng = np.random.default_rng(seed)
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    names, crawl_names = pa.array(["web", "books", "code"]), pa.array(list(crawls))
    ids, sources, crawl = [], [], []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        digits = hex_digits[rng.integers(0, 16, 32 * m, dtype=np.uint8)]
        offsets = np.arange(0, 32 * m + 1, 32, dtype=np.int32)
        ids.append(pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(offsets), pa.py_buffer(digits)]))
        sources.append(names.take(pa.array(rng.integers(0, 3, m, dtype=np.int8))))
        crawl.append(crawl_names.take(pa.array(rng.integers(0, len(crawls), m, dtype=np.int8))))
    return pa.table({"doc_id": pa.chunked_array(ids, pa.string()), "source": pa.chunked_array(sources, pa.string()),
                     "crawl": pa.chunked_array(crawl, pa.string()),
                     "component": pa.array(rng.integers(0, max(1, n // component_size), n)),
                     "node": pa.array(np.arange(n, dtype=np.int64))})
"""
namespace: dict[str, Any] = {}
exec(COMPONENTS, namespace)
components = namespace["components"]


def row_by_row(comps: pa.Table, crawl: str, source_priority: dict[str, int], scores: Any) -> pa.Table:
    """The removal table as fuzzy_duplicates built it before (object arrays, one piece)."""
    doc_id = fixed_ids(comps["doc_id"])
    earlier = np.asarray(pc.not_equal(comps["crawl"], crawl).to_numpy(zero_copy_only=False), bool)
    priority = np.where(earlier, np.iinfo(np.int64).min, source_priorities(comps["source"], source_priority))
    survivor = pick_survivors(comps["component"].to_numpy(), priority, doc_id)
    removed = np.flatnonzero((survivor != np.arange(len(survivor))) & ~earlier)
    keep_of = survivor[removed]
    score = scores(removed, keep_of)

    def rows_of(column: str, rows: np.ndarray) -> np.ndarray:
        return np.asarray(comps[column].take(pa.array(rows, pa.int64())).to_numpy(zero_copy_only=False), dtype=object)

    source = rows_of("source", removed)
    kept_crawl, kept_sources = rows_of("crawl", keep_of), rows_of("source", keep_of)
    kept_source = np.where(earlier[keep_of], kept_crawl + "/" + kept_sources, kept_sources)
    return removal_table(doc_id[removed].astype(str), source, "", doc_id[keep_of].astype(str), kept_source,
                         score.astype(np.float64),
                         reasons=np.where(earlier[keep_of], "near_duplicate_of_earlier_crawl", "near_duplicate"))


def test_removals_equal_the_row_by_row_table() -> None:
    comps = components(6000, seed=3, crawls=("c1", "c2", "c2"))
    comps = pa.concat_tables([comps.slice(0, 2500), comps.slice(2500)])  # two chunks a column
    priority = {"books": -1, "code": 2}

    def scores(removed: np.ndarray, keep_of: np.ndarray) -> np.ndarray:
        out = ((removed * 7 + keep_of) % 100 / 100).astype(np.float32)
        out[::5] = np.nan  # written as nulls, as before
        return out

    report: dict[str, Any] = {}
    parts = list(removals(comps, "c2", priority, scores, report))
    got = pa.concat_tables(parts)
    want = row_by_row(comps, "c2", priority, scores)
    assert got.schema == REMOVED and got.equals(want) and got.num_rows > 2500
    assert set(got["reason"].to_pylist()) == {"near_duplicate", "near_duplicate_of_earlier_crawl"}
    assert got["score"].null_count > 0
    # an earlier crawl's survivor is named "<crawl>/<source>", and read back as such
    source, crawl = kept_where(got["duplicate_of_source"], "c2")
    assert set(crawl.to_pylist()) == {"c1", "c2"} and set(source.to_pylist()) == {"web", "books", "code"}
    assert report["removed"] == got.num_rows
    assert report["removed_per_source"] == dict(sorted(Counter(got["source"].to_pylist()).items()))
    assert report["removed_as_earlier_crawl_duplicates"] == pc.sum(pc.equal(
        got["reason"], "near_duplicate_of_earlier_crawl")).as_py()
    assert report["components"] == len(np.unique(pick_survivors(
        comps["component"].to_numpy(),
        np.where(np.asarray(pc.not_equal(comps["crawl"], "c2")), np.iinfo(np.int64).min,
                 source_priorities(comps["source"], priority)), fixed_ids(comps["doc_id"]))))


def test_nothing_removed_is_an_empty_table() -> None:
    comps = components(50, component_size=1)  # every document its own component
    comps = comps.set_column(3, "component", pa.array(np.arange(50)))
    parts = list(removals(comps, "c2", {}, lambda r, k: np.zeros(len(r), np.float32), {}))
    assert len(parts) == 1 and parts[0].num_rows == 0 and parts[0].schema == REMOVED


def test_a_million_documents_in_near_duplicate_components_cost_a_bounded_amount_each() -> None:
    script = PEAK + COMPONENTS + """
from stages.programs.fuzzy_duplicates import removals
n = 1_000_000
comps = components(n, crawls=("c1", "c2", "c2", "c2"))
base = peak_kib()
report = {}
rows = sum(part.num_rows for part in removals(comps, "c2", {"books": 1}, lambda r, k: np.full(len(r), 0.9, np.float32),
                                              report))
assert rows == report["removed"] > n // 2, rows
print((peak_kib() - base) * 1024 / n)
"""
    per_doc = bytes_per_document(script)
    assert per_doc < BOUND, f"{per_doc:.0f} bytes a document"


def test_parts_split_scores_reasons_and_kept_labels_alike() -> None:
    from stages.removal import removal_parts

    comps = components(10)
    doc_id = fixed_ids(comps["doc_id"])
    rows, kept = np.arange(1, 10), np.zeros(9, np.int64)
    score = np.arange(9, dtype=np.float32) / 10
    score[3] = np.nan
    args: dict[str, Any] = dict(kept_index=np.arange(10, dtype=np.int32) % 2, kept_names=["a", "c1/b"], score=score,
                                reasons=(np.arange(9, dtype=np.int8) % 2, ["x", "y"]))
    whole = pa.concat_tables(removal_parts(doc_id, np.zeros(10, np.int32), ["s"], "", rows, kept, **args))
    chunks = list(removal_parts(doc_id, np.zeros(10, np.int32), ["s"], "", rows, kept, part_rows=4, **args))
    assert [c.num_rows for c in chunks] == [4, 4, 1] and pa.concat_tables(chunks).equals(whole)
    assert whole["reason"].to_pylist() == ["x", "y"] * 4 + ["x"]
    assert whole["score"].to_pylist()[:4] == [0.0, pytest.approx(0.1), pytest.approx(0.2), None]
    assert set(whole["duplicate_of_source"].to_pylist()) == {"a"}  # row 0's label, for every removal
