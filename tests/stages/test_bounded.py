"""Bounded resources: the per-crawl bookkeeping (removal ledger, ``doc_id_unique``, ``explain``,
the keep rule) is columnar, with no Python object per document, and streams what it only scans.

Python's heap (objects and numpy arrays: tracemalloc sees both) is measured per document of a
crawl of 60,000 tiny documents; the bounds are about half of what the per-document Python
objects of the earlier implementations cost (ledger 444 B, doc_id_unique 145 B, keep rule
173 B a document). Whole-crawl numbers: ``bench/bounded.py`` (docs/guarantees.md).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stages.checks import ChecksConfig, evaluate_doc_id_unique
from stages.dataroot import DataRoot
from stages.execute import execute, execute_crawl
from stages.keep import fixed_ids, pick_survivors, source_priorities
from stages.params import ExecutionParams, RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import Manifest, Store

DOCS = 60_000


class CountingStore(Store):
    """A real local store that also records which tables are read whole and which streamed."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.whole: list[str] = []
        self.streamed: list[str] = []

    def read_table(self, pdir: str, table: str, columns: list[str] | None = None,
                   manifest: Manifest | None = None) -> pa.Table:
        self.whole.append(table)
        return super().read_table(pdir, table, columns, manifest)

    def iter_batches(self, pdir: str, table: str, columns: list[str] | None = None,
                     batch_rows: int = 20_000) -> Iterator[pa.RecordBatch]:
        self.streamed.append(table)
        return super().iter_batches(pdir, table, columns, batch_rows)


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> tuple[CountingStore, CrawlSpec]:
    """Two sources, every text twice (exact dedup removes half), two bad lines quarantined."""
    root = tmp_path_factory.mktemp("bounded")
    sources = {}
    for name, part in (("a", 0), ("b", 1)):
        folder = root / "in" / name
        folder.mkdir(parents=True)
        lines = [json.dumps({"id": f"r{i}", "text": f"tiny document number {i // 2}"}) for i in range(part, DOCS, 2)]
        (folder / "part.jsonl").write_text("\n".join(["{not json", *lines, "[1, 2]"]) + "\n")
        sources[name] = RawDocumentsParams(url=str(folder))
    spec = CrawlSpec(crawl="c1", sources=sources, stages=("exact",))
    store = CountingStore(str(root / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    return store, spec


def heap_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes of Python objects and numpy arrays allocated while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def reference_ledger(store: Store, spec: CrawlSpec) -> list[dict[str, Any]]:
    """The ledger rows the way a dict-per-document implementation builds them (the oracle)."""
    record_ids: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for s in sorted(spec.sources):
        raw = DataRoot(store).output_dir(spec, "raw_documents", s)
        t = Store.read_table(store, raw, "documents", ["doc_id", "record_id"])
        record_ids.update(zip(t["doc_id"].to_pylist(), t["record_id"].to_pylist(), strict=True))
        for q in Store.read_table(store, raw, "quarantine").to_pylist():
            rows.append({"doc_id": q["doc_id"], "record_id": q["record_id"], "source": s, "stage": "quarantine",
                         "reason": q["reason"], "duplicate_of": None, "duplicate_of_record_id": None,
                         "duplicate_of_source": None, "duplicate_of_crawl": None, "score": None,
                         "detail": q["detail"]})
    removed = Store.read_table(store, DataRoot(store).output_dir(spec, "exact_duplicates", None), "removed")
    for s in sorted(spec.sources):
        for r in removed.to_pylist():
            if r["source"] == s:
                rows.append({"doc_id": r["doc_id"], "record_id": record_ids.get(r["doc_id"]), "source": s,
                             "stage": "exact", "reason": r["reason"], "duplicate_of": r["duplicate_of"],
                             "duplicate_of_record_id": record_ids.get(r["duplicate_of"]),
                             "duplicate_of_source": r["duplicate_of_source"], "duplicate_of_crawl": spec.crawl,
                             "score": r["score"],
                             "detail": None})
    return rows


def test_the_ledger_is_columnar_and_equals_the_per_document_reference(crawl: tuple[CountingStore, CrawlSpec]) -> None:
    store, spec = crawl
    ledger_dir = DataRoot(store).output_dir(spec, "removal_ledger", None)
    store.whole.clear()
    peak = heap_peak(lambda: execute(store, spec, "removal_ledger", None, ExecutionParams(workers=1), force=True))
    assert peak < 200 * DOCS, f"{peak / DOCS:.0f} bytes a document"
    # documents and quarantine are streamed; only the removal lists are held (as columns)
    assert "documents" not in store.whole and "quarantine" not in store.whole and "documents" in store.streamed
    got = Store.read_table(store, ledger_dir, "ledger")
    assert got.num_rows == DOCS // 2 + 4
    assert got.to_pylist() == reference_ledger(store, spec)


def test_doc_id_unique_streams_fixed_width_ids(crawl: tuple[CountingStore, CrawlSpec]) -> None:
    store, spec = crawl
    store.whole.clear()
    verdict = evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig())
    assert verdict.passed and verdict.metadata["rows"] == DOCS // 2
    peak = heap_peak(lambda: evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig()))
    assert peak < 100 * DOCS // 2, f"{peak / (DOCS // 2):.0f} bytes a document"
    assert "documents" not in store.whole and "documents" in store.streamed
    # a repeated id is found (and named) all the same
    raw = DataRoot(store).output_dir(spec, "raw_documents", "a")
    ids = Store.read_table(store, raw, "documents", ["doc_id"])["doc_id"]
    assert fixed_ids(ids).tolist() == [i.encode() for i in ids.to_pylist()]


def test_the_keep_rule_sorts_fixed_width_ids_without_python_objects(crawl: tuple[CountingStore, CrawlSpec]) -> None:
    store, spec = crawl
    tables = [Store.read_table(store, DataRoot(store).output_dir(spec, "raw_documents", s), "documents",
                               ["doc_id", "source"]) for s in ("a", "b")]
    ids = pa.chunked_array([t["doc_id"] for t in tables])
    sources = pa.chunked_array([t["source"] for t in tables])
    n = len(ids)
    group = np.arange(n, dtype=np.int64) % 1000
    priority = source_priorities(sources, {"b": -1})
    assert priority.tolist() == [0] * len(tables[0]) + [-1] * len(tables[1])
    as_bytes = fixed_ids(ids)
    peak = heap_peak(lambda: pick_survivors(group, priority, as_bytes))
    assert peak < 100 * n, f"{peak / n:.0f} bytes a document"
    expected = pick_survivors(group, priority, np.array(ids.to_pylist(), dtype=object))
    assert pick_survivors(group, priority, as_bytes).tolist() == expected.tolist()
    assert pick_survivors(group, priority, ids).tolist() == expected.tolist()  # an Arrow column as it is
