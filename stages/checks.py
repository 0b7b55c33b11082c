"""Check verdicts, with no Dagster: every program gets the checks its kind calls for
(``CHECK_KINDS``); ``curation_dagster.defs.checks`` makes them Dagster asset checks.

- ``over_deletion`` (every remover, ``Program.stage``; ERROR, blocking): a stage removed more
  than the bound of the documents of a source that reached it.
- ``empty_result`` (every dedup remover, ``uses_keep_rule``; WARN): no removal at all in a crawl
  of at least ``min_documents``.
- ``giant_groups`` (every crawl-level program but the output; WARN): a size among the largest
  groups the report names (``Report.largest_groups``: LSH buckets, duplicate clusters) above the
  bound; passes when there is none.
- ``input_complete`` (raw_documents; ERROR, blocking): a file of the source is damaged (truncated
  or corrupt), so records after the damage were never read; passes with a warning when the crawl
  allows damaged files (``allow_damaged_files``).
- ``doc_id_unique`` (raw_documents, curated_documents, removal_ledger; ERROR): a doc_id twice.
- ``ledger_consistency`` (curated_documents, removal_ledger; ERROR): input != kept + quarantined +
  removed, ledger rows != counts, or a ledger built from stale curated partitions.
- ``prior_crawls_current`` (the cross-crawl remover and the ledger; ERROR, blocking): the crawl was
  deduplicated against outputs of an earlier crawl that are no longer its current ones (it was
  rerun with new parameters since), so a removed document's kept copy may be gone from both.

The verdicts are plain functions of the store and the crawl spec (``evaluate_*``): they read
manifests as typed reports (``stages.reports``) and, for doc_id uniqueness and the ledger, one or
two columns; never a kernel. Their bounds (``ChecksConfig``) are the ``checks:`` section of the
workdir's ``curate.yaml`` (``curation_dagster.ops.config``), read at every evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from stages.catalog import PROGRAMS, QUARANTINE, STAGES, Program, partition_name
from stages.dataroot import DataRoot
from stages.reports import (
    CuratedDocumentsReport,
    RawDocumentsReport,
    RemovalLedgerReport,
    RemovalReport,
    SourceCounts,
    read,
    read_as,
)
from stages.spec import CrawlSpec, keys_held
from stages.store import Manifest, Store, manifests_held, written_ids


@dataclass(frozen=True)
class Verdict:
    """A check's answer; ``severity`` applies when it did not pass."""

    passed: bool
    description: str
    severity: Literal["ERROR", "WARN"] = "ERROR"
    metadata: dict[str, Any] = field(default_factory=dict)
    table: str | None = None  # Markdown, shown as the check's ``details``


class _Bounds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class OverDeletionConfig(_Bounds):
    """Fail (ERROR, blocking) when a stage removes more than this fraction of what it saw of a source."""

    max_removed_fraction: float = Field(default=0.9, ge=0.0, le=1.0)
    per_stage: dict[str, float] = Field(default_factory=dict)
    min_documents: int = Field(default=1000, ge=0)  # smaller sources are too small to judge

    def bound(self, stage: str) -> float:
        return self.per_stage.get(stage, self.max_removed_fraction)


class EmptyResultConfig(_Bounds):
    """Warn when a dedup stage removes nothing from a crawl of at least this many documents."""

    min_documents: int = Field(default=10_000, ge=0)


class GiantGroupConfig(_Bounds):
    """Warn when the largest bucket/cluster of a report exceeds max(min_size, max_fraction x documents)."""

    max_fraction: float = Field(default=0.05, gt=0.0, le=1.0)
    min_size: int = Field(default=1000, ge=1)

    def bound(self, documents: int) -> int:
        return max(self.min_size, int(self.max_fraction * documents))


class ChecksConfig(_Bounds):
    over_deletion: OverDeletionConfig = Field(default_factory=lambda: OverDeletionConfig())
    empty_result: EmptyResultConfig = Field(default_factory=lambda: EmptyResultConfig())
    giant_groups: GiantGroupConfig = Field(default_factory=lambda: GiantGroupConfig())


