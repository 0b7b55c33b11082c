"""``curate report``: a crawl's removal ledger report, as the source x stage table or as JSON.

``load_report`` reads the report of the crawl's current removal ledger (``NoLedger`` when it has
none for its current parameters), ``report_json`` is its documented JSON shape (README) and
``print_report`` its table, with the sub-columns ``lineage`` names (custom filters' share of the
heuristic removals, a dedup stage's duplicates of earlier crawls' documents).
"""

from __future__ import annotations

import sys
from typing import Any

from stages.catalog import QUARANTINE, STAGES
from stages.dataroot import DataRoot
from stages.errors import DamagedFile
from stages.reports import RemovalLedgerReport, read_as
from stages.store import MANIFEST, Manifest


class NoLedger(LookupError):
    """The crawl has no committed removal ledger for its current parameters."""


def _ledger(root: DataRoot, crawl: str) -> tuple[str, Manifest]:
    """The folder and manifest of the crawl's current removal ledger, checked whole (report,
    ledger and explain never show a damaged ledger); ``NoLedger`` when it is not committed."""
    spec = root.spec(crawl)
    manifest = root.manifest(spec, "removal_ledger", None)
    if manifest is None:
        raise NoLedger(f"crawl {crawl!r} has no removal ledger for its current parameters; run `curate run`")
    pdir = root.output_dir(spec, "removal_ledger", None)
    root.store.check_whole(pdir, manifest)
    return pdir, manifest


def ledger_dir(root: DataRoot, crawl: str) -> str:
    """The folder of the crawl's current removal ledger (``_ledger``)."""
    return _ledger(root, crawl)[0]


def load_report(root: DataRoot, crawl: str) -> RemovalLedgerReport:
    """The report of the crawl's current removal ledger (``_ledger``); a report that is not a
    ledger's is a ``DamagedFile`` naming its manifest."""
    pdir, manifest = _ledger(root, crawl)
    try:
        return read_as(manifest, RemovalLedgerReport)
    except ValueError as exc:  # a report that is not a ledger's (pydantic's ValidationError)
        raise DamagedFile(root.store.url(f"{pdir}/{MANIFEST}"), "removal ledger report", str(exc)) from None


def report_json(report: RemovalLedgerReport) -> dict[str, Any]:
    """The documented shape (README): ``removed`` here is the per-stage dict, as it always was."""
    return {"crawl": report.crawl, "sources": {
        s: {"input": r.input, "kept": r.kept, "quarantined": r.quarantined, "removed": r.removed_per_stage,
            **({"filters": r.filters} if r.filters else {}),
            **({"earlier_crawl_duplicates": r.earlier_crawl_duplicates} if r.earlier_crawl_duplicates else {})}
        for s, r in sorted(report.sources.items())
    }}


def print_report(report: RemovalLedgerReport) -> None:
    """The source x stage table on stdout (rich), a TOTAL row last."""
    from rich.console import Console
    from rich.table import Table

    from curation_dagster.tools.lineage import EARLIER, custom_filters, earlier_crawls, step_label, step_value

    # Sub-columns (``↳``), each a part of the stage column before it: custom filters' share of the
    # heuristic removals (docs/filters.md), a dedup stage's duplicates of earlier crawls' documents.
    earlier = earlier_crawls(report)
    columns: list[str] = []
    for stage in STAGES:
        columns.append(stage)
        if stage == "heuristic":
            columns += [f"heuristic:{name}" for name in custom_filters(report)]
        if stage in earlier:
            columns.append(f"{stage}:{EARLIER}")
    table = Table(title=f"crawl {report.crawl}: what each source lost at each stage")
    for col in ["SOURCE", "INPUT", QUARANTINE.upper(), *columns, "KEPT", "KEPT %"]:
        label = step_label(report, col) if ":" in col else col.upper()
        table.add_column(label, justify="left" if col == "SOURCE" else "right", min_width=min(len(label), 24))
    totals = {"input": 0, "kept": 0, "quarantined": 0, **{c: 0 for c in columns}}
    for source, row in sorted(report.sources.items()):
        removed = [step_value(row, c) for c in columns]
        for c, n in zip(columns, removed, strict=True):
            totals[c] += n
        totals["input"] += row.input
        totals["kept"] += row.kept
        totals["quarantined"] += row.quarantined
        pct = 100.0 * row.kept / row.input if row.input else 0.0
        table.add_row(source, str(row.input), str(row.quarantined), *map(str, removed), str(row.kept), f"{pct:.1f}")
    pct = 100.0 * totals["kept"] / totals["input"] if totals["input"] else 0.0
    table.add_row("TOTAL", str(totals["input"]), str(totals["quarantined"]), *[str(totals[c]) for c in columns],
                  str(totals["kept"]), f"{pct:.1f}", style="bold")
    # Piped or logged output has no terminal width: do not squeeze the table into 80 columns.
    Console(width=None if sys.stdout.isatty() else 160).print(table)
