"""Why a source shrank, at a glance: the source x stage waterfall of a crawl's ledger report.

``waterfall_markdown`` is the table (each step: documents removed and the share of what reached
it), ``waterfall_rows`` the same counts as plain rows (a native Dagster table with a schema),
``waterfall_png`` the chart (one 100 % bar per source: kept, quarantined, removed by each stage),
``chart_markdown`` the chart embedded as a base64 ``data:`` URI in Markdown (which the UI renders
inline). ``curation_dagster.run.metadata.ledger_metadata`` makes them the Dagster metadata of the
``removal_ledger`` materialization; this module imports no Dagster.
Pillow is imported only here and only when a chart is drawn.
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

from stages.catalog import QUARANTINE, STAGES
from stages.reports import LedgerSource, RemovalLedgerReport, SourceCounts

if TYPE_CHECKING:
    from stages.store import Store

KEPT_COLOR = "#2e7d32"
QUARANTINE_COLOR = "#9e9e9e"
STAGE_COLORS = ("#e65100", "#1565c0", "#6a1b9a", "#c62828", "#00838f", "#ad1457", "#f9a825", "#4e342e")


def stages_of(report: RemovalLedgerReport) -> list[str]:
    """Removal stages of a ledger report in pipeline order (unknown ones last, sorted)."""
    seen = {st for row in report.sources.values() for st in row.removed_per_stage}
    return [s for s in STAGES if s in seen] + sorted(seen - set(STAGES))


def custom_filters(report: RemovalLedgerReport) -> list[str]:
    """Names of the custom filters in a ledger report (``filters`` of a source: its heuristic
    removals by each custom filter, docs/filters.md), sorted."""
    return sorted({name for row in report.sources.values() for name in row.filters})


# The sub-column of a dedup stage's removals that duplicate documents earlier crawls kept.
EARLIER = "earlier_crawls"


def earlier_crawls(report: RemovalLedgerReport) -> dict[str, list[str]]:
    """Stage -> the earlier crawls whose kept documents its removals duplicated (sorted), for the
    stages (in pipeline order) that removed any document as a duplicate of an earlier crawl."""
    seen: dict[str, set[str]] = {}
    for row in report.sources.values():
        for stage, per_crawl in row.earlier_crawl_duplicates.items():
            if any(per_crawl.values()):
                seen.setdefault(stage, set()).update(c for c, n in per_crawl.items() if n)
    return {s: sorted(seen[s]) for s in stages_of(report) if s in seen}


def named_crawls(crawls: list[str], most: int = 3) -> str:
    """``c1``, ``c1, c2`` or ``c1, c2, c3 and 4 more``."""
    head = ", ".join(crawls[:most])
    return head if len(crawls) <= most else f"{head} and {len(crawls) - most} more"


def steps(row: SourceCounts, stages: list[str]) -> list[tuple[str, int, int]]:
    """(step, removed, entering) along one source's waterfall: quarantine, then each stage."""
    out = []
    remaining = row.input
    for name, n in [(QUARANTINE, row.quarantined), *[(s, row.removed_per_stage.get(s, 0)) for s in stages]]:
        out.append((name, n, remaining))
        remaining -= n
    return out


