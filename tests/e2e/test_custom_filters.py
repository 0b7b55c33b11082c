"""Custom filters through ``curate run``: a filter that cannot be used says so in one line; a
module:Class filter runs in the heuristic stage.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from stages import filters
from stages.filters import FilterError
from stages.params import FilteredDocumentsParams
from tests.stages.test_custom_filters import (
    EXPECTED_REASONS,
    PLUGIN,
    site,  # noqa: F401 (a fixture)
    web,  # noqa: F401 (a fixture)
)
from tests.support.tiny_corpus import fast_tmp


def test_filters_that_cannot_be_used_say_so_in_one_line(site: Path) -> None:  # noqa: F811 (the fixture)
    cases = {
        "no_such_module:X": "custom filter 'no_such_module:X' cannot be imported: ModuleNotFoundError: "
                            "No module named 'no_such_module'",
        "curate_plugin_filters:Nope": "custom filter 'curate_plugin_filters:Nope' cannot be imported: "
                                      "AttributeError: module 'curate_plugin_filters' has no attribute 'Nope'",
        "not_registered": "custom filter 'not_registered' cannot be imported: LookupError: no entry point "
                          "'not_registered' in group 'curation_dagster.filters' (nor module:Class)",
    }
    for ref, message in cases.items():
        with pytest.raises(FilterError) as info:
            FilteredDocumentsParams(filters=[{"filter": ref}])
        assert str(info.value) == message
    with pytest.raises(FilterError, match=r"does not take kwargs \{'wrd': 'x'\}"):
        FilteredDocumentsParams(filters=[{"filter": "mentions_word", "kwargs": {"wrd": "x"}}])
    with pytest.raises(FilterError, match="name 'digit_share' is taken by another filter"):
        FilteredDocumentsParams(filters=["digit_share", {"filter": "curate_plugin_filters:DigitShare"}])
    # Two of one class under their own names; a disabled stage imports nothing.
    two = FilteredDocumentsParams(filters=["digit_share", {"filter": "digit_share", "name": "digits_10",
                                                           "kwargs": {"max_share": 0.1}}])
    assert [(f.name, f.version, f.keep_kwargs) for f in two.filters] == [
        ("digit_share", 1, ("max_share",)), ("digits_10", 1, ("max_share",))]
    off = FilteredDocumentsParams(enabled=False, filters=["no_such_module:X"])
    assert (off.filters[0].filter, off.filters[0].name) == ("no_such_module:X", "")
    with pytest.raises(FilterError, match="a custom filter is 'module:Class', an entry point name or"):
        FilteredDocumentsParams(filters=[7])
    assert isinstance(filters.build("digit_share", {}), filters.DocumentFilter)

def test_curate_run_with_a_module_class_filter(tmp_path: Path, web: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 (the fixture)
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN))  # a module on sys.path, named as module:Class
    config = tmp_path / "crawl.json"
    config.write_text(json.dumps({"sources": {"web": {"url": str(web)}}, "stages": ["heuristic"], "params": {
        "filtered_documents": {"filters": [
            {"filter": "curate_plugin_filters:MentionsWord", "kwargs": {"word": "zyzzyva"}},
            {"filter": "curate_plugin_filters:DigitShare"}]}}}))
    with fast_tmp(tmp_path / "wd") as wd:
        assert cli.main(["run", "--workdir", str(wd), "--crawl", "c1", "--config", str(config), "--quiet"]) == 0
        printed = capsys.readouterr().out
        assert "↳ mentions_word" in printed and "↳ digit_share" in printed  # beside HEURISTIC
        assert cli.main(["report", "--workdir", str(wd), "--crawl", "c1", "--json"]) == 0
        web_row = json.loads(capsys.readouterr().out)["sources"]["web"]
        assert web_row["filters"] == {"mentions_word": 4, "digit_share": 2}
        assert web_row["removed"]["heuristic"] == 7 and web_row["kept"] == 10
        assert cli.main(["ledger", "--workdir", str(wd), "--crawl", "c1", "--out", str(tmp_path / "l.parquet")]) == 0
        ledger = pq.read_table(tmp_path / "l.parquet").to_pylist()
        assert Counter(r["reason"] for r in ledger) == {"filter:mentions_word": 4, "filter:digit_share": 2,
                                                        "min_words": 1}
        assert {r["record_id"]: r["reason"] for r in ledger} == EXPECTED_REASONS
        # The waterfall in the removal_ledger's metadata has a column per filter beside heuristic.
        with dg.DagsterInstance.from_config(str(wd / "dagster")) as instance:
            records = instance.fetch_materializations(dg.AssetKey("removal_ledger"), limit=1).records
            mat = records[0].asset_materialization
            assert mat is not None
            table = mat.metadata["waterfall_table"]
        assert isinstance(table, dg.TableMetadataValue)
        names = [c.name for c in table.schema.columns]
        assert names.index("heuristic") < names.index("heuristic:digit_share") < names.index("kept")
        rows = {r.data["source"]: r.data for r in table.records}
        assert (rows["web"]["heuristic"], rows["web"]["heuristic:mentions_word"], rows["web"]["heuristic:digit_share"],
                rows["web"]["kept"]) == (7, 4, 2, 10)
        # A filter that raises: the run stops with one line naming the filter and the document.
        config.write_text(json.dumps({"sources": {"web": {"url": str(web)}}, "stages": ["heuristic"], "params": {
            "filtered_documents": {"filters": [{"filter": "curate_plugin_filters:Fragile",
                                                "kwargs": {"marker": "zyzzyva"}}]}}}))
        capsys.readouterr()
        assert cli.main(["run", "--workdir", str(wd), "--crawl", "c2", "--config", str(config), "--quiet"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "filtered_documents[c2|web]: custom filter 'fragile' raised ValueError on document " in err
        assert "(record w0): cannot score a text with zyzzyva" in err
        # A filter that cannot be imported: one line, before any run.
        config.write_text(json.dumps({"sources": {"web": {"url": str(web)}}, "stages": ["heuristic"], "params": {
            "filtered_documents": {"filters": ["no_such_module:X"]}}}))
        assert cli.main(["run", "--workdir", str(wd), "--crawl", "c3", "--config", str(config), "--quiet"]) == 1
        assert capsys.readouterr().err.strip() == ("curate: error: custom filter 'no_such_module:X' cannot be "
                                                   "imported: ModuleNotFoundError: No module named 'no_such_module'")
