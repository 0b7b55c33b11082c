"""``curate run``'s and ``curate report``'s table: written line by line where no terminal reads it,
as rich would print it."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from curation_dagster.tools.report import PIPED_WIDTH, plain_table, print_report, rich_table
from stages.reports import LedgerSource, RemovalLedgerReport


def _rich(title: str, labels: list[str], rows: list[list[str]], width: int = PIPED_WIDTH) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(rich_table(title, labels, rows))
    return out.getvalue()


_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
_labels = st.one_of(st.sampled_from(["INPUT", "QUARANTINE", "LANGUAGE", "HEURISTIC", "KEPT", "KEPT %"]),
                    _names.map(lambda name: f"↳ {name}"), _names.map(lambda name: f"↳ earlier crawls {name}"))
_numbers = st.one_of(st.integers(0, 10**12).map(str), st.floats(0, 100).map(lambda x: f"{x:.1f}"))


@settings(max_examples=150, deadline=None)
@given(_names, st.lists(_labels, min_size=1, max_size=14), st.data())
def test_plain_table_is_what_rich_prints(crawl: str, labels: list[str], data: Any) -> None:
    labels = ["SOURCE", *labels]
    body = data.draw(st.lists(st.tuples(_names, st.lists(_numbers, min_size=len(labels) - 1,
                                                         max_size=len(labels) - 1)), max_size=6))
    rows = [[name, *cells] for name, cells in body] + [["TOTAL", *["0"] * (len(labels) - 1)]]
    title = f"crawl {crawl}: what each source lost at each stage"
    plain = plain_table(title, labels, rows, PIPED_WIDTH)
    if plain is not None:  # it fits: rich's text, character for character
        assert plain == _rich(title, labels, rows)
    else:  # rich wraps what is wider than the line; this declines it
        total = sum(max(len(r[i]) for r in [labels, *rows]) + 3 for i in range(len(labels))) + 1
        assert total > PIPED_WIDTH or len(title) > total


def test_a_table_too_wide_or_with_markup_is_left_to_rich() -> None:
    rows = [["s" * 150, "1"], ["TOTAL", "1"]]
    assert plain_table("crawl c: what each source lost at each stage", ["SOURCE", "INPUT"], rows, PIPED_WIDTH) is None
    assert plain_table("crawl c: x", ["SOURCE", "[bold]INPUT"], [["a", "1"]], PIPED_WIDTH) is None
    assert plain_table("crawl c: x", ["SOURCE", "INPUT"], [["a:smile:", "1"]], PIPED_WIDTH) is None


@pytest.mark.parametrize("sources", [3, 200])
def test_print_report_piped_is_rich_s_table(sources: int, capsys: pytest.CaptureFixture[str]) -> None:
    report = RemovalLedgerReport(crawl="c1", sources={
        f"src-{i:03d}": LedgerSource(input=100 + i, kept=50, quarantined=i % 3, removed=50 + i - i % 3,
                                     removed_per_stage={"heuristic": 40, "fuzzy": 10 + i - i % 3},
                                     filters={"no_lorem": 7})
        for i in range(sources)})
    print_report(report)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "TOTAL" in lines[-2] and f"{sum(100 + i for i in range(sources))}" in lines[-2]
    assert "↳ no_lorem" in lines[2] and len(lines) == sources + 6
    # the same rows through rich itself
    header = [cell.strip() for cell in lines[2].strip("┃").split("┃")]
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines[4:-1]]
    assert out == _rich("crawl c1: what each source lost at each stage", header, rows)
