"""``curate train-quality``: a fastText classifier trained on a crawl's surviving documents (positive
sources vs negative ones), its held-out metrics and provenance, and a crawl configured with it
removing the planted low-quality documents, on a real Dagster instance."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("fasttext")

from stages.dataroot import DataRoot
from stages.train_quality import heldout_metrics, provenance_path
from tests.support.tiny_corpus import curate, fast_tmp
from tests.support.tiny_models import HQ_WORDS, LQ_WORDS, prose

pytestmark = pytest.mark.slow

STAGES = "heuristic,quality"


def _corpus(root: Path) -> tuple[dict[str, Any], set[str]]:
    """papers: 30 reference documents; spam: 30 junk ones; blogs: 12, every third one junk (the
    planted negatives); stubs: 3 texts the heuristics remove (a source with no survivors)."""
    rng = random.Random(5)
    rows: dict[str, list[dict[str, str]]] = {
        "papers": [{"id": f"p{i}", "text": prose(rng, HQ_WORDS)} for i in range(30)],
        "spam": [{"id": f"s{i}", "text": prose(rng, LQ_WORDS)} for i in range(30)],
        "blogs": [{"id": f"b{i}", "text": prose(rng, LQ_WORDS if i % 3 == 0 else HQ_WORDS)} for i in range(12)],
        "stubs": [{"id": f"x{i}", "text": t} for i, t in enumerate(("Click here", "ok", "Home | About"))],
    }
    sources: dict[str, Any] = {}
    for name, docs in rows.items():
        (root / name).mkdir(parents=True)
        (root / name / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in docs))
        sources[name] = {"url": str(root / name), "id_field": "id"}
    return sources, {f"b{i}" for i in range(0, 12, 3)}


def _config(path: Path, sources: dict[str, Any], classifiers: list[dict[str, Any]] | None = None) -> str:
    params = {"quality_scores": {"classifiers": classifiers}} if classifiers else {}
    path.write_text(json.dumps({"sources": sources, "params": params}))
    return str(path)


def test_heldout_metrics_exact() -> None:
    scores = np.array([0.9, 0.6, 0.4, 0.7, 0.2, 0.1])
    truth = np.array([True, True, True, False, False, False])
    m = heldout_metrics(scores, truth, 0.5)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 1, 2)
    assert m["precision"] == pytest.approx(2 / 3, abs=1e-6) and m["recall"] == pytest.approx(2 / 3, abs=1e-6)
    assert m["auc"] == pytest.approx(7 / 9, abs=1e-6)  # 7 of the 9 (positive, negative) pairs ordered right
    # With ties (counted half), against the pairwise definition.
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = rng.integers(0, 4, 40).astype(np.float64) / 4
        t = rng.random(40) < 0.5
        pos, neg = s[t], s[~t]
        pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
        pairwise = pairs / (len(pos) * len(neg))
        assert heldout_metrics(s, t, 0.5)["auc"] == pytest.approx(pairwise, abs=1e-6)
    none = heldout_metrics(scores, truth, 0.95)  # nothing predicted positive: 0, not a NaN
    assert none["precision"] == 0.0 and none["recall"] == 0.0 and none["f1"] == 0.0


def test_train_quality_then_crawl_removes_planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources, planted = _corpus(tmp_path / "in")
    with fast_tmp(tmp_path / "w") as workdir:
        w = str(workdir)
        # Registered but not run: nothing to train on yet.
        code, _, err = curate("register", "--workdir", w, "--crawl", "c1", "--config",
                              _config(tmp_path / "c0.json", sources), "--stages", STAGES)
        assert code == 0, err
        model = tmp_path / "models" / "ft.bin"
        train = ("train-quality", "--workdir", w, "--crawl", "c1", "--positive", "papers", "--negative", "spam")
        code, _, err = curate(*train, "--out", str(model))
        assert code == 1 and "is not materialized" in err and "curate run" in err and len(err.splitlines()) == 1

        code, out, err = curate("run", "--workdir", w, "--crawl", "c1", "--config",
                                _config(tmp_path / "c1.json", sources), "--stages", STAGES, "--quiet")
        assert code == 0, err
        code, out, err = curate(*train, "--out", str(model), "--seed", "3", "--epoch", "20")
        assert code == 0, err
        assert "precision" in out and str(model) in out
        prov = json.loads(provenance_path(model).read_text())
        assert provenance_path(model) == tmp_path / "models" / "ft.json"

        # Sources and counts exactly: 30 each survive, balanced, 20% (6) held out per class.
        assert prov["sources"] == {"positive": ["papers"], "negative": ["spam"]}
        assert prov["available"] == {"papers": 30, "spam": 30}
        for label in ("positive", "negative"):
            assert {k: prov["documents"][label][k] for k in ("documents", "train", "heldout")} == \
                {"documents": 30, "train": 24, "heldout": 6}
        texts = {json.loads(line)["id"]: json.loads(line)["text"]
                 for name in ("papers", "spam") for line in (tmp_path / "in" / name / "part.jsonl").open()}
        assert prov["documents"]["positive"]["bytes"] + prov["documents"]["negative"]["bytes"] == \
            sum(len(t.encode()) for t in texts.values())
        assert prov["documents_per_source"] == {"train": {"papers": 24, "spam": 24},
                                                "heldout": {"papers": 6, "spam": 6}}
        assert prov["seed"] == 3 and prov["fasttext"]["epoch"] == 20 and prov["fasttext"]["thread"] == 1
        assert prov["crawl"] == "c1" and prov["labels"] == {"positive": "__label__hq", "negative": "__label__cc"}
        keys = DataRoot.open(None, workdir).spec("c1").keys()
        assert prov["params_keys"]["papers"]["raw_documents"] == keys[("raw_documents", "papers")]
        assert prov["params_keys"]["spam"]["filtered_documents"] == keys[("filtered_documents", "spam")]

        m = prov["heldout_metrics"]
        assert m["threshold"] == 0.5 and m["tp"] + m["fn"] == 6 and m["fp"] + m["tn"] == 6
        for k in ("precision", "recall", "f1", "accuracy", "auc"):
            assert 0.0 <= m[k] <= 1.0
        assert m["precision"] > 0.9 and m["recall"] > 0.9

        # Deterministic: the same training, found through the data root this time, gives the same
        # model bytes and metrics.
        again = tmp_path / "again" / "ft.bin"
        code, _, err = curate("train-quality", "--data-root", str(workdir / "data"), "--crawl", "c1",
                              "--positive", "papers", "--negative", "spam", "--out", str(again), "--seed", "3",
                              "--epoch", "20")
        assert code == 0, err
        assert again.read_bytes() == model.read_bytes()
        assert json.loads(provenance_path(again).read_text())["heldout_metrics"] == m

        # The crawl with the trained classifier: the planted junk of blogs (and spam) goes, by its name.
        assert prov["classifier"] == {"name": "ft", "kind": "fasttext", "path": str(model.resolve()), "label": "hq",
                                      "min_score": 0.5}
        code, out, err = curate("run", "--workdir", w, "--crawl", "c1", "--config",
                                _config(tmp_path / "c2.json", sources, [prov["classifier"]]), "--stages", STAGES,
                                "--quiet")
        assert code == 0, err
        code, out, err = curate("ledger", "--workdir", w, "--crawl", "c1", "--out", str(tmp_path / "ledger.parquet"))
        assert code == 0, err
        rows = [r for r in pq.read_table(tmp_path / "ledger.parquet").to_pylist() if r["stage"] == "quality"]
        by_source: dict[str, set[str]] = {}
        for r in rows:
            assert r["reason"] == "quality:ft" and r["score"] < 0.5
            by_source.setdefault(r["source"], set()).add(r["record_id"])
        assert by_source == {"blogs": planted, "spam": {f"s{i}" for i in range(30)}}

        # One-line errors: an unknown source, a class with no survivors, a source on both sides.
        for extra, message in (
            (("--positive", "nope", "--negative", "spam"), "not part of crawl 'c1'"),
            (("--positive", "stubs", "--negative", "spam"), "has 0 surviving document(s)"),
            (("--positive", "papers", "--negative", "papers"), "both --positive and --negative"),
        ):
            code, out, err = curate("train-quality", "--workdir", w, "--crawl", "c1", *extra,
                                    "--out", str(tmp_path / "bad.bin"))
            assert code == 1 and message in err and err.startswith("curate: error:"), err
            assert len(err.strip().splitlines()) == 1, err
        code, _, err = curate(*train, "--out", str(tmp_path / "bad.bin"), "--holdout", "1.5")
        assert code == 1 and err.startswith("curate: error: --holdout") and len(err.strip().splitlines()) == 1
        with monkeypatch.context() as m:  # an install without the quality extra
            m.setitem(sys.modules, "fasttext", None)
            code, _, err = curate(*train, "--out", str(tmp_path / "bad.bin"))
        assert code == 1 and "pip install 'curation-dagster[quality]'" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad.bin").exists()


def test_train_quality_on_a_crawl_without_the_quality_stage(tmp_path: Path) -> None:
    """A crawl that switched the quality stage off (and language, and exact dedup): the classifier
    is trained on what ``quality_scores`` would see, the survivors of the stages the crawl ran,
    read from their outputs; no switched-off stage is asked for (none was materialized)."""
    sources, _ = _corpus(tmp_path / "in")
    with fast_tmp(tmp_path / "w") as workdir:
        code, _, err = curate("run", "--workdir", str(workdir), "--crawl", "c1", "--config",
                              _config(tmp_path / "c1.json", sources), "--stages", "heuristic", "--quiet")
        assert code == 0, err
        model = tmp_path / "ft.bin"
        code, _, err = curate("train-quality", "--workdir", str(workdir), "--crawl", "c1", "--positive", "papers",
                              "--negative", "spam", "--out", str(model), "--seed", "3")
        assert code == 0, err
        prov = json.loads(provenance_path(model).read_text())
        assert prov["available"] == {"papers": 30, "spam": 30}
        assert set(prov["params_keys"]["papers"]) == {"raw_documents", "filtered_documents"}


def test_sample_flow_of_make_run(tmp_path: Path) -> None:
    """`make run`'s steps on a small sample: a first pass, `train-quality` docstrings vs package
    descriptions into the model path `curate-quality.json` names, a second pass with it that
    removes documents by reason quality:sample-quality."""
    make = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    train_args: list[str] = []
    for line in make[make.index("curate train-quality"):].splitlines():  # the command and its continuations
        train_args += line.rstrip("\\").split()
        if not line.endswith("\\"):
            break
    train_args = train_args[1:]
    assert "--config sample/curate.json" in make and "--config sample/curate-quality.json" in make
    sample = tmp_path / "sample"
    code, _, err = curate("sample", "--out", str(sample), "--max-docs", "60")
    assert code == 0, err
    config = json.loads((sample / "curate-quality.json").read_text())
    (clf,) = config["params"]["quality_scores"]["classifiers"]
    out_arg = train_args[train_args.index("--out") + 1]
    assert clf["path"] == str((tmp_path / out_arg).resolve()) and clf["name"] == "sample-quality"
    with fast_tmp(tmp_path / "w") as workdir:
        w = str(workdir)
        code, _, err = curate("run", "--workdir", w, "--crawl", "sample", "--config", str(sample / "curate.json"),
                              "--stages", STAGES, "--quiet")
        assert code == 0, err
        args = [a.replace("$(WORKDIR)", w).replace("$(CRAWL)", "sample") for a in train_args]
        args[args.index("--out") + 1] = clf["path"]
        code, out, err = curate(*args)
        assert code == 0, err
        prov = json.loads(provenance_path(Path(clf["path"])).read_text())
        assert prov["sources"] == {"positive": ["docstrings"], "negative": ["package_docs"]}
        assert prov["classifier"] == clf  # the sample's config is what train-quality prints for it
        code, _, err = curate("run", "--workdir", w, "--crawl", "sample", "--config",
                              str(sample / "curate-quality.json"), "--stages", STAGES, "--quiet")
        assert code == 0, err
        code, out, _ = curate("report", "--workdir", w, "--crawl", "sample", "--json")
        removed = {s: r["removed"]["quality"] for s, r in json.loads(out)["sources"].items()}
        assert removed["package_docs"] > 0, removed
        code, _, err = curate("ledger", "--workdir", w, "--crawl", "sample", "--out", str(tmp_path / "l.parquet"))
        reasons = {r["reason"] for r in pq.read_table(tmp_path / "l.parquet").to_pylist() if r["stage"] == "quality"}
        assert reasons == {"quality:sample-quality"}