def share(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage, short: whole percents from 10 % to 99 %, one decimal
    below and above (``1.1%``, ``34%``, ``99.6%``: never a rounded ``100%`` that is not all)."""
    if part == whole:
        return "100%"
    p = 100 * part / whole
    return f"{p:.0f}%" if 10 <= p < 99 else f"{p:.1f}%"


def _cell(removed: int, entering: int) -> str:
    if removed == 0:
        return "0"
    return f"−{removed:,} ({share(removed, entering)})" if entering else f"−{removed:,}"


def totals(report: RemovalLedgerReport) -> LedgerSource:
    """The sum over sources: every stage of any source (0 where none removed) and custom filter."""
    rows = report.sources.values()
    per_stage = {s: sum(r.removed_per_stage.get(s, 0) for r in rows) for s in stages_of(report)}
    return LedgerSource(
        input=sum(r.input for r in rows), kept=sum(r.kept for r in rows),
        quarantined=sum(r.quarantined for r in rows), removed=sum(per_stage.values()), removed_per_stage=per_stage,
        filters={n: sum(r.filters.get(n, 0) for r in rows) for n in custom_filters(report)},
        earlier_crawl_duplicates={
            stage: {c: sum(r.earlier_crawl_duplicates.get(stage, {}).get(c, 0) for r in rows) for c in crawls}
            for stage, crawls in earlier_crawls(report).items()},
    )


def _step_columns(report: RemovalLedgerReport) -> list[str]:
    """The stages in pipeline order, each custom filter's ``heuristic:NAME`` right after
    heuristic and, after a dedup stage that removed duplicates of earlier crawls' documents,
    ``STAGE:earlier_crawls``: sub-columns, each a share of the stage's removals before it."""
    earlier = earlier_crawls(report)
    out = []
    for stage in stages_of(report):
        out.append(stage)
        if stage == "heuristic":
            out += [f"heuristic:{name}" for name in custom_filters(report)]
        if stage in earlier:
            out.append(f"{stage}:{EARLIER}")
    return out


def step_value(row: LedgerSource, column: str) -> int:
    """A source's count in one ``_step_columns`` column."""
    stage, _, sub = column.partition(":")
    if not sub:
        return row.removed_per_stage.get(stage, 0)
    return row.earlier(stage) if sub == EARLIER and stage != "heuristic" else row.filters.get(sub, 0)


def step_label(report: RemovalLedgerReport, column: str, short: bool = False) -> str:
    """A column's heading: the stage, ``↳ NAME`` (a custom filter) or ``↳ earlier crawl c1``
    (duplicates of documents crawl c1 kept; ``crawls c1, c2`` for several; ``short``: ``↳ c1``,
    which a legend under the table explains)."""
    stage, _, sub = column.partition(":")
    if not sub:
        return stage
    if sub == EARLIER and stage != "heuristic":
        crawls = earlier_crawls(report).get(stage, [])
        named = named_crawls(crawls, most=2 if short else 3)
        return f"↳ {named}" if short else f"↳ earlier crawl{'s' if len(crawls) > 1 else ''} {named}"
    return f"↳ {sub}"


def legend(report: RemovalLedgerReport, columns: list[str]) -> list[str]:
    """What the short sub-column headings of the Markdown waterfall mean, a line each."""
    out = []
    for c in columns:
        stage, _, sub = c.partition(":")
        if sub == EARLIER and stage != "heuristic":
            crawls = earlier_crawls(report).get(stage, [])
            # short: the pane is as wide as the widest metadata value, so a long line is cut, not wrapped
            out.append(f"`{step_label(report, c, short=True)}`: {stage} removals that copy documents "
                       f"earlier crawl{'s' if len(crawls) > 1 else ''} {named_crawls(crawls, most=10)} kept.")
        elif sub:
            out.append(f"`↳ {sub}`: of the heuristic removals, those by custom filter {sub}.")
    return out


def waterfall_markdown(report: RemovalLedgerReport) -> str:
    """Markdown table: one row per source and a total; a step's cell is ``−removed (share of the
    documents that reached that step)``, then kept (its share is the chart's, and
    ``kept_fraction``). A sub-column (``↳``: a
    custom filter's, or a dedup stage's duplicates of documents earlier crawls kept) is a part of
    the stage's cell before it, a count (its share is of the same documents). Steps that removed nothing
    anywhere are left out (the native table has them), so it stays readable at 1,280 px."""
    columns = [c for c in _step_columns(report) if any(step_value(r, c) for r in report.sources.values())]
    quarantine = any(r.quarantined for r in report.sources.values())
    head = ["source", "input", *([QUARANTINE] if quarantine else []),
            *[step_label(report, c, short=True) for c in columns], "kept"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    rows = sorted(report.sources.items())
    stages = stages_of(report)
    for name, row in [*rows, ("**total**", totals(report))]:
        entering = {step: n_in for step, _, n_in in steps(row, stages)}
        # a sub-column's count alone: its share is of the same documents as the stage's cell before it
        cells = ([_cell(row.quarantined, row.input)] if quarantine else []) + [
            _cell(step_value(row, c), entering[c] if ":" not in c else 0) for c in columns]
        lines.append(f"| {name} | {row.input:,} | " + " | ".join(cells) + f" | {row.kept:,} |")
    notes = legend(report, columns)
    return "\n".join([*lines, *(["", *notes] if notes else [])])


def waterfall_columns(report: RemovalLedgerReport) -> list[tuple[str, str, str]]:
    """(name, type, description) of the ``waterfall_rows`` columns; types are TableColumn's."""
    earlier = earlier_crawls(report)

    def describe(col: str) -> str:
        stage, _, sub = col.partition(":")
        if not sub:
            return f"documents removed by stage {stage}"
        if sub == EARLIER and stage != "heuristic":
            return (f"of the {stage} removals, duplicates of documents kept by earlier crawl(s) "
                    f"{named_crawls(earlier.get(stage, []), most=10)} (the rest are duplicates within this crawl)")
        return f"of the heuristic removals, those by custom filter {sub}"

    return [
        ("source", "string", "source name, or 'total' for the sum over sources"),
        ("input", "int", "documents read"),
        (QUARANTINE, "int", "bad records (ingestion quarantine)"),
        *[(c, "int", describe(c)) for c in _step_columns(report)],
        ("kept", "int", "documents in the curated output"),
        ("kept_fraction", "float", "kept / input"),
    ]


def waterfall_rows(report: RemovalLedgerReport) -> list[dict[str, Any]]:
    """One row per source (sorted) and a ``total`` row: input, quarantine, removed per stage, the
    sub-columns (``heuristic:NAME``: a custom filter's share of the heuristic removals;
    ``STAGE:earlier_crawls``: a dedup stage's duplicates of earlier crawls' documents), kept; per
    row ``input == quarantine + sum(stages) + kept``."""
    out = []
    columns = _step_columns(report)  # O(sources): once, not once a row
    for name, row in [*sorted(report.sources.items()), ("total", totals(report))]:
        out.append({
            "source": name, "input": row.input, QUARANTINE: row.quarantined,
            **{c: step_value(row, c) for c in columns},
            "kept": row.kept,
            "kept_fraction": round(row.kept / row.input, 6) if row.input else 0.0,
        })
    return out


# The most sources the chart draws: a bar each, the crawl's sources that kept the least beyond it
# (the table has every source; a chart of a 1,000-source crawl would be 400 inches tall).
CHART_SOURCES = 40


def charted_sources(report: RemovalLedgerReport, most: int = CHART_SOURCES) -> list[str]:
    """The sources the chart draws, sorted: all, or the ``most`` that kept the smallest share."""
    if len(report.sources) <= most:
        return sorted(report.sources)
    share = {n: r.kept / r.input if r.input else 1.0 for n, r in report.sources.items()}  # empty: lost nothing
    return sorted(sorted(report.sources, key=lambda n: (share[n], n))[:most])


def waterfall_png(report: RemovalLedgerReport, dpi: int = 90) -> bytes:
    """PNG: one horizontal 100 % bar per source (kept, quarantined, each stage's removals), for at
    most ``CHART_SOURCES`` sources (``charted_sources``); 8 inches wide, 1.4 + 0.4 per source high.

    Drawn with Pillow (its bundled scalable font): ~60 ms with its import, where matplotlib's
    import alone took ~0.6 s of every crawl's last step."""
    from PIL import Image, ImageDraw, ImageFont

    stages = stages_of(report)
    names = charted_sources(report)
    segments = [("kept", KEPT_COLOR), (QUARANTINE, QUARANTINE_COLOR)] + [
        (s, STAGE_COLORS[i % len(STAGE_COLORS)]) for i, s in enumerate(stages)
    ]
    width, height = int(8.0 * dpi), round(dpi * (1.4 + 0.4 * len(names)))
    small, large = ImageFont.load_default(size=max(8, dpi // 9)), ImageFont.load_default(size=max(9, dpi // 7))
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    title = f"crawl {report.crawl}: where each source's documents went" if len(names) == len(report.sources) else \
        f"crawl {report.crawl}: where the documents went in the {len(names)} of {len(report.sources):,} sources " \
        "that kept the least"
    while draw.textlength(title, font=large) > width - 24 and len(title) > 20:
        title = title[:-2].rstrip() + "…"
    draw.text((width / 2, dpi * 0.12), title, fill="black", font=large, anchor="mt")
    shown = [n if len(n) <= 28 else n[:27] + "…" for n in names]
    left = min(12 + max((draw.textlength(n, font=small) for n in shown), default=0.0), width * 0.3)
    top, row = dpi * 0.35, dpi * 0.4
    kept = [f"{report.sources[n].kept:,} of {report.sources[n].input:,} kept" for n in names]
    # 100 % where the widest "k of n kept" still fits to its right.
    full = max(left + 10, width - 12 - 6 - max((draw.textlength(k, font=small) for k in kept), default=0.0))

    def x(percent: float) -> float:  # 0..100 % of a source's input across the bars
        return left + (full - left) * percent / 100.0

    for y, (name, label) in enumerate(zip(names, shown, strict=True)):
        rec = report.sources[name]
        mid = top + row * (y + 0.5)
        draw.text((left - 6, mid), label, fill="black", font=small, anchor="rm")
        start = 0.0
        for segment, color in segments:
            n = rec.kept if segment == "kept" else rec.quarantined if segment == QUARANTINE else \
                rec.removed_per_stage.get(segment, 0)
            share = 100.0 * n / rec.input if rec.input else 0.0
            if share > 0:
                draw.rectangle((x(start), mid - row * 0.35, x(start + share), mid + row * 0.35), fill=color)
            start += share
        draw.text((x(100) + 6, mid), kept[y], fill="black", font=small, anchor="lm")
    axis = top + row * len(names)
    draw.line((x(0), axis, x(100), axis), fill="black")
    for tick in (0, 25, 50, 75, 100):
        draw.line((x(tick), axis, x(tick), axis + 4), fill="black")
        draw.text((x(tick), axis + 6), str(tick), fill="black", font=small, anchor="mt")
    draw.text(((x(0) + x(100)) / 2, axis + 6 + dpi * 0.18), "% of the source's input documents", fill="black",
              font=small, anchor="mt")
    # The legend, centred in rows across the bottom.
    entries = [(label, color, 14 + 6 + draw.textlength(label, font=small) + 14) for label, color in segments]
    rows: list[list[tuple[str, str, float]]] = [[]]
    for entry in entries:
        if rows[-1] and sum(e[2] for e in rows[-1]) + entry[2] > width - 24:
            rows.append([])
        rows[-1].append(entry)
    y0 = axis + 6 + dpi * 0.42
    for i, line in enumerate(rows):
        cx = (width - sum(e[2] for e in line)) / 2
        cy = y0 + i * dpi * 0.2
        for label, color, room in line:
            draw.rectangle((cx, cy - 6, cx + 12, cy + 6), fill=color)
            draw.text((cx + 18, cy), label, fill="black", font=small, anchor="lm")
            cx += room
    buf = io.BytesIO()
    img.save(buf, format="PNG", dpi=(dpi, dpi))
    return buf.getvalue()


def chart_markdown(report: RemovalLedgerReport) -> str:
    """The chart as Markdown with an inline ``data:image/png;base64`` image (what the UI renders)."""
    data = base64.b64encode(waterfall_png(report)).decode()
    return f"![where each source's documents went](data:image/png;base64,{data})"


def previous_reports(store: Store, crawl: str, sources: list[str]) -> dict[str, RemovalLedgerReport]:
    """Source -> the ledger report of the latest crawl registered before ``crawl`` that has the
    source and a ledger for its current parameters (none for a source seen first now)."""
    from stages.dataroot import DataRoot
    from stages.reports import read_as

    root = DataRoot(store)
    records = root.records()
    names = [r.crawl for r in records]
    before = records[: names.index(crawl)] if crawl in names else records
    cache: dict[str, RemovalLedgerReport | None] = {}
    out: dict[str, RemovalLedgerReport] = {}
    for record in reversed(before):
        todo = [s for s in sources if s not in out and s in record.spec.sources]
        if not todo:
            continue
        if record.crawl not in cache:
            m = root.manifest(record.spec, "removal_ledger", None)
            cache[record.crawl] = read_as(m, RemovalLedgerReport) if m is not None else None
        prev = cache[record.crawl]
        for s in todo:
            if prev is not None and s in prev.sources:
                out[s] = prev
    return out


def crawl_over_crawl_rows(
    report: RemovalLedgerReport, previous: dict[str, RemovalLedgerReport]
) -> list[dict[str, Any]]:
    """Per source (sorted) with a previous crawl: that crawl, input and kept then and now, and
    per removal stage (of either crawl, pipeline order) the change in its removals, now − then."""
    # the stages that removed anything from a compared source, in either crawl
    stages = [s for s in STAGES if any(r.sources[n].removed_per_stage.get(s, 0) for n, r in previous.items())
              or any(report.sources[n].removed_per_stage.get(s, 0) for n in previous)]
    out = []
    for name in sorted(report.sources):
        if name not in previous:
            continue
        now, then = report.sources[name], previous[name].sources[name]
        out.append({
            "source": name, "previous_crawl": previous[name].crawl,
            "input_before": then.input, "input": now.input, "input_change": now.input - then.input,
            "kept_before": then.kept, "kept": now.kept, "kept_change": now.kept - then.kept,
            "quarantine_change": now.quarantined - then.quarantined,
            **{f"{s}_change": now.removed_per_stage.get(s, 0) - then.removed_per_stage.get(s, 0) for s in stages},
        })
    return out
