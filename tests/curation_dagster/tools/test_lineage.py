"""Why a source shrank: the waterfall table and chart of a ledger report, and the metadata of
the removal_ledger and curated_documents materializations of the recrawled tiny crawl."""

from __future__ import annotations

import base64
import re

import dagster as dg
import pytest

from curation_dagster.run.done import TIMINGS
from curation_dagster.run.metadata import ledger_metadata
from curation_dagster.tools.lineage import stages_of, waterfall_markdown, waterfall_png, waterfall_rows
from stages.reports import RemovalLedgerReport
from tests.support import ops_workdir
from tests.support import tiny_corpus as T
from tests.support.metadata import md_table

REPORT = RemovalLedgerReport.model_validate({"crawl": "c1", "sources": {
    "news": {"input": 100, "kept": 50, "quarantined": 10, "removed": 40,
             "removed_per_stage": {"heuristic": 30, "exact": 10, "custom": 0}},
    "blog": {"input": 8, "kept": 0, "quarantined": 8, "removed": 0,
             "removed_per_stage": {"heuristic": 0, "exact": 0, "custom": 0}},
}})


def test_waterfall_table_shares_of_what_reached_each_step() -> None:
    assert stages_of(REPORT) == ["heuristic", "exact", "custom"]  # pipeline order, unknown stages last
    assert waterfall_markdown(REPORT).splitlines() == [
        # custom removed nothing anywhere: no column (the native table has it)
        "| source | input | quarantine | heuristic | exact | kept |",
        "|---|---:|---:|---:|---:|---:|",
        "| blog | 8 | −8 (100%) | 0 | 0 | 0 |",
        # news: 10 of 100 quarantined, 30 of the 90 left (33 %), 10 of the 60 left (17 %)
        "| news | 100 | −10 (10%) | −30 (33%) | −10 (17%) | 50 |",
        "| **total** | 108 | −18 (17%) | −30 (33%) | −10 (17%) | 50 |",
    ]


def test_waterfall_chart_is_a_png() -> None:
    png = waterfall_png(REPORT)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (720, int(90 * (1.4 + 0.4 * 2)))  # 8 in x (1.4 + 0.4 per source) at 90 dpi


def test_the_chart_of_many_sources_draws_those_that_kept_the_least() -> None:
    from curation_dagster.tools.lineage import CHART_SOURCES, charted_sources

    row = REPORT.sources["news"]
    many = RemovalLedgerReport.model_validate({"crawl": "c1", "sources": {
        f"s{i:04d}": {**row.model_dump(), "kept": i % 97, "removed": row.removed + row.kept - i % 97}
        for i in range(1000)}})
    chosen = charted_sources(many)
    assert len(chosen) == CHART_SOURCES and chosen == sorted(chosen)
    kept = sorted(r.kept for r in many.sources.values())
    assert sorted(many.sources[n].kept for n in chosen) == kept[:CHART_SOURCES]
    png = waterfall_png(many)
    assert abs(int.from_bytes(png[20:24], "big") - 90 * (1.4 + 0.4 * CHART_SOURCES)) <= 1  # not 1,000 bars tall
    assert charted_sources(REPORT) == ["blog", "news"]


def test_ledger_metadata_embeds_the_chart_as_a_data_uri() -> None:
    meta = ledger_metadata(REPORT)
    assert list(meta)[:2] == ["waterfall", "waterfall_chart"]
    assert {k: meta[k] for k in ("input_total", "kept_total", "quarantined_total", "kept_fraction")} == {
        "input_total": 108, "kept_total": 50, "quarantined_total": 18, "kept_fraction": 0.462963}
    assert {k: v for k, v in meta.items() if k.startswith("removed_")} == {
        "removed_heuristic": 30, "removed_exact": 10, "removed_custom": 0}
    m = re.fullmatch(r"!\[[^\]]+\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", meta["waterfall_chart"].value)
    assert m and base64.b64decode(m.group(1))[:4] == b"\x89PNG"


