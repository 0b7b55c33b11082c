"""The stage programs, their dependencies and resources, and how one crawl is planned and run.

One name per concept: a program's ``name`` is its asset key, its module under
``stages/programs/``, the path segment of its outputs and its ``python -m stages`` word.
Removal programs also carry a ``stage`` word (``heuristic``, ``exact``, ...): the name used by
``curate run --stages``, the report and the ledger's ``stage`` column.

This module imports no kernels: program modules are loaded only when a task executes, so the
orchestration package can plan a crawl without numba, torch or a GPU.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from stages import params as P
from stages.backend import reported as reported_backend
from stages.paths import Manifest, PartitionWriter, Store, check_name
from stages.progress import Progress
from stages.reports import Report, read

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
    name: str
    level: Level
    params: type[P.StageParams]
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
        "Heuristic scores (Gopher quality/repetition, C4 lines) and the keep decision per document.",
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
    Program(
        "fuzzy_duplicates", "crawl", P.FuzzyDuplicatesParams, ("raw_documents", "duplicate_components"),
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


def removal_programs() -> list[Program]:
    return [PROGRAMS[name] for name in STAGES.values()]


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


class CrawlSpec(BaseModel):
    """Everything that defines one crawl's outputs: its sources and every stage's parameters."""

    # A rejected value (a source URL with a password in it) is never echoed in the error.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    crawl: str
    sources: dict[str, P.RawDocumentsParams]
    stages: tuple[str, ...] = Field(default_factory=lambda: tuple(STAGES))
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    keep: P.KeepParams = Field(default_factory=P.KeepParams)
    # Earlier crawls whose kept documents this crawl is deduplicated against, each with the keys
    # of the outputs read from it (``prior_outputs``); fixed when the crawl is first registered.
    dedup_against: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Accept sources with damaged files (their records before the damage): the ``input_complete``
    # check then passes with a warning instead of holding the crawl back. Keys no output.
    allow_damaged_files: bool = False

    def model_post_init(self, __context: Any) -> None:
        check_name("crawl", self.crawl)
        for name in self.sources:
            check_name("source", name)
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)}; known: {', '.join(STAGES)}")
        bad = set(self.params) - set(PROGRAMS)
        if bad:
            raise ValueError(f"params for unknown program(s) {sorted(bad)}; known: {', '.join(PROGRAMS)}")

    def program_params(self, program: str, source: str | None = None) -> P.StageParams:
        prog = PROGRAMS[program]
        if program == "raw_documents":
            assert source is not None
            return self.sources[source]
        values = dict(self.params.get(program, {}))
        if prog.stage is not None or prog.part_of is not None:
            values["enabled"] = (prog.stage or prog.part_of) in self.stages
        return prog.params(**values)

    def partitions(self, program: str) -> list[str | None]:
        return list(sorted(self.sources)) if PROGRAMS[program].level == "source" else [None]

    def upstream(self, program: str, source: str | None) -> list[tuple[str, str | None]]:
        """(program, source) pairs this partition reads: same source, fan-in, or fan-out."""
        out: list[tuple[str, str | None]] = []
        for dep in PROGRAMS[program].deps:
            if PROGRAMS[dep].level == "crawl":
                out.append((dep, None))
            elif source is not None:
                out.append((dep, source))
            else:
                out.extend((dep, s) for s in sorted(self.sources))
        return out

    def keys(self) -> dict[tuple[str, str | None], str]:
        """params_key of every (program, source) partition of this crawl, in dependency order."""
        keys: dict[tuple[str, str | None], str] = {}
        for name in PROGRAMS:  # PROGRAMS is in topological order
            for source in self.partitions(name):
                up = {f"{d}/{s or ''}": keys[(d, s)] for d, s in self.upstream(name, source)}
                if PROGRAMS[name].uses_keep_rule:
                    up["keep"] = P.params_key("keep", self.keep)
                if PROGRAMS[name].reads_prior and self.dedup_against:
                    up["prior"] = json.dumps(self.dedup_against, sort_keys=True)
                keys[(name, source)] = P.params_key(name, self.program_params(name, source), up)
        return keys


def prior_outputs(spec: CrawlSpec) -> dict[str, str]:
    """Keys of the outputs a later crawl reads from ``spec``'s crawl: its raw and curated
    documents per source and its bucket index (``lsh_buckets``), as {"program/source": key}."""
    keys = spec.keys()
    out = {"lsh_buckets/": keys[("lsh_buckets", None)]}
    for source in sorted(spec.sources):
        out[f"raw_documents/{source}"] = keys[("raw_documents", source)]
        out[f"curated_documents/{source}"] = keys[("curated_documents", source)]
    return out


class Inputs:
    """The committed upstream partitions of one task, by program and source; ``prior`` holds
    the output dirs of earlier crawls ({crawl: {"program/source": dir}}) for incremental dedup."""

    def __init__(
        self, store: Store, dirs: dict[str, dict[str | None, str]], prior: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.store = store
        self.dirs = dirs
        self.prior = prior or {}

    def dir(self, program: str, source: str | None = None) -> str:
        return self.dirs[program][source]

    def sources(self, program: str) -> list[str]:
        return [s for s in self.dirs[program] if s is not None]

    def manifest(self, program: str, source: str | None = None) -> Manifest:
        m = self.store.read_manifest(self.dir(program, source))
        if m is None:
            raise FileNotFoundError(f"{program}[{source or 'crawl'}] has not been materialized")
        return m


@dataclass(frozen=True)
class Partition:
    crawl: str
    source: str | None
    spec: CrawlSpec
    # Where a long program says how far it is (``expect``/``advance``); silent by default.
    progress: Progress = field(default_factory=Progress, compare=False)


def partition_name(program: str, crawl: str, source: str | None) -> str:
    """``program[crawl|source]`` or ``program[crawl]``: how messages name a stage partition."""
    return f"{program}[{crawl}|{source}]" if source is not None else f"{program}[{crawl}]"


class ProgramModule(Protocol):
    def run(
        self,
        params: Any,
        inputs: Inputs,
        output: PartitionWriter,
        partition: Partition,
        execution: P.ExecutionParams,
    ) -> Report: ...


@dataclass(frozen=True)
class Task:
    """One partition of one program, fully resolved."""

    program: str
    source: str | None
    crawl: str
    params: P.StageParams
    key: str
    output_dir: str
    input_dirs: dict[str, dict[str | None, str]]
    prior_dirs: dict[str, dict[str, str]] = field(default_factory=dict)


def plan_task(store: Store, spec: CrawlSpec, program: str, source: str | None) -> Task:
    if program not in PROGRAMS:
        raise KeyError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    if PROGRAMS[program].level == "source" and source not in spec.sources:
        raise KeyError(f"source {source!r} is not part of crawl {spec.crawl!r}")
    keys = spec.keys()
    input_dirs: dict[str, dict[str | None, str]] = {}
    for dep, s in spec.upstream(program, source):
        input_dirs.setdefault(dep, {})[s] = store.partition_dir(dep, keys[(dep, s)], spec.crawl, s)
    src = source if PROGRAMS[program].level == "source" else None
    prior_dirs: dict[str, dict[str, str]] = {}
    if PROGRAMS[program].reads_prior:
        for crawl, outputs in spec.dedup_against.items():
            prior_dirs[crawl] = {}
            for name, key in outputs.items():
                prog, _, src_name = name.partition("/")
                prior_dirs[crawl][name] = store.partition_dir(prog, key, crawl, src_name or None)
    return Task(
        program=program,
        source=src,
        crawl=spec.crawl,
        params=spec.program_params(program, src),
        key=keys[(program, src)],
        output_dir=store.partition_dir(program, keys[(program, src)], spec.crawl, src),
        input_dirs=input_dirs,
        prior_dirs=prior_dirs,
    )


def load_program(name: str) -> ProgramModule:
    return importlib.import_module(f"stages.programs.{name}")  # type: ignore[return-value]


def data_version(store: Store, task: Task) -> str:
    """Identity of the data a task would produce: its key plus its inputs' data versions.

    ``raw_documents`` fingerprints its input files instead (names, sizes, mtimes/ETags), so a
    rerun on unchanged inputs recomputes nothing and a changed file recomputes everything below.
    """
    parts: list[str] = [task.key]
    if task.program == "raw_documents":
        parts.append(load_program("raw_documents").fingerprint(task.params))  # type: ignore[attr-defined]
    for program, by_source in sorted(task.input_dirs.items()):
        for source, pdir in sorted(by_source.items(), key=lambda kv: kv[0] or ""):
            m = store.read_manifest(pdir)
            if m is None:
                raise FileNotFoundError(
                    f"{program}[{source or task.crawl}] must be materialized before {task.program}"
                )
            parts.append(f"{program}/{source}={m.data_version}")
    for crawl, outputs in sorted(task.prior_dirs.items()):
        for name, pdir in sorted(outputs.items()):
            m = store.read_manifest(pdir)
            if m is None:
                raise FileNotFoundError(f"earlier crawl {crawl}: {name} is not materialized (needed by {task.program})")
            parts.append(f"{crawl}:{name}={m.data_version}")
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@dataclass
class Outcome:
    manifest: Manifest
    skipped: bool
    seconds: float


def execute(
    store: Store, spec: CrawlSpec, program: str, source: str | None,
    execution: P.ExecutionParams | None = None, force: bool = False, emit: Callable[[str], None] | None = None,
) -> Outcome:
    """Run one partition unless an up-to-date committed output exists; commit it atomically.
    ``emit`` receives the partition's progress lines (``stages.progress``), if given."""
    t0 = time.perf_counter()
    execution = execution or P.ExecutionParams()
    task = plan_task(store, spec, program, source)
    progress = Progress(partition_name(program, spec.crawl, task.source), emit, execution.progress_interval_s)
    version = data_version(store, task)
    existing = store.read_manifest(task.output_dir)
    if existing is not None and existing.data_version == version and not force:
        progress.finish(skipped=True)
        return Outcome(existing, True, time.perf_counter() - t0)
    writer = store.writer(task.output_dir)
    try:
        module = load_program(program)
        report = module.run(
            task.params, Inputs(store, task.input_dirs, task.prior_dirs), writer,
            Partition(spec.crawl, task.source, spec, progress), execution,
        )
        report = report.model_copy(update={  # backend: cpu | gpu | gpu-twin-on-cpu
            "seconds": round(time.perf_counter() - t0, 3), "backend": reported_backend(report.dump())})
        manifest = Manifest(
            program=program, params_key=task.key, data_version=version, crawl=spec.crawl,
            source=task.source, params=task.params.canonical(), report=report.dump(),
        )
        writer.commit(manifest)
    finally:
        writer.close()  # a failed attempt releases the partition at once, not when collected
    progress.finish()
    return Outcome(manifest, False, time.perf_counter() - t0)


def metadata(outcome: Outcome) -> dict[str, Any]:
    """Materialization metadata of one partition (plain JSON values, so Dagster and Dagster
    Pipes publish the same thing): rows in/out, removals per reason, params, params_key."""
    m = outcome.manifest
    meta: dict[str, Any] = {
        "params_key": m.params_key,
        "data_version": m.data_version,
        "params": m.params,
        "rows": m.rows,
        "cached": outcome.skipped,
        "seconds": round(outcome.seconds, 3),
    }
    report = read(m)
    meta.update(report.metadata())
    meta["report"] = report.dump()
    return meta


def execute_crawl(
    store: Store, spec: CrawlSpec, execution: P.ExecutionParams | None = None, force: bool = False
) -> dict[tuple[str, str | None], Outcome]:
    """Every partition of a crawl in dependency order, without Dagster (tests, benchmarks, pods)."""
    return {
        (name, source): execute(store, spec, name, source, execution, force)
        for name in PROGRAMS
        for source in spec.partitions(name)
    }
