"""The recorder's presentation of a partition's metadata: counts first, no JSON where a table or
a number fits, timings last."""

from __future__ import annotations

from dagster import MarkdownMetadataValue, TextMetadataValue

from curation_dagster.run.recorder import TIMINGS, present


def test_counts_first_tables_for_params_numbers_for_rows_timings_last() -> None:
    meta = {"wall_s": 1.5, "params": {"min_words": 50, "langs": ["en"]}, "input": 10, "kept": 7,
            "rows": {"documents": 7, "quarantine": 3}, "overhead_s": 0.02, "params_key": "abc", "seconds": 1.6}
    out = present(meta)
    keys = list(out)
    timing_keys = [k for k in keys if k in TIMINGS]
    assert timing_keys == ["seconds", "wall_s", "overhead_s"] and keys[-3:] == timing_keys
    assert keys[:2] == ["input", "kept"]
    assert out["rows/documents"] == 7 and out["rows/quarantine"] == 3 and "rows" not in out
    params = out["params"]
    assert isinstance(params, MarkdownMetadataValue)
    assert "| `min_words` | 50 |" in params.md_str and "| `langs` | `['en']` |" in params.md_str


def test_a_program_without_parameters_says_so() -> None:
    out = present({"params": {}, "input": 1})
    assert isinstance(out["params"], TextMetadataValue) and "no parameters" in out["params"].text
