"""removal_ledger[crawl]: one row per removed or quarantined document, and the source x stage report.

Columns: doc_id, record_id, source, stage, reason, duplicate_of, duplicate_of_record_id, score,
detail. ``stage`` is ``quarantine`` or a removal stage word (``heuristic``, ``exact``, ...).
The report is checked before it is committed: for every source
``input == kept + quarantined + sum(removed)``, and the ledger holds exactly that many rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stages import filters
from stages.params import ExecutionParams, RemovalLedgerParams
from stages.paths import PartitionWriter
from stages.registry import PROGRAMS, QUARANTINE, STAGES, Inputs, Partition
from stages.removal import applied_programs, removed_table

LEDGER = pa.schema([
    ("doc_id", pa.string()),
    ("record_id", pa.string()),
    ("source", pa.string()),
    ("stage", pa.string()),
    ("reason", pa.string()),
    ("duplicate_of", pa.string()),
    ("duplicate_of_record_id", pa.string()),
    ("score", pa.float64()),
    ("detail", pa.string()),
])


HEURISTIC = "heuristic"
HEURISTIC_PROGRAM = STAGES[HEURISTIC]


class LedgerMismatch(RuntimeError):
    """Counts that do not add up: a removal was lost or counted twice."""


def _prior_record_ids(inputs: Inputs, doc_ids: set[str]) -> dict[str, str | None]:
    wanted = pa.array(sorted(doc_ids), pa.string())
    found: dict[str, str | None] = {}
    for outputs in inputs.prior.values():
        for name, pdir in sorted(outputs.items()):
            if name.startswith("raw_documents/"):
                t = inputs.store.read_table(pdir, "documents", ["doc_id", "record_id"])
                t = t.filter(pc.is_in(t["doc_id"], value_set=wanted))
                found.update(zip(t["doc_id"].to_pylist(), t["record_id"].to_pylist(), strict=True))
    return found


def run(
    params: RemovalLedgerParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: {"crawl", "sources": {source: {input, kept, quarantined, removed: {stage: n}}}}, and
    per source ``filters: {name: n}`` (of the heuristic removals, those of each custom filter)
    when the heuristic stage ran custom filters."""
    store = inputs.store
    sources = inputs.sources("raw_documents")
    record_ids: dict[str, str | None] = {}
    for s in sources:
        t = store.read_table(inputs.dir("raw_documents", s), "documents", ["doc_id", "record_id"])
        record_ids.update(zip(t["doc_id"].to_pylist(), t["record_id"].to_pylist(), strict=True))
    ledger_counts: Counter[tuple[str, str]] = Counter()
    reason_counts: Counter[tuple[str, str]] = Counter()  # heuristic removals per (source, reason)
    for s in sources:
        q = store.read_table(inputs.dir("raw_documents", s), "quarantine")
        n = q.num_rows
        output.write("ledger", pa.table({
            "doc_id": q["doc_id"], "record_id": q["record_id"], "source": q["source"],
            "stage": pa.array([QUARANTINE] * n, pa.string()), "reason": q["reason"],
            "duplicate_of": pa.nulls(n, pa.string()), "duplicate_of_record_id": pa.nulls(n, pa.string()),
            "score": pa.nulls(n, pa.float64()), "detail": q["detail"],
        }, schema=LEDGER))
        ledger_counts[(s, QUARANTINE)] += n
    seen: set[str] = set()
    for program in applied_programs(inputs):
        stage = PROGRAMS[program].stage
        assert stage is not None
        cols = ["doc_id", "source", "reason", "duplicate_of", "score"]
        rows = [r for s in sources for r in removed_table(inputs, program, s, cols).to_pylist()
                if r["doc_id"] not in seen]
        if not rows:
            continue
        seen.update(r["doc_id"] for r in rows)
        dup = [r["duplicate_of"] for r in rows]
        missing = {d for d in dup if d and d not in record_ids}
        if missing and inputs.prior:  # duplicates of documents kept by an earlier crawl
            record_ids.update(_prior_record_ids(inputs, missing))
        output.write("ledger", pa.table({
            "doc_id": [r["doc_id"] for r in rows],
            "record_id": [record_ids.get(r["doc_id"]) for r in rows],
            "source": [r["source"] for r in rows],
            "stage": [stage] * len(rows),
            "reason": [r["reason"] for r in rows],
            "duplicate_of": dup,
            "duplicate_of_record_id": [record_ids.get(d) if d else None for d in dup],
            "score": [r["score"] for r in rows],
            "detail": [None] * len(rows),
        }, schema=LEDGER))
        ledger_counts.update((r["source"], stage) for r in rows)
        if stage == HEURISTIC:
            reason_counts.update((r["source"], r["reason"]) for r in rows)
    if not output.tables.get("ledger"):
        output.write("ledger", LEDGER.empty_table())

    report: dict[str, Any] = {"crawl": partition.crawl, "sources": {}}
    for s in sources:
        cur = inputs.manifest("curated_documents", s).report
        entry = {"input": cur["input"], "kept": cur["kept"], "quarantined": cur["quarantined"],
                 "removed": cur["removed"]}
        total = entry["kept"] + entry["quarantined"] + sum(entry["removed"].values())
        if total != entry["input"]:
            raise LedgerMismatch(f"source {s}: input {entry['input']} != kept + quarantined + removed = {total}")
        for stage, n in [(QUARANTINE, entry["quarantined"]), *entry["removed"].items()]:
            if ledger_counts[(s, stage)] != n:
                raise LedgerMismatch(f"source {s}, stage {stage}: ledger has {ledger_counts[(s, stage)]} rows, "
                                     f"curated counts {n}")
        names = _custom_filters(inputs, s)
        if names:  # the custom filters' share of the heuristic removals, from the ledger's reasons
            entry["filters"] = {name: reason_counts[(s, filters.reason(name))] for name in names}
        report["sources"][s] = entry
    return report


def _custom_filters(inputs: Inputs, source: str) -> list[str]:
    """Names of the custom filters the heuristic stage ran for ``source`` (from its manifest)."""
    if HEURISTIC_PROGRAM not in inputs.dirs:
        return []
    params = inputs.manifest(HEURISTIC_PROGRAM, source).params
    return [f["name"] for f in params.get("filters", [])] if params.get("enabled", True) else []
