"""stages.keep.pick_survivors: the one keep rule, a total order on (priority, doc_id) per group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.keep import pick_survivors


def reference(group: list[int], priority: list[int], doc_id: list[str]) -> list[int]:
    """For each row, the row of its group with the lowest (priority, doc_id)."""
    best: dict[int, int] = {}
    for i, g in enumerate(group):
        if g not in best or (priority[i], doc_id[i]) < (priority[best[g]], doc_id[best[g]]):
            best[g] = i
    return [best[g] for g in group]


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[int], list[int], list[str]]:
    n = draw(st.integers(0, 60))
    ids = draw(st.lists(st.text("0123456789abcdef", min_size=1, max_size=32), min_size=n, max_size=n,
                        unique=True))
    group = draw(st.lists(st.integers(-3, 6), min_size=n, max_size=n))
    priority = draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
    return group, priority, ids


@settings(max_examples=200, deadline=None)
@given(rows())
def test_survivor_is_the_lowest_priority_then_doc_id_of_its_group(data: tuple[list[int], list[int], list[str]]) -> None:
    group, priority, ids = data
    survivor = pick_survivors(np.array(group, np.int64), np.array(priority, np.int64), np.array(ids, object))
    assert survivor.dtype == np.int64 and survivor.shape == (len(group),)
    assert survivor.tolist() == reference(group, priority, ids)
    for i, s in enumerate(survivor.tolist()):
        assert group[s] == group[i]
        assert survivor[s] == s  # a survivor survives itself


@settings(max_examples=200, deadline=None)
@given(rows(), st.randoms(use_true_random=False))
def test_survivors_do_not_depend_on_row_order(data: tuple[list[int], list[int], list[str]], rnd: object) -> None:
    group, priority, ids = data
    perm = list(range(len(group)))
    rnd.shuffle(perm)  # type: ignore[attr-defined]

    def kept(order: list[int]) -> dict[str, str]:
        g = np.array([group[i] for i in order], np.int64)
        p = np.array([priority[i] for i in order], np.int64)
        d = np.array([ids[i] for i in order], object)
        s = pick_survivors(g, p, d)
        return {d[i]: d[s[i]] for i in range(len(order))}  # doc_id -> doc_id of its survivor

    assert kept(perm) == kept(list(range(len(group))))


@settings(max_examples=100, deadline=None)
@given(rows())
def test_bytes_and_str_ids_agree(data: tuple[list[int], list[int], list[str]]) -> None:
    """exact_duplicates passes doc_ids as fixed-width bytes (S32); the order is the same."""
    group, priority, ids = data
    g, p = np.array(group, np.int64), np.array(priority, np.int64)
    as_bytes = np.array([i.encode() for i in ids], dtype="S32") if ids else np.zeros(0, "S32")
    assert pick_survivors(g, p, as_bytes).tolist() == pick_survivors(g, p, np.array(ids, dtype=str)).tolist()


def test_priority_beats_doc_id_and_doc_id_breaks_ties() -> None:
    group = np.array([7, 7, 7, 2, 2])
    ids = np.array(["b", "a", "c", "z", "y"])
    assert pick_survivors(group, np.zeros(5, np.int64), ids).tolist() == [1, 1, 1, 4, 4]
    assert pick_survivors(group, np.array([0, 1, 0, 0, 0]), ids).tolist() == [0, 0, 0, 4, 4]
    assert pick_survivors(group, np.array([1, 1, -1, 5, 0]), ids).tolist() == [2, 2, 2, 4, 4]


@pytest.mark.parametrize("n", [0, 1])
def test_trivial_inputs(n: int) -> None:
    out = pick_survivors(np.zeros(n, np.int64), np.zeros(n, np.int64), np.array(["x"] * n, dtype=object))
    assert out.tolist() == list(range(n)) and out.dtype == np.int64


def test_singletons_survive() -> None:
    out = pick_survivors(np.arange(5)[::-1].copy(), np.zeros(5, np.int64), np.array(list("edcba")))
    assert out.tolist() == [0, 1, 2, 3, 4]
