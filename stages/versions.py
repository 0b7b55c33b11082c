"""Versions of the code behind each program's output, beyond its parameters.

A program's output depends on its parameters (``stages.params``, whose class ``version`` is
bumped when the program itself changes) and on the kernels, scorers and formats it calls. Those
are versioned here, in one module without heavy imports, and ``params_key`` hashes the versions a
program uses (``code_versions``): bumping one re-keys that program's outputs and everything
downstream, so one crawl never mixes two rule sets and a stale output is never read as current.
Kernels take their version from here (``heuristics.SCORER_VERSION is HEURISTIC_SCORER``).
"""

from __future__ import annotations

import sys

# 2: stop_word_count counts distinct stop words (1 counted occurrences: "and and and" passed).
HEURISTIC_SCORER = 2  # stages.kernels.heuristics: every score of a document
QUALITY_SCORER = 1  # stages.programs.quality_scores: fastText / HF scoring for the same model
DECONTAM_HASH = 1  # stages.kernels.decontam: words(), word and n-gram hashing
EXACT_NORMALIZE = 1  # stages.kernels.exact: normalize() and the text hash
MINHASH_FAMILY = 1  # stages.kernels.minhash (and its GPU twin): shingles and the hash family (docs/minhash.md)
LANGUAGE_IDENTIFIER = 1  # stages.kernels.language: line selection, the prose vote, the score
# 2: the quarantine table names the kept document of a duplicate_record_id (duplicate_of).
QUARANTINE_FORMAT = 2  # stages.ingest.writer: the columns of raw_documents' quarantine table
EMBEDDING_FORMAT = 1  # stages.programs.document_embeddings: tokenization, pooling, stored vector layout

# The versions each program's output depends on (by name of the constant above).
USES: dict[str, tuple[str, ...]] = {
    "raw_documents": ("QUARANTINE_FORMAT",),
    "document_languages": ("LANGUAGE_IDENTIFIER",),
    "filtered_documents": ("HEURISTIC_SCORER",),
    "exact_duplicates": ("EXACT_NORMALIZE",),
    "minhash_signatures": ("MINHASH_FAMILY",),
    "document_embeddings": ("EMBEDDING_FORMAT",),
    "quality_scores": ("QUALITY_SCORER",),
    "contaminated_documents": ("DECONTAM_HASH",),
}


def code_versions(program: str) -> dict[str, int]:
    """{constant: value} of the code versions ``program``'s output depends on (read at call
    time, so a bump, or a test's monkeypatch, takes effect at once)."""
    module = sys.modules[__name__]
    return {name: int(getattr(module, name)) for name in USES.get(program, ())}
