"""The sample crawl's removal ledger, row for row, against a golden ledger written before the
layout move (issue 19), so a refactor is proven to keep every decision.

``tests/data/sample/`` is a frozen cut of the sample corpus (``curate sample``; written by
``tests/data/make_sample.py``): real docstrings, licenses (exact and near duplicates) and package
descriptions, planted junk and bad lines, and a benchmark of edited docstring passages. The crawl
runs in-process, without Dagster, with the removal stages ``language``, ``heuristic``, ``exact``,
``fuzzy``, ``quality`` (no classifier configured: it removes nothing) and ``decontam``, as
``sample/curate.json`` configures them; ``semantic`` is left out (embedding the corpus on two
CPU cores takes about two minutes, the rest about 15 s).

The golden (``tests/data/golden/sample_ledger.json``) holds the source x stage counts and every
ledger row: doc id, source, stage, reason, duplicate_of and the score rounded to ``PRECISION``
decimals. Regenerate it only for a change meant to change outputs (whose params version is
bumped), and review its diff:

    CURATE_UPDATE_GOLDEN=1 python -m pytest tests/e2e/test_sample_ledger.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import Store

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS = DATA / "sample"
GOLDEN = DATA / "golden" / "sample_ledger.json"
UPDATE_ENV = "CURATE_UPDATE_GOLDEN"
SOURCES = ("docstrings", "licenses", "package_docs", "scraps")
STAGES = ("language", "heuristic", "exact", "fuzzy", "quality", "decontam")
BENCHMARK = "sample_qa"
PRECISION = 6  # decimals of a score: float32 similarities widened to float64 differ below that
COLUMNS = ("doc_id", "source", "stage", "reason", "duplicate_of", "score")


def sample_spec() -> CrawlSpec:
    """The crawl of ``sample/curate.json`` on the frozen corpus, without the semantic stage."""
    sources = {name: {"url": str(CORPUS / name), "text_field": "text", "id_field": "id", "url_field": "url"}
               for name in SOURCES}
    benchmark = {"name": BENCHMARK, "path": str(CORPUS / "benchmarks" / f"{BENCHMARK}.jsonl")}
    return CrawlSpec(crawl="sample", sources=sources, stages=STAGES,
                     params={"contaminated_documents": {"benchmarks": [benchmark]}})


def source_counts(golden: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Source -> input, kept, quarantined and the non-zero removals per stage, from a ledger
    report's sources of either shape: ``removed`` a dict per stage (the golden's, written before
    reports were typed) or a count beside ``removed_per_stage``."""
    out = {}
    for source, c in golden["counts"].items():
        per_stage = c["removed"] if isinstance(c["removed"], dict) else c["removed_per_stage"]
        out[source] = {"input": c["input"], "kept": c["kept"], "quarantined": c["quarantined"],
                       "removed": {stage: n for stage, n in sorted(per_stage.items()) if n}}
    return out


def ledger_rows(ledger: pa.Table) -> list[list[Any]]:
    """The ledger as sorted JSON rows of ``COLUMNS``, the score rounded to ``PRECISION``."""
    rows = []
    for row in ledger.select(list(COLUMNS)).to_pylist():
        score = row["score"]
        rows.append([*(row[c] for c in COLUMNS[:-1]), None if score is None else round(score, PRECISION)])
    return sorted(rows, key=lambda r: [str(v) for v in r])


def dump(golden: dict[str, Any]) -> str:
    """The golden as JSON with one ledger row a line, so a changed decision is a one-line diff."""
    head = json.dumps({k: v for k, v in golden.items() if k != "rows"}, indent=1, sort_keys=True)
    rows = ",\n".join(f"  {json.dumps(row)}" for row in golden["rows"])
    return f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n'


@pytest.mark.slow
def test_the_sample_crawl_gives_the_golden_ledger(tmp_path: Path) -> None:
    store, spec = Store(str(tmp_path / "data")), sample_spec()
    execute_crawl(store, spec, ExecutionParams(workers=1))
    pdir = DataRoot(store).output_dir(spec, "removal_ledger", None)
    manifest = store.read_manifest(pdir)
    assert manifest is not None
    got = {"stages": list(STAGES), "precision": PRECISION, "columns": list(COLUMNS),
           "counts": manifest.report["sources"], "rows": ledger_rows(store.read_table(pdir, "ledger"))}
    if os.environ.get(UPDATE_ENV):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(dump(got))
        pytest.skip(f"{UPDATE_ENV} is set: wrote {GOLDEN.name}")
    want = json.loads(GOLDEN.read_text())
    assert (got["stages"], got["columns"]) == (want["stages"], want["columns"]), "the golden is of another crawl"
    assert source_counts(got) == source_counts(want), "source x stage counts differ from the golden ledger"
    have, had = {json.dumps(r) for r in got["rows"]}, {json.dumps(r) for r in want["rows"]}
    assert have == had, (f"ledger rows differ from the golden: {len(had - have)} missing, "
                         f"{len(have - had)} new; first missing {sorted(had - have)[:5]}, "
                         f"first new {sorted(have - had)[:5]} ({', '.join(COLUMNS)})")
    assert got["rows"] == want["rows"]


def test_the_golden_ledger_holds_every_kind_of_removal() -> None:
    """The golden is not vacuous: each configured stage but quality removed something from the
    frozen corpus, and every planted bad line of ``scraps`` is quarantined."""
    want = json.loads(GOLDEN.read_text())
    stages = {row[2] for row in want["rows"]}
    assert {"heuristic", "exact", "fuzzy", "decontam", "quarantine"} <= stages
    quarantined = {row[3] for row in want["rows"] if row[2] == "quarantine" and row[1] == "scraps"}
    assert quarantined == {"invalid_json", "text_not_string", "empty_text", "missing_text", "invalid_utf8"}
    counts = source_counts(want)
    for source, c in counts.items():
        assert c["input"] == c["kept"] + c["quarantined"] + sum(c["removed"].values()), source
    assert len(want["rows"]) == sum(c["quarantined"] + sum(c["removed"].values()) for c in counts.values())
