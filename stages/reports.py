"""What each program reports: one frozen model per program, named after it (``exact_duplicates``
-> ``ExactDuplicatesReport``), stored as JSON in the partition's manifest.

A program's ``run`` returns its model; the executor adds ``seconds`` and ``backend`` and the
manifest stores ``dump()``: only the fields the program set, so a disabled program's short report
stays short and the JSON keeps the names it always had. Readers (checks, lineage, the CLI, Dagster
metadata, downstream programs) get the model back with ``read(manifest)`` or, typed for one
program, ``read_as(manifest, FuzzyDuplicatesReport)``.

One meaning per name: ``removed`` is always a number of documents; its breakdowns are
``removed_per_reason``, ``removed_per_source`` and ``removed_per_stage``. The last one is what
``curated_documents`` and the ledger's source rows stored under ``removed`` before (a dict);
``SourceCounts`` still reads manifests written that way. (``curate report --json`` keeps its
documented shape, ``removed`` per stage: it is the CLI's contract, not a manifest.)

Every field has a default: a disabled program reports a few of them, and manifests written by
earlier versions (or planted by tests) lack newer ones. Unknown keys are kept, untyped
(``extra="allow"``), so a manifest with a key since dropped still reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from stages.store import Manifest

# Headline counts and their breakdowns, published as Dagster materialization metadata where a
# report has them (the rest of a report is published whole, as ``report``).
HEADLINE = ("input", "embedded", "kept", "documents", "quarantined", "removed", "enabled", "backend")
BREAKDOWNS = ("removed_per_reason", "removed_per_source", "removed_per_stage", "quarantine_reasons",
              "fails_per_rule")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    def dump(self) -> dict[str, Any]:
        """Plain JSON: the fields that were set (by the program, or in the file read), so a short
        report stays short."""
        return self.model_dump(mode="json", exclude_unset=True)


class Report(_Model):
    """The fields every program's report may have; ``seconds`` and ``backend`` come from the executor."""

    enabled: bool = True
    seconds: float | None = None  # wall time of the partition, set by the executor
    backend: str | None = None  # cpu | gpu | gpu-twin-on-cpu
    device: str | None = None  # the torch device, for programs that run a torch model
    timing: dict[str, Any] | None = None  # read/compute/write seconds and bytes (stages.timing), set by the executor

    def metadata(self) -> dict[str, Any]:
        """The headline counts and breakdowns this report has (``HEADLINE``, ``BREAKDOWNS``)."""
        return self.model_dump(mode="json", include={*HEADLINE, *BREAKDOWNS}, exclude_unset=True)

    def largest_groups(self) -> dict[str, list[int]]:
        """Sizes of the largest groups this program formed, by kind (``buckets``, ``clusters``),
        for the ``giant_groups`` check; none by default."""
        return {}

    def grouped_documents(self) -> int | None:
        """The documents those groups were formed from, where the report counts them."""
        return None


class RemovalReport(Report):
    """A program that writes a removal list: ``removed`` documents of ``input``."""

    input: int = 0
    removed: int = 0
    removed_per_reason: dict[str, int] = Field(default_factory=dict)
    removed_per_source: dict[str, int] = Field(default_factory=dict)


class SourceCounts(_Model):
    """One source's documents: input = kept + quarantined + removed, ``removed`` split by stage."""

    input: int = 0
    kept: int = 0
    quarantined: int = 0
    removed: int = 0
    removed_per_stage: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _per_stage_under_removed(cls, data: Any) -> Any:
        """Manifests written before ``removed_per_stage`` stored the per-stage dict as ``removed``."""
        if isinstance(data, dict) and isinstance(data.get("removed"), dict):
            per_stage = {str(k): int(v) for k, v in data["removed"].items()}
            data = {**data, "removed": sum(per_stage.values()), "removed_per_stage": per_stage}
        elif isinstance(data, dict) and "removed_per_stage" in data and "removed" not in data:
            data = {**data, "removed": sum(int(v) for v in data["removed_per_stage"].values())}
        return data

    def adds_up(self) -> tuple[bool, int]:
        """(input == kept + quarantined + removed per stage, that sum)."""
        total = self.kept + self.quarantined + sum(self.removed_per_stage.values())
        return total == self.input, total


# --- ingestion ------------------------------------------------------------------------------------


class DamagedFile(_Model):
    """A truncated or corrupt input file: its records before the damage were read."""

    file: str
    error: str
    size: int
    unread_bytes: int  # stored bytes after the damage
    partial_bytes: int = 0  # decoded bytes of the incomplete record at the damage, dropped


