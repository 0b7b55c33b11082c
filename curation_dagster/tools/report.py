"""``curate report``: a crawl's removal ledger report, as the source x stage table or as JSON.

``load_report`` reads the report of the crawl's current removal ledger (``NoLedger`` when it has
none for its current parameters), ``report_json`` is its documented JSON shape (README) and
``print_report`` its table, with the sub-columns ``lineage`` names (custom filters' share of the
heuristic removals, a dedup stage's duplicates of earlier crawls' documents).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from stages.catalog import QUARANTINE, STAGES
from stages.dataroot import DataRoot
from stages.errors import DamagedFile
from stages.reports import RemovalLedgerReport, read_as
from stages.store import MANIFEST, Manifest

if TYPE_CHECKING:
    from rich.table import Table


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
    """The source x stage table on stdout, a TOTAL row last: rich's (``rich_table``), or its text
    where no terminal reads it (``plain_table``)."""
    from rich.console import Console

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
    title = f"crawl {report.crawl}: what each source lost at each stage"
    labels = [step_label(report, col) if ":" in col else col.upper()
              for col in ["SOURCE", "INPUT", QUARANTINE.upper(), *columns, "KEPT", "KEPT %"]]
    totals = {"input": 0, "kept": 0, "quarantined": 0, **{c: 0 for c in columns}}
    rows: list[list[str]] = []
    for source, row in sorted(report.sources.items()):
        removed = [step_value(row, c) for c in columns]
        for c, n in zip(columns, removed, strict=True):
            totals[c] += n
        totals["input"] += row.input
        totals["kept"] += row.kept
        totals["quarantined"] += row.quarantined
        pct = 100.0 * row.kept / row.input if row.input else 0.0
        rows.append([source, str(row.input), str(row.quarantined), *map(str, removed), str(row.kept), f"{pct:.1f}"])
    pct = 100.0 * totals["kept"] / totals["input"] if totals["input"] else 0.0
    rows.append(["TOTAL", str(totals["input"]), str(totals["quarantined"]), *[str(totals[c]) for c in columns],
                 str(totals["kept"]), f"{pct:.1f}"])
    # Piped or logged output has no terminal width: do not squeeze the table into 80 columns. There
    # it has no style either, and where it fits it is written as rich lays it out, line by line
    # (200 sources: 0.22 s of rich's rendering, cell by cell, against 5 ms).
    console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
    options = console.options
    if not (console.is_terminal or console.is_jupyter or options.legacy_windows or options.ascii_only):
        plain = plain_table(title, labels, rows, PIPED_WIDTH)
        if plain is not None:
            console.file.write(plain)
            return
    console.print(rich_table(title, labels, rows))


PIPED_WIDTH = 160  # the width of the table where stdout is no terminal


def rich_table(title: str, labels: list[str], rows: list[list[str]]) -> Table:
    """``print_report``'s table: the first column left-justified, the
    others right, the last row (TOTAL) bold."""
    from rich.table import Table

    table = Table(title=title)
    for i, label in enumerate(labels):
        table.add_column(label, justify="left" if i == 0 else "right", min_width=min(len(label), 24))
    for i, cells in enumerate(rows):
        table.add_row(*cells, style="bold" if i == len(rows) - 1 else None)
    return table


def plain_table(title: str, labels: list[str], rows: list[list[str]], width: int) -> str | None:
    """The text rich prints for ``print_report``'s table with no terminal (its default box, the
    first column left-justified and the others right, ``title`` centred above), where the table
    fits in ``width`` cells; None where it does not (rich then wraps cells, which this does not),
    or where a text holds what rich would read as markup, an emoji code or a line break."""
    from rich.cells import cell_len

    texts = [*labels, *(cell for cells in rows for cell in cells)]
    # the title has one colon of its own: an emoji code takes two
    if any(ch in text for text in texts for ch in "[:\n\t\r") or any(ch in title for ch in "[\n\t\r") \
            or title.count(":") > 1:
        return None
    lengths = [[cell_len(cell) for cell in cells] for cells in (labels, *rows)]  # each cell measured once
    widths = [max(column) for column in zip(*lengths, strict=True)]
    total = sum(widths) + 3 * len(widths) + 1
    if total > width or cell_len(title) > total:
        return None

    def line(left: str, mid: str, right: str, cells: list[str], used: list[int]) -> str:
        padded = [f" {cell}{' ' * (w - n)} " if i == 0 else f" {' ' * (w - n)}{cell} "
                  for i, (cell, n, w) in enumerate(zip(cells, used, widths, strict=True))]
        return left + mid.join(padded) + right

    space = total - cell_len(title)
    out = [" " * (space // 2) + title + " " * (space - space // 2),
           "┏" + "┳".join("━" * (w + 2) for w in widths) + "┓",
           line("┃", "┃", "┃", labels, lengths[0]),
           "┡" + "╇".join("━" * (w + 2) for w in widths) + "┩",
           *(line("│", "│", "│", cells, used) for cells, used in zip(rows, lengths[1:], strict=True)),
           "└" + "┴".join("─" * (w + 2) for w in widths) + "┘"]
    return "\n".join(out) + "\n"
