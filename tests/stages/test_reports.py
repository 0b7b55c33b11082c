"""Typed reports (``stages.reports``): every program's model round-trips through the manifest JSON,
reports of the old shape still read, and the checks read the typed fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages import reports as R
from stages.catalog import PROGRAMS
from stages.checks import ChecksConfig, evaluate_giant_groups, evaluate_over_deletion, removed_by_source
from stages.dataroot import DataRoot
from stages.execute import execute, metadata
from stages.spec import CrawlSpec
from stages.store import Manifest, Store

# One report per program, with the values its program writes (a few of each kind: counts,
# breakdowns, nested models, nulls).
SAMPLES: dict[str, R.Report] = {
    "raw_documents": R.RawDocumentsReport(
        input=12, documents=10, quarantined=2, quarantine_reasons={"empty_text": 2}, files=2,
        damaged_files=[R.DamagedFile(file="b.jsonl.gz", error="truncated gzip", size=900, unread_bytes=400,
                                     partial_bytes=12)],
        unread_bytes=412, ignored_files=1, ignored_examples=[".hidden"], empty_files=0, tasks=3, blank_lines=1,
        chars=5000),
    "document_languages": R.DocumentLanguagesReport(
        enabled=True, input=10, kept=8, removed=2, removed_per_reason={"language:fr": 2}, languages={"en": 8, "fr": 2},
        cached=False),
    "filtered_documents": R.FilteredDocumentsReport(
        enabled=True, rules="default", word_rules_off=0, input=8, kept=6, removed=2,
        removed_per_reason={"min_words": 1, "filter:digits": 1}, fails_per_rule={"min_words": 1, "filter:digits": 1},
        custom_filters={"digits": R.CustomFilterCounts(version=1, input=7, scored=7, removed=1)}),
    "exact_duplicates": R.ExactDuplicatesReport(
        enabled=True, input=6, removed=1, groups=1, removed_per_source={"a": 1}),
    "minhash_signatures": R.MinhashSignaturesReport(
        enabled=True, backend="cpu", documents=5, bytes=4000, kernel_seconds=0.01, kernel_mb_per_s=None),
    "lsh_buckets": R.LshBucketsReport(
        enabled=True, bands=20, rows=13, threshold=0.7946, s_curve={"0.80": 0.53}, backend="cpu", shingle=24,
        num_perm=260, seed=42, nodes=5, prior_documents={"c0": 3}, edges=4, bucket_size_hist={"2-3": 2},
        largest_buckets=[R.Bucket(size=3, key="00000000000000ff")]),
    "duplicate_components": R.DuplicateComponentsReport(
        enabled=True, backend="cpu", verify="jaccard", shingle=24, threshold=0.8, nodes=5, candidate_pairs=4,
        fallback_pairs=0, edges=3, rejected_pairs=1, text_blocks=1, candidate_text_bytes=2000, text_spilled=False,
        components=1, documents_in_components=3, largest_clusters=[3]),
    "fuzzy_duplicates": R.FuzzyDuplicatesReport(
        enabled=True, input=3, removed=2, components=1, removed_per_source={"a": 2},
        removed_as_earlier_crawl_duplicates=0),
    "document_embeddings": R.DocumentEmbeddingsReport(
        enabled=True, input=3, embedded=2, cached=1, tokens=300, truncated=0, max_tokens=256, dim=384, device="cpu",
        embed_seconds=0.2, docs_per_second=10.0),
    "semantic_clusters": R.SemanticClustersReport(
        enabled=True, input=3, dropped=0, n_clusters=1, clusters=1, largest=3, median_size=3.0, splits=0, spilled=0,
        fit_rows=3, device="cpu", load_seconds=0.0, kmeans_seconds=0.01),
    "semantic_duplicates": R.SemanticDuplicatesReport(
        enabled=True, input=3, clusters=1, appearances=3, removed=1, removed_per_source={"a": 1}, eps=0.05,
        which_to_keep="hard", pairs=3, device="cpu", pairwise_seconds=0.001, pairs_per_second=3000,
        similarity_bands={">=0.95": 1}),
    "quality_scores": R.QualityScoresReport(
        enabled=True, device="cpu", input=2, kept=1, removed=1, removed_per_reason={"quality:edu": 1},
        classifiers={"edu": R.ClassifierStats(kind="fasttext", min_score=0.5, max_score=None, scored=2, cached=0,
                                              computed=2, removed=1, seconds=0.01, docs_per_s=200.0,
                                              histogram={"count": 2, "nan": 0})},
        unknown_sources_in_thresholds=["gone"]),
    "contaminated_documents": R.ContaminatedDocumentsReport(
        enabled=True, input=1, removed=0, removed_per_source={}, removed_per_reason={}, ngram=13, min_matches=1,
        index_ngrams=100, index_mib=0.001, index_seconds=0.002, docs_per_s=500.0,
        benchmarks={"hist": R.BenchmarkStats(examples=2, ngrams=100, examples_without_ngrams=0, removed=0,
                                             removed_per_source={}, docs_with_any_match=0, examples_found=0)}),
    "curated_documents": R.CuratedDocumentsReport(
        input=12, kept=1, quarantined=2, removed=9,
        removed_per_stage={"language": 2, "heuristic": 2, "exact": 1, "fuzzy": 2, "semantic": 1, "quality": 1,
                           "decontam": 0}),
    "removal_ledger": R.RemovalLedgerReport(crawl="c1", sources={
        "a": R.LedgerSource(input=12, kept=1, quarantined=2, removed=9, removed_per_stage={"heuristic": 9},
                            filters={"digits": 1})}),
}


def test_one_model_per_program_named_after_it() -> None:
    assert list(R.REPORTS) == list(PROGRAMS)
    for program, model in R.REPORTS.items():
        assert model.__name__ == "".join(w.title() for w in program.split("_")) + "Report"
        assert R.report_model(program) is model
        assert model.model_config["frozen"]
    assert set(SAMPLES) == set(PROGRAMS)
    with pytest.raises(KeyError, match="no report model for program 'nope'"):
        R.report_model("nope")


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_each_report_round_trips_through_the_manifest(tmp_path: Path, program: str) -> None:
    report = SAMPLES[program]
    assert isinstance(report, R.report_model(program))
    store = Store(str(tmp_path / "data"))
    writer = store.writer(store.partition_dir(program, "k", "c1", None))
    writer.commit(Manifest(program, "k", "v", "c1", None, {}, report=report.dump()))
    manifest = store.read_manifest(store.partition_dir(program, "k", "c1", None))
    assert manifest is not None
    assert manifest.report == json.loads(json.dumps(report.dump()))  # plain JSON on disk
    assert R.read(manifest) == report
    assert R.read_as(manifest, R.report_model(program)) == report
    assert R.read(manifest).dump() == report.dump()


def test_a_report_keeps_only_what_its_program_set() -> None:
    # A disabled program's short report stays short: the JSON it always wrote, key for key.
    assert R.ExactDuplicatesReport(enabled=False, input=0, removed=0, removed_per_source={}).dump() == \
        {"enabled": False, "input": 0, "removed": 0, "removed_per_source": {}}
    assert R.DocumentEmbeddingsReport(enabled=False, input=0).dump() == {"enabled": False, "input": 0}
    read = R.RawDocumentsReport.model_validate({"documents": 3, "a_key_since_dropped": 1})  # older manifests
    assert read.documents == 3 and read.files == 0 and read.dump() == {"documents": 3, "a_key_since_dropped": 1}


def test_removed_is_a_count_everywhere() -> None:
    for program, report in SAMPLES.items():
        if isinstance(report, (R.RemovalReport, R.SourceCounts)):
            assert type(report.removed) is int, program
    assert {p for p, r in SAMPLES.items() if isinstance(r, R.RemovalReport)} == \
        {p.name for p in PROGRAMS.values() if p.stage}  # every remover, and only they


def test_old_shape_curated_and_ledger_reports_still_read() -> None:
    """Manifests written before ``removed_per_stage`` stored the per-stage dict as ``removed``."""
    old = {"input": 10, "kept": 5, "quarantined": 2, "removed": {"heuristic": 2, "exact": 1}, "seconds": 0.1,
           "backend": "cpu"}
    cur = R.read(Manifest("curated_documents", "k", "v", "c1", "a", {}, report=old))
    assert isinstance(cur, R.CuratedDocumentsReport)
    assert (cur.removed, cur.removed_per_stage, cur.adds_up()) == (3, {"heuristic": 2, "exact": 1}, (True, 10))
    assert cur.dump() == {**old, "removed": 3, "removed_per_stage": {"heuristic": 2, "exact": 1}}
    ledger = R.read_as(Manifest("removal_ledger", "k", "v", "c1", None, {}, report={
        "crawl": "c1", "sources": {"a": {k: old[k] for k in ("input", "kept", "quarantined", "removed")},
                                   "b": {"input": 4, "kept": 4, "quarantined": 0, "removed": {},
                                         "filters": {"digits": 0}}}}), R.RemovalLedgerReport)
    assert ledger.sources["a"] == R.LedgerSource(input=10, kept=5, quarantined=2, removed=3,
                                                 removed_per_stage={"heuristic": 2, "exact": 1})
    assert (ledger.sources["b"].removed, ledger.sources["b"].filters) == (0, {"digits": 0})
    # New-shape rows written without the total get it from the breakdown.
    assert R.LedgerSource.model_validate({"input": 3, "removed_per_stage": {"exact": 3}}).removed == 3


def test_read_as_refuses_another_programs_model() -> None:
    m = Manifest("exact_duplicates", "k", "v", "c1", None, {}, report={"removed": 1})
    assert R.read_as(m, R.RemovalReport).removed == 1  # a base of its model
    with pytest.raises(TypeError, match="exact_duplicates reports a ExactDuplicatesReport, not a LshBucketsReport"):
        R.read_as(m, R.LshBucketsReport)


def test_metadata_publishes_the_typed_counts() -> None:
    curated = SAMPLES["curated_documents"]
    assert isinstance(curated, R.CuratedDocumentsReport)
    assert curated.metadata() == {"input": 12, "kept": 1, "quarantined": 2, "removed": 9,
                                  "removed_per_stage": curated.removed_per_stage}
    assert SAMPLES["filtered_documents"].metadata() == {
        "enabled": True, "input": 8, "kept": 6, "removed": 2,
        "removed_per_reason": {"min_words": 1, "filter:digits": 1},
        "fails_per_rule": {"min_words": 1, "filter:digits": 1}}


# --- the checks read the typed fields --------------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Store, CrawlSpec]:
    spec = CrawlSpec(crawl="c1", sources={s: {"url": f"/nowhere/{s}"} for s in ("a", "b")},
                     stages=("heuristic", "exact", "fuzzy"))
    store = Store(str(tmp_path / "data"))

    def plant(program: str, source: str | None, report: R.Report) -> None:
        w = store.writer(DataRoot(store).output_dir(spec, program, source))
        w.commit(Manifest(program, "planted", "planted", spec.crawl, source, {}, report=report.dump()))

    for s in ("a", "b"):
        plant("raw_documents", s, R.RawDocumentsReport(input=2000, documents=2000))
        plant("document_languages", s, R.DocumentLanguagesReport(enabled=False, input=2000, kept=2000))
        plant("filtered_documents", s, R.FilteredDocumentsReport(input=2000, kept=1000, removed=1000))
    plant("exact_duplicates", None, R.ExactDuplicatesReport(input=2000, removed=950, removed_per_source={"a": 950}))
    plant("lsh_buckets", None, R.LshBucketsReport(nodes=1050, largest_buckets=[
        R.Bucket(size=1200, key="00ff"), R.Bucket(size=2, key="0a0b")]))
    plant("duplicate_components", None, R.DuplicateComponentsReport(enabled=False, components=0))
    return store, spec


def test_checks_read_removed_and_largest_groups_typed(planted: tuple[Store, CrawlSpec]) -> None:
    store, spec = planted
    cfg = ChecksConfig()
    assert removed_by_source(store, spec, "filtered_documents") == {"a": 1000, "b": 1000}  # source level: removed
    assert removed_by_source(store, spec, "exact_duplicates") == {"a": 950, "b": 0}  # crawl level: per source
    v = evaluate_over_deletion(store, spec, "exact_duplicates", None, cfg)
    assert not v.passed and v.description.startswith("stage exact removed more than 90.0% of: a 95.0% (950 of 1,000); ")
    v = evaluate_giant_groups(store, spec, "lsh_buckets", None, cfg)
    assert not v.passed and v.metadata == {"documents": 1050, "bound": 1000, "largest_buckets": 1200}
    assert v.description.startswith("giant group(s) in lsh_buckets: buckets of 1,200 documents (bound 1,000")
    v = evaluate_giant_groups(store, spec, "duplicate_components", None, cfg)  # disabled: no sizes
    assert v.passed and v.metadata == {"stats": "none"}


def test_the_executor_adds_seconds_and_backend(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "p.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"document {i}"}) + "\n"
                                         for i in range(3)))
    spec = CrawlSpec(crawl="c1", sources={"s": {"url": str(src), "id_field": "id"}})
    store = Store(str(tmp_path / "data"))
    outcome = execute(store, spec, "raw_documents", "s")
    report = R.read_as(outcome.manifest, R.RawDocumentsReport)
    assert (report.input, report.documents, report.backend) == (3, 3, "cpu")
    assert report.seconds is not None and report.seconds >= 0
    assert set(outcome.manifest.report) >= {"input", "documents", "quarantined", "seconds", "backend"}
    meta: dict[str, Any] = metadata(outcome)
    assert (meta["documents"], meta["backend"], meta["report"]) == (3, "cpu", outcome.manifest.report)
    assert "removed_per_stage" not in meta  # a breakdown raw_documents does not have
