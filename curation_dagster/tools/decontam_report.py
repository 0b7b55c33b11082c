"""``curate decontam-report``: per benchmark, how many documents matched and from which sources."""

from __future__ import annotations

from stages.dataroot import DataRoot
from stages.errors import DamagedFile
from stages.reports import ContaminatedDocumentsReport, read_as
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store

PROGRAM = "contaminated_documents"


def decontam_report(store: Store, spec: CrawlSpec) -> ContaminatedDocumentsReport | None:
    """The committed report of ``contaminated_documents`` for the crawl's current parameters,
    or None when it has not been materialized; a disabled one where the crawl switched the stage
    off (it has no partition); ``DamagedFile`` when its partition is not whole or its report is
    not a decontamination report."""
    if spec.switched_off(PROGRAM):
        return ContaminatedDocumentsReport.switched_off()
    pdir = DataRoot(store).output_dir(spec, PROGRAM, None)
    manifest = store.read_manifest(pdir)
    if manifest is None:
        return None
    store.check_whole(pdir, manifest)
    try:
        return read_as(manifest, ContaminatedDocumentsReport)
    except ValueError as exc:  # pydantic's ValidationError
        raise DamagedFile(store.url(f"{pdir}/{MANIFEST}"), "decontamination report", str(exc)) from None


def print_decontam_report(crawl: str, report: ContaminatedDocumentsReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not report.enabled:
        console.print(f"crawl {crawl}: stage decontam was not run (switched off)")
        return
    if report.note is not None:
        console.print(f"crawl {crawl}: {report.note}; {report.input} documents checked, none removed")
        return
    sources = sorted({s for b in report.benchmarks.values() for s in b.removed_per_source})
    table = Table(title=f"crawl {crawl}: documents removed for benchmark overlap "
                        f"({report.ngram}-grams, min_matches={report.min_matches}, "
                        f"{report.input} documents checked)")
    for col in ["BENCHMARK", "EXAMPLES", "EXAMPLES FOUND", "ANY MATCH", "REMOVED", *sources]:
        table.add_column(col, justify="left" if col == "BENCHMARK" else "right")
    for name, b in report.benchmarks.items():
        table.add_row(name, str(b.examples), str(b.examples_found), str(b.docs_with_any_match),
                      str(b.removed), *[str(b.removed_per_source.get(s, 0)) for s in sources])
    console.print(table)
