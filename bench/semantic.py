"""Semantic dedup benchmarks: embedding docs/s, pairwise pairs/s, and accuracy against all-pairs.

    python bench/semantic.py embed    [--docs 600] [--max-tokens 256] [--device cpu] [--repeats 3]
                                      [--precision fp32|bf16|autocast-bf16|int8] [--runtime onnx]
    python bench/semantic.py pairwise [--rows 8192] [--device cpu]
    python bench/semantic.py accuracy [--max-tokens 256] [--device cpu]

``embed``: the same documents (stdlib docstrings from ``curation_dagster.tools.sample``) through plain
``SentenceTransformer.encode`` (batch 32, its own length sort by characters) and through the
pipeline's Encoder (token-length buckets, token-budget batches, bf16 on a GPU); repeats are
interleaved and the best of each is reported, with the cosine between the two outputs.
``--precision`` adds a third path: the same Encoder with its model computing in another precision
(``bf16``: weights cast; ``autocast-bf16``: fp32 weights under ``torch.autocast``; ``int8``: dynamic
int8 quantization of the Linear layers, CPU only; ``fp32``: e.g. against the bf16 default on a
GPU), with its docs/s, its ratio to plain encode and to the Encoder, and its cosine to the Encoder.
``--runtime onnx`` adds the transformer run by ONNX Runtime (fp32, CPU; needs ``onnxruntime`` and
``onnx``): exported here from the same weights, fused by ``onnxruntime.transformers``' BERT
optimizer, fed the Encoder's token-length batches, mean-pooled in torch. It is a measurement, not
a pipeline option: on the 2-core CPU it was no faster than torch (docs/semantic.md, "Precision").

``pairwise``: the tiled in-cluster kernel on random unit vectors (one cluster of ``--rows``),
pairs/s = rows * (rows - 1) / 2 / seconds; and k-means assignment rows/s.

``accuracy``: docstrings of the same APIs in different versions (every copy of packaging, rich,
pygments, urllib3, ... that this environment carries: installed and vendored by pip and
setuptools). Two documents are true duplicates when they document the same qualified name of the
same package. After exact dedup, SemDeDup (priority rank) at several eps, all-pairs (one cluster)
against the k-means partitioning: precision and recall of removals, and the recall the
partitioning loses. CPU is fine for a few thousand documents; a crawl wants a GPU.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.kernels.exact import text_hashes

if TYPE_CHECKING:
    import torch

    from stages.programs.document_embeddings import Encoder


def docstrings(n: int) -> list[str]:
    import gzip
    import json

    from curation_dagster.tools.sample import build_sample

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_sample(Path(tmp), max_docs_per_source=n)["docstrings"]
        texts: list[str] = []
        for part in sorted(folder.iterdir()):
            opener = gzip.open if part.name.endswith(".gz") else open
            with opener(part, "rt") as fh:
                texts.extend(json.loads(line)["text"] for line in fh if line.strip())
    return texts[:n]


def bench_embed(args: argparse.Namespace) -> None:
    from stages.programs.document_embeddings import encoder

    texts = docstrings(args.docs)
    from sentence_transformers import SentenceTransformer

    from stages.params import embedding_model_path

    enc = encoder("all-MiniLM-L6-v2", args.device, args.max_tokens)
    variant = encoder_variant(enc, args.precision) if args.precision else None
    # the baseline: the model as a user loads it (float32), its own encode()
    plain = SentenceTransformer(embedding_model_path("all-MiniLM-L6-v2"), device=args.device, local_files_only=True)
    plain.max_seq_length = enc.max_tokens
    plain.encode(texts[:32], batch_size=32)  # warm-up of both paths
    enc.embed(enc.tokenize(texts[:32]))
    if variant is not None:
        variant.embed(variant.tokenize(texts[:32]))
    tmp = tempfile.TemporaryDirectory()
    ort_forward = onnx_forward(enc, Path(tmp.name)) if args.runtime == "onnx" else None
    if ort_forward is not None:
        _embed_with(enc, ort_forward, enc.tokenize(texts[:32]), args.batch_tokens)
    # Wall time and CPU time (process_time, all threads): on a shared machine the CPU seconds a
    # path consumes are the steadier measure of what it would do on idle cores.
    best_plain = best_ours = cpu_plain = cpu_ours = best_var = cpu_var = best_ort = cpu_ort = math.inf
    ref = ours = other = by_ort = np.zeros(0)
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        ref = plain.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
        best_plain = min(best_plain, time.perf_counter() - t0)
        cpu_plain = min(cpu_plain, time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        ours = enc.embed(enc.tokenize(texts), args.batch_tokens)
        best_ours = min(best_ours, time.perf_counter() - t0)
        cpu_ours = min(cpu_ours, time.process_time() - c0)
        if variant is not None:
            t0, c0 = time.perf_counter(), time.process_time()
            other = variant.embed(variant.tokenize(texts), args.batch_tokens)
            best_var = min(best_var, time.perf_counter() - t0)
            cpu_var = min(cpu_var, time.process_time() - c0)
        if ort_forward is not None:
            t0, c0 = time.perf_counter(), time.process_time()
            by_ort = _embed_with(enc, ort_forward, enc.tokenize(texts), args.batch_tokens)
            best_ort = min(best_ort, time.perf_counter() - t0)
            cpu_ort = min(cpu_ort, time.process_time() - c0)
    tmp.cleanup()
    cos = (np.asarray(ref, np.float32) * ours).sum(axis=1)
    tokens = sum(len(t) for t in enc.tokenize(texts))
    n = len(texts)
    print(f"embedding {n} docstrings, {tokens / n:.0f} tokens/doc (max {enc.max_tokens}), "
          f"device {args.device}, {enc.dtype}, torch threads {_threads()}")
    print(f"  plain SentenceTransformer.encode(batch_size=32): {n / best_plain:8.1f} docs/s wall, "
          f"{n / cpu_plain:8.1f} docs per CPU-second")
    print(f"  Encoder (token buckets, tokenise ahead)        : {n / best_ours:8.1f} docs/s wall, "
          f"{n / cpu_ours:8.1f} docs per CPU-second")
    print(f"  speed-up: {best_plain / best_ours:.2f}x wall, {cpu_plain / cpu_ours:.2f}x CPU time")
    print(f"  cosine(plain, ours): min {cos.min():.6f}, mean {cos.mean():.6f}")
    if variant is not None:
        vcos = (ours * other).sum(axis=1)
        base = _dtype_name(enc.dtype)
        print(f"  Encoder, {args.precision:<38}: {n / best_var:8.1f} docs/s wall, "
              f"{n / cpu_var:8.1f} docs per CPU-second")
        print(f"  {args.precision} vs plain encode: {best_plain / best_var:.2f}x wall, "
              f"{cpu_plain / cpu_var:.2f}x CPU time; vs Encoder ({base}): {best_ours / best_var:.2f}x wall, "
              f"{cpu_ours / cpu_var:.2f}x CPU time")
        print(f"  cosine(Encoder {base}, Encoder {args.precision}): min {vcos.min():.6f}, "
              f"mean {vcos.mean():.6f}")
    if ort_forward is not None:
        ocos = (ours * by_ort).sum(axis=1)
        print(f"  Encoder batches, ONNX Runtime fp32 (fused BERT)  : {n / best_ort:8.1f} docs/s wall, "
              f"{n / cpu_ort:8.1f} docs per CPU-second")
        print(f"  ONNX Runtime vs plain encode: {best_plain / best_ort:.2f}x wall, "
              f"{cpu_plain / cpu_ort:.2f}x CPU time; "
              f"vs Encoder (torch {_dtype_name(enc.dtype)}): {best_ours / best_ort:.2f}x wall, "
              f"{cpu_ours / cpu_ort:.2f}x CPU time")
        print(f"  cosine(Encoder torch, ONNX Runtime): min {ocos.min():.7f}, mean {ocos.mean():.7f}")
    # Padding: encode sorts by characters and pads batches of 32; the Encoder sorts by tokens.
    from stages.kernels.semantic import length_batches
    from stages.programs.document_embeddings import CPU_BATCH_TOKENS

    lens = np.array([len(t) for t in enc.tokenize(texts)])
    by_chars = np.argsort([-len(t) for t in texts], kind="stable")
    padded_plain = sum(lens[by_chars[a:a + 32]].max() * len(by_chars[a:a + 32]) for a in range(0, n, 32))
    batch_tokens = args.batch_tokens or CPU_BATCH_TOKENS
    padded_ours = sum(lens[b].max() * len(b) for b in length_batches(lens, batch_tokens))
    print(f"  real tokens / computed tokens: plain {lens.sum() / padded_plain:.3f}, "
          f"ours {lens.sum() / padded_ours:.3f}")


def encoder_variant(enc: Encoder, precision: str) -> Encoder:
    """A copy of ``enc`` (same tokenizer, max_tokens, batching) whose model computes in
    ``precision``: bf16 (weights cast), autocast-bf16 (fp32 weights, bf16 matmuls under
    ``torch.autocast``), int8 (dynamic int8 Linear layers, fp32 activations; CPU only) or fp32.
    The pipeline's cached Encoder is left as it is."""
    import copy

    import torch

    var = copy.copy(enc)
    model = copy.deepcopy(enc.model)
    if precision == "int8":
        if not enc.device.startswith("cpu"):
            raise SystemExit("--precision int8: dynamic quantization runs on the CPU only")
        model = torch.ao.quantization.quantize_dynamic(model.float(), {torch.nn.Linear}, dtype=torch.qint8)
        var.dtype = torch.qint8
    elif precision == "autocast-bf16":
        model = model.float()
        var.dtype = torch.float32
        device_type = torch.device(enc.device).type
        plain_forward = var.forward

        def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return plain_forward(input_ids, attention_mask)

        var.forward = forward  # type: ignore[method-assign]
    else:
        var.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model = model.to(var.dtype)
    var.model = model.eval()
    return var


