"""The seeds' sizing arithmetic for a crawl, before hardware is reserved (``curate size``).

Pure arithmetic on a crawl's size (documents, mean characters) and its parameters; nothing is
read or run. Every figure is a closed formula of the ``Crawl``, the ``Setting`` and the stated
``Assumptions``, so a test can check it by hand and ``curate profile`` can check it against a run:

* signature table: ``docs x (4 x num_perm + 36)`` bytes (a uint32 per hash, a 32-char doc_id
  string with its int32 offset): the Arrow size of ``minhash_signatures``' output.
* band keys: ``docs x bands`` keys, ``docs x 8 x (1 + bands)`` bytes (a node int64, a uint64 per
  band): the Arrow size of ``lsh_buckets``' ``band_keys`` table, the bucket index.
* candidates: a fraction ``dup_rate`` of the documents duplicate another at Jaccard
  ``dup_similarity``; such a pair is a candidate with P(s) = 1 - (1 - s^r)^b and collides in
  ``b x s^r`` bands on average. Unrelated pairs are assumed never to collide (64-bit band keys;
  templated boilerplate does, which is why heuristics run first). Candidate pairs =
  ``docs x dup_rate x P(s)``; band edges (one anchor edge per bucket member per band, what
  ``lsh_buckets`` writes) = ``docs x dup_rate x b x s^r``.
* verification (exact Jaccard, ``verify="jaccard"``): the texts of the documents in candidate
  pairs, ``min(docs, 2 x pairs) x mean_chars x bytes_per_char`` bytes; beyond ``text_block_bytes``
  they spill to local disk twice (the gathered texts, then one file per block).
* embeddings (after fuzzy dedup: the found duplicates are never embedded): per model,
  ``2 x parameters x tokens`` FLOPs per document, tokens = ``min(mean_chars x tokens_per_char,
  max_tokens)``; GPU-hours at ``gpu_tflops`` sustained x ``utilisation``.
* memory of one program partition (a pod): the dominant buffers of each program, in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DOC_ID_BYTES = 36  # a 32-hex-char doc_id in an Arrow string array: 32 data bytes + an int32 offset
NODES_ROW_BYTES = 8 + 2 * DOC_ID_BYTES  # lsh_buckets' nodes: node int64, doc_id, source (short), crawl
BANDS_PER_TASK = 4  # stages.programs.lsh_buckets: bands one pass-2 task holds at once
GIB = 1 << 30


@dataclass(frozen=True)
class Model:
    """An encoder whose forward passes are sized: parameters, tokens read per document, output width."""

    name: str
    parameters: int
    max_tokens: int = 512
    dim: int = 0


# The packaged embedding model (sentence-transformers/all-MiniLM-L6-v2: 6 layers, 384 wide,
# 22.7M parameters with its 30k-token embedding table) at the stage's default max_tokens.
MINILM = Model("all-MiniLM-L6-v2", 22_713_216, 256, 384)
KNOWN_MODELS: dict[str, Model] = {MINILM.name: MINILM}


@dataclass(frozen=True)
class Crawl:
    """The crawl's size: documents reaching the fuzzy stage (after heuristics and exact dedup)
    and their mean length in characters."""

    docs: int
    mean_chars: float


@dataclass(frozen=True)
class Setting:
    """The parameters that size the work (the config's, else the stages' defaults)."""

    num_perm: int = 260
    shingle: int = 24
    bands: int = 26
    rows: int = 10
    verify: bool = True
    text_block_bytes: int = 512 << 20
    batch_rows: int = 20_000
    workers: int = 1
    models: tuple[Model, ...] = (MINILM,)
    embedding_bytes: int = 2  # float16 vectors
    max_cluster_size: int = 5000
    pairwise_batch_size: int = 1024


@dataclass(frozen=True)
class Assumptions:
    """What the arithmetic cannot know and states instead (each a ``curate size`` flag)."""

    dup_rate: float = 0.1  # fraction of documents that near-duplicate another one
    dup_similarity: float = 0.9  # their Jaccard similarity to it
    tokens_per_char: float = 0.25  # ~4 characters per token (English prose, WordPiece/BPE)
    bytes_per_char: float = 1.0  # UTF-8 bytes per character (1: mostly ASCII)
    gpu_tflops: float = 150.0  # sustained dense TFLOP/s of one GPU (the seeds' figure)
    utilisation: float = 1 / 3  # fraction of it an inference job reaches ("a third is common")


@dataclass
class Sizing:
    """Every figure of a sizing, by section; ``as_dict`` is ``curate size --json``."""

    crawl: Crawl
    setting: Setting
    assumptions: Assumptions
    signatures: dict[str, float] = field(default_factory=dict)
    band_keys: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, float] = field(default_factory=dict)
    verification: dict[str, float] = field(default_factory=dict)
    embeddings: dict[str, dict[str, float]] = field(default_factory=dict)
    memory_bytes: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "crawl": vars(self.crawl),
            "setting": {**{k: v for k, v in vars(self.setting).items() if k != "models"},
                        "models": [vars(m) for m in self.setting.models]},
            "assumptions": vars(self.assumptions),
            "signatures": self.signatures, "band_keys": self.band_keys, "candidates": self.candidates,
            "verification": self.verification, "embeddings": self.embeddings, "memory_bytes": self.memory_bytes,
        }


def candidate_probability(s: float, bands: int, rows: int) -> float:
    """P(s) = 1 - (1 - s^rows)^bands: a pair of Jaccard ``s`` shares at least one band."""
    return 1.0 - (1.0 - s**rows) ** bands


def signature_bytes(docs: int, num_perm: int) -> int:
    """Arrow bytes of the signature table: uint32 x num_perm and a doc_id per document."""
    return docs * (4 * num_perm + DOC_ID_BYTES)


def band_key_bytes(docs: int, bands: int) -> int:
    """Arrow bytes of the band-key table: a node int64 and a uint64 per band per document."""
    return docs * 8 * (1 + bands)


def flops_per_document(model: Model, mean_chars: float, tokens_per_char: float) -> float:
    """2 x parameters x tokens: one forward pass over the document's first ``max_tokens`` tokens."""
    return 2.0 * model.parameters * min(mean_chars * tokens_per_char, model.max_tokens)


