"""``curate explain``: the per-document answer to "why was this removed?"."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from stages.dataroot import DataRoot
from stages.spec import CrawlSpec
from stages.store import Store

SNIPPET = 300


def _document(store: Store, spec: CrawlSpec, doc_id: str) -> dict[str, Any] | None:
    """A document of this crawl or of an earlier crawl it was deduplicated against."""
    dirs = [DataRoot(store).output_dir(spec, "raw_documents", source) for source in sorted(spec.sources)]
    for crawl, outputs in sorted(spec.dedup_against.items()):
        dirs += [store.partition_dir("raw_documents", key, crawl, name.partition("/")[2])
                 for name, key in sorted(outputs.items()) if name.startswith("raw_documents/")]
    for pdir in dirs:
        hit = _first(store, pdir, "documents", ["doc_id", "record_id", "source", "url", "text"], doc_id)
        if hit is not None:
            return hit
    return None


def _first(store: Store, pdir: str, table: str, columns: list[str] | None, doc_id: str) -> dict[str, Any] | None:
    """The first row of ``table`` whose doc_id is ``doc_id``, streamed batch by batch (memory:
    one batch, never a whole table; no Python object but for the row found)."""
    for batch in store.iter_batches(pdir, table, columns):
        hit = batch.filter(pc.equal(batch["doc_id"], doc_id))
        if hit.num_rows:
            return hit.slice(0, 1).to_pylist()[0]
    return None


def _snippet(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= SNIPPET else text[:SNIPPET] + " ..."


def kept_where(row: dict[str, Any], kept: dict[str, Any] | None, crawl: str) -> str:
    """``record_id R, source S, crawl C`` of the kept document a ledger row names; the crawl is
    marked when it is an earlier one (ledgers before version 2 have no duplicate_of_crawl)."""
    source = row.get("duplicate_of_source") or (kept["source"] if kept else "?")
    of = row.get("duplicate_of_crawl")
    where = "?" if of is None else f"{of} (an earlier crawl, which kept it)" if of != crawl else f"{of} (this crawl)"
    return f"record_id {row['duplicate_of_record_id']}, source {source}, crawl {where}"


def _doc_ids_of_record(store: Store, spec: CrawlSpec, ledger_dir: str, record_id: str) -> list[str]:
    """Every doc_id of this crawl whose record id is ``record_id``: documents ingested (kept or
    removed later) and those quarantined (a ``duplicate_record_id`` among them), sorted; streamed."""
    found: set[str] = set()
    dirs = [(DataRoot(store).output_dir(spec, "raw_documents", s), "documents") for s in sorted(spec.sources)]
    for pdir, table in [*dirs, (ledger_dir, "ledger")]:
        for batch in store.iter_batches(pdir, table, ["doc_id", "record_id"]):
            hit = batch.filter(pc.equal(batch["record_id"], record_id))
            found.update(hit["doc_id"].to_pylist())
    return sorted(found)


def explain(store: Store, spec: CrawlSpec, ledger_dir: str, doc_id: str) -> tuple[str, bool]:
    """(text to print, whether it was found in the crawl). ``doc_id`` is a doc id, else a record
    id: then every document carrying that record id is explained."""
    row = _first(store, ledger_dir, "ledger", None, doc_id)
    doc = _document(store, spec, doc_id)
    if row is None:
        if doc is None:
            ids = _doc_ids_of_record(store, spec, ledger_dir, doc_id)
            if not ids:
                return f"{doc_id}: not a document (nor a record id) of crawl {spec.crawl}", False
            parts = [explain(store, spec, ledger_dir, i)[0] for i in ids if i != doc_id]
            return "\n".join([f"record_id {doc_id}: {len(ids)} document(s)", *parts]), True
        return (f"{doc_id}: kept (source {doc['source']}, record_id {doc['record_id']})\n"
                f"  text: {_snippet(doc['text'])}"), True
    lines = [
        f"{doc_id}: removed by stage '{row['stage']}' ({row['reason']})",
        f"  source: {row['source']}   record_id: {row['record_id']}",
    ]
    if row["score"] is not None:
        lines.append(f"  score: {row['score']:.4g}")
    if row["detail"]:
        lines.append(f"  detail: {row['detail']}")
    if doc is not None:
        lines.append(f"  text: {_snippet(doc['text'])}")
    if row["duplicate_of"] and str(row["reason"]).startswith("benchmark:"):
        # decontam: duplicate_of names "<benchmark>:<example_id>", score the shared n-grams
        lines.append(f"  benchmark example: {row['duplicate_of']} (shares {row['score']:.0f} n-grams)")
    elif row["duplicate_of"]:
        kept = _document(store, spec, row["duplicate_of"])
        lines.append(f"  duplicate of: {row['duplicate_of']} ({kept_where(row, kept, spec.crawl)})")
        if kept is not None:
            lines.append(f"  kept text: {_snippet(kept['text'])}")
    return "\n".join(lines), True
