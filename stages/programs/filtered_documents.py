"""filtered_documents[source, crawl]: heuristic scores and the keep decision per document (none
where the heuristic stage is switched off: it judged nothing).

It sees only the survivors of the language stage, and its rule set follows their language
(``stages.kernels.heuristics.exemptions``: no word rules for Chinese, Japanese, Thai...; the
English stop-word rule for English only).

Scores and decisions are separate: scores depend only on the text and the scorer version and
are cached under ``heuristic_scores/<scorer key>/<crawl>/<source>`` (keyed by the raw data's
version), so changing a threshold re-keys this output but recomputes no score.

``params.rules`` picks the rule set: the default one, or the same thresholds with datatrove's
semantics (``stages.kernels.heuristics_datatrove``), whose scores are cached under their own key.

Custom filters (``params.filters``, ``stages.filters``, docs/filters.md) judge, in order, the
documents the built-in rules kept; each one's scores are cached the same way under its own key,
``filter:<name>`` is the reason of what it removes, and a filter that raises on a document fails the
partition naming both (``FilterFailed``): a document is never dropped or kept by an accident.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages import filters
from stages.cache import RowCache
from stages.kernels import heuristics as H
from stages.parallel import zip_results
from stages.params import CustomFilter, ExecutionParams, FilteredDocumentsParams
from stages.progress import Progress
from stages.removal import REMOVED, removal_table, survivor_count, survivors
from stages.reports import CustomFilterCounts, FilteredDocumentsReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

SCORES = "heuristic_scores"
# Each judged document: kept or not, the first rule it failed and that rule's measure.
DECISIONS = pa.schema([("doc_id", pa.string()), ("keep", pa.bool_()), ("reason", pa.string()), ("score", pa.float64())])


def _kernel(rules: str) -> ModuleType:
    """The scoring module of a rule set (``FilteredDocumentsParams.rules``); the datatrove one is
    imported only when used (its tokenizer rules take ~0.1 s to load)."""
    if rules == "datatrove":
        from stages.kernels import heuristics_datatrove

        return heuristics_datatrove
    return H


def _score_batch(batch: pa.RecordBatch, rules: str = "default") -> pa.Table:
    return _score_table(batch.column(1).to_pylist(), rules)


def _score_table(texts: list[str], rules: str = "default") -> pa.Table:
    kernel = _kernel(rules)
    scores = kernel.score_documents(texts)
    return pa.table({name: pa.array(scores[name], pa.float64()) for name in kernel.SCORE_NAMES})


CHUNK_CHARS = 4_000_000  # text per scoring task: long documents still spread over every worker


def _chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Re-cut record batches into pieces of about ``CHUNK_CHARS`` characters of text."""
    for batch in batches:
        lengths = pc.utf8_length(batch.column(1)).to_numpy(zero_copy_only=False)
        bounds = np.searchsorted(np.cumsum(lengths), np.arange(CHUNK_CHARS, lengths.sum() + CHUNK_CHARS, CHUNK_CHARS))
        start = 0
        for stop in sorted(set(np.minimum(bounds + 1, len(lengths)).tolist())):
            if stop > start:
                yield batch.slice(start, stop - start)
                start = stop


def _wanted(inputs: Inputs, source: str, execution: ExecutionParams) -> pa.Array:
    """doc_id of every survivor of the removers before this stage (the language stage), in
    ``raw_documents`` order: the rows every score table of this run is aligned to."""
    return pa.concat_arrays([pa.array([], pa.string())] + [
        t["doc_id"].combine_chunks() for t in survivors(inputs, source, ["doc_id"], execution.batch_rows)
    ])


