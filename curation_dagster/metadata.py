"""A partition's materialization metadata beyond its program's figures (``stages.execute.metadata``):
what explains a shrinking source (the kept fraction, the ledger's waterfall, examples) and the
row count and column schema of its main table. Built where the partition ran, for an asset step
and a crawl step alike (``curation_dagster.crawl_run``).
"""

from __future__ import annotations

from typing import Any

from curation_dagster.resources import CurationResource
from stages.plan import plan_task
from stages.reports import CuratedDocumentsReport, RemovalLedgerReport, read_as
from stages.spec import CrawlSpec


def _lineage(curation: CurationResource, program: str, spec: CrawlSpec, source: str | None) -> dict[str, Any]:
    """Extra metadata that explains a shrinking source: the kept fraction of a curated partition,
    the source x stage waterfall (table and chart) of the crawl's ledger."""
    if program not in ("curated_documents", "removal_ledger"):
        return {}
    store = curation.store()
    manifest = store.read_manifest(plan_task(store, spec, program, source).output_dir)
    if manifest is None:
        return {}
    if program == "curated_documents":
        cur = read_as(manifest, CuratedDocumentsReport)
        return {"kept_fraction": round(cur.kept / cur.input, 6) if cur.input else 0.0}
    from curation_dagster.lineage import removal_ledger_metadata

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


def table_metadata(curation: CurationResource, program: str, spec: CrawlSpec, source: str | None) -> dict[str, Any]:
    """``dagster/row_count`` and ``dagster/column_schema`` of the partition's main table (its
    documents, its ledger, or its removal list), from its manifest and one part file's Parquet
    footer; none where the partition holds no table."""
    import pyarrow.parquet as pq
    from dagster import TableColumn, TableSchema

    store = curation.store()
    pdir = plan_task(store, spec, program, source).output_dir
    manifest = store.read_manifest(pdir)
    if manifest is None or not manifest.tables:
        return {}
    table = next((t for t in MAIN_TABLES if t in manifest.tables), sorted(manifest.tables)[0])
    meta: dict[str, Any] = {"dagster/row_count": int(manifest.rows.get(table, 0))}
    parts = manifest.tables[table]
    if parts:
        with store.fs.open(f"{pdir}/{parts[0]}", "rb") as fh:
            schema = pq.read_schema(fh)
        meta["dagster/column_schema"] = TableSchema(columns=[
            TableColumn(f.name, _column_type(f.type), f"{table}.{f.name}") for f in schema])
    return meta


def asset_metadata(
    curation: CurationResource, program: str, crawl: str, source: str | None, meta: dict[str, Any],
    spec: CrawlSpec | None = None,
) -> dict[str, Any]:
    """A partition's materialization metadata: ``meta`` (``stages.execute.metadata`` and the
    profile's ``overhead_s``) after the lineage that explains a shrinking source, the waterfall
    first: it is what the materialization's page shows at the top. An asset step and a crawl
    step record the same (``curation_dagster.crawl_run``). ``spec``: the crawl's, where the caller
    has it (a step describing its partitions), else read from the data root."""
    # Read once here, not per helper: a spec is read and parsed whole, sources and all (py-spy put
    # it at half of the run worker's metadata time on a 1,000-source deployed crawl).
    spec = spec or curation.spec(crawl)
    return {**_lineage(curation, program, spec, source), **table_metadata(curation, program, spec, source), **meta}