# The table whose doc_ids must be unique, per program that carries one document per row.
UNIQUE_TABLES = {"raw_documents": "documents", "curated_documents": "documents", "removal_ledger": "ledger"}
LEDGER_PROGRAMS = ("curated_documents", "removal_ledger")


class NotMaterialized(Exception):
    """An input of the check has no committed output for the crawl's current parameters."""


@contextmanager
def manifests_read_once() -> Iterator[None]:
    """Within: each partition's manifest is read once (``stages.store.manifests_held``) and the
    partition keys each manifest's folder is named by derived once (``keys_held``), whichever
    checks read them. The checks of one partition read the same committed manifests (a crawl-wide
    remover's ``over_deletion`` and ``empty_result`` each read every source's ingestion and
    earlier removals: 600 manifests at 200 sources); a committed manifest does not change under
    them, but may between two evaluations, so nothing is held beyond the block."""
    with keys_held(), manifests_held():
        yield


def _manifest(store: Store, spec: CrawlSpec, program: str, source: str | None) -> Manifest:
    m = DataRoot(store).manifest(spec, program, source)
    if m is None:
        raise NotMaterialized(f"{partition_name(program, spec.crawl, source)} has no committed output for its current "
                              "parameters")
    return m


def documents_by_source(store: Store, spec: CrawlSpec, sources: list[str] | None = None) -> dict[str, int]:
    """Ingested (not quarantined) documents per source."""
    names = sorted(spec.sources) if sources is None else sources
    return {s: read_as(_manifest(store, spec, "raw_documents", s), RawDocumentsReport).documents for s in names}


def removed_by_source(store: Store, spec: CrawlSpec, program: str, sources: list[str] | None = None) -> dict[str, int]:
    """Documents each source lost to one removing program, from its manifests."""
    names = sorted(spec.sources) if sources is None else sources
    if PROGRAMS[program].level == "source":
        return {s: read_as(_manifest(store, spec, program, s), RemovalReport).removed for s in names}
    per_source = read_as(_manifest(store, spec, program, None), RemovalReport).removed_per_source
    return {s: per_source.get(s, 0) for s in names}