class RawDocumentsReport(Report):
    input: int = 0  # records read: documents + quarantined
    documents: int = 0
    quarantined: int = 0
    quarantine_reasons: dict[str, int] = Field(default_factory=dict)
    files: int = 0
    bytes: int = 0  # of the input files
    damaged_files: list[DamagedFile] = Field(default_factory=list)
    unread_bytes: int = 0
    ignored_files: int = 0
    ignored_examples: list[str] = Field(default_factory=list)
    empty_files: int = 0
    tasks: int = 0
    blank_lines: int = 0
    chars: int = 0


# --- filters --------------------------------------------------------------------------------------


class DocumentLanguagesReport(RemovalReport):
    kept: int = 0
    languages: dict[str, int] = Field(default_factory=dict)  # the 20 most frequent
    cached: bool = False


class CustomFilterCounts(_Model):
    version: int = 1
    input: int = 0  # documents it judged
    scored: int = 0  # now, not from the cache
    removed: int = 0


class FilteredDocumentsReport(RemovalReport):
    kept: int = 0
    rules: str | None = None
    word_rules_off: int | None = None  # documents exempt from the word rules by their language
    fails_per_rule: dict[str, int] = Field(default_factory=dict)
    custom_filters: dict[str, CustomFilterCounts] = Field(default_factory=dict)


# --- dedup ----------------------------------------------------------------------------------------


class ExactDuplicatesReport(RemovalReport):
    groups: int = 0  # hash groups with more than one member


class MinhashSignaturesReport(Report):
    documents: int = 0
    bytes: int = 0
    kernel_seconds: float = 0.0
    kernel_mb_per_s: float | None = None


class Bucket(_Model):
    size: int
    key: str  # the band key, hex


class LshBucketsReport(Report):
    bands: int = 0
    rows: int = 0
    threshold: float = 0.0  # the S-curve's midpoint
    s_curve: dict[str, float] = Field(default_factory=dict)
    shingle: int | None = None
    num_perm: int | None = None
    seed: int | None = None
    nodes: int | None = None
    prior_documents: dict[str, int] = Field(default_factory=dict)  # kept documents of each earlier crawl merged in
    edges: int = 0
    bucket_size_hist: dict[str, int] = Field(default_factory=dict)
    largest_buckets: list[Bucket] = Field(default_factory=list)

    def largest_groups(self) -> dict[str, list[int]]:
        return {"buckets": [b.size for b in self.largest_buckets]} if self.largest_buckets else {}

    def grouped_documents(self) -> int | None:
        return self.nodes


class DuplicateComponentsReport(Report):
    verify: str | None = None
    shingle: int | None = None
    threshold: float | None = None
    nodes: int | None = None
    candidate_pairs: int = 0
    fallback_pairs: int = 0  # bucket-mate pairs compared beyond the candidates
    edges: int = 0
    rejected_pairs: int = 0
    text_blocks: int = 0
    candidate_text_bytes: int = 0
    text_spilled: bool = False
    components: int = 0
    documents_in_components: int = 0
    largest_clusters: list[int] = Field(default_factory=list)

    def largest_groups(self) -> dict[str, list[int]]:
        return {"clusters": list(self.largest_clusters)} if self.largest_clusters else {}

    def grouped_documents(self) -> int | None:
        return self.nodes


class FuzzyDuplicatesReport(RemovalReport):
    components: int = 0
    removed_as_earlier_crawl_duplicates: int = 0


class DocumentEmbeddingsReport(Report):
    input: int = 0  # survivors seen
    embedded: int = 0  # computed now
    cached: int = 0  # from the embedding cache
    tokens: int = 0
    truncated: int = 0
    max_tokens: int | None = None
    dim: int | None = None
    embed_seconds: float = 0.0
    docs_per_second: float | None = None


class SemanticClustersReport(Report):
    input: int = 0
    dropped: int = 0  # removed by an earlier stage
    n_clusters: int = 0
    clusters: int = 0
    largest: int = 0  # capped by max_cluster_size, so not a giant_groups size
    median_size: float = 0.0
    splits: int = 0
    spilled: int = 0
    fit_rows: int = 0
    load_seconds: float = 0.0
    kmeans_seconds: float = 0.0


