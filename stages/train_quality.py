"""Train a fastText quality classifier from a crawl's own documents (DCLM's recipe).

DCLM trains a bigram fastText model on reference text (the positive class, ``__label__hq``)
against random crawl text (the negative class, ``__label__cc``) and keeps the crawl documents
the model scores as reference-like. Here both classes come from sources of one crawl, read as
the quality stage would see them: the documents of each source that survived every remover
before ``quality_scores`` (language, heuristic, exact, fuzzy, semantic), from the committed
outputs of the crawl's current parameters in the data root.

- Sampling: each class is a uniform sample of the union of its sources, chosen by a seeded
  hash of the ``doc_id`` (the smallest ``max_docs`` hashes), so the result does not depend on
  batch order or sharding and memory holds at most ``max_docs`` texts per class. The larger
  class is cut to the smaller one's size (balanced, as DCLM's 200k/200k) unless ``balance``
  is off.
- Held-out split: a seeded permutation per class; the model written is the one trained on the
  rest, so the held-out precision and recall describe the file on disk.
- Determinism: one training thread (the default) and a fixed seed give the same model bytes
  on every run.

The provenance (sources, counts, sizes, fastText parameters, seed, the crawl and the params
keys of the outputs read, held-out metrics, a ready classifier config) is written beside the
model as JSON, after the model.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash
from pydantic import BaseModel, ConfigDict, Field

from stages.catalog import partition_name
from stages.kernels.quality import fasttext_line, fasttext_scores
from stages.removal import survivors
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from stages.store import Store
from stages.task import Inputs

POSITIVE = "__label__hq"
NEGATIVE = "__label__cc"
PROGRAM = "quality_scores"  # the classifier is trained on the documents this program scores


class TrainError(ValueError):
    """A user mistake (unknown source, empty class, crawl not run): reported as one line."""


class FastTextParams(BaseModel):
    """fastText supervised training parameters: word bigrams as DCLM's model; 25 epochs at lr 0.5,
    as fastText advises for small sets (5 at 0.1, its default, leaves a few thousand documents
    underfit: every held-out document scored ~0.5 on the sample)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    dim: int = Field(default=100, ge=1)
    epoch: int = Field(default=25, ge=1)
    lr: float = Field(default=0.5, gt=0)
    word_ngrams: int = Field(default=2, ge=1)
    min_count: int = Field(default=1, ge=1)
    # Hash buckets of the word n-grams: dim x bucket float32 in the model file (100 x 200k = 80 MB).
    bucket: int = Field(default=200_000, ge=0)


class TrainParams(BaseModel):
    """What a training run is made of besides its sources."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_docs: int = Field(default=100_000, ge=2)  # per class, before balancing
    holdout: float = Field(default=0.2, gt=0, lt=1)
    seed: int = Field(default=0, ge=0)
    threshold: float = Field(default=0.5, ge=0, le=1)  # P(hq) >= threshold: predicted positive
    balance: bool = True  # cut the larger class to the smaller one's size
    # 1: the same model bytes on every run; more: faster (fastText's Hogwild SGD), not reproducible.
    threads: int = Field(default=1, ge=1)
    fasttext: FastTextParams = Field(default_factory=FastTextParams)


@dataclass
class _Sample:
    """The ``limit`` documents of smallest seeded hash seen so far (ties broken by doc_id)."""

    limit: int
    hashes: npt.NDArray[np.uint64]
    ids: list[str]
    texts: list[str]
    sources: list[str]

    @classmethod
    def empty(cls, limit: int) -> _Sample:
        return cls(limit, np.zeros(0, np.uint64), [], [], [])

    def add(self, hashes: npt.NDArray[np.uint64], ids: list[str], texts: list[str], source: str) -> None:
        all_h = np.concatenate([self.hashes, hashes])
        all_ids = self.ids + ids
        all_texts = self.texts + texts
        all_src = self.sources + [source] * len(ids)
        # By hash, then doc_id (a 64-bit tie is rare but must not depend on reading order).
        order = np.lexsort((np.array(all_ids, dtype=object).astype(str), all_h))[: self.limit].tolist()
        self.hashes = all_h[order]
        self.ids = [all_ids[i] for i in order]
        self.texts = [all_texts[i] for i in order]
        self.sources = [all_src[i] for i in order]


def _hashes(ids: Sequence[str], seed: int) -> npt.NDArray[np.uint64]:
    return np.fromiter((xxhash.xxh3_64_intdigest(i.encode(), seed=seed) for i in ids), np.uint64, count=len(ids))


def _source_inputs(store: Store, spec: CrawlSpec, source: str) -> tuple[Inputs, dict[str, str]]:
    """The committed inputs ``quality_scores`` of ``source`` reads, and their params keys by
    program. A missing one is a TrainError naming it: the crawl has to be run first."""
    task = resolve_task(store, spec, PROGRAM, source)
    keys = spec.keys()
    used: dict[str, str] = {}
    for program, by_source in task.input_dirs.items():
        for src, pdir in by_source.items():
            if store.read_manifest(pdir) is None:
                raise TrainError(f"{partition_name(program, spec.crawl, src)} is not materialized for crawl "
                                 f"{spec.crawl!r}'s current parameters: run `curate run --crawl {spec.crawl}` first")
            used[program] = keys[(program, src)]
    return Inputs(store, task.input_dirs), dict(sorted(used.items()))


def sample_class(
    store: Store, spec: CrawlSpec, sources: Sequence[str], limit: int, seed: int
) -> tuple[_Sample, dict[str, int], dict[str, dict[str, str]]]:
    """Up to ``limit`` surviving documents drawn uniformly from ``sources``; also the number of
    survivors per source and the params keys of the inputs read per source."""
    sample = _Sample.empty(limit)
    available: dict[str, int] = {}
    keys: dict[str, dict[str, str]] = {}
    for source in sources:
        inputs, keys[source] = _source_inputs(store, spec, source)
        available[source] = 0
        for batch in survivors(inputs, source, ["doc_id", "text"]):
            ids = batch["doc_id"].to_pylist()
            texts = batch["text"].to_pylist()  # a string: ingestion quarantines any other
            available[source] += len(ids)
            sample.add(_hashes(ids, seed), ids, texts, source)
    return sample, available, keys


def _split(n: int, holdout: float, rng: np.random.Generator) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(train, held-out) row indices of ``n`` rows; at least one of each."""
    perm = rng.permutation(n).astype(np.int64)
    k = min(max(1, round(holdout * n)), n - 1)
    return np.sort(perm[k:]), np.sort(perm[:k])