def _cached(
    inputs: Inputs, partition: Partition, execution: ExecutionParams, wanted: pa.Array, ident: str,
    empty: pa.Table, score: Callable[[pa.RecordBatch], pa.Table], columns: list[str],
    progress: Progress | None = None,
) -> tuple[pa.Table, int]:
    """(doc_id + the score columns of ``empty`` for every ``wanted`` document, in its order;
    how many were scored now): from the cache ``heuristic_scores/<hash of ident>/<crawl>/<source>``
    (a ``stages.cache.RowCache``), the missing ones scored by ``score`` over batches of
    ``columns`` (doc_id and text first) and added to it. The cache holds every document ever
    scored for this ident (the raw data version is part of it), so a language setting that lets
    more documents through scores only those. ``progress``: given for the stage's main pass only
    (the built-in scores), not once per filter."""
    assert partition.source is not None
    empty = empty.add_column(0, "doc_id", pa.array([], pa.string()))
    cache = RowCache(inputs.store, SCORES, ident, partition.crawl, partition.source, empty.schema, table="scores")
    todo = wanted.filter(pa.array(cache.find(wanted) < 0))
    if len(todo):
        batches = (
            b for t in survivors(inputs, partition.source, columns, execution.batch_rows, progress=progress)
            for b in t.filter(pc.is_in(t["doc_id"], value_set=todo)).to_batches() if b.num_rows
        )
        for batch, scores in zip_results(_chunks(batches), score, execution):
            cache.add(scores.add_column(0, "doc_id", batch.column(0)))
    fresh = cache.added
    table = cache.content().combine_chunks()
    cache.save(compression=execution.intermediate_compression)
    # The wanted rows, in raw order (the cache holds them in the order they were scored).
    return table.take(pc.index_in(wanted, value_set=table["doc_id"])), fresh


def _scores(
    inputs: Inputs, partition: Partition, execution: ExecutionParams, wanted: pa.Array, rules: str = "default"
) -> pa.Table:
    """doc_id + one float64 column per built-in score of every ``wanted`` document, cached by the
    scorer version, the raw data's version and the rule set (``params.rules``)."""
    assert partition.source is not None
    raw = inputs.manifest("raw_documents", partition.source)
    mode = "" if rules == "default" else f"/{rules}"  # the default key predates the modes
    table, _ = _cached(inputs, partition, execution, wanted, f"{H.SCORER_VERSION}/{raw.data_version}{mode}",
                       _score_table([], rules), partial(_score_batch, rules=rules), ["doc_id", "text"],
                       partition.progress)
    return table


class _FilterScorer:
    """Scores a batch (doc_id, text, record_id) with one custom filter, built once per process;
    picklable (the reference and kwargs travel, not the instance) for the process pool and Ray."""

    def __init__(self, spec: CustomFilter) -> None:
        self.ref, self.kwargs, self.name = spec.filter, dict(spec.kwargs), spec.name

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        instance = filters.build(self.ref, self.kwargs)
        docs = [f"{d} (record {r})" if r is not None else d
                for d, r in zip(batch.column(0).to_pylist(), batch.column(2).to_pylist(), strict=True)]
        values = [filters.score_one(instance, self.name, doc, text)
                  for doc, text in zip(docs, batch.column(1).to_pylist(), strict=True)]
        return pa.table({"score": pa.array(values, pa.float64())})


def _filter_scores(
    inputs: Inputs, partition: Partition, execution: ExecutionParams, wanted: pa.Array, spec: CustomFilter
) -> tuple[np.ndarray, int]:
    """float64 (n,): the custom filter's score of every ``wanted`` document, and how many were
    scored now. Cached like the built-in scores, keyed by the raw data version and the filter's
    reference, version and kwargs (less the ``keep_kwargs`` that only ``keep`` reads)."""
    assert partition.source is not None
    raw = inputs.manifest("raw_documents", partition.source)
    kwargs = {k: v for k, v in sorted(spec.kwargs.items()) if k not in spec.keep_kwargs}
    about = {"filter": spec.filter, "version": spec.version, "kwargs": kwargs}
    ident = json.dumps({**about, "raw": raw.data_version}, sort_keys=True)
    empty = pa.table({"score": pa.array([], pa.float64())})
    try:
        table, fresh = _cached(inputs, partition, execution, wanted, ident, empty, _FilterScorer(spec),
                               ["doc_id", "text", "record_id"])
    except filters.FilterError as exc:  # from a Ray task: its text is the worker's traceback
        raise filters.unwrapped(exc) from None
    return table["score"].to_numpy(), fresh


def _languages(inputs: Inputs, source: str, doc_id: pa.Array) -> np.ndarray:
    """object (n,): the language of each document (None where the language stage did not run)."""
    if "document_languages" not in inputs.dirs:
        return np.full(len(doc_id), None, dtype=object)
    t = inputs.read("document_languages", "languages", source, ["doc_id", "language"])
    pos = pc.index_in(doc_id, value_set=t["doc_id"].combine_chunks())
    return np.asarray(t["language"].combine_chunks().take(pos).to_pylist(), dtype=object)