class SemanticDuplicatesReport(RemovalReport):
    clusters: int = 0
    appearances: int = 0
    eps: float | None = None
    which_to_keep: str | None = None
    pairs: int = 0
    pairwise_seconds: float = 0.0
    pairs_per_second: int | None = None
    similarity_bands: dict[str, int] = Field(default_factory=dict)


# --- classifiers ----------------------------------------------------------------------------------


class ClassifierStats(_Model):
    kind: str
    min_score: float | None = None
    max_score: float | None = None
    scored: int = 0
    cached: int = 0
    computed: int = 0
    removed: int = 0
    seconds: float = 0.0
    docs_per_s: float | None = None
    histogram: dict[str, Any] = Field(default_factory=dict)  # kernels.quality.histogram


class QualityScoresReport(RemovalReport):
    kept: int = 0
    note: str | None = None
    classifiers: dict[str, ClassifierStats] = Field(default_factory=dict)
    unknown_sources_in_thresholds: list[str] = Field(default_factory=list)


class BenchmarkStats(_Model):
    examples: int = 0
    ngrams: int = 0
    examples_without_ngrams: int = 0
    removed: int = 0
    removed_per_source: dict[str, int] = Field(default_factory=dict)
    docs_with_any_match: int = 0
    examples_found: int = 0


class ContaminatedDocumentsReport(RemovalReport):
    note: str | None = None
    ngram: int | None = None
    min_matches: int | None = None
    index_ngrams: int = 0
    index_mib: float = 0.0
    index_seconds: float = 0.0
    docs_per_s: float | None = None
    benchmarks: dict[str, BenchmarkStats] = Field(default_factory=dict)

    @classmethod
    def switched_off(cls) -> ContaminatedDocumentsReport:
        """The stage's report where a crawl leaves it out: every count set, to 0 (``dump`` shows
        what was set)."""
        return cls(enabled=False, input=0, removed=0, removed_per_source={}, removed_per_reason={})


# --- output ---------------------------------------------------------------------------------------


class CuratedDocumentsReport(SourceCounts, Report):
    """The source's input documents, kept, quarantined at ingestion, removed by each stage."""


class LedgerSource(SourceCounts):
    # Of the heuristic removals, those of each custom filter (when the heuristics ran any).
    filters: dict[str, int] = Field(default_factory=dict)
    # Of removed_per_stage[STAGE], the duplicates of a document an earlier crawl kept, per that
    # crawl: {stage: {crawl: n}} (set only when there are any), apart from the within-crawl ones.
    earlier_crawl_duplicates: dict[str, dict[str, int]] = Field(default_factory=dict)

    def earlier(self, stage: str) -> int:
        """Removals of ``stage`` as duplicates of documents earlier crawls kept."""
        return sum(self.earlier_crawl_duplicates.get(stage, {}).values())


class RemovalLedgerReport(Report):
    crawl: str = ""
    sources: dict[str, LedgerSource] = Field(default_factory=dict)


REPORTS: dict[str, type[Report]] = {
    "raw_documents": RawDocumentsReport,
    "document_languages": DocumentLanguagesReport,
    "filtered_documents": FilteredDocumentsReport,
    "exact_duplicates": ExactDuplicatesReport,
    "minhash_signatures": MinhashSignaturesReport,
    "lsh_buckets": LshBucketsReport,
    "duplicate_components": DuplicateComponentsReport,
    "fuzzy_duplicates": FuzzyDuplicatesReport,
    "document_embeddings": DocumentEmbeddingsReport,
    "semantic_clusters": SemanticClustersReport,
    "semantic_duplicates": SemanticDuplicatesReport,
    "quality_scores": QualityScoresReport,
    "contaminated_documents": ContaminatedDocumentsReport,
    "curated_documents": CuratedDocumentsReport,
    "removal_ledger": RemovalLedgerReport,
}

R = TypeVar("R", bound=Report)


def report_model(program: str) -> type[Report]:
    """The report model of ``program``; KeyError names the known ones."""
    try:
        return REPORTS[program]
    except KeyError:
        raise KeyError(f"no report model for program {program!r}; known: {', '.join(REPORTS)}") from None


def read(manifest: Manifest) -> Report:
    """The report of a committed partition, as its program's model."""
    return report_model(manifest.program).model_validate(manifest.report)


def read_as(manifest: Manifest, model: type[R]) -> R:
    """The report of a committed partition as ``model`` (its program's model or a base of it)."""
    report = read(manifest)
    if not isinstance(report, model):
        raise TypeError(f"{manifest.program} reports a {type(report).__name__}, not a {model.__name__}")
    return report
