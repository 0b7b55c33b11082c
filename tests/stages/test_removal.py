"""``kept_rows``: the rows a removal list keeps, as zero-copy slices where removals are few."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from stages.removal import kept_rows


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
