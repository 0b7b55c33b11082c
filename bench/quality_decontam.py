"""Throughput of the quality and decontam kernels on the sample corpus (real text), on this machine.

    python bench/quality_decontam.py [--docs 1500] [--device cpu|cuda]

Prints one JSON object: fastText docs/s; a transformer classifier (randomly initialised, 4 layers,
hidden 256; the size does not change the batching comparison) with length-bucketed batches vs
fixed batches in corpus order vs padding to max_tokens, and the share of real tokens in each;
tokenization time vs forward time; decontam index build and match throughput.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import source_texts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curation_dagster.tools.sample import build_sample
from stages.kernels import decontam as D
from stages.kernels import quality as Q


def bench_fasttext(texts: list[str], other: list[str], tmp: Path) -> dict[str, Any]:
    import fasttext

    train = tmp / "ft.txt"
    lines = [f"__label__hq {' '.join(t.split())}" for t in texts[:500]]
    lines += [f"__label__lq {' '.join(t.split())}" for t in other[:500]]
    train.write_text("\n".join(lines) + "\n")
    model = fasttext.train_supervised(str(train), dim=256, wordNgrams=2, epoch=2, thread=1, seed=0, verbose=0)
    t0 = time.perf_counter()
    Q.fasttext_scores(model, texts, "__label__hq")
    sec = time.perf_counter() - t0
    mb = sum(len(t.encode()) for t in texts) / 1e6
    return {"docs": len(texts), "seconds": round(sec, 3), "docs_per_s": round(len(texts) / sec),
            "mb_per_s": round(mb / sec, 1), "dim": 256, "wordNgrams": 2}


def bench_transformer(texts: list[str], device: str, max_tokens: int = 512) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab_words = sorted({w for t in texts for w in t.lower().split()})[:30_000]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {w: i for i, w in enumerate(specials + vocab_words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=max_tokens, num_labels=1)
    model = BertForSequenceClassification(cfg).eval().to(device)
    if device.startswith("cuda"):
        model = model.to(torch.bfloat16)
    t0 = time.perf_counter()
    ids = Q.tokenize(tokenizer, texts, max_tokens)
    tok_sec = time.perf_counter() - t0
    lengths = np.array([len(x) for x in ids])
    real = int(lengths.sum())
    budget = 262_144 if device.startswith("cuda") else 16_384

    def timed(fn: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t, out

    sec_b, scores_b = timed(lambda: Q.classifier_scores(model, ids, pad_id=0, label_index=None,
                                                        batch_tokens=budget, device=device))
    padded_b = sum(len(b) * int(lengths[b].max()) for b in Q.length_batches(lengths, budget))

    def fixed(pad_to: int | None, rows: int = 32) -> np.ndarray:
        out = []
        for i in range(0, len(ids), rows):
            chunk = ids[i : i + rows]
            width = pad_to or max(len(x) for x in chunk)
            arr = np.zeros((len(chunk), width), np.int64)
            mask = np.zeros_like(arr)
            for j, x in enumerate(chunk):
                arr[j, : len(x)] = x
                mask[j, : len(x)] = 1
            with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda")):
                logits = model(input_ids=torch.from_numpy(arr).to(device),
                               attention_mask=torch.from_numpy(mask).to(device)).logits.float()
            out.append(logits[:, 0].cpu().numpy())
        return np.concatenate(out)

    sec_f, scores_f = timed(lambda: fixed(None))
    padded_f = sum(len(ids[i : i + 32]) * max(len(x) for x in ids[i : i + 32]) for i in range(0, len(ids), 32))
    sec_m, _ = timed(lambda: fixed(max_tokens))
    n = len(texts)
    return {
        "docs": n, "device": device, "max_tokens": max_tokens,
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "tokens": real, "tokenize_seconds": round(tok_sec, 3),
        "bucketed": {"seconds": round(sec_b, 2), "docs_per_s": round(n / sec_b, 1),
                     "real_token_share": round(real / padded_b, 3)},
        "fixed32_corpus_order": {"seconds": round(sec_f, 2), "docs_per_s": round(n / sec_f, 1),
                                 "real_token_share": round(real / padded_f, 3)},
        "padded_to_max": {"seconds": round(sec_m, 2), "docs_per_s": round(n / sec_m, 1),
                          "real_token_share": round(real / (n * max_tokens), 3)},
        "max_abs_diff_bucketed_vs_fixed": float(np.abs(scores_b - scores_f).max()),
    }


def bench_decontam(texts: list[str], examples: int = 10_000) -> dict[str, Any]:
    rng = random.Random(0)
    vocab = sorted({w for t in texts[:300] for w in D.words(t)})
    bench = [[" ".join(rng.choice(vocab) for _ in range(80))] for _ in range(examples)]
    t0 = time.perf_counter()
    index = D.build_index(bench, 13)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, len(texts), 2000):
        D.match(index, texts[i : i + 2000])
    sec = time.perf_counter() - t0
    mb = sum(len(t.encode()) for t in texts) / 1e6
    return {"benchmark_examples": examples, "index_ngrams": len(index.hashes),
            "index_mib": round(index.nbytes / 2**20, 1),
            "index_build_seconds": round(build, 2), "docs": len(texts), "mb": round(mb, 1),
            "match_seconds": round(sec, 2), "docs_per_s": round(len(texts) / sec), "mb_per_s": round(mb / sec, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--copies", type=int, default=4, help="sample copies for the decontam corpus")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_sample(Path(tmp) / "s", max_docs_per_source=args.docs, copies=args.copies)
        docs = list(source_texts(folders["docstrings"]))
        other = [*source_texts(folders["licenses"]), *source_texts(folders["package_docs"])]
        originals = docs[: args.docs]
        out = {
            "fasttext": bench_fasttext(originals, other, Path(tmp)),
            "transformer": bench_transformer(originals, args.device),
            "decontam": bench_decontam(docs + other),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