def _custom_filters(
    params: FilteredDocumentsParams, inputs: Inputs, partition: Partition, execution: ExecutionParams,
    wanted: pa.Array, keep: np.ndarray, reason: np.ndarray, score: np.ndarray, fails: dict[str, int],
) -> dict[str, dict[str, int]]:
    """Each custom filter in order judges the documents that the built-in rules and the filters
    before it kept (no scoring of the doomed, as the stages do), in place: a document it rejects
    gets the reason ``filter:<name>`` and the filter's score. Returns {name: {version, input
    (documents it judged), scored (now, not from the cache), removed}}."""
    out: dict[str, dict[str, int]] = {}
    for spec in params.filters:
        rows = np.flatnonzero(keep)
        judged = wanted.take(pa.array(rows, pa.int64()))
        values, fresh = _filter_scores(inputs, partition, execution, judged, spec)
        instance = filters.build(spec.filter, spec.kwargs)
        ok = np.fromiter((filters.keep_one(instance, spec.name, d, v)
                          for d, v in zip(judged.to_pylist(), values.tolist(), strict=True)), bool, len(rows))
        rejected = rows[~ok]
        reason[rejected] = filters.reason(spec.name)
        score[rejected] = values[~ok]
        keep[rejected] = False
        fails[filters.reason(spec.name)] = len(rejected)
        out[spec.name] = {"version": spec.version, "input": len(rows), "scored": fresh, "removed": len(rejected)}
    return out


def run(
    params: FilteredDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> FilteredDocumentsReport:
    """Report: input, kept, removed, removed per rule (first failing), fails per rule (any)."""
    assert partition.source is not None
    if not params.enabled:
        # No decisions: the stage judged nothing, as a switched-off language stage identifies
        # nothing. (It listed every document, kept: at 200 sources a read of every source's ids, a
        # part and two fsyncs a partition, 0.3 s of the crawl.) No params version bump: no program
        # reads this table, and a bump would re-key every later output of every crawl; partitions
        # written before keep their full table.
        output.write("decisions", DECISIONS.empty_table())
        output.write("removed", REMOVED.empty_table())
        n = survivor_count(inputs, partition.source)
        return FilteredDocumentsReport(enabled=False, input=n, kept=n, removed=0, removed_per_reason={})
    kernel = _kernel(params.rules)
    wanted = _wanted(inputs, partition.source, execution)
    table = _scores(inputs, partition, execution, wanted, params.rules)
    scores = {name: table[name].to_numpy() for name in kernel.SCORE_NAMES}
    language = _languages(inputs, partition.source, table["doc_id"].combine_chunks())
    exempt = kernel.exemptions(language)
    keep, reason, fails = H.decide(scores, params, exempt, kernel.RULE_TABLE)
    # The value of the rule that removed the document, for the ledger's score column.
    score = np.full(len(keep), np.nan)
    for rule in kernel.RULE_TABLE:
        rows = reason == rule.name
        if rows.any():
            score[rows] = scores[rule.score][rows]
    custom = _custom_filters(params, inputs, partition, execution, wanted, keep, reason, score, fails)
    decisions = pa.table({
        "doc_id": table["doc_id"],
        "keep": pa.array(keep, pa.bool_()),
        "reason": pa.array(reason.tolist(), pa.string()),
        "score": pa.array(score, pa.float64(), mask=np.isnan(score)),
    }, schema=DECISIONS)
    output.write("decisions", decisions)
    gone = ~keep
    output.write("removed", removal_table(
        table["doc_id"].to_numpy(zero_copy_only=False)[gone], np.full(int(gone.sum()), partition.source, object),
        "", None, None, score[gone], reasons=reason[gone],
    ))
    removed_per_reason: dict[str, int] = {}
    for r in reason[~keep].tolist():
        removed_per_reason[r] = removed_per_reason.get(r, 0) + 1
    # Set only where they apply (languages known, custom filters run): the JSON stays as short as the run.
    optional: dict[str, Any] = {}
    if any(x is not None for x in language):
        optional["word_rules_off"] = int(exempt[kernel.RULE_TABLE[0].name].sum())
    if custom:
        optional["custom_filters"] = {name: CustomFilterCounts(**c) for name, c in custom.items()}
    return FilteredDocumentsReport(
        enabled=True,
        rules=params.rules,
        input=len(keep),
        kept=int(keep.sum()),
        removed=int((~keep).sum()),
        removed_per_reason=dict(sorted(removed_per_reason.items())),
        fails_per_rule={k: int(v) for k, v in sorted(fails.items()) if v},
        **optional,
    )
