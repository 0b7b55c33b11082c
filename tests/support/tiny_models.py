"""Tiny classifiers built on the fly (nothing is downloaded): a fastText model trained on planted
vocabularies and randomly initialised BERT-style sequence classifiers with a word-level tokenizer."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

HQ_WORDS = ("physics energy theory experiment measurement equation hypothesis evidence analysis "
            "chemistry molecule reaction biology cell protein history century archive research").split()
LQ_WORDS = ("buy cheap click now free offer winner casino bonus deal discount sale subscribe "
            "viagra prize limited hurry cash").split()
COMMON = "the a of and to in is it that for with as on".split()


def hq_text(rng: random.Random, words: int = 40) -> str:
    return " ".join(rng.choice(HQ_WORDS if rng.random() < 0.7 else COMMON) for _ in range(words))


def lq_text(rng: random.Random, words: int = 40) -> str:
    return " ".join(rng.choice(LQ_WORDS if rng.random() < 0.7 else COMMON) for _ in range(words))


def prose(rng: random.Random, vocab: list[str] | tuple[str, ...], sentences: int = 8) -> str:
    """Sentences of ``vocab`` words with stop words and end punctuation, so the heuristic filters
    keep them: documents only a quality classifier tells apart."""
    out = []
    for _ in range(sentences):
        words = [rng.choice(vocab if rng.random() < 0.6 else COMMON) for _ in range(11)]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def train_fasttext(path: Path, seed: int = 0) -> Path:
    """A fastText supervised model with labels __label__hq / __label__lq, trained in ~0.1 s."""
    import fasttext

    rng = random.Random(seed)
    train = path.with_suffix(".train.txt")
    lines = []
    for _ in range(300):
        lines.append(f"__label__hq {hq_text(rng, 20)}")
        lines.append(f"__label__lq {lq_text(rng, 20)}")
    rng.shuffle(lines)
    train.write_text("\n".join(lines) + "\n")
    model = fasttext.train_supervised(str(train), dim=16, epoch=10, lr=0.5, thread=1, seed=seed, verbose=0)
    model.save_model(str(path))
    return path


def make_tokenizer(words: list[str] | None = None) -> Any:
    """A word-level fast tokenizer (lower-cased, [CLS] ... [SEP]) over a fixed vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab_words = sorted(set(words or (HQ_WORDS + LQ_WORDS + COMMON)))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + vocab_words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=128,
    )


def make_hf_classifier(path: Path, *, num_labels: int = 1, seed: int = 0,
                       id2label: dict[int, str] | None = None) -> tuple[Any, Any]:
    """Save a randomly initialised 1-layer BERT sequence classifier and its tokenizer to ``path``;
    return the in-memory (model, tokenizer). A large init range spreads the scores apart."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=128, num_labels=num_labels,
        initializer_range=0.5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        id2label=id2label or {i: f"LABEL_{i}" for i in range(num_labels)},
        label2id={v: k for k, v in (id2label or {i: f"LABEL_{i}" for i in range(num_labels)}).items()},
    )
    model = BertForSequenceClassification(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return model, tokenizer


def reference_scores(model: Any, tokenizer: Any, texts: list[str], label_index: int | None,
                     max_tokens: int = 512) -> list[float]:
    """Scores computed one text at a time, unpadded, straight from the in-memory model: what a
    correct load plus batching must reproduce."""
    import torch

    out = []
    for text in texts:
        enc = tokenizer(text, truncation=True, max_length=max_tokens, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**enc).logits.float()[0]
        out.append(float(logits[0]) if label_index is None else float(torch.softmax(logits, -1)[label_index]))
    return out
