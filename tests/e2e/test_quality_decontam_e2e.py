"""quality and decontam through ``curate run`` on a real Dagster instance: report, ledger, explain and
``curate decontam-report``, with a fastText model trained here and a benchmark file written here."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("fasttext")

from tests.support.tiny_corpus import curate, fast_tmp
from tests.support.tiny_models import HQ_WORDS, LQ_WORDS, prose, train_fasttext

pytestmark = pytest.mark.slow

PASSAGE = ("The lighthouse keeper logged the passing of every ship in a leather book, noting the wind, "
           "the state of the sea and the colour of each hull, until the light was automated in the spring.")


def _corpus(root: Path) -> tuple[dict[str, Any], dict[str, set[str]]]:
    rng = random.Random(11)
    sources: dict[str, Any] = {}
    lq: dict[str, set[str]] = {}
    for name in ("blogs", "papers"):
        rows = []
        for i in range(12):
            bad = i % 3 == 0
            rows.append({"id": f"{name}{i}", "text": prose(rng, LQ_WORDS if bad else HQ_WORDS)})
        lq[name] = {r["id"] for r in rows if r["id"].removeprefix(name) in {str(i) for i in range(0, 12, 3)}}
        if name == "papers":  # a benchmark passage, upper-cased, inside a good document
            rows[4]["text"] = rows[4]["text"] + " " + PASSAGE.upper()
        (root / name).mkdir(parents=True)
        (root / name / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        sources[name] = {"url": str(root / name), "id_field": "id"}
    return sources, lq


def test_quality_and_decontam_through_curate(tmp_path: Path) -> None:
    sources, lq = _corpus(tmp_path / "in")
    model = train_fasttext(tmp_path / "hq.bin")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "lh-7", "question": "Who logged the ships?", "answers": ["the keeper"],
                                 "passages": [PASSAGE]}) + "\n")
    params = {
        "quality_scores": {"classifiers": [
            {"name": "ft", "kind": "fasttext", "path": str(model), "label": "hq", "min_score": 0.5}]},
        "contaminated_documents": {"benchmarks": [{"name": "lighthouse", "path": str(bench)}]},
    }
    config = tmp_path / "curate.json"
    config.write_text(json.dumps({"sources": sources, "params": params}))
    with fast_tmp(tmp_path / "w") as workdir:
        code, out, err = curate("run", "--workdir", str(workdir), "--crawl", "c1", "--config", str(config),
                                "--stages", "quality,decontam", "--quiet")
        assert code == 0, err
        code, out, err = curate("report", "--workdir", str(workdir), "--crawl", "c1", "--json")
        report = json.loads(out)["sources"]
        assert report["blogs"]["removed"]["quality"] == 4 and report["papers"]["removed"]["quality"] == 4
        assert report["blogs"]["removed"]["decontam"] == 0 and report["papers"]["removed"]["decontam"] == 1
        assert report["papers"]["kept"] == 12 - 4 - 1

        code, _, err = curate("ledger", "--workdir", str(workdir), "--crawl", "c1", "--out", str(tmp_path / "l.pq"))
        assert code == 0, err
        ledger = pq.read_table(tmp_path / "l.pq").to_pylist()
        quality = {(r["source"], r["record_id"]) for r in ledger if r["stage"] == "quality"}
        assert quality == {(s, rid) for s, ids in lq.items() for rid in ids}
        assert {r["reason"] for r in ledger if r["stage"] == "quality"} == {"quality:ft"}
        assert all(r["score"] < 0.5 for r in ledger if r["stage"] == "quality")
        (dec,) = [r for r in ledger if r["stage"] == "decontam"]
        assert (dec["source"], dec["record_id"], dec["reason"], dec["duplicate_of"]) == \
            ("papers", "papers4", "benchmark:lighthouse", "lighthouse:lh-7")
        assert dec["score"] == len(PASSAGE.split()) - 13 + 1

        code, out, _ = curate("explain", "--workdir", str(workdir), "--crawl", "c1", dec["doc_id"])
        assert code == 0 and "benchmark example: lighthouse:lh-7" in out
        code, out, _ = curate("decontam-report", "--workdir", str(workdir), "--crawl", "c1")
        assert code == 0 and "lighthouse" in out and "papers" in out
        code, out, _ = curate("decontam-report", "--workdir", str(workdir), "--crawl", "c1", "--json")
        bench_rep = json.loads(out)["benchmarks"]["lighthouse"]
        assert bench_rep["removed"] == 1 and bench_rep["removed_per_source"] == {"papers": 1}

        # With the stages before them: quality and decontam still run, last, and the counts add up.
        # (semantic is left out: it loads an embedding model, which this test does not need.)
        code, out, err = curate("run", "--workdir", str(workdir), "--crawl", "c1", "--config", str(config), "--quiet",
                                "--stages", "heuristic,exact,fuzzy,quality,decontam")
        assert code == 0, err
        code, out, _ = curate("report", "--workdir", str(workdir), "--crawl", "c1", "--json")
        full = json.loads(out)["sources"]
        assert full["papers"]["removed"]["decontam"] == 1
        assert full["blogs"]["removed"]["quality"] + full["blogs"]["removed"].get("heuristic", 0) >= 4
        for row in full.values():
            assert row["input"] == row["kept"] + row["quarantined"] + sum(row["removed"].values())