def gpu_hours(flops: float, tflops: float, utilisation: float) -> float:
    """Hours of one GPU sustaining ``tflops`` x ``utilisation``."""
    return flops / (tflops * 1e12 * utilisation) / 3600.0


def size(crawl: Crawl, setting: Setting | None = None, assumptions: Assumptions | None = None) -> Sizing:
    """The sizing of ``crawl`` under ``setting`` and ``assumptions`` (the module docstring's formulas)."""
    st = setting or Setting()
    a = assumptions or Assumptions()
    n, chars = crawl.docs, crawl.mean_chars
    out = Sizing(crawl, st, a)
    out.signatures = {"rows": n, "bytes": signature_bytes(n, st.num_perm)}
    out.band_keys = {"keys": n * st.bands, "bytes": band_key_bytes(n, st.bands)}

    p = candidate_probability(a.dup_similarity, st.bands, st.rows)
    duplicates = n * a.dup_rate
    pairs = duplicates * p
    out.candidates = {
        "threshold": (1.0 / st.bands) ** (1.0 / st.rows),
        "p_candidate": p,
        "duplicate_pairs": duplicates,
        "candidate_pairs": pairs,
        "band_edges": duplicates * st.bands * a.dup_similarity**st.rows,
        "removed": pairs,  # each found pair removes one document (pairs of two; s above the threshold)
    }

    verified_docs = min(float(n), 2.0 * pairs) if st.verify else 0.0
    text = verified_docs * chars * a.bytes_per_char
    out.verification = {
        "documents": verified_docs,
        "text_bytes": text,
        "spill_bytes": 2.0 * text if text > st.text_block_bytes else 0.0,
    }

    embedded = n - pairs
    for model in st.models:
        per_doc = flops_per_document(model, chars, a.tokens_per_char)
        flops = per_doc * embedded
        out.embeddings[model.name] = {
            "documents": embedded,
            "tokens_per_document": min(chars * a.tokens_per_char, model.max_tokens),
            "flops_per_document": per_doc,
            "flops": flops,
            "gpu_hours": gpu_hours(flops, a.gpu_tflops, a.utilisation),
        }

    out.memory_bytes = memory(crawl, st, a, out.candidates["band_edges"], text, embedded)
    return out


