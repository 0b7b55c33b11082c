"""contaminated_documents[crawl]: documents that contain benchmark text, over all sources of a crawl.

Runs after every other remover and before the curated output, so nothing contaminated is
mixed or upsampled (the "late decontamination" failure mode). The benchmark sets
(``stages.decontam_sets``) become one ``NgramIndex`` of 64-bit n-gram hashes, 12 bytes per
distinct (n-gram, example): memory grows with the benchmarks, never with the crawl, which is
streamed in batches (tested under 30 bytes a document, measured 13-16:
tests/stages/programs/test_crawl_memory.py); per document of a source, only the
ids the earlier stages removed from it (~36 bytes each) while it is read.

Each removed document gets a ``removed`` row with
``reason = "benchmark:<benchmark>"``, ``duplicate_of = "<benchmark>:<example_id>"`` (the
example sharing the most n-grams with it), ``duplicate_of_source`` null and
``score`` = the number of distinct n-grams it shares with that example.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import numpy as np

from stages.decontam_sets import Example, load_examples
from stages.kernels import decontam as D
from stages.params import ContaminatedDocumentsParams, ExecutionParams
from stages.removal import REMOVED, removal_table, survivors
from stages.reports import BenchmarkStats, ContaminatedDocumentsReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

NO_BENCHMARK = "no benchmark configured"


def run(
    params: ContaminatedDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> ContaminatedDocumentsReport:
    """Report: input, removed, removed_per_source, removed_per_reason and, per benchmark, its
    examples and n-grams, documents removed (per source), documents with any shared n-gram,
    and examples found."""
    if not params.enabled or not params.benchmarks:
        output.write("removed", REMOVED.empty_table())
        if params.enabled:
            return ContaminatedDocumentsReport(enabled=True, input=0, removed=0, removed_per_source={},
                                               removed_per_reason={}, note=NO_BENCHMARK)
        return ContaminatedDocumentsReport.switched_off()

    t0 = time.perf_counter()
    examples: list[Example] = [e for b in params.benchmarks for e in load_examples(b)]
    index = D.build_index([e.texts for e in examples], params.ngram)
    index_seconds = time.perf_counter() - t0
    bench_of = np.array([e.benchmark for e in examples], dtype=object)

    total = 0
    per_source: Counter[str] = Counter()
    per_bench: dict[str, Counter[str]] = defaultdict(Counter)
    any_match: Counter[str] = Counter()
    examples_hit: dict[str, set[str]] = defaultdict(set)
    for source in inputs.sources("raw_documents"):
        for table in survivors(inputs, source, ["doc_id", "text"], execution.batch_rows,
                               progress=partition.progress):
            total += table.num_rows
            best, count, anyc = D.match(index, table["text"].to_pylist())
            for e in best[anyc > 0].tolist():
                any_match[examples[e].benchmark] += 1
            hit = np.flatnonzero(count >= params.min_matches)
            if not len(hit):
                continue
            ex = [examples[e] for e in best[hit].tolist()]
            ids = table["doc_id"].to_numpy(zero_copy_only=False)[hit]
            output.write("removed", removal_table(
                ids, np.full(len(hit), source, object), "",
                np.array([f"{e.benchmark}:{e.example_id}" for e in ex], dtype=object), None,
                count[hit].astype(np.float64), reasons=np.array([f"benchmark:{e.benchmark}" for e in ex], object),
            ))
            per_source[source] += len(hit)
            for e in ex:
                per_bench[e.benchmark][source] += 1
                examples_hit[e.benchmark].add(e.example_id)
    if not output.tables.get("removed"):
        output.write("removed", REMOVED.empty_table())

    benchmarks: dict[str, BenchmarkStats] = {}
    for b in params.benchmarks:
        mine = bench_of == b.name
        benchmarks[b.name] = BenchmarkStats(
            examples=int(mine.sum()),
            ngrams=int(index.example_ngrams[mine].sum()),
            examples_without_ngrams=int((index.example_ngrams[mine] == 0).sum()),
            removed=sum(per_bench[b.name].values()),
            removed_per_source=dict(sorted(per_bench[b.name].items())),
            docs_with_any_match=any_match[b.name],
            examples_found=len(examples_hit[b.name]),
        )
    seconds = time.perf_counter() - t0
    return ContaminatedDocumentsReport(
        enabled=True,
        input=total,
        removed=sum(per_source.values()),
        removed_per_source=dict(sorted(per_source.items())),
        removed_per_reason={f"benchmark:{name}": v.removed for name, v in benchmarks.items() if v.removed},
        ngram=params.ngram,
        min_matches=params.min_matches,
        index_ngrams=len(index.hashes),
        index_mib=round(index.nbytes / 2**20, 3),
        index_seconds=round(index_seconds, 3),
        docs_per_s=round(total / max(seconds - index_seconds, 1e-9), 1),
        benchmarks=benchmarks,
    )
