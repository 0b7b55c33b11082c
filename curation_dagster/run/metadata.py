"""A partition's materialization metadata beyond its program's figures (``stages.execute.metadata``):
what explains a shrinking source (the kept fraction, the ledger's waterfall, examples) and the
row count and column schema of its main table. Built where the partition ran, for an asset step
and a crawl step alike (``curation_dagster.run.crawl_job``). Also the Dagster form of what
``curation_dagster.tools`` computes without Dagster: the ledger's waterfall table and chart
(``tools.lineage``), removal examples (``tools.examples``) and, on a failed ``over_deletion``
check, what the stopped stage would remove (``tools.pending``).
"""

from __future__ import annotations

from typing import Any

from curation_dagster.run import values
from curation_dagster.run.done import TIMINGS
from curation_dagster.tools.examples import COLUMNS, EXAMPLE_COLUMNS, pick, removal_examples
from curation_dagster.tools.lineage import (
    chart_markdown,
    crawl_over_crawl_rows,
    previous_reports,
    totals,
    waterfall_columns,
    waterfall_markdown,
    waterfall_rows,
)
from curation_dagster.tools.pending import NOT_APPLIED, counts_markdown, stage_removals
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.reports import CuratedDocumentsReport, RemovalLedgerReport, read_as
from stages.spec import CrawlSpec
from stages.store import Manifest, Store, written_schema
from stages.timing import helper_thread


def _lineage(store: Store, program: str, spec: CrawlSpec, manifest: Manifest) -> dict[str, Any]:
    """Extra metadata that explains a shrinking source: the kept fraction of a curated partition,
    the source x stage waterfall (table and chart) of the crawl's ledger (``manifest``: the
    partition's committed one)."""
    if program not in ("curated_documents", "removal_ledger"):
        return {}
    if program == "curated_documents":
        cur = read_as(manifest, CuratedDocumentsReport)
        return {"kept_fraction": round(cur.kept / cur.input, 6) if cur.input else 0.0}
    return removal_ledger_metadata(store, spec, read_as(manifest, RemovalLedgerReport))


# The table a partition of each kind is about, the first of these it holds (else its first).
MAIN_TABLES = ("documents", "ledger", "removed")


