"""Which documents: a few removed documents per source x stage x reason, each with an excerpt, its
score and the kept document it duplicated (its crawl, source and an excerpt), for the UI.

``removal_examples`` picks them from a removal list in the ledger's shape (the committed ledger, or
a stopped stage's removal list, ``curation_dagster.tools.pending``) and reads the texts of only those
documents: each raw_documents partition that holds one is streamed until all it holds are found.
``curation_dagster.run.metadata.examples_table`` makes those rows Dagster table metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stages.catalog import QUARANTINE, STAGES
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec
from stages.store import Store

PER_REASON = 2  # examples of each (source, stage, reason)
MOST_ROWS = 200  # a crawl of many sources: those first in ``sources`` get theirs
EXCERPT = 160  # characters of each text shown
COLUMNS = ["doc_id", "source", "stage", "reason", "score", "duplicate_of", "duplicate_of_source",
           "duplicate_of_crawl"]


def pick(batches: Iterable[pa.RecordBatch], sources: list[str], per_reason: int = PER_REASON,
         most: int = MOST_ROWS) -> list[dict[str, Any]]:
    """The first ``per_reason`` rows of each (source, stage, reason) among ``batches`` (ledger
    columns ``COLUMNS``, missing ones read as null), quarantine left out, in the order of
    ``sources``, then stage (pipeline order), then reason; at most ``most`` rows. Python objects only for the
    rows picked (a batch is grouped columnar first)."""
    rank = {s: i for i, s in enumerate(sources)}
    taken: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for batch in batches:
        t = pa.Table.from_batches([batch])
        for col in COLUMNS:
            if col not in t.column_names:
                t = t.append_column(col, pa.nulls(t.num_rows, pa.float64() if col == "score" else pa.string()))
        t = t.filter(pc.and_(pc.not_equal(t["stage"], QUARANTINE),
                             pc.is_in(t["source"], value_set=pa.array(sources, pa.string()))))
        if not t.num_rows:
            continue
        t = t.append_column("_row", pa.array(range(t.num_rows), pa.int64()))
        firsts = t.group_by(["source", "stage", "reason"], use_threads=False).aggregate([("_row", "list")])
        for s, st, r, rows in zip(*(firsts[c].to_pylist() for c in ("source", "stage", "reason", "_row_list")),
                                  strict=True):
            have = taken.setdefault((s, st, r), [])
            if len(have) < per_reason:
                want = rows[: per_reason - len(have)]
                have.extend(t.select(COLUMNS).take(pa.array(want, pa.int64())).to_pylist())
    stage_rank = {s: i for i, s in enumerate(STAGES)}  # pipeline order, unknown stages last
    picked = sorted(taken.items(), key=lambda kv: (rank[kv[0][0]], stage_rank.get(kv[0][1], len(STAGES)),
                                                   kv[0][1], kv[0][2]))
    return [row for _, rows in picked for row in rows][:most]


def _raw_dir(store: Store, spec: CrawlSpec, crawl: str, source: str) -> str | None:
    """The raw_documents partition of ``source`` in ``crawl`` (this crawl or one it was
    deduplicated against), None where the spec does not know it."""
    if crawl == spec.crawl:
        return DataRoot(store).output_dir(spec, "raw_documents", source) if source in spec.sources else None
    key = spec.dedup_against.get(crawl, {}).get(f"raw_documents/{source}")
    return store.partition_dir("raw_documents", key, crawl, source) if key else None


def texts(store: Store, wanted: dict[str, set[str]]) -> dict[str, str]:
    """doc_id -> text of the ``wanted`` doc_ids of each raw_documents partition dir, each
    partition streamed (doc_id and text) until all it holds are found."""
    out: dict[str, str] = {}
    for pdir, ids in wanted.items():
        value_set = pa.array(sorted(ids), pa.string())
        for batch in store.iter_batches(pdir, "documents", ["doc_id", "text"]):
            hit = batch.filter(pc.is_in(batch["doc_id"], value_set=value_set))
            out.update(zip(hit["doc_id"].to_pylist(), hit["text"].to_pylist(), strict=True))
            if ids <= out.keys():
                break
    return out


def excerpt(text: str | None, chars: int = EXCERPT) -> str:
    """The text on one line, at most ``chars`` characters (``…`` where cut)."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def removal_examples(store: Store, spec: CrawlSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (``pick``'s) with their texts: source, stage, reason, score, doc_id, excerpt,
    kept_doc_id, kept_crawl, kept_source, kept_excerpt (kept_* empty where a row names no kept
    document, or names a benchmark example: decontam)."""
    wanted: dict[str, set[str]] = {}
    for r in rows:
        pdir = _raw_dir(store, spec, spec.crawl, r["source"])
        if pdir:
            wanted.setdefault(pdir, set()).add(r["doc_id"])
        if r["duplicate_of"] and r["duplicate_of_crawl"] and r["duplicate_of_source"]:
            pdir = _raw_dir(store, spec, r["duplicate_of_crawl"], r["duplicate_of_source"])
            if pdir:
                wanted.setdefault(pdir, set()).add(r["duplicate_of"])
    found = texts(store, wanted)
    out = []
    for r in rows:
        kept = r["duplicate_of"] if r["duplicate_of_crawl"] else None  # a decontam row names a benchmark example
        out.append({
            "source": r["source"], "stage": r["stage"], "reason": r["reason"],
            "score": None if r["score"] is None else round(float(r["score"]), 4),
            "doc_id": r["doc_id"], "excerpt": excerpt(found.get(r["doc_id"])),
            "kept_doc_id": kept or (r["duplicate_of"] or ""), "kept_crawl": r["duplicate_of_crawl"] or "",
            "kept_source": r["duplicate_of_source"] or "",
            "kept_excerpt": excerpt(found.get(kept)) if kept else "",
        })
    return out


EXAMPLE_COLUMNS = [
    ("source", "string", "the source that lost the document"),
    ("stage", "string", "the removal stage"),
    ("reason", "string", "why (a filter rule, exact_duplicate, near_duplicate, near_duplicate_of_earlier_crawl, ...)"),
    ("score", "float", "the value that decided it (a rule's measure, Jaccard, cosine, shared n-grams)"),
    ("doc_id", "string", "the removed document (curate explain DOC_ID)"),
    ("excerpt", "string", f"its text, first {EXCERPT} characters"),
    ("kept_doc_id", "string", "the kept document it duplicated (decontam: the benchmark example)"),
    ("kept_crawl", "string", "the crawl that kept it: this crawl, or an earlier one"),
    ("kept_source", "string", "the kept document's source"),
    ("kept_excerpt", "string", f"the kept document's text, first {EXCERPT} characters"),
]
