"""removal_ledger[crawl]: one row per removed or quarantined document, and the source x stage report.

Columns: doc_id, record_id, source, stage, reason, duplicate_of, duplicate_of_record_id,
duplicate_of_source, duplicate_of_crawl, score, detail. ``stage`` is ``quarantine`` or a removal
stage word (``heuristic``, ``exact``, ...); ``duplicate_of_crawl`` is the crawl that kept the
document a duplicate was removed for: this crawl, or an earlier one it was deduplicated against.
The report is checked before it is committed: for every source
``input == kept + quarantined + sum(removed)``, and the ledger holds exactly that many rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages import filters
from stages.catalog import PROGRAMS, QUARANTINE, STAGES
from stages.errors import StageError
from stages.keep import ID_BYTES, fixed_ids
from stages.params import ExecutionParams, RemovalLedgerParams
from stages.removal import applied_programs, kept_where
from stages.reports import CuratedDocumentsReport, LedgerSource, RemovalLedgerReport, read_as
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

LEDGER = pa.schema([
    ("doc_id", pa.string()),
    ("record_id", pa.string()),
    ("source", pa.string()),
    ("stage", pa.string()),
    ("reason", pa.string()),
    ("duplicate_of", pa.string()),
    ("duplicate_of_record_id", pa.string()),
    ("duplicate_of_source", pa.string()),  # the kept document's source
    ("duplicate_of_crawl", pa.string()),  # the kept document's crawl (this one or an earlier one)
    ("score", pa.float64()),
    ("detail", pa.string()),
])
QUARANTINE_COLUMNS = ["doc_id", "record_id", "source", "reason", "detail", "duplicate_of"]


HEURISTIC = "heuristic"
HEURISTIC_PROGRAM = STAGES[HEURISTIC]


class LedgerMismatch(StageError):
    """Counts that do not add up: a removal was lost or counted twice."""


def _ids32(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(``"S32"`` ids, bool mask of the rows that hold a doc_id): nulls and other values (a
    decontam ``duplicate_of`` names a benchmark example) are masked out."""
    ok = pc.fill_null(pc.equal(pc.binary_length(keys), ID_BYTES), False)
    filled = pc.if_else(ok, keys, "0" * ID_BYTES)  # every row 32 bytes: read without Python objects
    return fixed_ids(filled), np.asarray(ok.to_numpy(zero_copy_only=False), bool)


