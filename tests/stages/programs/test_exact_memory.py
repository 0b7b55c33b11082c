"""exact_duplicates' memory per document (issue 30): a crawl of identical records used to cost
~450-500 bytes a removed document (fixed-width unicode copies of every removed doc_id and object
arrays); the removal list is now built from the numpy buffers a part at a time. Both the result
and the bound are tested: the same removal table as the row-by-row construction, and a peak of
at most ``BOUND`` bytes a document over the inputs for 1M identical documents."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from stages.keep import pick_survivors
from stages.kernels.exact import duplicate_groups
from stages.programs.exact_duplicates import removals
from stages.removal import REMOVED, removal_table
from tests.support.peak_rss import PEAK, bytes_per_document

BOUND = 220  # bytes a document over the inputs at 1M documents (measured 176; the old way 497)


def hex_ids(n: int, seed: int = 0) -> np.ndarray:
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[np.random.default_rng(seed).integers(0, 16, 32 * n)]
    return digits.view("S32").copy()


def test_removals_equal_the_row_by_row_table() -> None:
    rng = np.random.default_rng(1)
    n = 5000
    doc_id, source_index = hex_ids(n), rng.integers(0, 3, n).astype(np.int32)
    hashes = rng.integers(0, 40, (n, 2)).astype(np.uint64)
    names, priorities = ["a", "b", "c"], [1, 0, 2]
    report: dict[str, Any] = {}
    got = pa.concat_tables(removals(doc_id, source_index, hashes, names, priorities, report))
    groups = duplicate_groups(hashes)
    survivor = pick_survivors(groups, np.array(priorities)[source_index], doc_id)
    removed = np.flatnonzero(survivor != np.arange(n))
    dup = survivor[removed]
    name_of = np.array(names, dtype=object)
    want = removal_table(doc_id[removed].astype(str), name_of[source_index[removed]], "exact_duplicate",
                         doc_id[dup].astype(str), name_of[source_index[dup]], None)
    assert got.schema == REMOVED and got.equals(want) and got.num_rows > 3000
    assert report["removed"] == got.num_rows and report["groups"] == len(np.unique(groups[dup]))
    assert sum(report["removed_per_source"].values()) == got.num_rows


def test_parts_and_nothing_removed() -> None:
    doc_id = hex_ids(10)
    parts = list(removals(doc_id, np.zeros(10, np.int32), np.arange(20, dtype=np.uint64).reshape(10, 2), ["s"], [0],
                          {}))
    assert len(parts) == 1 and parts[0].num_rows == 0 and parts[0].schema == REMOVED
    from stages.removal import removal_parts

    chunks = list(removal_parts(doc_id, np.zeros(10, np.int32), ["s"], "r", np.arange(1, 10), np.zeros(9, np.int64),
                                part_rows=4))
    assert [c.num_rows for c in chunks] == [4, 4, 1]
    assert pa.concat_tables(chunks)["doc_id"].to_pylist() == [i.decode() for i in doc_id[1:]]
    assert set(pa.concat_tables(chunks)["duplicate_of"].to_pylist()) == {doc_id[0].decode()}


def test_a_million_identical_documents_cost_a_bounded_amount_each() -> None:
    script = PEAK + """
import numpy as np
from stages.programs.exact_duplicates import removals
n = 1_000_000
digits = np.frombuffer(b"0123456789abcdef", np.uint8)[np.random.default_rng(0).integers(0, 16, 32 * n)]
doc_id = digits.view("S32").copy()
del digits
source_index, hashes = np.zeros(n, np.int32), np.ones((n, 2), np.uint64)
base = peak_kib()
rows = sum(part.num_rows for part in removals(doc_id, source_index, hashes, ["s"], [0], {}))
assert rows == n - 1, rows
print((peak_kib() - base) * 1024 / n)
"""
    per_doc = bytes_per_document(script)
    assert per_doc < BOUND, f"{per_doc:.0f} bytes a document"