def heldout_metrics(scores: npt.NDArray[np.float64], truth: npt.NDArray[np.bool_], threshold: float) -> dict[str, Any]:
    """Precision, recall, F1 and accuracy of ``scores >= threshold`` against ``truth`` (positive
    class), the confusion counts and the ROC AUC (rank statistic, ties counted half).
    An undefined ratio (no predicted or no true positives) is 0.0."""
    pred = scores >= threshold
    tp = int((pred & truth).sum())
    fp = int((pred & ~truth).sum())
    fn = int((~pred & truth).sum())
    tn = int((~pred & ~truth).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    auc = _auc(scores[truth], scores[~truth])
    return {
        "threshold": threshold, "precision": round(precision, 6), "recall": round(recall, 6),
        "f1": round(2 * precision * recall / (precision + recall), 6) if precision + recall else 0.0,
        "accuracy": round((tp + tn) / len(scores), 6) if len(scores) else 0.0, "auc": round(auc, 6),
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
    }


def _auc(pos: npt.NDArray[np.float64], neg: npt.NDArray[np.float64]) -> float:
    """P(a random positive scores above a random negative), ties counted half: the Mann-Whitney
    U from average ranks, in O(n log n) (a pairwise matrix of 20k x 20k held-out scores would
    take gigabytes). 0.0 when a class is empty."""
    if not len(pos) or not len(neg):
        return 0.0
    values = np.concatenate([pos, neg])
    order = np.argsort(values, kind="stable")
    _, inverse, counts = np.unique(values[order], return_inverse=True, return_counts=True)
    average = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based mean rank of each distinct value
    ranks = np.empty(len(values))
    ranks[order] = average[inverse]
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def provenance_path(out: Path) -> Path:
    """Where the provenance of model ``out`` goes: ``model.bin`` -> ``model.json``."""
    return out.with_suffix(".json") if out.suffix else out.with_name(out.name + ".json")


def _write_atomic(path: Path, write: Any) -> None:
    """``write(tmp_path)`` then rename over ``path``: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def train(
    store: Store, spec: CrawlSpec, positive: Sequence[str], negative: Sequence[str], out: Path,
    params: TrainParams | None = None, name: str = "trained",
) -> dict[str, Any]:
    """Train ``out`` (a fastText ``.bin``) on ``positive`` vs ``negative`` sources of ``spec``'s
    crawl and write its provenance beside it; returns the provenance."""
    fasttext = _fasttext_trainer()
    params = params or TrainParams()
    pos_names, neg_names = list(dict.fromkeys(positive)), list(dict.fromkeys(negative))
    if not pos_names or not neg_names:
        raise TrainError("give at least one --positive and one --negative source")
    unknown = [s for s in pos_names + neg_names if s not in spec.sources]
    if unknown:
        raise TrainError(f"source(s) {', '.join(unknown)} are not part of crawl {spec.crawl!r} "
                         f"(its sources: {', '.join(sorted(spec.sources))})")
    both = sorted(set(pos_names) & set(neg_names))
    if both:
        raise TrainError(f"source(s) {', '.join(both)} are given as both --positive and --negative")
    if provenance_path(out) == out:
        raise TrainError(f"--out {out}: the model needs a name other than its provenance's (use .bin)")
    pos, pos_avail, pos_keys = sample_class(store, spec, pos_names, params.max_docs, params.seed)
    neg, neg_avail, neg_keys = sample_class(store, spec, neg_names, params.max_docs, params.seed)
    for label, smp, names in (("positive", pos, pos_names), ("negative", neg, neg_names)):
        if len(smp.ids) < 2:
            raise TrainError(f"the {label} set ({', '.join(names)}) has {len(smp.ids)} surviving document(s) in "
                             f"crawl {spec.crawl!r}; training needs at least 2 per class")
    n = min(len(pos.ids), len(neg.ids))  # balanced: the first n by hash are a uniform sample too
    rng = np.random.default_rng(params.seed)
    rows: dict[str, dict[str, list[tuple[str, str, str]]]] = {"train": {}, "heldout": {}}
    for label, smp in ((POSITIVE, pos), (NEGATIVE, neg)):
        tr, ho = _split(n if params.balance else len(smp.ids), params.holdout, rng)
        for part, idx in (("train", tr), ("heldout", ho)):
            rows[part][label] = [(smp.ids[i], smp.sources[i], smp.texts[i]) for i in idx.tolist()]

    lines = [f"{label} {fasttext_line(text)}" for label, docs in rows["train"].items() for _, _, text in docs]
    order = rng.permutation(len(lines))  # SGD over interleaved classes, not one class then the other
    ft = params.fasttext
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train-quality-") as tmp:
        train_file = Path(tmp) / "train.txt"
        train_file.write_text("".join(lines[i] + "\n" for i in order.tolist()), encoding="utf-8")
        model = fasttext.train_supervised(
            input=str(train_file), dim=ft.dim, epoch=ft.epoch, lr=ft.lr, wordNgrams=ft.word_ngrams,
            minCount=ft.min_count, bucket=ft.bucket, thread=params.threads, seed=params.seed, verbose=0,
        )
    held = rows["heldout"]
    texts = [t for label in (POSITIVE, NEGATIVE) for _, _, t in held[label]]
    truth = np.array([True] * len(held[POSITIVE]) + [False] * len(held[NEGATIVE]))
    metrics = heldout_metrics(fasttext_scores(model, texts, POSITIVE), truth, params.threshold)
    _write_atomic(out, lambda p: model.save_model(str(p)))

    from stages.fingerprint import fingerprint

    def counts(part: str, label: str) -> dict[str, int]:
        c: dict[str, int] = {}
        for _, src, _ in rows[part][label]:
            c[src] = c.get(src, 0) + 1
        return dict(sorted(c.items()))

    def size(label: str) -> dict[str, Any]:
        docs = [d for part in ("train", "heldout") for d in rows[part][label]]
        return {"documents": len(docs), "bytes": sum(len(t.encode("utf-8")) for _, _, t in docs),
                "train": len(rows["train"][label]), "heldout": len(rows["heldout"][label])}

    provenance: dict[str, Any] = {
        "model": out.name,
        "model_fingerprint": fingerprint(str(out)),
        "kind": "fasttext",
        "labels": {"positive": POSITIVE, "negative": NEGATIVE},
        "crawl": spec.crawl,
        "read": f"the survivors of every stage before {PROGRAM} (its inputs' committed outputs)",
        "sources": {"positive": pos_names, "negative": neg_names},
        "available": {**pos_avail, **neg_avail},  # surviving documents per source
        "documents": {"positive": size(POSITIVE), "negative": size(NEGATIVE)},
        "documents_per_source": {
            "train": {**counts("train", POSITIVE), **counts("train", NEGATIVE)},
            "heldout": {**counts("heldout", POSITIVE), **counts("heldout", NEGATIVE)},
        },
        "params_keys": {**pos_keys, **neg_keys},  # per source: {program: params_key} of the inputs read
        "seed": params.seed,
        "max_docs": params.max_docs,
        "holdout": params.holdout,
        "balance": params.balance,
        "fasttext": {**ft.model_dump(), "thread": params.threads, "loss": "softmax", "version": _fasttext_version()},
        "heldout_metrics": metrics,
        "classifier": {"name": name, "kind": "fasttext", "path": str(out.resolve()),
                       "label": POSITIVE.removeprefix("__label__"), "min_score": params.threshold},
    }
    blob = json.dumps(provenance, indent=1, ensure_ascii=False) + "\n"
    _write_atomic(provenance_path(out), lambda p: p.write_text(blob, encoding="utf-8"))
    return provenance


def _fasttext_trainer() -> Any:
    """The ``fasttext`` module, if it can train: fasttext-predict (the language extra's) installs
    a predict-only module under the same name."""
    try:
        import fasttext
    except ModuleNotFoundError as exc:
        raise TrainError("training a classifier needs fastText: pip install 'curation-dagster[quality]'") from exc
    if not hasattr(fasttext, "train_supervised"):
        raise TrainError("the installed fasttext module only predicts (fasttext-predict); put fasttext-community's "
                         "back: pip install --no-deps --force-reinstall fasttext-community")
    return fasttext


def _fasttext_version() -> str:
    import importlib.metadata as md

    for dist in ("fasttext-community", "fasttext"):
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            continue
    return "unknown"

