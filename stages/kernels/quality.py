"""Quality classifier kernels: one contract, texts in, one float64 score per text out.

The model objects are loaded by the program (``stages.programs.quality_scores``); these
functions only compute. Keep/drop is a separate step (``keep_mask``) on stored scores, so
thresholds can change without rescoring.

- fastText (``fasttext_scores``): the probability of one label. Newlines become spaces, the
  preprocessing DCLM's and FineWeb's fastText filters were trained with.
- Transformers (``tokenize`` then ``classifier_scores``): documents are tokenized ahead of the
  model (the caller overlaps the next chunk's tokenization with this chunk's forward pass),
  sorted by token length and cut into batches under a token budget, so a batch of short pages
  is never padded to ``max_tokens``. On a GPU the forward pass runs in bf16 autocast; the CPU
  path (float32) is the same function with ``device="cpu"``.

torch is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def fasttext_line(text: str) -> str:
    """One text as the single line fastText reads: newlines and carriage returns become spaces
    (what DCLM did, and what training and scoring must agree on)."""
    return " ".join(text.split("\n")).replace("\r", " ")


def fasttext_scores(model: Any, texts: Sequence[str], label: str) -> npt.NDArray[np.float64]:
    """float64 (n,): probability of ``label`` (e.g. ``__label__hq``) per text under a loaded
    fastText supervised model. A label the model does not return for a text scores 0."""
    if len(texts) == 0:
        return np.zeros(0, dtype=np.float64)
    lines = [fasttext_line(t) for t in texts]
    labels, probs = model.predict(lines, k=-1)
    out = np.zeros(len(texts), dtype=np.float64)
    for i, (labs, ps) in enumerate(zip(labels, probs, strict=True)):
        for lab, p in zip(labs, ps, strict=True):
            if lab == label:
                out[i] = min(float(p), 1.0)  # fastText's softmax can exceed 1 by ~1e-5
                break
    return out


def tokenize(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> list[list[int]]:
    """Token ids per text, truncated to ``max_tokens`` (special tokens included), unpadded.

    A fast (Rust) tokenizer encodes a batch on all cores and releases the GIL, so a thread can
    run this for the next chunk while the model scores the current one.
    """
    if len(texts) == 0:
        return []
    enc = tokenizer(list(texts), truncation=True, max_length=max_tokens, padding=False)
    return [list(ids) for ids in enc["input_ids"]]


def length_batches(
    lengths: npt.NDArray[np.int64], batch_tokens: int, max_rows: int = 1024
) -> list[npt.NDArray[np.int64]]:
    """Row indices per batch: rows sorted by length (stable), each batch padded to its longest
    row holds at most ``batch_tokens`` tokens (``rows * longest``) and ``max_rows`` rows.

    lengths: int (n,). Returns int64 arrays whose concatenation is a permutation of range(n).
    """
    order = np.argsort(np.asarray(lengths), kind="stable").astype(np.int64)
    batches: list[npt.NDArray[np.int64]] = []
    start = 0
    n = len(order)
    sorted_len = np.asarray(lengths)[order]
    while start < n:
        end = start + 1
        # Sorted ascending, so the batch's longest row is its last one.
        while end < n and end - start < max_rows and (end - start + 1) * max(int(sorted_len[end]), 1) <= batch_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def classifier_scores(
    model: Any,
    ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    label_index: int | None,
    batch_tokens: int = 65_536,
    device: str = "cpu",
) -> npt.NDArray[np.float64]:
    """float64 (n,): scores of a sequence-classification model for pre-tokenized texts.

    ids: n lists of token ids (from ``tokenize``). ``label_index=None``: regression, the single
    logit; otherwise the softmax probability of that label. Batches follow ``length_batches``;
    padding is to the batch's longest row, with an attention mask. ``device`` "cuda..." runs
    under bf16 autocast; "cpu" in float32. Results are in input order.
    """
    import torch

    n = len(ids)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
    on_gpu = device.startswith("cuda")
    for rows in length_batches(lengths, batch_tokens):
        width = max(int(lengths[rows].max()), 1)
        batch = np.full((len(rows), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, r in enumerate(rows.tolist()):
            batch[j, : lengths[r]] = ids[r]
            mask[j, : lengths[r]] = 1
        input_ids = torch.from_numpy(batch).to(device, non_blocking=True)
        attention = torch.from_numpy(mask).to(device, non_blocking=True)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu):
            logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
        if label_index is None:
            scores = logits[:, 0]
        else:
            scores = torch.softmax(logits, dim=-1)[:, label_index]
        out[rows] = scores.cpu().numpy().astype(np.float64)
    return out


def keep_mask(
    scores: npt.NDArray[np.floating], min_score: float | None, max_score: float | None
) -> npt.NDArray[np.bool_]:
    """bool (n,): ``min_score <= score <= max_score`` (a ``None`` bound is open). A NaN score
    fails any bound and passes when both are open."""
    s = np.asarray(scores, dtype=np.float64)
    keep = np.ones(len(s), dtype=bool)
    with np.errstate(invalid="ignore"):
        if min_score is not None:
            keep &= s >= min_score
        if max_score is not None:
            keep &= s <= max_score
    return keep


def histogram(scores: npt.NDArray[np.floating], bins: int = 10) -> dict[str, Any]:
    """Plain-JSON summary of scores: count, min/mean/max, quantiles and ``bins`` equal-width
    bins over [min, max] (edges has bins+1 values). NaNs are counted apart."""
    s = np.asarray(scores, dtype=np.float64)
    nan = int(np.isnan(s).sum())
    s = s[~np.isnan(s)]
    if len(s) == 0:
        return {"count": 0, "nan": nan}
    counts, edges = np.histogram(s, bins=bins)
    q = np.quantile(s, [0.1, 0.5, 0.9])
    return {
        "count": len(s), "nan": nan,
        "min": float(s.min()), "mean": float(s.mean()), "max": float(s.max()),
        "p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2]),
        "edges": [round(float(e), 6) for e in edges], "counts": counts.astype(int).tolist(),
    }