def memory(crawl: Crawl, st: Setting, a: Assumptions, band_edges: float, text: float,
           embedded: float) -> dict[str, float]:
    """Bytes one partition of each sized program holds at its peak (its dominant buffers; Python
    and library overhead not included). Streaming programs hold batches, whatever the crawl's size;
    crawl-level programs hold columns of every document."""
    n = crawl.docs
    batch = st.batch_rows * crawl.mean_chars * a.bytes_per_char
    streaming = 2.0 * batch * st.workers  # a batch of text per worker, twice (Arrow, the kernel's copy)
    dim = max((m.dim for m in st.models), default=0)
    params = max((m.parameters for m in st.models), default=0)
    return {
        "raw_documents": streaming,
        "filtered_documents": streaming,
        "minhash_signatures": streaming + st.workers * st.batch_rows * 4.0 * st.num_perm,
        # a 16-byte text hash and a doc_id per document, sorted (a second copy)
        "exact_duplicates": 2.0 * n * (16 + DOC_ID_BYTES),
        # the nodes table, and per task in flight its (1 + 4) columns of 8 bytes per document
        "lsh_buckets": n * NODES_ROW_BYTES + st.workers * n * 8.0 * (1 + BANDS_PER_TASK),
        # nodes, the band edges (src, dst int64, band int32) and at most one block of candidate texts
        "duplicate_components": n * NODES_ROW_BYTES + band_edges * 20.0 + min(text, float(st.text_block_bytes)),
        # the model's float32 weights and a batch of text
        "document_embeddings": params * 4.0 + batch,
        # every embedding of the crawl, stored (float16) and as float32 for k-means
        "semantic_clusters": embedded * dim * (st.embedding_bytes + 4.0),
        # the largest cluster as float32 and its N x B similarity tile
        "semantic_duplicates": st.max_cluster_size * (dim * 4.0 + st.pairwise_batch_size * 4.0),
    }


def setting_from_config(config: dict[str, Any], extra_models: tuple[Model, ...] = ()) -> Setting:
    """The ``Setting`` of a ``curate run --config`` file's content: its ``params`` (MinHash, LSH
    ``bands``/``rows`` or ``preset``, ``verify``, the embedding model and ``max_tokens``, the
    cluster cap) over the stages' defaults; no embedding model when ``stages`` leaves out
    ``semantic``. ``extra_models`` (classifiers, say) are sized beside it."""
    from stages.params import DuplicateComponentsParams, LshBucketsParams, MinhashSignaturesParams

    params = config.get("params") or {}
    sig = MinhashSignaturesParams(**params.get("minhash_signatures", {}))
    lsh = LshBucketsParams(**params.get("lsh_buckets", {}))
    verify = DuplicateComponentsParams(**params.get("duplicate_components", {})).verify == "jaccard"
    # Not DocumentEmbeddingsParams: validating it fingerprints the model's files, which need not exist here.
    emb = params.get("document_embeddings", {})
    models: tuple[Model, ...] = ()
    if "semantic" in (config.get("stages") or ("semantic",)):
        name = str(emb.get("model", MINILM.name))
        given = {m.name for m in extra_models}
        known = KNOWN_MODELS.get(name.rstrip("/").rsplit("/", 1)[-1])
        if known is None and name not in given:
            raise ValueError(f"embedding model {name!r} has no known parameter count: give it with --model NAME=PARAMS")
        if known is not None and known.name not in given:
            models = (Model(known.name, known.parameters, int(emb.get("max_tokens", known.max_tokens)), known.dim),)
    clusters = params.get("semantic_clusters", {})
    return Setting(num_perm=sig.num_perm, shingle=sig.shingle, bands=lsh.bands, rows=lsh.rows, verify=verify,
                   models=(*models, *extra_models),
                   embedding_bytes=2 if emb.get("dtype", "float16") == "float16" else 4,
                   max_cluster_size=int(clusters.get("max_cluster_size", Setting.max_cluster_size)))