def _positions(ids: np.ndarray, ok: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of each id in the sorted ``wanted`` (``len(wanted)`` where it is not there)."""
    if not len(wanted):
        return np.zeros(len(ids), np.int64)
    pos = np.minimum(np.searchsorted(wanted, ids), len(wanted) - 1)
    return np.where(ok & (wanted[pos] == ids), pos, len(wanted))


def _record_ids(inputs: Inputs, wanted: np.ndarray, batch_rows: int) -> pa.Array:
    """The record_id of each of the ``wanted`` doc_ids (sorted ``"S32"``; null where none is),
    streamed out of ``raw_documents`` of this crawl, then, for those not found, of the earlier
    crawls it is deduplicated against (the kept copy of a cross-crawl duplicate). Memory: the
    wanted ids, their record ids and one batch."""
    positions: list[np.ndarray] = []
    values: list[pa.Array] = []
    missing = np.ones(len(wanted), bool)
    groups = [[inputs.dir("raw_documents", s) for s in inputs.sources("raw_documents")],
              [pdir for outputs in inputs.prior.values()
               for name, pdir in sorted(outputs.items()) if name.startswith("raw_documents/")]]
    for group in groups:
        if not missing.any():
            break
        for block in inputs.store.iter_blocks(group, "documents", ["doc_id", "record_id"], batch_rows):
            pos = _positions(*_ids32(block.column(0)), wanted)
            hit = pos < len(wanted)
            hit[hit] = missing[pos[hit]]
            if hit.any():
                positions.append(pos[hit])
                values.append(block.column(1).filter(pa.array(hit)).combine_chunks())
        for pos in positions:
            missing[pos] = False
    found = pa.concat_arrays([*[v.cast(pa.string()) for v in values], pa.nulls(1, pa.string())])
    index = np.full(len(wanted), len(found) - 1, np.int64)  # the null at the end
    if positions:
        index[np.concatenate(positions)] = np.arange(len(found) - 1)
    return found.take(pa.array(index))


def _lookup(keys: pa.Array | pa.ChunkedArray, wanted: np.ndarray, record_ids: pa.Array) -> pa.Array:
    """The record_id of each of ``keys`` (doc_ids among ``wanted``; null where none), in order."""
    with_null = pa.concat_arrays([record_ids, pa.nulls(1, pa.string())])
    return with_null.take(pa.array(_positions(*_ids32(keys), wanted)))


def _counts(table: pa.Table) -> dict[str, int]:
    """Rows per source."""
    grouped = table.group_by("source").aggregate([("doc_id", "count")])
    return dict(zip(grouped["source"].to_pylist(), grouped["doc_id_count"].to_pylist(), strict=True))


def _removed(inputs: Inputs, program: str, sources: list[str], columns: list[str]) -> pa.Table:
    """``program``'s removed rows of ``sources``, source by source in their order (a crawl-level
    table is read once and ordered by source, stably)."""
    if PROGRAMS[program].level == "source":
        tables: list[pa.Table] = []
        for s in sources:
            manifest = inputs.manifest(program, s)
            if tables and manifest.rows.get("removed") == 0:
                continue  # an empty list (a stage that removed nothing: at every source): not read
            tables.append(inputs.store.read_table(inputs.dir(program, s), "removed", sorted({*columns, "source"}),
                                                  manifest).select(columns))
        return pa.concat_tables(tables)
    t = inputs.read(program, "removed", columns=columns)
    rank = pc.index_in(t["source"], value_set=pa.array(sources, pa.string()))
    t = t.filter(pc.is_valid(rank))
    order = np.argsort(pc.drop_null(rank).to_numpy(zero_copy_only=False), kind="stable")
    return t.take(pa.array(order))


def run(
    params: RemovalLedgerParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> RemovalLedgerReport:
    """Report: {"crawl", "sources": {source: {input, kept, quarantined, removed, removed_per_stage:
    {stage: n}}}}, and per source ``filters: {name: n}`` (of the heuristic removals, those of each custom filter)
    when the heuristic stage ran custom filters.

    Columnar throughout (Arrow compute, tables streamed in batches of ``batch_rows``): no Python
    object per document, so a crawl of any size costs its removed rows' columns and one batch."""
    store = inputs.store
    sources = inputs.sources("raw_documents")
    ledger_counts: Counter[tuple[str, str]] = Counter()
    reason_counts: Counter[tuple[str, str]] = Counter()  # heuristic removals per (source, reason)
    earlier_counts: Counter[tuple[str, str, str]] = Counter()  # (source, stage, earlier crawl): removals
    for s in sources:
        for batch in store.iter_batches(inputs.dir("raw_documents", s), "quarantine", QUARANTINE_COLUMNS,
                                        execution.batch_rows):
            n = batch.num_rows
            kept, none = pc.is_valid(batch["duplicate_of"]), pa.scalar(None, pa.string())
            output.write("ledger", pa.table({
                "doc_id": batch["doc_id"], "record_id": batch["record_id"], "source": batch["source"],
                "stage": pa.repeat(pa.scalar(QUARANTINE, pa.string()), n), "reason": batch["reason"],
                # duplicate_record_id: the kept document, of the same record id, source and crawl by definition
                "duplicate_of": batch["duplicate_of"],
                "duplicate_of_record_id": pc.if_else(kept, batch["record_id"], none),
                "duplicate_of_source": pc.if_else(kept, batch["source"], none),
                "duplicate_of_crawl": pc.if_else(kept, pa.scalar(partition.crawl, pa.string()), none),
                "score": pa.nulls(n, pa.float64()), "detail": batch["detail"],
            }, schema=LEDGER))
            ledger_counts[(s, QUARANTINE)] += n
    # Each removing program's rows, without documents an earlier program removed already.
    removed: list[tuple[str, pa.Table]] = []
    seen = np.zeros(0, f"S{ID_BYTES}")  # sorted
    for program in applied_programs(inputs):
        stage = PROGRAMS[program].stage
        assert stage is not None
        t = _removed(inputs, program, sources,
                     ["doc_id", "source", "reason", "duplicate_of", "duplicate_of_source", "score"])
        t = t.combine_chunks()
        ids, ok = _ids32(t["doc_id"])
        if len(seen):
            fresh = _positions(ids, ok, seen) == len(seen)
            t, ids, ok = t.filter(pa.array(fresh)), ids[fresh], ok[fresh]
        if t.num_rows:
            removed.append((stage, t))
            seen = np.sort(np.concatenate([seen, ids[ok]]))
    # Every doc_id whose record_id a row names: the removed ones and the kept copies.
    dups = [_ids32(t["duplicate_of"]) for _, t in removed]
    wanted = np.unique(np.concatenate([seen, *[ids[ok] for ids, ok in dups]]))
    del dups
    record_ids = _record_ids(inputs, wanted, execution.batch_rows)
    for stage, t in removed:
        n = t.num_rows
        kept_source, kept_crawl = kept_where(t["duplicate_of_source"], partition.crawl)
        output.write("ledger", pa.table({
            "doc_id": t["doc_id"], "record_id": _lookup(t["doc_id"], wanted, record_ids), "source": t["source"],
            "stage": pa.repeat(pa.scalar(stage, pa.string()), n), "reason": t["reason"],
            "duplicate_of": t["duplicate_of"],
            "duplicate_of_record_id": _lookup(t["duplicate_of"], wanted, record_ids),
            "duplicate_of_source": kept_source, "duplicate_of_crawl": kept_crawl,
            "score": t["score"].cast(pa.float64()), "detail": pa.nulls(n, pa.string()),
        }, schema=LEDGER))
        ledger_counts.update({(source, stage): count for source, count in _counts(t).items()})
        earlier_counts.update(_earlier_crawl_counts(t["source"], kept_crawl, stage, partition.crawl))
        if stage == HEURISTIC:
            by_reason = t.group_by(["source", "reason"]).aggregate([("doc_id", "count")])
            reason_counts.update(dict(zip(zip(by_reason["source"].to_pylist(), by_reason["reason"].to_pylist(),
                                              strict=True), by_reason["doc_id_count"].to_pylist(), strict=True)))
    if not output.tables.get("ledger"):
        output.write("ledger", LEDGER.empty_table())

    entries: dict[str, LedgerSource] = {}
    for s in sources:
        cur = read_as(inputs.manifest("curated_documents", s), CuratedDocumentsReport)
        adds_up, total = cur.adds_up()
        if not adds_up:
            raise LedgerMismatch(f"source {s}: input {cur.input} != kept + quarantined + removed = {total}")
        for stage, n in [(QUARANTINE, cur.quarantined), *cur.removed_per_stage.items()]:
            if ledger_counts[(s, stage)] != n:
                raise LedgerMismatch(f"source {s}, stage {stage}: ledger has {ledger_counts[(s, stage)]} rows, "
                                     f"curated counts {n}")
        names = _custom_filters(inputs, s)
        # the custom filters' share of the heuristic removals, from the ledger's reasons (set only if any)
        custom = {"filters": {name: reason_counts[(s, filters.reason(name))] for name in names}} if names else {}
        earlier: dict[str, dict[str, int]] = {}
        for (source, stage, crawl), n in sorted(earlier_counts.items()):
            if source == s:
                earlier.setdefault(stage, {})[crawl] = n
        extra: dict[str, Any] = dict(custom)
        if earlier:  # set only if any: a crawl deduplicated against no earlier crawl keeps its short report
            extra["earlier_crawl_duplicates"] = earlier
        entries[s] = LedgerSource(input=cur.input, kept=cur.kept, quarantined=cur.quarantined, removed=cur.removed,
                                  removed_per_stage=cur.removed_per_stage, **extra)
    return RemovalLedgerReport(crawl=partition.crawl, sources=entries)


