"""One frozen parameter model per stage program, and the key that names its outputs.

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
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class StageParams(BaseModel):
    """Base of every stage's parameters: frozen, strict about unknown fields.

    ``version`` is bumped whenever the program's output changes for the same parameters;
    it is part of the key, so outputs of an older program are never read by a newer one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: ClassVar[int] = 1

    def canonical(self) -> dict[str, Any]:
        """Parameters as a JSON-ready dict with a stable field order."""
        return json.loads(self.model_dump_json())


class RawDocumentsParams(StageParams):
    """Ingestion of one source: where the records are and which fields mean what."""

    version: ClassVar[int] = 1
    url: str = Field(description="fsspec URL, glob or directory of JSONL(.gz/.zst) or Parquet files")
    text_field: str = "text"
    id_field: str | None = None
    url_field: str | None = None
    format: Literal["auto", "jsonl", "parquet"] = "auto"


class FilteredDocumentsParams(StageParams):
    """Heuristic filters: thresholds on stored scores (Gopher quality/repetition, C4 lines).

    ``None`` switches a rule off. Defaults follow Gopher (Rae et al. 2021, appendix A) and
    the C4/FineWeb line rules. Changing a threshold re-keys this output but not the scores,
    which are cached under ``heuristic_scores/<scorer key>``.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
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


class ExactDuplicatesParams(StageParams):
    """Exact dedup over all sources of a crawl on a hash of normalized text.

    Normalization (``stages.kernels.exact.normalize``): Unicode NFKC, then every run of
    whitespace becomes one space, then leading/trailing whitespace is stripped; with
    ``lowercase`` the text is also case-folded.
    """

    version: ClassVar[int] = 1
    enabled: bool = True
    lowercase: bool = False


class CuratedDocumentsParams(StageParams):
    """The curated output of one source: raw documents minus every removal list."""

    version: ClassVar[int] = 1


class RemovalLedgerParams(StageParams):
    """One row per removed or quarantined document of a crawl."""

    version: ClassVar[int] = 1


class KeepParams(StageParams):
    """The shared keep rule: the lowest (priority, doc_id) of a duplicate group survives.

    ``source_priority`` maps source names to a priority (lower wins, default 0), so a trusted
    source keeps its copy. Ties are broken by ``doc_id``, so the survivor never depends on
    worker count, shard layout or processing order.
    """

    version: ClassVar[int] = 1
    source_priority: dict[str, int] = Field(default_factory=dict)


class ExecutionParams(BaseModel):
    """How programs run; never part of a key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    batch_rows: int = 20_000
    workers: int = 0  # processes for parallel kernels; 0 = every core
    backend: Literal["auto", "cpu", "gpu"] = "cpu"

    def resolved_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)


def params_key(program: str, params: StageParams, upstream: dict[str, str] | None = None) -> str:
    """Key of a program's output: 16 hex chars of sha256 over name, version, params, upstream keys.

    ``upstream`` maps input names to their params keys; its order does not matter.
    """
    payload = {
        "program": program,
        "version": type(params).version,
        "params": params.canonical(),
        "upstream": dict(sorted((upstream or {}).items())),
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
