"""The recorder's presentation of a partition's metadata: counts first, no JSON where a table or
a number fits, timings last."""

from __future__ import annotations

from dagster import MarkdownMetadataValue, TextMetadataValue

from curation_dagster.run.done import TIMINGS
from curation_dagster.run.recorder import present


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


def test_a_verdict_recorded_for_an_earlier_materialization_is_recorded_again_for_the_latest() -> None:
    """The UI shows a partition's verdict only where it targets the latest materialization: a
    passing verdict recorded without a target (before evaluations targeted theirs) or for an
    earlier materialization counts as none, so the same verdict is recorded again, targeting it
    (that an unchanged, targeted verdict is not: tests/curation_dagster/defs/test_checks.py)."""
    import dagster as dg

    from curation_dagster.run.recorder import evaluation, rejudged
    from stages.checks import Verdict

    key = str(dg.MultiPartitionKey({"crawl": "c1", "source": "a"}))
    passed = Verdict(True, "kept 10 of 10")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("crawl", ["c1"])
        instance.add_dynamic_partitions("source", ["a"])
        instance.report_runless_asset_event(dg.AssetMaterialization("raw_documents", partition=key))
        instance.report_runless_asset_event(evaluation("raw_documents", "over_deletion", True, passed, key))
        again = rejudged(instance, "raw_documents", [(key, "over_deletion", True, passed)])
        (latest,) = instance.fetch_materializations(dg.AssetKey("raw_documents"), limit=1).records
        assert [(e.partition, e.passed) for e in again] == [(key, True)]
        target = again[0].target_materialization_data
        assert target is not None and target.storage_id == latest.storage_id
