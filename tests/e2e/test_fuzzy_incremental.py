"""Incremental recrawls: a new crawl is deduplicated against the kept documents of an earlier
one through the earlier crawl's persisted bucket index, and only new documents are removed."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow.compute as pc
import pytest

from curation_dagster.tools.sample import build_sample
from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.spec import CrawlSpec, prior_outputs
from stages.store import MANIFEST, Store


def _write(path: Path, records: list[dict[str, str]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _ids(store: Store, spec: CrawlSpec, program: str, table: str, source: str | None = None) -> set[str]:
    return set(store.read_table(DataRoot(store).output_dir(spec, program, source), table)["doc_id"].to_pylist())


@pytest.fixture(scope="module")
def crawls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("incremental")
    folders = build_sample(root / "sample", max_docs_per_source=300)
    docs = []
    for part in sorted(folders["docstrings"].iterdir()):
        data = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
        docs.extend(json.loads(line) for line in data.decode().splitlines() if line.strip())
    docs = [d for d in docs if len(d["text"]) > 400][:120]
    first, rest = docs[:80], docs[80:]
    _write(root / "c1" / "web", first)
    # The recrawl: 30 pages unchanged, 20 lightly edited, 40 new (of which 2 exact copies of each other).
    edited = [{"id": d["id"], "text": d["text"].replace(" the ", " a ", 1) + "\nUpdated."} for d in first[30:50]]
    new = [*rest, dict(rest[0], id="copy-of-first-new")]
    _write(root / "c2" / "web", first[:30] + edited + new)
    store = Store(str(root / "data"))
    spec1 = CrawlSpec(crawl="c1", sources={"web": {"url": str(root / "c1" / "web"), "id_field": "id"}},
                      stages=("fuzzy",))
    execute_crawl(store, spec1)
    stamps = {p: os.stat(p).st_mtime_ns for p in (root / "data").rglob(MANIFEST)}
    spec2 = CrawlSpec(crawl="c2", sources={"web": {"url": str(root / "c2" / "web"), "id_field": "id"}},
                      stages=("fuzzy",), dedup_against={"c1": prior_outputs(spec1)})
    execute_crawl(store, spec2)
    return {"store": store, "spec1": spec1, "spec2": spec2, "stamps": stamps, "new": len(new)}


def test_only_new_documents_are_removed(crawls: dict[str, object]) -> None:
    store, spec1, spec2 = crawls["store"], crawls["spec1"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec1, CrawlSpec) and isinstance(spec2, CrawlSpec)
    removed = store.read_table(DataRoot(store).output_dir(spec2, "fuzzy_duplicates", None), "removed")
    c1_kept = _ids(store, spec1, "curated_documents", "documents", "web")
    c2_docs = _ids(store, spec2, "raw_documents", "documents", "web")
    assert set(removed["doc_id"].to_pylist()) <= c2_docs
    earlier = removed.filter(pc.equal(removed["reason"], "near_duplicate_of_earlier_crawl"))
    # 30 unchanged + 20 lightly edited pages duplicate crawl c1's kept pages
    assert earlier.num_rows == 50
    assert set(earlier["duplicate_of"].to_pylist()) <= c1_kept
    assert set(earlier["duplicate_of_source"].to_pylist()) == {"c1/web"}
    within = removed.filter(pc.equal(removed["reason"], "near_duplicate"))
    assert within.num_rows == 1  # the exact copy among the new pages
    kept = _ids(store, spec2, "curated_documents", "documents", "web")
    assert len(kept) == crawls["new"] - 1


def test_earlier_crawl_is_not_recomputed(crawls: dict[str, object]) -> None:
    store, spec1, spec2 = crawls["store"], crawls["spec1"], crawls["spec2"]
    stamps = crawls["stamps"]
    assert isinstance(stamps, dict) and isinstance(store, Store)
    assert isinstance(spec1, CrawlSpec) and isinstance(spec2, CrawlSpec)
    for path, stamp in stamps.items():
        assert os.stat(path).st_mtime_ns == stamp, f"{path} was rewritten by the recrawl"
    lsh = DataRoot(store).manifest(spec2, "lsh_buckets", None)
    assert lsh is not None and lsh.report["prior_documents"] == {
        "c1": len(_ids(store, spec1, "curated_documents", "documents", "web"))
    }


def test_changed_lsh_params_are_refused(crawls: dict[str, object], tmp_path: Path) -> None:
    store, spec1, spec2 = crawls["store"], crawls["spec1"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec1, CrawlSpec) and isinstance(spec2, CrawlSpec)
    spec3 = spec2.model_copy(update={"params": {"lsh_buckets": {"preset": "seed"}}})
    with pytest.raises(ValueError, match="same MinHash and LSH parameters"):
        execute_crawl(store, spec3)


def test_an_earlier_crawl_without_fuzzy_dedup_adds_no_bucket_index(crawls: dict[str, object]) -> None:
    """Deduplicated against a crawl that switched fuzzy dedup off (it has no bucket index, no
    partition of it): the recrawl's fuzzy dedup matches nothing of that crawl, and finds its own
    duplicates as a crawl against nothing would. So does a crawl registered when such a crawl
    still wrote an empty index, which its entry names: that entry is still current."""
    from stages.execute import execute
    from stages.spec import priors_current

    store, spec1, spec2 = crawls["store"], crawls["spec1"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec1, CrawlSpec) and isinstance(spec2, CrawlSpec)
    exact_only = spec1.model_copy(update={"crawl": "c0", "stages": ("exact",)})
    execute_crawl(store, exact_only)
    prior = prior_outputs(exact_only)
    assert "lsh_buckets/" not in prior and DataRoot(store).manifest(exact_only, "lsh_buckets", None) is None
    spec3 = spec2.model_copy(update={"crawl": "c3", "dedup_against": {"c0": prior}})
    execute_crawl(store, spec3)
    lsh = DataRoot(store).manifest(spec3, "lsh_buckets", None)
    assert lsh is not None and "c0" not in (lsh.report.get("prior_documents") or {})
    removed = store.read_table(DataRoot(store).output_dir(spec3, "fuzzy_duplicates", None), "removed")
    assert removed.num_rows and set(removed["reason"].to_pylist()) == {"near_duplicate"}
    execute(store, exact_only, "lsh_buckets", None)  # the empty index, as such a crawl wrote it then
    old = {**prior, "lsh_buckets/": exact_only.keys()[("lsh_buckets", None)]}
    assert priors_current(exact_only, old) and priors_current(exact_only, prior)
    assert not priors_current(exact_only, {**prior, "lsh_buckets/": "0" * 16, "curated_documents/web": "x"})
    spec4 = spec2.model_copy(update={"crawl": "c4", "dedup_against": {"c0": old}})
    execute_crawl(store, spec4)
    again = store.read_table(DataRoot(store).output_dir(spec4, "fuzzy_duplicates", None), "removed")
    assert again.num_rows == removed.num_rows and set(again["reason"].to_pylist()) == {"near_duplicate"}


def test_the_ledger_counts_earlier_crawl_duplicates_apart(crawls: dict[str, object]) -> None:
    from curation_dagster.tools.lineage import waterfall_markdown, waterfall_rows
    from stages.reports import RemovalLedgerReport, read_as

    store, spec2 = crawls["store"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec2, CrawlSpec)
    pdir = DataRoot(store).output_dir(spec2, "removal_ledger", None)
    manifest = store.read_manifest(pdir)
    assert manifest is not None
    report = read_as(manifest, RemovalLedgerReport)
    web = report.sources["web"]
    assert web.removed_per_stage["fuzzy"] == 51
    assert web.earlier_crawl_duplicates == {"fuzzy": {"c1": 50}}  # the within-crawl copy is not among them
    ledger = store.read_table(pdir, "ledger")
    fuzzy = ledger.filter(pc.equal(ledger["stage"], "fuzzy")).to_pylist()
    by_reason = {r: sorted({(x["duplicate_of_crawl"], x["duplicate_of_source"]) for x in fuzzy if x["reason"] == r})
                 for r in {x["reason"] for x in fuzzy}}
    assert by_reason == {"near_duplicate_of_earlier_crawl": [("c1", "web")], "near_duplicate": [("c2", "web")]}
    rows = waterfall_rows(report)
    assert [(r["source"], r["fuzzy"], r["fuzzy:earlier_crawls"]) for r in rows] == [("web", 51, 50), ("total", 51, 50)]
    head = waterfall_markdown(report).splitlines()[0]
    assert "| fuzzy | ↳ c1 |" in head


def test_explain_names_the_crawl_that_kept_the_original(crawls: dict[str, object]) -> None:
    from curation_dagster.tools.explain import explain

    store, spec2 = crawls["store"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec2, CrawlSpec)
    pdir = DataRoot(store).output_dir(spec2, "removal_ledger", None)
    ledger = store.read_table(pdir, "ledger")
    for reason, where in [("near_duplicate_of_earlier_crawl", "crawl c1 (an earlier crawl, which kept it)"),
                          ("near_duplicate", "crawl c2 (this crawl)")]:
        row = ledger.filter(pc.equal(ledger["reason"], reason)).slice(0, 1).to_pylist()[0]
        text, found = explain(store, spec2, pdir, row["doc_id"])
        assert found
        assert f"duplicate of: {row['duplicate_of']} (record_id {row['duplicate_of_record_id']}, source web, " \
               f"{where})" in text, text
        assert "kept text: " in text


def test_the_ledger_metadata_shows_example_pairs_kept_by_the_earlier_crawl(crawls: dict[str, object]) -> None:
    from curation_dagster.run.metadata import removal_ledger_metadata
    from stages.reports import RemovalLedgerReport, read_as

    store, spec1, spec2 = crawls["store"], crawls["spec1"], crawls["spec2"]
    assert isinstance(store, Store) and isinstance(spec1, CrawlSpec) and isinstance(spec2, CrawlSpec)
    manifest = DataRoot(store).manifest(spec2, "removal_ledger", None)
    assert manifest is not None
    meta = removal_ledger_metadata(store, spec2, read_as(manifest, RemovalLedgerReport))
    assert list(meta)[:3] == ["waterfall", "waterfall_chart", "removal_examples"]
    rows = [dict(r.data) for r in meta["removal_examples"].value.records]
    assert {(r["stage"], r["reason"]) for r in rows} == {("fuzzy", "near_duplicate_of_earlier_crawl"),
                                                         ("fuzzy", "near_duplicate")}
    c1 = {d["doc_id"]: d["text"] for d in store.read_table(
        DataRoot(store).output_dir(spec1, "raw_documents", "web"), "documents").to_pylist()}
    earlier = [r for r in rows if r["reason"] == "near_duplicate_of_earlier_crawl"]
    assert len(earlier) == 2
    for r in earlier:
        assert r["kept_crawl"] == "c1" and r["kept_source"] == "web" and r["kept_doc_id"] in c1
        assert r["kept_excerpt"] and " ".join(c1[r["kept_doc_id"]].split()).startswith(r["kept_excerpt"].rstrip("…"))
        assert r["excerpt"] and 0.0 < r["score"] <= 1.0
    assert [r["kept_crawl"] for r in rows if r["reason"] == "near_duplicate"] == ["c2"]
