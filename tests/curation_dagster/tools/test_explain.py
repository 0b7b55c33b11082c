"""``curate explain`` streams the ledger and the documents (bounded memory)."""

from __future__ import annotations

from curation_dagster.tools.explain import explain
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec
from stages.store import Store
from tests.stages.test_bounded import (
    CountingStore,
    crawl,  # noqa: F401 (a fixture)
)


def test_explain_streams_the_ledger_and_the_documents(crawl: tuple[CountingStore, CrawlSpec]) -> None:  # noqa: F811 (the fixture)
    store, spec = crawl
    ledger_dir = DataRoot(store).output_dir(spec, "removal_ledger", None)
    removed = next(r for b in Store.iter_batches(store, ledger_dir, "ledger", None, 1000) for r in b.to_pylist()
                   if r["stage"] == "exact")
    store.whole.clear()
    text, found = explain(store, spec, ledger_dir, removed["doc_id"])
    assert found and "removed by stage 'exact' (exact_duplicate)" in text and removed["duplicate_of"] in text
    assert store.whole == [] and {"ledger", "documents"} <= set(store.streamed)