def entering_by_source(store: Store, spec: CrawlSpec, program: str, sources: list[str] | None = None) -> dict[str, int]:
    """Documents of each source that reach removing ``program``: the ingested ones minus those
    removed by the stages before it (removers see only the survivors of earlier removers, so
    their removals are disjoint)."""
    remaining = documents_by_source(store, spec, sources)
    for earlier in STAGES.values():
        if earlier == program:
            break
        if spec.switched_off(earlier):  # no partition: it removed nothing
            continue
        for s, n in removed_by_source(store, spec, earlier, sources).items():
            remaining[s] -= n
    return remaining


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def evaluate_over_deletion(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    stage = PROGRAMS[program].stage
    assert stage is not None, f"{program} removes nothing"
    od = cfg.over_deletion
    bound = od.bound(stage)
    sources = [source] if source is not None else sorted(spec.sources)
    entering = entering_by_source(store, spec, program, sources)
    removed = removed_by_source(store, spec, program, sources)
    rows, bad, small = [], [], []
    worst = (0.0, "")
    for s in sources:
        frac = removed[s] / entering[s] if entering[s] else 0.0
        judged = entering[s] >= od.min_documents
        if judged and frac > bound:
            bad.append(f"{s} {_pct(frac)} ({removed[s]:,} of {entering[s]:,})")
        if judged:
            worst = max(worst, (frac, s))
        else:  # no fraction beside a pass: the per-source table has it, marked not judged
            small.append(f"{s} ({entering[s]:,} documents)")
        rows.append(f"| {s} | {entering[s]:,} | {removed[s]:,} | {_pct(frac)} | "
                    f"{'judged' if judged else f'not judged: under min_documents {od.min_documents:,}'} |")
    table = "\n".join([f"| source | entering {stage} | removed | fraction | note |", "|---|---:|---:|---:|---|", *rows])
    # The settings are text: a number would be plotted as a flat line in the check's Plots.
    meta: dict[str, Any] = {"stage": stage, "bound": _pct(bound), "min_documents": f"{od.min_documents:,}",
                            "sources_judged": len(sources) - len(small), "sources_not_judged": len(small),
                            "worst_fraction": round(worst[0], 6), "worst_source": worst[1]}
    if bad:  # the Dagster check adds the stage's removal list (curation_dagster.defs.checks)
        return Verdict(False, over_deletion_failure(stage, bound, bad), "ERROR", meta, table)
    return Verdict(True, over_deletion_pass(stage, bound, worst, small, od.min_documents), metadata=meta, table=table)


def over_deletion_failure(stage: str, bound: float, bad: list[str]) -> str:
    """The failure text: the sources over the bound and the curate.yaml setting that allows it."""
    return (f"stage {stage} removed more than {_pct(bound)} of: {'; '.join(bad)}; not applied, the crawl stops "
            f"here. If intended, raise checks.over_deletion.per_stage.{stage} in curate.yaml; else fix the "
            f"stage's parameters")


def over_deletion_pass(stage: str, bound: float, worst: tuple[float, str], small: list[str],
                       min_documents: int) -> str:
    """The passing text: what was judged, and apart from it the sources too small to judge."""
    not_judged = (f"not judged (under min_documents {min_documents:,}): {', '.join(small[:5])}"
                  f"{f' and {len(small) - 5} more' if len(small) > 5 else ''}") if small else ""
    if not worst[1] and small:
        return f"NOT JUDGED: stage {stage}: every source is too small; {not_judged}"
    head = f"stage {stage} removed at most {_pct(worst[0])} of a judged source (bound {_pct(bound)})"
    return f"{head}; {not_judged}" if small else head


def evaluate_empty_result(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    stage = PROGRAMS[program].stage
    report = read(_manifest(store, spec, program, source))
    sources = [source] if source is not None else sorted(spec.sources)
    seen = sum(entering_by_source(store, spec, program, sources).values())
    removed = sum(removed_by_source(store, spec, program, sources).values())
    meta = {"stage": stage, "documents": seen, "removed": removed,
            "min_documents": f"{cfg.empty_result.min_documents:,}"}  # a setting: text, not plotted
    if not report.enabled:
        return Verdict(True, f"stage {stage} is disabled for this crawl", metadata=meta)
    if removed == 0 and seen >= cfg.empty_result.min_documents:
        return Verdict(False, f"stage {stage} found no duplicate among {seen:,} documents: check its parameters "
                              "(a disabled or broken dedup stage looks exactly like this)", "WARN", meta)
    return Verdict(True, f"stage {stage} removed {removed:,} of {seen:,} documents", metadata=meta)


def evaluate_giant_groups(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    report = read(_manifest(store, spec, program, source))
    groups = {kind: sizes for kind, sizes in sorted(report.largest_groups().items()) if sizes}
    if not groups:
        return Verdict(True, f"{program} reports no bucket or cluster sizes (no largest_* in its report)",
                       metadata={"stats": "none"})
    documents = report.grouped_documents()
    if documents is None:
        documents = sum(documents_by_source(store, spec).values())
    bound = cfg.giant_groups.bound(documents)
    largest = {kind: max(sizes) for kind, sizes in groups.items()}
    meta: dict[str, Any] = {"documents": documents, "bound": bound,
                            **{f"largest_{kind}": n for kind, n in largest.items()}}
    bad = [f"{kind} of {n:,}" for kind, n in largest.items() if n > bound]
    if bad:
        return Verdict(False, f"giant group(s) in {program}: {', '.join(bad)} documents (bound {bound:,} of "
                              f"{documents:,}): boilerplate or a false-positive chain", "WARN", meta)
    return Verdict(True, f"largest group {max(largest.values()):,} <= bound {bound:,}", metadata=meta)


def evaluate_doc_id_unique(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    table = UNIQUE_TABLES[program]
    manifest = _manifest(store, spec, program, source)
    pdir = DataRoot(store).output_dir(spec, program, source)
    from stages.keep import fixed_ids

    # Each part into 32 bytes a row (no Python object per document), then sorted in place: memory
    # ~ 2 x 32 bytes a row. A part this process has just written: its ids as they were written
    # (``stages.store.written_ids``), not read back; any other streamed batch by batch.
    parts: list[np.ndarray] = []
    for name in manifest.tables.get(table, []):
        path = f"{pdir}/{name}"
        held = written_ids(store, path, manifest.sizes.get(name))
        if held is not None:
            parts.append(fixed_ids(held))
        else:
            parts += [fixed_ids(b.column(0)) for b in store.part_batches(path, ["doc_id"])]
    ids = np.concatenate(parts) if parts else np.zeros(0, "S32")
    del parts
    ids.sort()
    repeated = ids[1:][ids[1:] == ids[:-1]]
    dup = np.unique(repeated)
    meta = {"rows": len(ids), "distinct": len(ids) - len(repeated), "duplicated_ids": len(dup)}
    if len(dup):
        sample = ", ".join(d.decode() for d in dup[:5])
        return Verdict(False, f"{len(dup)} doc_id(s) occur more than once in {program}.{table}: {sample}",
                       "ERROR", meta)
    return Verdict(True, f"{len(ids):,} rows, every doc_id distinct", metadata=meta)


def evaluate_input_complete(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    """Every byte of the source's files was read: no file is damaged (or the crawl accepts it)."""
    report = read_as(_manifest(store, spec, program, source), RawDocumentsReport)
    damaged = report.damaged_files
    unread = report.unread_bytes
    meta = {"files": report.files, "damaged_files": len(damaged), "unread_bytes": unread,
            "ignored_files": report.ignored_files}
    if not damaged:
        return Verdict(True, f"every byte of {report.files} file(s) read", metadata=meta)
    rows = [f"| {d.file} | {d.size:,} | {d.unread_bytes:,} | {d.partial_bytes:,} | {d.error} |" for d in damaged]
    table = "\n".join(["| file | bytes | unread bytes | dropped partial record bytes | error |",
                       "|---|---:|---:|---:|---|", *rows])
    what = (f"{len(damaged)} damaged file(s), {unread:,} bytes unread; first: {damaged[0].error}")
    if spec.allow_damaged_files:
        return Verdict(True, f"{what} (accepted: allow_damaged_files)", metadata=meta, table=table)
    return Verdict(False, f"{what}; the records after the damage are missing. Replace the file(s), or accept "
                          "them with allow_damaged_files: true in the crawl config (curate run "
                          "--allow-damaged-files)", "ERROR", meta, table)


def evaluate_ledger_consistency(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    """input = kept + quarantined + removed per source; the ledger's rows match the counts and
    the curated partitions it was built from are the current ones."""
    problems: list[str] = []
    if program == "curated_documents":
        assert source is not None
        m = _manifest(store, spec, program, source)
        cur = read_as(m, CuratedDocumentsReport)
        ok, total = cur.adds_up()
        if not ok:
            problems.append(f"input {cur.input} != kept + quarantined + removed = {total}")
        if m.rows.get("documents", 0) != cur.kept:
            problems.append(f"{m.rows.get('documents', 0)} curated rows but kept = {cur.kept}")
        meta = cur.model_dump(include=set(SourceCounts.model_fields))
    else:
        m = _manifest(store, spec, program, None)
        ledger = read_as(m, RemovalLedgerReport)
        pdir = DataRoot(store).output_dir(spec, program, None)
        t = store.read_table(pdir, "ledger", ["source", "stage"])
        counted: dict[tuple[str, str], int] = {}
        if t.num_rows:
            for row in t.group_by(["source", "stage"]).aggregate([([], "count_all")]).to_pylist():
                counted[(row["source"], row["stage"])] = row["count_all"]
        for s in sorted(spec.sources):
            entry = ledger.sources.get(s)
            if entry is None:
                problems.append(f"source {s} missing from the ledger report")
                continue
            ok, total = entry.adds_up()
            if not ok:
                problems.append(f"{s}: input {entry.input} != kept + quarantined + removed = {total}")
            for stage, n in [(QUARANTINE, entry.quarantined), *entry.removed_per_stage.items()]:
                if counted.get((s, stage), 0) != n:
                    problems.append(f"{s}/{stage}: {counted.get((s, stage), 0)} ledger rows, report says {n}")
            now = read_as(_manifest(store, spec, "curated_documents", s), CuratedDocumentsReport)
            if now.kept != entry.kept:
                problems.append(f"{s}: ledger built from a stale curated_documents (kept {entry.kept} "
                                f"vs {now.kept} now)")
        extra = {(s, st) for s, st in counted if s not in spec.sources}
        if extra:
            problems.append(f"ledger rows for sources outside the crawl: {sorted(extra)}")
        meta = {"ledger_rows": t.num_rows, "sources": len(spec.sources)}
    if problems:
        return Verdict(False, "; ".join(problems[:5]), "ERROR", meta)
    return Verdict(True, "every document is kept, quarantined or removed exactly once", metadata=meta)


def evaluate_prior_crawls_current(
    store: Store, spec: CrawlSpec, program: str, source: str | None, cfg: ChecksConfig
) -> Verdict:
    """The earlier crawls this crawl was deduplicated against still have the outputs it read.

    When one was rerun with new parameters, this crawl removed documents as duplicates of its
    *old* kept documents, which its new run may have removed: such a document would be lost
    from both crawls. ``curate run`` of this crawl dedups it against the current outputs."""
    stale = DataRoot(store).stale_priors(spec)
    meta = {"dedup_against": sorted(spec.dedup_against), "stale": sorted(stale)}
    if stale:
        names = ", ".join(sorted(stale))
        why = "; ".join(stale.values())
        return Verdict(False, f"crawl {spec.crawl} was deduplicated against outputs of earlier crawl(s) {names} that "
                              f"are no longer current ({why}): a document it removed as a duplicate may be lost from "
                              f"both crawls; rerun crawl {spec.crawl} (`curate run --crawl {spec.crawl}` dedups it "
                              "against their current outputs)", "ERROR", meta)
    if not spec.dedup_against:
        return Verdict(True, f"crawl {spec.crawl} is not deduplicated against an earlier crawl", metadata=meta)
    return Verdict(True, f"deduplicated against the current outputs of {', '.join(sorted(spec.dedup_against))}",
                   metadata=meta)


Evaluator = Callable[[Store, CrawlSpec, str, "str | None", ChecksConfig], Verdict]


@dataclass(frozen=True)
class CheckKind:
    name: str
    evaluate: Evaluator
    applies: Callable[[Program], bool]
    blocking: bool
    description: str
    # The verdict reads only the partition's own committed output (no bound, no other crawl), so
    # it cannot change while the partition is current: ``curate run`` never judges it again.
    output_only: bool = False


CHECK_KINDS: tuple[CheckKind, ...] = (
    CheckKind("over_deletion", evaluate_over_deletion, lambda p: p.stage is not None, True,
              "Removed fraction per source at this stage <= checks.over_deletion bound (blocks downstream); a "
              "source under checks.over_deletion.min_documents is reported as not judged."),
    CheckKind("empty_result", evaluate_empty_result, lambda p: p.stage is not None and p.uses_keep_rule, False,
              "A dedup stage that finds no duplicate in a large crawl is suspicious (warns)."),
    CheckKind("giant_groups", evaluate_giant_groups, lambda p: p.level == "crawl" and p.group != "output", False,
              "Largest LSH bucket / duplicate cluster (report keys largest_*) <= checks.giant_groups bound (warns)."),
    CheckKind("input_complete", evaluate_input_complete, lambda p: p.name == "raw_documents", True,
              "Every byte of the source's files was read (no truncated or corrupt file), unless the crawl "
              "allows damaged files (blocks downstream)."),
    CheckKind("doc_id_unique", evaluate_doc_id_unique, lambda p: p.name in UNIQUE_TABLES, False,
              "Every doc_id occurs once.", output_only=True),
    CheckKind("ledger_consistency", evaluate_ledger_consistency, lambda p: p.name in LEDGER_PROGRAMS, False,
              "input = kept + quarantined + removed for every source, and the ledger rows match.", output_only=True),
    # On the remover that reads earlier crawls (it holds the crawl's output back) and the ledger.
    CheckKind("prior_crawls_current", evaluate_prior_crawls_current,
              lambda p: p.reads_prior and (p.stage is not None or p.name == "removal_ledger"), True,
              "The earlier crawls this crawl was deduplicated against have not been rerun with new parameters "
              "since (else a document could be lost from both; blocks downstream)."),
)
