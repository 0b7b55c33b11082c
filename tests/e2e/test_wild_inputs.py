"""Inputs from the wild through ``curate run``: a damaged file stops its source in one line naming it,
unless the crawl allows it; a rewritten input is never up to date.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from stages.dataroot import DataRoot
from stages.store import Store
from tests.stages.ingest.test_wild_inputs import jsonl, rec, write


def test_a_damaged_file_fails_its_source_unless_the_crawl_allows_it(tmp_path: Path) -> None:
    from curation_dagster import cli

    src = tmp_path / "src"
    write(src / "good.jsonl", jsonl(*(rec(i) for i in range(20))))
    blob = gzip.compress(jsonl(*(rec(100 + i) for i in range(400))), mtime=0)
    (src / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    args = ["run", "--workdir", str(tmp_path / "w"), "--crawl", "c1", "--source", f"s={src}", "--stages",
            "heuristic", "--quiet"]
    assert cli.main(args) == 1
    assert cli.main([*args, "--allow-damaged-files"]) == 0
    report = json.loads(_capture(lambda: cli.main(["report", "--workdir", str(tmp_path / "w"), "--crawl", "c1",
                                                    "--json"])))
    row = report["sources"]["s"]
    assert row["input"] == row["kept"] + row["quarantined"] + sum(row["removed"].values())

def _capture(fn: Any) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert fn() == 0
    return buf.getvalue()

def test_a_damaged_file_is_named_in_the_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from curation_dagster import cli

    src = tmp_path / "src"
    write(src / "good.jsonl", jsonl(*(rec(i) for i in range(20))))
    blob = gzip.compress(jsonl(*(rec(100 + i) for i in range(400))), mtime=0)
    (src / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    assert cli.main(["run", "--workdir", str(tmp_path / "w"), "--crawl", "c1", "--source", f"s={src}",
                     "--stages", "heuristic", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "raw_documents[c1|s]" in err and "input_complete" in err and "cut.jsonl.gz" in err
    assert "allow_damaged_files" in err

def test_rewritten_inputs_are_not_up_to_date_through_curate_run(tmp_path: Path) -> None:
    from curation_dagster import cli

    path = write(tmp_path / "src" / "a.jsonl", jsonl(rec(1)))
    st = path.stat()
    args = ["run", "--workdir", str(tmp_path / "w"), "--crawl", "c1", "--source", f"s={tmp_path / 'src'}",
            "--stages", "heuristic", "--quiet"]
    assert cli.main(args) == 0
    path.write_bytes(jsonl(rec(2)))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cli.main(args) == 0
    from curation_dagster.defs.resources import load_spec

    store = Store(str(tmp_path / "w" / "data"))
    pdir = DataRoot(store).output_dir(load_spec(tmp_path / "w", "c1"), "raw_documents", "s")
    assert store.read_table(pdir, "documents")["record_id"].to_pylist() == ["r2"]
