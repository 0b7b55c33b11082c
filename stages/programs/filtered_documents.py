"""filtered_documents[source, crawl]: heuristic scores and the keep decision per document.

It sees only the survivors of the language stage, and its rule set follows their language
(``stages.kernels.heuristics.exemptions``: no word rules for Chinese, Japanese, Thai...; the
English stop-word rule for English only).

Scores and decisions are separate: scores depend only on the text and the scorer version and
are cached under ``heuristic_scores/<scorer key>/<crawl>/<source>`` (keyed by the raw data's
version), so changing a threshold re-keys this output but recomputes no score.

``params.rules`` picks the rule set: the default one, or the same thresholds with datatrove's
semantics (``stages.kernels.heuristics_datatrove``), whose scores are cached under their own key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stages.kernels import heuristics as H
from stages.parallel import zip_results
from stages.params import ExecutionParams, FilteredDocumentsParams
from stages.paths import Manifest, PartitionBusy, PartitionWriter
from stages.registry import Inputs, Partition
from stages.removal import REMOVED, removal_table, survivors

SCORES = "heuristic_scores"


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


def _scores(inputs: Inputs, partition: Partition, execution: ExecutionParams, rules: str = "default") -> pa.Table:
    """doc_id + one float64 column per score for every survivor of the removers before this
    stage (the language stage), in ``raw_documents`` order: from the cache, the missing ones
    computed and added to it. The cache holds the scores of every document ever scored for this
    raw data version, so a language setting that lets more documents through scores only those."""
    assert partition.source is not None
    raw = inputs.manifest("raw_documents", partition.source)
    mode = "" if rules == "default" else f"/{rules}"  # the default key predates the modes
    key = hashlib.sha256(f"{H.SCORER_VERSION}/{raw.data_version}{mode}".encode()).hexdigest()[:16]
    store = inputs.store
    cache_dir = store.partition_dir(SCORES, key, partition.crawl, partition.source)
    empty = _score_table([], rules).add_column(0, "doc_id", pa.array([], pa.string()))
    cached = store.read_table(cache_dir, "scores") if store.read_manifest(cache_dir) is not None else empty
    wanted = pa.concat_arrays([pa.array([], pa.string())] + [
        t["doc_id"].combine_chunks() for t in survivors(inputs, partition.source, ["doc_id"], execution.batch_rows)
    ])
    missing = pc.invert(pc.is_in(wanted, value_set=cached["doc_id"].combine_chunks()))
    fresh: list[pa.Table] = [empty]
    if pc.any(missing).as_py():
        todo = wanted.filter(missing)
        batches = (
            b for t in survivors(inputs, partition.source, ["doc_id", "text"], execution.batch_rows,
                                 progress=partition.progress)
            for b in t.filter(pc.is_in(t["doc_id"], value_set=todo)).to_batches() if b.num_rows
        )
        for batch, scores in zip_results(_chunks(batches), partial(_score_batch, rules=rules), execution):
            fresh.append(scores.add_column(0, "doc_id", batch.column(0)))
    table = pa.concat_tables([cached, *fresh]).combine_chunks()
    if len(fresh) > 1 or store.read_manifest(cache_dir) is None:
        try:
            writer = store.writer(cache_dir)
        except PartitionBusy:  # another attempt is filling this cache right now: go on without it
            writer = None
        if writer is not None:
            try:
                writer.write("scores", table)
                writer.commit(Manifest(SCORES, key, key, partition.crawl, partition.source,
                                       {"scorer_version": H.SCORER_VERSION, "rules": rules}))
            finally:
                writer.close()
    # The survivors' rows, in raw order (the cache holds them in the order they were scored).
    return table.take(pc.index_in(wanted, value_set=table["doc_id"]))


def _languages(inputs: Inputs, source: str, doc_id: pa.Array) -> np.ndarray:
    """object (n,): the language of each document (None where the language stage did not run)."""
    if "document_languages" not in inputs.dirs:
        return np.full(len(doc_id), None, dtype=object)
    t = inputs.store.read_table(inputs.dir("document_languages", source), "languages", ["doc_id", "language"])
    pos = pc.index_in(doc_id, value_set=t["doc_id"].combine_chunks())
    return np.asarray(t["language"].combine_chunks().take(pos).to_pylist(), dtype=object)


def run(
    params: FilteredDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> dict[str, Any]:
    """Report: input, kept, removed, removed per rule (first failing), fails per rule (any)."""
    assert partition.source is not None
    if not params.enabled:
        ids = pa.concat_tables([pa.table({"doc_id": pa.array([], pa.string())}), *(
            t.select(["doc_id"]) for t in survivors(inputs, partition.source, ["doc_id"], execution.batch_rows))])
        n = ids.num_rows
        output.write("decisions", pa.table({
            "doc_id": ids["doc_id"], "keep": pa.array(np.ones(n, bool)),
            "reason": pa.nulls(n, pa.string()), "score": pa.nulls(n, pa.float64()),
        }))
        output.write("removed", REMOVED.empty_table())
        return {"enabled": False, "input": n, "kept": n, "removed": 0, "removed_per_reason": {}}
    kernel = _kernel(params.rules)
    table = _scores(inputs, partition, execution, params.rules)
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
    decisions = pa.table({
        "doc_id": table["doc_id"],
        "keep": pa.array(keep, pa.bool_()),
        "reason": pa.array(reason.tolist(), pa.string()),
        "score": pa.array(score, pa.float64(), mask=np.isnan(score)),
    })
    output.write("decisions", decisions)
    gone = ~keep
    output.write("removed", removal_table(
        table["doc_id"].to_numpy(zero_copy_only=False)[gone], np.full(int(gone.sum()), partition.source, object),
        "", None, None, score[gone], reasons=reason[gone],
    ))
    removed_per_reason: dict[str, int] = {}
    for r in reason[~keep].tolist():
        removed_per_reason[r] = removed_per_reason.get(r, 0) + 1
    per_language = {}
    if any(x is not None for x in language):
        per_language = {"word_rules_off": int(exempt[kernel.RULE_TABLE[0].name].sum())}
    return {
        "enabled": True,
        "rules": params.rules,
        **per_language,
        "input": len(keep),
        "kept": int(keep.sum()),
        "removed": int((~keep).sum()),
        "removed_per_reason": dict(sorted(removed_per_reason.items())),
        "fails_per_rule": {k: int(v) for k, v in sorted(fails.items()) if v},
    }