def onnx_forward(enc: Encoder, folder: Path) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A ``stages.kernels.semantic`` forward (input_ids, attention_mask int64 (b, L) -> mean-pooled
    float32 (b, dim)) that runs ``enc``'s transformer in ONNX Runtime on the CPU, fp32.

    The transformer is exported to ``folder`` with eager attention (the TorchScript exporter;
    sdpa's graph is not recognised by the fusion passes) and dynamic batch and length axes, then
    optimised by ``onnxruntime.transformers.optimizer`` for BERT (fused Attention,
    SkipLayerNormalization, BiasGelu) and run with every graph optimisation, one intra-op thread
    per torch thread. Mean pooling stays in torch; the model must pool by mean."""
    import copy

    import torch

    try:
        import onnx  # noqa: F401  (the exporter and the optimizer need it)
        import onnxruntime as ort
        from onnxruntime.transformers import optimizer
    except ImportError as e:
        raise SystemExit(f"--runtime onnx needs: pip install onnxruntime onnx ({e})") from e

    if not enc.device.startswith("cpu"):
        raise SystemExit("--runtime onnx: measured on the CPU only")
    pooling = getattr(enc.model[1], "pooling_mode", "mean")
    if pooling != "mean":
        raise SystemExit(f"--runtime onnx: mean pooling only, the model pools by {pooling}")
    bert: Any = copy.deepcopy(enc.model[0].auto_model)  # the HF BertModel
    bert = bert.float().eval()
    bert.set_attn_implementation("eager")
    token_types = enc.token_types

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if token_types else {}
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state

    ids = torch.full((2, 16), 1000, dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # traced with padding, so the graph keeps the attention mask
    raw, fused = folder / "model.onnx", folder / "model.fused.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Hidden().eval(), (ids, mask), str(raw), dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"], output_names=["hidden"],
            dynamic_axes={"input_ids": {0: "b", 1: "l"}, "attention_mask": {0: "b", 1: "l"},
                          "hidden": {0: "b", 1: "l"}},
        )
    config = bert.config
    optimizer.optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                             hidden_size=config.hidden_size, opt_level=0).save_model_to_file(str(fused))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(fused), options, providers=["CPUExecutionProvider"])

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        (hidden,) = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
        m = attention_mask.unsqueeze(-1).float()
        return (torch.from_numpy(hidden) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)

    return forward


def _embed_with(enc: Encoder, forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                token_ids: list[list[int]], batch_tokens: int | None) -> np.ndarray:
    """``enc.embed`` with another forward: the same token-length batches and normalisation."""
    from stages.kernels.semantic import embed
    from stages.programs.document_embeddings import CPU_BATCH_TOKENS

    return embed(forward, token_ids, enc.pad_id, enc.dim, batch_tokens or CPU_BATCH_TOKENS, enc.device)


def _dtype_name(dtype: object) -> str:
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(str(dtype), str(dtype))


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def bench_pairwise(args: argparse.Namespace) -> None:
    import torch

    from stages.kernels.semantic import kmeans_fit, max_earlier_similarity

    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(args.rows, 384, generator=g), dim=1).to(args.device)
    for batch in (512, 1024, 2048):
        max_earlier_similarity(x[:batch * 2], batch)  # warm-up
        _sync(args.device)
        t0 = time.perf_counter()
        max_earlier_similarity(x, batch)
        _sync(args.device)
        dt = time.perf_counter() - t0
        pairs = args.rows * (args.rows - 1) / 2
        print(f"pairwise: one cluster of {args.rows} x 384, pairwise_batch_size {batch}, {args.device}: "
              f"{pairs / dt / 1e6:8.1f} M pairs/s ({dt:.3f} s)")
    t0 = time.perf_counter()
    kmeans_fit(x, 64, 10, 0)
    _sync(args.device)
    print(f"k-means: {args.rows} rows, 64 centroids, 10 iterations: {time.perf_counter() - t0:.3f} s")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- accuracy

PACKAGES = ("packaging", "platformdirs", "tomli", "rich", "pygments", "urllib3", "requests", "idna",
            "certifi", "importlib_metadata", "zipp", "more_itertools", "wheel", "pyparsing", "distlib")


def versioned_docstrings() -> tuple[list[str], list[str], list[str]]:
    """(text, key, copy) of every docstring (>= 200 chars) of each copy of PACKAGES found in
    site-packages and the pip/setuptools vendor folders; key = package:module:qualname."""
    import site

    from curation_dagster.tools.sample import MIN_DOCSTRING_CHARS, _docstrings

    roots = [Path(p) for p in site.getsitepackages()]
    copies: list[tuple[str, Path, str]] = []
    for sp in roots:
        for vendor in ("", "pip/_vendor", "setuptools/_vendor"):
            for pkg in PACKAGES:
                path = sp / vendor / pkg
                if path.is_dir():
                    copies.append((pkg, path, vendor or "site-packages"))
    texts, keys, where = [], [], []
    for pkg, path, copy in copies:
        for file in sorted(path.rglob("*.py")):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(file.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            module = file.relative_to(path).with_suffix("").as_posix().replace("/", ".")
            for qualname, doc in _docstrings(tree, ""):
                if len(doc) >= MIN_DOCSTRING_CHARS:
                    texts.append(doc)
                    keys.append(f"{pkg}:{module}:{qualname}")
                    where.append(f"{pkg}@{copy}")
    return texts, keys, where


def bench_accuracy(args: argparse.Namespace) -> None:
    import torch

    from stages.kernels.semantic import partitioned_similarity, semantic_clusters
    from stages.programs.document_embeddings import encoder

    texts, keys, where = versioned_docstrings()
    # exact dedup first, as in the pipeline: keep the first copy of each normalized text
    h = text_hashes(texts)
    _, first = np.unique(h, axis=0, return_index=True)
    keep = np.sort(first)
    texts = [texts[i] for i in keep]
    keys = [keys[i] for i in keep]
    print(f"{len(h)} docstrings of {len(set(where))} package copies; {len(texts)} after exact dedup, "
          f"{len(set(keys))} distinct APIs")
    enc = encoder("all-MiniLM-L6-v2", args.device, args.max_tokens)
    t0 = time.perf_counter()
    x = enc.embed(enc.tokenize(texts))
    print(f"embedded in {time.perf_counter() - t0:.1f} s on {args.device}")
    key_arr = np.asarray(keys)
    # a document is removable when an earlier document documents the same API
    _, first_of_key = np.unique(key_arr, return_index=True)
    removable = np.ones(len(keys), bool)
    removable[first_of_key] = False
    total_true = int(removable.sum())
    print(f"true duplicates (a later version of an API already seen): {total_true}")
    xt = torch.from_numpy(x).to(args.device)
    settings = [("all-pairs (one cluster)", None, 0.0), ("k-means 1000/cluster, no spill", 1000, 0.0),
                ("k-means 1000/cluster, spill 0.05", 1000, 0.05), ("k-means 100/cluster, no spill", 100, 0.0),
                ("k-means 100/cluster, spill 0.05", 100, 0.05)]
    rank = np.arange(len(x))  # priority order: the first copy of an API comes first
    neighbors = {}
    for name, per, margin in settings:
        t0 = time.perf_counter()
        if per is None:
            labels, second = np.zeros(len(x), np.int64), np.full(len(x), -1)
        else:
            labels, _, second, _ = semantic_clusters(
                xt, math.ceil(len(x) / per), 5 * per, per, 0.1, 50, 30, 42, margin)
        neighbors[name] = partitioned_similarity(xt, labels, second, rank)
        spilled = (second >= 0).mean()
        print(f"{name}: {labels.max() + 1} clusters, largest {np.bincount(labels).max()}, spilled {spilled:.1%}, "
              f"{time.perf_counter() - t0:.2f} s")
    print(f"{'eps':>5} {'setting':<34} {'removed':>7} {'precision':>9} {'recall':>7} {'vs all-pairs':>12}")
    for eps in args.eps:
        base = None
        for name, _, _ in settings:
            sim, dup = neighbors[name]
            removed = sim >= 1 - eps
            right = removed & (dup >= 0) & (key_arr[np.maximum(dup, 0)] == key_arr)
            precision = right.sum() / max(1, removed.sum())
            recall = right.sum() / max(1, total_true)
            if base is None:
                base = removed
            kept_recall = (removed & base).sum() / max(1, base.sum())
            print(f"{eps:5.2f} {name:<34} {removed.sum():7d} {precision:9.3f} {recall:7.3f} {kept_recall:12.4f}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("embed", "pairwise", "accuracy"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--docs", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", choices=("fp32", "bf16", "autocast-bf16", "int8"),
                   help="embed: also time the Encoder computing in this precision")
    p.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                   help="embed: onnx also times the transformer run by ONNX Runtime (fp32, CPU)")
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--eps", type=float, nargs="+", default=[0.01, 0.03, 0.05, 0.07, 0.10, 0.15])
    args = p.parse_args()
    {"embed": bench_embed, "pairwise": bench_pairwise, "accuracy": bench_accuracy}[args.mode](args)


if __name__ == "__main__":
    main()