def _earlier_crawl_counts(source: pa.ChunkedArray | pa.Array, kept_crawl: pa.Array, stage: str,
                          crawl: str) -> dict[tuple[str, str, str], int]:
    """(source, stage, earlier crawl) -> removals of ``stage`` whose kept document an earlier
    crawl holds (``kept_crawl`` neither null nor ``crawl``): counted apart from the duplicates
    within this crawl."""
    earlier = pc.fill_null(pc.not_equal(kept_crawl, crawl), False)
    if not pc.any(earlier).as_py():
        return {}
    t = pa.table({"source": source, "crawl": kept_crawl}).filter(earlier)
    g = t.group_by(["source", "crawl"]).aggregate([([], "count_all")])
    return {(s, stage, c): n for s, c, n in zip(g["source"].to_pylist(), g["crawl"].to_pylist(),
                                                 g["count_all"].to_pylist(), strict=True)}


def _custom_filters(inputs: Inputs, source: str) -> list[str]:
    """Names of the custom filters the heuristic stage ran for ``source`` (from its manifest)."""
    if HEURISTIC_PROGRAM not in inputs.dirs:
        return []
    params = inputs.manifest(HEURISTIC_PROGRAM, source).params
    return [f["name"] for f in params.get("filters", [])] if params.get("enabled", True) else []
