"""``curate semantic-audit``: sampled document pairs per similarity band, side by side.

Choosing ``eps`` is choosing the cosine similarity above which two documents are redundant. The
``neighbors`` table of ``semantic_duplicates`` holds, for every ranked document, its most similar
earlier-ranked document of the same cluster at *any* similarity; this module samples pairs from
each band of similarity (seeded, so the report is reproducible), fetches both texts from
``raw_documents`` and writes an HTML (or Markdown, for a ``.md`` path) page: per band, how many
documents a threshold at the band's lower edge would remove and a few pairs to read. Pick the
lowest band whose pairs are still truly redundant; ``eps = 1 - its lower edge``.

Reads only committed outputs; imports no kernels and no torch.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.dataroot import DataRoot
from stages.reports import SemanticDuplicatesReport, read_as
from stages.spec import CrawlSpec
from stages.store import Store

# Lower edges of the similarity bands, highest first; the last band holds everything below.
BANDS = (0.99, 0.97, 0.95, 0.93, 0.90, 0.87, 0.85, 0.80, 0.75, 0.70, -1.0)


@dataclass
class Band:
    low: float
    high: float
    count: int
    cumulative: int  # documents at similarity >= low: what eps = 1 - low would remove
    pairs: list[dict[str, Any]]


class AuditError(RuntimeError):
    """No semantic_duplicates output to audit."""


def audit(store: Store, spec: CrawlSpec, per_band: int = 4, seed: int = 0
          ) -> tuple[list[Band], SemanticDuplicatesReport]:
    """The bands of ``spec``'s crawl (highest first) with sampled pairs, and the stage's report."""
    if spec.switched_off("semantic_duplicates"):
        raise AuditError(f"stage 'semantic' is not enabled for crawl {spec.crawl!r} (see --stages)")
    root = DataRoot(store)
    pdir = root.output_dir(spec, "semantic_duplicates", None)
    manifest = root.manifest(spec, "semantic_duplicates", None)
    if manifest is None:
        raise AuditError(
            f"crawl {spec.crawl!r} has no semantic_duplicates output for its current parameters; "
            "run `curate run` with stage 'semantic'"
        )
    report = read_as(manifest, SemanticDuplicatesReport)
    nb = store.read_table(pdir, "neighbors")
    nb = nb.filter(pc.is_valid(nb["similarity"]))
    sim = nb["similarity"].to_numpy()
    rng = np.random.default_rng(seed)
    bands: list[Band] = []
    high = 1.0
    for low in BANDS:
        # the top band is open above: float rounding can put a cosine a hair over 1
        rows = np.flatnonzero((sim >= low) & (sim < high)) if bands else np.flatnonzero(sim >= low)
        pick = np.sort(rng.choice(rows, size=min(per_band, len(rows)), replace=False)) if len(rows) else rows
        pairs = nb.take(pa.array(pick, pa.int64())).to_pylist() if len(pick) else []
        pairs.sort(key=lambda r: -r["similarity"])
        bands.append(Band(max(low, -1.0), high, len(rows), int((sim >= low).sum()), pairs))
        high = low
    wanted = {r[k] for b in bands for r in b.pairs for k in ("doc_id", "neighbor")}
    texts = _texts(root, spec, wanted)
    for b in bands:
        for r in b.pairs:
            r["text"] = texts.get(r["doc_id"], "")
            r["neighbor_text"] = texts.get(r["neighbor"], "")
    return bands, report


def _texts(root: DataRoot, spec: CrawlSpec, wanted: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if not wanted:
        return out
    value_set = pa.array(sorted(wanted), pa.string())
    for source in sorted(spec.sources):
        pdir = root.output_dir(spec, "raw_documents", source)
        for batch in root.store.iter_batches(pdir, "documents", ["doc_id", "text"]):
            hit = pc.is_in(batch.column(0), value_set=value_set)
            for doc_id, text in zip(batch.column(0).filter(hit).to_pylist(), batch.column(1).filter(hit).to_pylist(),
                                    strict=True):
                out[doc_id] = text
    return out


def _label(b: Band) -> str:
    return f"[{b.low:.2f}, {b.high:.2f}]" if b.high >= 1.0 else f"[{b.low:.2f}, {b.high:.2f})"


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + " […]"


def render_html(spec: CrawlSpec, bands: list[Band], report: SemanticDuplicatesReport, max_chars: int = 1500) -> str:
    e = html.escape
    eps = report.eps
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>semantic audit: {e(spec.crawl)}</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}",
        "table.pair{width:100%;border-collapse:collapse;margin:0.5em 0 1.5em}",
        "table.pair td{vertical-align:top;width:50%;border:1px solid #ccc;padding:0.5em;white-space:pre-wrap;"
        "font-size:0.85em}",
        "table.pair th{text-align:left;background:#f3f3f3;padding:0.3em 0.5em;font-weight:normal;font-size:0.85em}",
        ".removed{color:#a00}.kept{color:#070}table.bands td,table.bands th{padding:0.2em 0.8em;text-align:right}",
        "</style></head><body>",
        f"<h1>Semantic dedup audit: crawl {e(spec.crawl)}</h1>",
        f"<p>{report.input} documents ranked in {report.clusters} clusters; which_to_keep = "
        f"{e(str(report.which_to_keep))}; current eps = {eps} (removes similarity &ge; "
        f"{1 - eps if eps is not None else float('nan'):.3f}): {report.removed} documents.</p>",
        "<p>Each pair: a document (right) and the most similar document ranked before it in its cluster "
        "(left, the one that would be kept). Pick the lowest band whose pairs are still redundant; "
        "eps = 1 &minus; its lower edge.</p>",
        "<table class='bands'><tr><th>band</th><th>documents</th><th>removed at eps = 1 &minus; lower edge</th>"
        "<th>eps</th></tr>",
    ]
    for b in bands:
        out.append(f"<tr><td><a href='#b{b.low:.2f}'>{_label(b)}</a></td><td>{b.count}</td><td>{b.cumulative}</td>"
                   f"<td>{max(0.0, 1 - b.low):.2f}</td></tr>")
    out.append("</table>")
    for b in bands:
        cls = "removed" if eps is not None and b.low >= 1 - eps - 1e-9 else "kept"
        verdict = "removed at the current eps" if cls == "removed" else "kept at the current eps"
        out.append(f"<h2 id='b{b.low:.2f}'>similarity {_label(b)}: {b.count} documents "
                   f"<span class='{cls}'>({verdict})</span></h2>")
        if not b.pairs:
            out.append("<p>no pairs in this band</p>")
        for r in b.pairs:
            out.append(
                "<table class='pair'><tr>"
                f"<th>kept / earlier: {e(r['neighbor'] or '')} ({e(r['neighbor_source'] or '')})</th>"
                f"<th>cosine {r['similarity']:.4f} &mdash; {e(r['doc_id'])} ({e(r['source'])}), "
                f"cluster {r['cluster']}, rank {r['rank']}</th></tr>"
                f"<tr><td>{e(_cut(r['neighbor_text'], max_chars))}</td><td>{e(_cut(r['text'], max_chars))}</td></tr>"
                "</table>"
            )
    out.append("</body></html>")
    return "\n".join(out)


def render_markdown(spec: CrawlSpec, bands: list[Band], report: SemanticDuplicatesReport, max_chars: int = 600) -> str:
    def cell(text: str) -> str:
        return _cut(text, max_chars).replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")

    eps = report.eps
    out = [f"# Semantic dedup audit: crawl {spec.crawl}", "",
           f"{report.input} documents; which_to_keep = {report.which_to_keep}; current eps = {eps}, "
           f"{report.removed} removed. Left: the earlier-ranked (kept) document; right: the document.", "",
           "| band | documents | removed at eps = 1 - lower edge | eps |", "|---|---:|---:|---:|"]
    out += [f"| {_label(b)} | {b.count} | {b.cumulative} | {max(0.0, 1 - b.low):.2f} |" for b in bands]
    for b in bands:
        out += ["", f"## similarity {_label(b)}: {b.count} documents", ""]
        if not b.pairs:
            out.append("no pairs in this band")
            continue
        out += ["| kept / earlier | document |", "|---|---|"]
        for r in b.pairs:
            out.append(f"| **{r['neighbor']}** ({r['neighbor_source']}) | **{r['doc_id']}** ({r['source']}), "
                       f"cosine {r['similarity']:.4f} |")
            out.append(f"| {cell(r['neighbor_text'])} | {cell(r['text'])} |")
    return "\n".join(out) + "\n"


def write_audit(root: DataRoot, crawl: str, out: Path, per_band: int = 4, seed: int = 0) -> Path:
    """Write the audit of ``crawl``, from the data root ``root``, to ``out`` (.html, or .md)."""
    spec = root.spec(crawl)
    bands, report = audit(root.store, spec, per_band, seed)
    text = render_markdown(spec, bands, report) if out.suffix == ".md" else render_html(spec, bands, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out