def _column_type(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    return str(t)


def table_metadata(store: Store, program: str, spec: CrawlSpec, source: str | None, manifest: Manifest
                   ) -> dict[str, Any]:
    """``dagster/row_count`` and ``dagster/column_schema`` of the partition's main table (its
    documents, its ledger, or its removal list), from its committed manifest and one part file's
    schema (``stages.store.written_schema``, else its Parquet footer); none where the partition
    holds no table."""
    import pyarrow.parquet as pq

    if not manifest.tables:
        return {}
    table = next((t for t in MAIN_TABLES if t in manifest.tables), sorted(manifest.tables)[0])
    meta: dict[str, Any] = {"dagster/row_count": int(manifest.rows.get(table, 0))}
    parts = manifest.tables[table]
    schema = manifest.schema(table)  # a table with no rows has no part
    if parts:  # as this process wrote it (a partition described where it ran), else its footer's
        path = f"{DataRoot(store).output_dir(spec, program, source)}/{parts[0]}"
        schema = written_schema(store, path, manifest.sizes.get(parts[0]))
        if schema is None:
            with store.open_read(path) as fh:
                schema = pq.read_schema(fh)
    if schema is not None:
        meta["dagster/column_schema"] = values.schema([(f.name, _column_type(f.type), f"{table}.{f.name}")
                                                       for f in schema])
    return meta


def per_source_counts(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` of a source x crawl partition with its counts (every int or float but the timings
    and Dagster's row count, and ``rows`` as ``rows/<table>``) folded into one ``counts`` mapping,
    first, which the recorder shows as a table.

    Why: the UI plots each numeric metadata entry of a partitioned asset as one line through its
    partitions in key order (c1|docstrings, c1|licenses, c2|docstrings, ...), which joins
    different sources and reads as nothing. A table is not plotted. The counts of a source over
    crawls are in removal_ledger's ``crawl_over_crawl`` and ``waterfall_table``; a crawl-level
    asset keeps its numbers, whose line runs crawl to crawl. Timings stay numbers: by partition
    they are a per-partition profile (and ``curate profile`` reads ``overhead_s``)."""
    def count(key: str, value: Any) -> bool:
        return (isinstance(value, int | float) and not isinstance(value, bool) and key not in TIMINGS
                and not key.startswith("dagster/"))

    counts = {k: v for k, v in meta.items() if count(k, v)}
    if isinstance(meta.get("rows"), dict):
        counts.update({f"rows/{table}": int(n) for table, n in meta["rows"].items()})
    rest = {k: v for k, v in meta.items() if k not in counts and k != "rows"}
    return {"counts": counts, **rest} if counts else rest


def asset_metadata(
    store: Store, program: str, spec: CrawlSpec, source: str | None, meta: dict[str, Any], manifest: Manifest,
) -> dict[str, Any]:
    """A partition's materialization metadata: ``meta`` (``stages.execute.metadata`` and the
    profile's ``overhead_s``) after the lineage that explains a shrinking source, the waterfall
    first: it is what the materialization's page shows at the top. A source x crawl partition's
    counts are one table (``per_source_counts``). An asset step and a crawl step record the same
    (``curation_dagster.run.crawl_job``). ``spec``: the crawl's, as the partition ran it (not read
    again from the data root for each partition); ``store``: the resource's (the caller's: opening
    one costs a third of a millisecond); ``manifest``: the partition's committed one."""
    out = {**_lineage(store, program, spec, manifest), **table_metadata(store, program, spec, source, manifest),
           **meta}
    return per_source_counts(out) if source is not None else out


def ledger_metadata(report: RemovalLedgerReport) -> dict[str, Any]:
    """Metadata of a removal_ledger materialization: the waterfall as Markdown, as a native table
    (``waterfall_table``) and as a chart, and numeric totals (plotted across materializations by the UI)."""
    tot = totals(report)
    meta: dict[str, Any] = {
        "waterfall": values.md(waterfall_markdown(report)),
        # The same counts as a native table: typed columns the UI sorts, and tools read as data.
        "waterfall_table": values.table(waterfall_rows(report), waterfall_columns(report)),
        "input_total": tot.input,
        "kept_total": tot.kept,
        "quarantined_total": tot.quarantined,
        "kept_fraction": round(tot.kept / tot.input, 6) if tot.input else 0.0,
        **{f"removed_{stage}": n for stage, n in tot.removed_per_stage.items()},
    }
    try:
        chart = values.md(chart_markdown(report))
    except ImportError:  # pillow (with FreeType, as its wheels are) is a dependency; a trimmed image gets the table
        chart = values.md("_install Pillow with FreeType support to see the chart_")
    return {"waterfall": meta.pop("waterfall"), "waterfall_chart": chart, **meta}


def crawl_over_crawl_table(report: RemovalLedgerReport, previous: dict[str, RemovalLedgerReport]) -> Any:
    """``crawl_over_crawl_rows`` as a Dagster table with its schema (None where no source has a
    previous crawl)."""
    rows = crawl_over_crawl_rows(report, previous)
    if not rows:
        return None
    described = {"source": ("string", "source name"),
                 "previous_crawl": ("string", "the latest crawl before this one that has the source (and a ledger)"),
                 "input_before": ("int", "documents read then"), "input": ("int", "documents read now"),
                 "input_change": ("int", "now − then"), "kept_before": ("int", "documents kept then"),
                 "kept": ("int", "documents kept now"), "kept_change": ("int", "now − then"),
                 "quarantine_change": ("int", "documents quarantined at ingestion: now − then")}
    columns = [(c, *described[c]) if c in described else
               (c, "int", f"documents removed by {c.removesuffix('_change')}: now − then")
               for c in rows[0]]
    return values.table(rows, columns)


def removal_ledger_metadata(store: Store, spec: CrawlSpec, report: RemovalLedgerReport) -> dict[str, Any]:
    """``ledger_metadata`` and, after the waterfall, ``removal_examples``: a few removed documents
    of each source x stage x reason with the kept document each duplicated (its crawl and an
    excerpt), the sources that kept the smallest share first."""
    pdir = DataRoot(store).output_dir(spec, "removal_ledger", None)
    order = sorted(report.sources, key=lambda n: (report.sources[n].kept / report.sources[n].input
                                                  if report.sources[n].input else 1.0, n))

    def examples() -> list[dict[str, Any]]:
        rows = pick(store.iter_batches(pdir, "ledger", COLUMNS), order)  # ledgers of v2 have every column
        return removal_examples(store, spec, rows)

    # The examples' texts are read on a helper thread (with the keys and manifests this block
    # holds) while this one draws the waterfall: at 200 sources, 172 sources' reads (0.1 s) beside
    # the tables and the chart (0.04 s), on the run's way to its end.
    with helper_thread("removal-examples") as submit:
        picked = submit(examples)
        meta = ledger_metadata(report)
        head = {k: meta.pop(k) for k in ("waterfall", "waterfall_chart")}
        compared = crawl_over_crawl_table(report, previous_reports(store, spec.crawl, sorted(report.sources)))
        found = picked.result()
    return {**head, "removal_examples": examples_table(found),
            **({"crawl_over_crawl": compared} if compared is not None else {}), **meta}


def examples_table(examples: list[dict[str, Any]]) -> Any:
    """``removal_examples`` rows as a Dagster table with its schema."""
    # an unscored removal shows an empty score
    return values.table([{k: ("" if v is None else v) for k, v in e.items()} for e in examples], EXAMPLE_COLUMNS)


def pending_metadata(store: Store, spec: CrawlSpec, program: str, sources: list[str]) -> dict[str, Any]:
    """Dagster metadata of a failed over_deletion: the stage's removal list per source and reason
    and a few examples (``curation_dagster.tools.examples``), titled as not applied."""
    t = stage_removals(store, spec, program, sources)
    title = (f"**{NOT_APPLIED}**: what stage `{PROGRAMS[program].stage}` would remove (its removal list, "
             f"committed; the crawl stopped before applying it)")
    rows = pick(t.to_batches(), sources)
    return {
        "would_remove": values.md(counts_markdown(t, title)),
        "would_remove_examples": examples_table(removal_examples(store, spec, rows)),
    }
