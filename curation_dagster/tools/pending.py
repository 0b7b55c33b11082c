"""What a stopped crawl would remove: its committed removal lists, not applied.

A blocking check (``over_deletion``) that fails stops a crawl after the stage's partition is
committed and before ``curated_documents`` applies it, so there is no removal ledger. The removal
lists that were committed are still there: ``pending_removals`` reads them in the ledger's shape
(one row per document a stage would remove), for ``curate report``/``ledger``/``explain`` and the
failed check's metadata, every one of them marked *not applied*.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from stages.catalog import PROGRAMS, STAGES
from stages.dataroot import DataRoot
from stages.removal import kept_where
from stages.spec import CrawlSpec
from stages.store import Store

NOT_APPLIED = "NOT APPLIED"
COLUMNS = ["doc_id", "source", "stage", "reason", "score", "duplicate_of", "duplicate_of_source",
           "duplicate_of_crawl"]
SCHEMA = pa.schema([(c, pa.float64() if c == "score" else pa.string()) for c in COLUMNS])


def _committed(store: Store, spec: CrawlSpec, program: str, source: str | None) -> str | None:
    root = DataRoot(store)
    return root.output_dir(spec, program, source) if root.manifest(spec, program, source) is not None else None


def stage_removals(store: Store, spec: CrawlSpec, program: str, sources: list[str] | None = None) -> pa.Table:
    """The committed removal list of one removing ``program`` for ``sources`` (default: all of
    the crawl's) in ``COLUMNS``; partitions not committed are left out."""
    stage = PROGRAMS[program].stage
    assert stage is not None, f"{program} removes nothing"
    names = sorted(spec.sources) if sources is None else sources
    cols = ["doc_id", "source", "reason", "score", "duplicate_of", "duplicate_of_source"]
    parts: list[pa.Table] = []
    if PROGRAMS[program].level == "source":
        for s in names:
            pdir = _committed(store, spec, program, s)
            if pdir:
                parts.append(store.read_table(pdir, "removed", cols))
    else:
        pdir = _committed(store, spec, program, None)
        if pdir:
            t = store.read_table(pdir, "removed", cols)
            parts.append(t.filter(pc.is_in(t["source"], value_set=pa.array(names, pa.string()))))
    parts = [t for t in parts if t.num_columns]  # a partition without a removed table holds no removal
    if not parts:
        return SCHEMA.empty_table()
    t = pa.concat_tables(parts).combine_chunks()
    kept_source, kept_crawl = kept_where(t["duplicate_of_source"], spec.crawl)
    return pa.table({
        "doc_id": t["doc_id"], "source": t["source"], "stage": pa.repeat(pa.scalar(stage, pa.string()), t.num_rows),
        "reason": t["reason"], "score": t["score"].cast(pa.float64()), "duplicate_of": t["duplicate_of"],
        "duplicate_of_source": kept_source, "duplicate_of_crawl": kept_crawl,
    }, schema=SCHEMA)


def pending_removals(store: Store, spec: CrawlSpec) -> pa.Table:
    """Every committed removal list of the crawl, in pipeline order, in ``COLUMNS`` (empty when
    none is committed)."""
    tables = [stage_removals(store, spec, program) for program in STAGES.values() if program in PROGRAMS]
    return pa.concat_tables([SCHEMA.empty_table(), *tables])


def counts(table: pa.Table) -> dict[str, dict[str, dict[str, int]]]:
    """{source: {stage: {reason: documents}}} of a ``COLUMNS`` table, sorted."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    if not table.num_rows:
        return out
    g = table.group_by(["source", "stage", "reason"]).aggregate([([], "count_all")])
    rows = sorted(zip(*(g[c].to_pylist() for c in ("source", "stage", "reason", "count_all")), strict=True),
                  key=lambda r: (r[0], list(STAGES).index(r[1]) if r[1] in STAGES else len(STAGES), r[2]))
    for source, stage, reason, n in rows:
        out.setdefault(source, {}).setdefault(stage, {})[reason] = n
    return out


def counts_markdown(table: pa.Table, title: str) -> str:
    """Markdown: ``title``, then one row per source x stage x reason with its documents."""
    lines = [title, "", "| source | stage | reason | documents |", "|---|---|---|---:|"]
    for source, per_stage in counts(table).items():
        for stage, per_reason in per_stage.items():
            lines += [f"| {source} | {stage} | {reason} | {n:,} |" for reason, n in per_reason.items()]
    return "\n".join(lines)


def stopped_report(crawl: str, table: pa.Table) -> str:
    """``curate report`` of a crawl with no ledger: what its committed removal lists hold."""
    lines = [f"crawl {crawl} has no removal ledger: it stopped before its removals were applied (a blocking check "
             f"failed, or a stage has not run). {NOT_APPLIED}: what its committed removal lists would remove:",
             "", f"{'SOURCE':<20} {'STAGE':<10} {'REASON':<36} {'DOCUMENTS':>9}"]
    for source, per_stage in counts(table).items():
        for stage, per_reason in per_stage.items():
            lines += [f"{source:<20} {stage:<10} {reason:<36} {n:>9,}" for reason, n in per_reason.items()]
    lines += ["", f"{table.num_rows:,} document(s), {NOT_APPLIED}; `curate explain DOC_ID` shows one, "
                  "`curate ledger --out FILE` writes them all (column applied = false)"]
    return "\n".join(lines)


def explain_pending(store: Store, spec: CrawlSpec, table: pa.Table, doc_id: str) -> str | None:
    """``curate explain`` of a document a stopped stage would remove (None: no list names it)."""
    from curation_dagster.tools.explain import _document, _snippet

    hit = table.filter(pc.equal(table["doc_id"], doc_id))
    if not hit.num_rows:
        return None
    row = hit.slice(0, 1).to_pylist()[0]
    lines = [f"{doc_id}: would be removed by stage '{row['stage']}' ({row['reason']}): {NOT_APPLIED}, crawl "
             f"{spec.crawl} stopped before applying it", f"  source: {row['source']}"]
    if row["score"] is not None:
        lines.append(f"  score: {row['score']:.4g}")
    doc = _document(store, spec, doc_id)
    if doc is not None:
        lines.append(f"  text: {_snippet(doc['text'])}")
    if row["duplicate_of"] and row["duplicate_of_crawl"]:
        kept = _document(store, spec, row["duplicate_of"])
        lines.append(f"  duplicate of: {row['duplicate_of']} (source {row['duplicate_of_source']}, crawl "
                     f"{row['duplicate_of_crawl']})")
        if kept is not None:
            lines.append(f"  kept text: {_snippet(kept['text'])}")
    return "\n".join(lines)


def stopped(root: DataRoot, crawl: str) -> tuple[Store, CrawlSpec, pa.Table] | None:
    """(store, spec, its committed removal lists) of a crawl that has no ledger but some removal
    list (a blocking check stopped it); None otherwise."""
    spec = root.spec(crawl)
    if root.manifest(spec, "removal_ledger", None) is not None:
        return None
    table = pending_removals(root.store, spec)
    return (root.store, spec, table) if table.num_rows else None