def test_waterfall_is_a_native_table_with_a_schema() -> None:
    value = ledger_metadata(REPORT)["waterfall_table"]
    assert isinstance(value, dg.TableMetadataValue)
    assert [(c.name, c.type) for c in value.schema.columns] == [
        ("source", "string"), ("input", "int"), ("quarantine", "int"), ("heuristic", "int"), ("exact", "int"),
        ("custom", "int"), ("kept", "int"), ("kept_fraction", "float")]
    rows = [dict(r.data) for r in value.records]
    assert rows == waterfall_rows(REPORT)
    assert rows == [
        {"source": "blog", "input": 8, "quarantine": 8, "heuristic": 0, "exact": 0, "custom": 0, "kept": 0,
         "kept_fraction": 0.0},
        {"source": "news", "input": 100, "quarantine": 10, "heuristic": 30, "exact": 10, "custom": 0, "kept": 50,
         "kept_fraction": 0.5},
        {"source": "total", "input": 108, "quarantine": 18, "heuristic": 30, "exact": 10, "custom": 0, "kept": 50,
         "kept_fraction": 0.462963},
    ]
    for row in rows:  # every document is kept, quarantined or removed by one stage
        assert row["input"] == row["quarantine"] + sum(row[s] for s in stages_of(REPORT)) + row["kept"]


def test_custom_filters_have_their_columns_beside_heuristic() -> None:
    report = RemovalLedgerReport.model_validate({"crawl": "c1", "sources": {
        "a": {"input": 10, "kept": 4, "quarantined": 1, "removed": 5, "removed_per_stage": {"heuristic": 4, "exact": 1},
              "filters": {"digits": 2, "banned": 1}},
        "b": {"input": 3, "kept": 3, "quarantined": 0, "removed": 0, "removed_per_stage": {"heuristic": 0, "exact": 0},
              "filters": {"digits": 0, "banned": 0}},
    }})
    value = ledger_metadata(report)["waterfall_table"]
    assert [c.name for c in value.schema.columns] == [
        "source", "input", "quarantine", "heuristic", "heuristic:banned", "heuristic:digits", "exact", "kept",
        "kept_fraction"]
    total = [dict(r.data) for r in value.records][-1]
    assert (total["heuristic"], total["heuristic:banned"], total["heuristic:digits"]) == (4, 1, 2)
    assert total["input"] == total["quarantine"] + total["heuristic"] + total["exact"] + total["kept"]


@pytest.mark.slow
def test_materializations_carry_the_counts(prepared: ops_workdir.Prepared) -> None:
    expected = T.EXPECTED["default"]["counts"]
    with dg.DagsterInstance.from_config(str(prepared.home)) as instance:
        def latest(asset: str, partition: str) -> dict[str, dg.MetadataValue]:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records
            mat = records[0].asset_materialization
            assert mat is not None
            return dict(mat.metadata)

        ledger = latest("removal_ledger", "tiny")
        for source, counts in expected.items():
            cur = latest("curated_documents", f"tiny|{source}")
            # a source x crawl partition's counts are one table (a number would plot across sources)
            assert not any(isinstance(v.value, int | float) and not isinstance(v.value, bool)
                           for k, v in cur.items() if k not in TIMINGS and k != "dagster/row_count")
            shown = md_table(cur["counts"])
            assert {k: shown[k] for k in ("input", "kept", "quarantined")} == {
                k: counts[k] for k in ("input", "kept", "quarantined")}
            assert shown["kept_fraction"] == round(counts["kept"] / counts["input"], 6)
            assert shown["rows/documents"] == counts["kept"] == cur["dagster/row_count"].value
            assert {k: v for k, v in cur["report"].value["removed_per_stage"].items() if v} == counts["removed"]
            for stage, n in counts["removed"].items():  # and the UI's table of them (not JSON)
                assert f"| `{stage}` | {n} |" in cur["removed_per_stage"].value
    native = {r.data["source"]: dict(r.data) for r in ledger["waterfall_table"].value.records}
    assert set(native) == {*expected, "total"}
    for source, counts in expected.items():
        assert native[source]["kept"] == counts["kept"] and native[source]["quarantine"] == counts["quarantined"]
        assert {s: native[source][s] for s in counts["removed"]} == counts["removed"]
    assert native["total"]["input"] == sum(c["input"] for c in expected.values())
    table = ledger["waterfall"].value
    # language off: no column; then 4 of 16, then 3 of 12
    assert "| forum | 22 | −6 (27%) | −4 (25%) | −3 (25%) |" in table
    assert ledger["input_total"].value == sum(c["input"] for c in expected.values())
    assert ledger["kept_total"].value == sum(c["kept"] for c in expected.values())
    assert ledger["removed_exact"].value == sum(c["removed"]["exact"] for c in expected.values())
    assert ledger["waterfall_chart"].value.startswith("![where each source's documents went](data:image/png;base64,")
