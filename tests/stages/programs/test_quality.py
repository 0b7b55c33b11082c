"""Quality classifiers: real loading of a fastText .bin and a local Hugging Face directory (both built
here), threshold direction, the cascade, the score cache and the model fingerprint in the key."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fasttext")
pytest.importorskip("transformers")

from stages.backend import cuda_available
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.execute import execute
from stages.kernels import quality as Q
from stages.params import QualityClassifier, QualityScoresParams, params_key
from stages.programs.quality_scores import NO_MODEL, load_scorer
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.tiny_models import hq_text, lq_text, make_hf_classifier, reference_scores, train_fasttext


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("models")
    ft = train_fasttext(root / "hq.bin")
    reg_model, reg_tok = make_hf_classifier(root / "edu", num_labels=1, seed=0)
    lab_model, lab_tok = make_hf_classifier(root / "labels", num_labels=3, seed=1,
                                            id2label={0: "low", 1: "medium", 2: "high"})
    return {"fasttext": ft, "edu": root / "edu", "labels": root / "labels",
            "edu_model": (reg_model, reg_tok), "labels_model": (lab_model, lab_tok)}


def _texts(seed: int = 7) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    return [hq_text(rng) for _ in range(6)], [lq_text(rng) for _ in range(6)]


# --------------------------------------------------------------------------- kernels


def test_keep_mask_direction_and_bounds() -> None:
    s = np.array([0.1, 0.5, 0.9, np.nan])
    assert Q.keep_mask(s, 0.5, None).tolist() == [False, True, True, False]
    assert Q.keep_mask(s, None, 0.5).tolist() == [True, True, False, False]
    assert Q.keep_mask(s, 0.2, 0.6).tolist() == [False, True, False, False]
    assert Q.keep_mask(s, None, None).tolist() == [True, True, True, True]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=80), st.integers(1, 2000), st.integers(1, 16))
def test_length_batches_partition_and_budget(lengths: list[int], budget: int, max_rows: int) -> None:
    arr = np.array(lengths, dtype=np.int64)
    batches = Q.length_batches(arr, budget, max_rows)
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))  # a permutation: every row once
    for b in batches:
        assert 1 <= len(b) <= max_rows
        # within budget unless a single row alone exceeds it
        assert len(b) == 1 or len(b) * int(arr[b].max()) <= budget
    # sorted by length across batches, so padding waste stays small
    assert arr[flat].tolist() == sorted(lengths)


def test_histogram_values() -> None:
    h = Q.histogram(np.array([0.0, 0.25, 0.5, 1.0, np.nan]), bins=4)
    assert h["count"] == 4 and h["nan"] == 1
    assert h["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0] and h["counts"] == [1, 1, 1, 1]
    assert h["min"] == 0.0 and h["max"] == 1.0 and h["mean"] == pytest.approx(0.4375)


# --------------------------------------------------------------------------- real model loading


def test_fasttext_load_and_label_direction(models: dict[str, Any]) -> None:
    hq, lq = _texts()
    clf = QualityClassifier(name="ft", kind="fasttext", path=str(models["fasttext"]), label="hq")
    scores = load_scorer(clf, _exec())
    s_hq, s_lq = scores.score(hq), scores.score(lq)
    assert (s_hq > 0.9).all() and (s_lq < 0.1).all(), (s_hq, s_lq)
    # The other label is the complement: a label mix-up would invert every decision.
    inv = load_scorer(clf.model_copy(update={"label": "__label__lq"}), _exec())
    np.testing.assert_allclose(inv.score(hq), 1 - s_hq, atol=1e-4)
    with pytest.raises(ValueError, match="__label__hq"):
        load_scorer(clf.model_copy(update={"label": "nope"}), _exec())


def test_hf_regression_load_matches_in_memory_model(models: dict[str, Any]) -> None:
    hq, lq = _texts()
    texts = [*hq, *lq, "physics", "the " * 300]  # one long text: truncated at max_tokens
    model, tok = models["edu_model"]
    expected = reference_scores(model, tok, texts, None, max_tokens=64)
    clf = QualityClassifier(name="edu", kind="hf", path=str(models["edu"]), max_tokens=64)
    got = load_scorer(clf, _exec()).score(texts)
    # Batched, length-sorted and padded scoring of the loaded model == one-by-one in memory.
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.ptp(got) > 0.05  # the check is sensitive: scores differ between texts
    # A differently initialised model (what a wrong or partial load gives) scores differently.
    other, _ = make_hf_classifier(models["edu"].parent / "edu_other", num_labels=1, seed=5)
    assert not np.allclose(reference_scores(other, tok, texts, None, 64), got, atol=1e-3)


def test_hf_labels_probability_of_named_label(models: dict[str, Any]) -> None:
    hq, lq = _texts()
    model, tok = models["labels_model"]
    clf = QualityClassifier(name="q3", kind="hf", path=str(models["labels"]), label="high")
    got = load_scorer(clf, _exec()).score(hq + lq)
    np.testing.assert_allclose(got, reference_scores(model, tok, hq + lq, 2), rtol=1e-4, atol=1e-6)
    by_index = load_scorer(clf.model_copy(update={"label": "0"}), _exec()).score(hq)
    np.testing.assert_allclose(by_index, reference_scores(model, tok, hq, 0), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match=r"\['low', 'medium', 'high'\]"):
        load_scorer(clf.model_copy(update={"label": None}), _exec())


def test_local_paths_only(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        QualityScoresParams(classifiers=[{"name": "x", "kind": "hf", "path": "HuggingFaceFW/fineweb-edu-classifier"}])
    (tmp_path / "weights.bin").write_bytes(b"x")  # a directory without config.json
    clf = QualityClassifier(name="x", kind="hf", path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        load_scorer(clf, _exec())


# --------------------------------------------------------------------------- fingerprint in the key


def test_changed_model_file_rekeys_and_unchanged_content_does_not(tmp_path: Path, models: dict[str, Any]) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(models["fasttext"].read_bytes())
    cfg = {"classifiers": [{"name": "ft", "kind": "fasttext", "path": str(path), "label": "hq", "min_score": 0.5}]}
    k1 = params_key("quality_scores", QualityScoresParams(**cfg))
    os.utime(path, (1_000_000, 1_000_000))  # a touch or a copy with a new mtime: same bytes, same key
    assert params_key("quality_scores", QualityScoresParams(**cfg)) == k1
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte changed (a retrained checkpoint of the same shape)
    path.write_bytes(bytes(data))
    os.utime(path, (1_000_000, 1_000_000))  # even with the old mtime
    assert params_key("quality_scores", QualityScoresParams(**cfg)) != k1
    # Disabled: the file is not needed at all.
    QualityScoresParams(enabled=False, classifiers=[{**cfg["classifiers"][0], "path": "/nonexistent"}])


# --------------------------------------------------------------------------- the program


def _exec() -> Any:
    from stages.params import ExecutionParams

    return ExecutionParams(batch_rows=7)  # several batches per source


def _corpus(root: Path) -> dict[str, dict[str, str]]:
    rng = random.Random(3)
    sources = {}
    for name in ("web", "books"):
        folder = root / name
        folder.mkdir(parents=True)
        rows = []
        for i in range(10):
            kind = "hq" if i % 2 == 0 else "lq"
            text = hq_text(rng) if kind == "hq" else lq_text(rng)
            rows.append({"id": f"{name}-{kind}-{i}", "text": text})
        (folder / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        sources[name] = {"url": str(folder), "text_field": "text", "id_field": "id"}
    return sources


def _run(store: Store, spec: CrawlSpec) -> dict[tuple[str, str | None], Any]:
    out = {}
    for name in PROGRAMS:
        for source in spec.partitions(name):
            out[(name, source)] = execute(store, spec, name, source, _exec())
    return out


def _removed(store: Store, spec: CrawlSpec, source: str) -> dict[str, tuple[str, float]]:
    pdir = DataRoot(store).output_dir(spec, "quality_scores", source)
    t = store.read_table(pdir, "removed")
    return {r["doc_id"]: (r["reason"], r["score"]) for r in t.to_pylist()}


def _record_ids(store: Store, spec: CrawlSpec, source: str) -> dict[str, str]:
    t = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", source), "documents")
    return dict(zip(t["doc_id"].to_pylist(), t["record_id"].to_pylist(), strict=True))


def test_cascade_thresholds_cache_and_ledger(tmp_path: Path, models: dict[str, Any]) -> None:
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "data"))
    edu_model, tok = models["edu_model"]
    # The transformer's threshold: the median of its scores on the corpus' hq documents, so it
    # removes some documents the fastText model kept.
    hq_docs = [json.loads(line)["text"] for s in sources.values()
               for line in Path(s["url"], "part-0.jsonl").read_text().splitlines() if "-hq-" in line]
    edu_ref = dict(zip(hq_docs, reference_scores(edu_model, tok, hq_docs, None), strict=True))
    cut = float(np.median(list(edu_ref.values())))
    ft = {"name": "ft", "kind": "fasttext", "path": str(models["fasttext"]), "label": "hq", "min_score": 0.5}
    edu = {"name": "edu", "kind": "hf", "path": str(models["edu"]), "min_score": cut}
    spec = CrawlSpec(crawl="c1", sources=sources, stages=("quality",),
                     params={"quality_scores": {"classifiers": [ft, edu]}})
    outcomes = _run(store, spec)

    for source in sources:
        ids = _record_ids(store, spec, source)
        removed = {ids[d]: v for d, v in _removed(store, spec, source).items()}
        texts = {json.loads(line)["id"]: json.loads(line)["text"]
                 for line in Path(sources[source]["url"], "part-0.jsonl").read_text().splitlines()}
        # Every lq document fails the cheap fastText model first, with its (low) probability.
        lq = {r for r in texts if "-lq-" in r}
        assert {r for r, (reason, _) in removed.items() if reason == "quality:ft"} == lq
        assert all(score < 0.5 for r, (_, score) in removed.items() if r in lq)
        # Among the survivors, the transformer removes exactly those below its threshold.
        expected_edu = {r for r in texts if "-hq-" in r and edu_ref[texts[r]] < cut}
        assert {r for r, (reason, _) in removed.items() if reason == "quality:edu"} == expected_edu
        for r in expected_edu:
            assert removed[r][1] == pytest.approx(edu_ref[texts[r]], rel=1e-4, abs=1e-5)
        # The transformer scored only the fastText survivors (null where not scored).
        scores = store.read_table(DataRoot(store).output_dir(spec, "quality_scores", source), "scores")
        by_rec = dict(zip([ids[d] for d in scores["doc_id"].to_pylist()], scores["edu"].to_pylist(), strict=True))
        assert {r for r, v in by_rec.items() if v is None} == lq
        rep = outcomes[("quality_scores", source)].manifest.report
        assert rep["classifiers"]["ft"]["scored"] == 10 and rep["classifiers"]["edu"]["scored"] == 5
        assert rep["removed_per_reason"]["quality:ft"] == 5
        assert rep["classifiers"]["edu"]["histogram"]["count"] == 5
        on_gpu = _exec().backend == "auto" and cuda_available()
        assert (rep["device"], rep["backend"]) == (("cuda", "gpu") if on_gpu else ("cpu", "cpu"))

    ledger = store.read_table(DataRoot(store).output_dir(spec, "removal_ledger", None), "ledger")
    q = ledger.filter(pc.equal(ledger["stage"], "quality"))
    assert q.num_rows == sum(len(_removed(store, spec, s)) for s in sources)
    report = outcomes[("removal_ledger", None)].manifest.report
    assert sum(r["removed_per_stage"]["quality"] for r in report["sources"].values()) == q.num_rows

    # A stricter transformer threshold re-keys the output but reuses every cached score.
    edu2 = {**edu, "min_score": cut + 10.0}
    spec2 = spec.model_copy(update={"params": {"quality_scores": {"classifiers": [ft, edu2]}}})
    again = execute(store, spec2, "quality_scores", "web", _exec()).manifest.report
    assert again["classifiers"]["edu"]["computed"] == 0 and again["classifiers"]["edu"]["cached"] == 5
    assert again["removed"] == 10  # everything fails an unreachable threshold
    # Per-source thresholds: books keeps everything the fastText model keeps.
    edu3 = {**edu2, "min_score_per_source": {"books": -1e9}}
    spec3 = spec.model_copy(update={"params": {"quality_scores": {"classifiers": [ft, edu3]}}})
    books = execute(store, spec3, "quality_scores", "books", _exec()).manifest.report
    assert books["removed_per_reason"] == {"quality:ft": 5} and books["classifiers"]["edu"]["min_score"] == -1e9


def test_no_model_configured_is_a_noop(tmp_path: Path) -> None:
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "data"))
    spec = CrawlSpec(crawl="c1", sources=sources, stages=("quality",))
    outcomes = _run(store, spec)
    rep = outcomes[("quality_scores", "web")].manifest.report
    assert rep["note"] == NO_MODEL and rep["input"] == 10 and rep["removed"] == 0
    assert outcomes[("curated_documents", "web")].manifest.report["kept"] == 10


@pytest.mark.gpu
def test_gpu_bf16_scores_match_cpu(models: dict[str, Any]) -> None:
    """The GPU path (bf16 weights and autocast) gives the CPU float32 scores within bf16 tolerance."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from stages.params import ExecutionParams

    hq, lq = _texts()
    clf = QualityClassifier(name="edu", kind="hf", path=str(models["edu"]))
    cpu = load_scorer(clf, ExecutionParams(backend="cpu")).score(hq + lq)
    gpu = load_scorer(clf, ExecutionParams(backend="gpu")).score(hq + lq)
    np.testing.assert_allclose(gpu, cpu, rtol=0.05, atol=0.05)
