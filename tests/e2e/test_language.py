"""The language stage through ``curate run``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from tests.stages.programs.test_language import _corpus
from tests.support.tiny_corpus import fast_tmp


@pytest.mark.slow
def test_language_stage_through_curate_run(tmp_path: Path) -> None:
    sources = _corpus(tmp_path / "in")
    config = tmp_path / "curate.json"
    config.write_text(json.dumps({"sources": sources, "params": {"document_languages": {"languages": ["en"]}}}))

    def curate(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
        return code, out.getvalue(), err.getvalue()

    with fast_tmp(tmp_path / "w") as workdir:
        code, _, err = curate("run", "--workdir", str(workdir), "--crawl", "c1", "--config", str(config),
                              "--stages", "language,heuristic", "--quiet")
        assert code == 0, err
        code, out, _ = curate("report", "--workdir", str(workdir), "--crawl", "c1", "--json")
        row = json.loads(out)["sources"]["web"]
        assert row["removed"]["language"] == 12
        assert row["input"] == row["kept"] + row["quarantined"] + sum(row["removed"].values())
        code, _, err = curate("ledger", "--workdir", str(workdir), "--crawl", "c1", "--out", str(tmp_path / "l.pq"))
        assert code == 0, err
        ledger = pq.read_table(tmp_path / "l.pq").to_pylist()
        german = [r for r in ledger if r["record_id"] == "de-1"]
        assert [(r["stage"], r["reason"]) for r in german] == [("language", "language:de")]
        code, out, _ = curate("explain", "--workdir", str(workdir), "--crawl", "c1", german[0]["doc_id"])
        assert code == 0 and "language:de" in out
