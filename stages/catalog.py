"""The program catalog: every program, its level, dependencies and resources.

One name per concept: a program's ``name`` is its asset key, its module under
``stages/programs/``, the path segment of its outputs and its ``python -m stages`` word.
Removal programs also carry a ``stage`` word (``heuristic``, ``exact``, ...): the name used by
``curate run --stages``, the report and the ledger's ``stage`` column.

This module imports no program and no kernel: programs are loaded by name only when a task
executes (``stages.resolve.load_program``), so the orchestration package can plan a crawl without
numba, torch or a GPU, and programs can import the catalog without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from stages import params as P

Level = Literal["source", "crawl"]
QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Resources:
    """What one task of a program needs; turned into a pod spec by the orchestration package."""

    cpu: float = 1.0
    memory_gib: float = 2.0
    gpu: int = 0
    image: Literal["cpu", "gpu"] = "cpu"


@dataclass(frozen=True)
class Program:
    """One program: its asset key, partition level, params model, inputs and resources."""

    name: str
    level: Level
    params: type[P.ProgramParams]
    deps: tuple[str, ...]
    description: str
    group: str
    stage: str | None = None  # removal stage word, for programs whose output removes documents
    part_of: str | None = None  # the stage word of the chain an intermediate program belongs to
    reads_prior: bool = False  # reads the kept documents of earlier crawls (incremental dedup)
    sees_survivors: bool = False  # depends on every remover listed before it
    uses_keep_rule: bool = False
    resources: Resources = field(default_factory=Resources)


# The programs between ingestion and output, in dependency order. Those with a ``stage`` remove
# documents, in pipeline order (cheapest first): each sees only the survivors of the removers
# before it, and the first stage that removes a document is the one the ledger names. Add a
# program here; the output programs below pick its removal list up.
_MIDDLE: tuple[Program, ...] = (
    Program(
        "document_languages", "source", P.DocumentLanguagesParams, ("raw_documents",),
        "Language and score of every document (fastText lid.176 voted over prose lines), and a removal list.",
        group="filter", stage="language", resources=Resources(memory_gib=2.0),
    ),
    # The heuristics read the languages (their rule set follows them); the programs below that
    # read filtered_documents' survivors also read the language removal list.
    Program(
        "filtered_documents", "source", P.FilteredDocumentsParams, ("raw_documents", "document_languages"),
        "Heuristic scores (Gopher quality/repetition, C4 lines) and the keep decision per document (none when off).",
        group="filter", stage="heuristic",
    ),
    Program(
        "exact_duplicates", "crawl", P.ExactDuplicatesParams,
        ("raw_documents", "document_languages", "filtered_documents"),
        "Removal list of documents whose normalized text hash equals a kept document's.",
        group="dedup", stage="exact", uses_keep_rule=True, resources=Resources(memory_gib=4.0),
    ),
    Program(
        "minhash_signatures", "source", P.MinhashSignaturesParams,
        ("raw_documents", "document_languages", "filtered_documents", "exact_duplicates"),
        "MinHash signatures (character shingles) of the documents that survived heuristic and exact dedup.",
        group="dedup", part_of="fuzzy", resources=Resources(cpu=2.0, memory_gib=4.0),
    ),
    Program(
        "lsh_buckets", "crawl", P.LshBucketsParams, ("minhash_signatures",),
        "LSH band keys (the bucket index) and one anchor edge per bucket member, band by band.",
        group="dedup", part_of="fuzzy", reads_prior=True, resources=Resources(cpu=2.0, memory_gib=8.0),
    ),
    Program(
        "duplicate_components", "crawl", P.DuplicateComponentsParams, ("raw_documents", "lsh_buckets"),
        "Candidate edges checked against exact Jaccard, then connected components.",
        group="dedup", part_of="fuzzy", reads_prior=True, resources=Resources(cpu=2.0, memory_gib=8.0),
    ),
    # minhash_signatures: its reports count the documents that reached fuzzy dedup (``input``).
    Program(
        "fuzzy_duplicates", "crawl", P.FuzzyDuplicatesParams,
        ("raw_documents", "minhash_signatures", "duplicate_components"),
        "Removal list of near-duplicates: one survivor per component, each removed one names it.",
        group="dedup", stage="fuzzy", uses_keep_rule=True, reads_prior=True, resources=Resources(memory_gib=4.0),
    ),
    # Embeddings see only the survivors of every remover before them (language, heuristic,
    # exact, fuzzy): a document dropped by a cheaper stage is never embedded. A dedup parameter
    # change re-keys them, and the embedding cache (keyed by model and text) re-embeds only the
    # documents whose survival changed. Clusters and duplicates still read the exact and fuzzy
    # removal lists (nothing left to drop; they say so in ``dropped``).
    Program(
        "document_embeddings", "source", P.DocumentEmbeddingsParams, ("raw_documents",),
        "Sentence embeddings (L2-normalised, length-bucketed batches) of the exact/fuzzy survivors.",
        group="dedup", part_of="semantic", sees_survivors=True,
        resources=Resources(cpu=4.0, memory_gib=8.0, gpu=1, image="gpu"),
    ),
    Program(
        "semantic_clusters", "crawl", P.SemanticClustersParams,
        ("document_embeddings", "exact_duplicates", "fuzzy_duplicates"),
        "k-means clusters (fit on a sample, oversized clusters split again) of the exact/fuzzy survivors.",
        group="dedup", part_of="semantic", resources=Resources(cpu=4.0, memory_gib=16.0, gpu=1, image="gpu"),
    ),
    Program(
        "semantic_duplicates", "crawl", P.SemanticDuplicatesParams,
        ("semantic_clusters", "exact_duplicates", "fuzzy_duplicates"),
        "Removal list of documents within eps cosine of an earlier-ranked document of their cluster.",
        group="dedup", stage="semantic", uses_keep_rule=True,
        resources=Resources(cpu=4.0, memory_gib=8.0, gpu=1, image="gpu"),
    ),
    Program(
        "quality_scores", "source", P.QualityScoresParams, ("raw_documents",),
        "Classifier scores (fastText / local Hugging Face models, as a cascade) and a removal list.",
        group="classify", stage="quality", sees_survivors=True, resources=Resources(cpu=4.0, memory_gib=8.0),
    ),
    Program(
        "contaminated_documents", "crawl", P.ContaminatedDocumentsParams, ("raw_documents",),
        "Removal list of documents sharing benchmark n-grams, over all sources, before the output.",
        group="classify", stage="decontam", sees_survivors=True, resources=Resources(memory_gib=8.0),
    ),
)
# Programs marked ``sees_survivors`` read the removal lists of every remover before them.
_MIDDLE = tuple(
    replace(p, deps=(*p.deps, *(q.name for q in _MIDDLE[:i] if q.stage and q.name not in p.deps)))
    if p.sees_survivors else p
    for i, p in enumerate(_MIDDLE)
)
_REMOVERS = tuple(p.name for p in _MIDDLE if p.stage)

PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program(
            "raw_documents", "source", P.RawDocumentsParams, (),
            "Records of one source in one crawl, with a stable doc_id; bad records quarantined.",
            group="ingest",
        ),
        *_MIDDLE,
        Program(
            "curated_documents", "source", P.CuratedDocumentsParams, ("raw_documents", *_REMOVERS),
            "The curated output: raw documents minus every removal list.",
            group="output",
        ),
        Program(
            "removal_ledger", "crawl", P.RemovalLedgerParams,
            ("raw_documents", *_REMOVERS, "curated_documents"),
            "One row per removed or quarantined document, and the source x stage counts.",
            group="output", reads_prior=True,
        ),
    )
}

# Removal stages in pipeline order (cheapest first): the first stage that removes a document
# is the one the ledger names.
STAGES: dict[str, str] = {p.stage: p.name for p in PROGRAMS.values() if p.stage}


def waves() -> list[list[str]]:
    """The programs in dependency order, cut into waves: each wave is of one level (per source,
    or per crawl) and takes every program of that level whose inputs come from earlier waves or
    from earlier in the wave (same partition, so one run materializes a wave's partition in
    order). One pass in ``PROGRAMS``' topological order finds a wave's closure: a program's
    inputs come before it."""
    done: set[str] = set()
    out: list[list[str]] = []
    while len(done) < len(PROGRAMS):
        level = next(p.level for n, p in PROGRAMS.items() if n not in done and set(p.deps) <= done)
        wave: list[str] = []
        for name, program in PROGRAMS.items():
            if name not in done and program.level == level and set(program.deps) <= done.union(wave):
                wave.append(name)
        out.append(wave)
        done.update(wave)
    return out


def steps() -> list[str]:
    """The programs in the order a crawl's run takes them, a step each: ``waves`` flattened."""
    return [p for wave in waves() for p in wave]


def step_after(program: str) -> str | None:
    """The step a crawl's run takes after ``program``'s (``steps``), None after the last."""
    order = steps()
    at = order.index(program) + 1
    return order[at] if at < len(order) else None


def partition_name(program: str, crawl: str, source: str | None) -> str:
    """``program[crawl|source]`` or ``program[crawl]``: how messages name a program's partition."""
    return f"{program}[{crawl}|{source}]" if source is not None else f"{program}[{crawl}]"
