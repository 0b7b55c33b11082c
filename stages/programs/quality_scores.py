"""quality_scores[source, crawl]: classifier scores of the surviving documents, and a removal list.

Classifiers run as a cascade in the configured order: each scores only the documents every
classifier before it kept, so a cheap fastText model first spares the transformer the obvious
junk. Removed documents get reason ``quality:<classifier>`` and the score that decided it.

Outputs: ``scores`` (doc_id + one float64 column per classifier, null where a document was not
scored because an earlier classifier removed it) and ``removed``.

Scores and decisions are separate: each classifier's scores are cached (``stages.cache``) under
``quality_model_scores/<key>/<crawl>/<source>`` by the xxh3-128 of the text, where the key
hashes the scorer version, the model's content fingerprint, its label and truncation, never the
thresholds; a threshold change, or an upstream dedup parameter that changes the survivors,
scores only texts the cache lacks, and a changed model file gets a new key, so stale scores are
never read.

Models load only from local paths (``local_files_only``): nothing is downloaded at run time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stages import versions
from stages.backend import resolve
from stages.cache import RowCache, text_keys
from stages.kernels import quality as Q
from stages.params import ExecutionParams, QualityClassifier, QualityScoresParams
from stages.removal import REMOVED, removal_table, survivor_count, survivors
from stages.reports import ClassifierStats, QualityScoresReport
from stages.store import PartitionWriter, Store
from stages.task import Inputs, Partition

SCORES = "quality_model_scores"
SCORER_VERSION = versions.QUALITY_SCORER  # bumped in stages/versions.py when scores change for one model
NO_MODEL = "no model configured"
CHUNK = 2048  # texts per tokenize/forward step; the next chunk is tokenized during this one's forward
BATCH_TOKENS = {"cpu": 16_384, "cuda": 262_144}  # padded tokens per forward batch


class Scorer(Protocol):
    """The one contract of every classifier: a batch of texts in, float64 (n,) scores out, on
    ``device`` (a torch device name; ``cpu`` for non-torch models)."""

    device: str

    def score(self, texts: list[str]) -> npt.NDArray[np.float64]: ...


class FastTextScorer:
    """A fastText ``.bin`` model; the score is the probability of ``label``."""

    device = "cpu"

    def __init__(self, clf: QualityClassifier) -> None:
        import fasttext

        path = Path(clf.path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"classifier {clf.name}: fastText model {clf.path} is not a file")
        self.model = fasttext.load_model(str(path))
        labels = list(self.model.labels)
        wanted = clf.label if clf.label is None or clf.label.startswith("__label__") else f"__label__{clf.label}"
        if wanted is None or wanted not in labels:
            raise ValueError(f"classifier {clf.name}: set label to one of the model's labels {labels} "
                             f"(got {clf.label!r})")
        self.label = wanted

    def score(self, texts: list[str]) -> npt.NDArray[np.float64]:
        return Q.fasttext_scores(self.model, texts, self.label)


class HFScorer:
    """A local Hugging Face sequence-classification model (a directory with config, weights and
    tokenizer). One output: regression, the score is the logit; several: the probability of
    ``label``. bf16 weights on a GPU, float32 on the CPU."""

    def __init__(self, clf: QualityClassifier, device: str) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        path = Path(clf.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"classifier {clf.name}: {clf.path} is not a local model directory "
                                    "(no config.json); models are never downloaded")
        hf_logging.disable_progress_bar()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        self.device = device
        if device.startswith("cuda"):
            model = model.to(device=device, dtype=torch.bfloat16)
        self.model = model.eval()
        self.max_tokens = clf.max_tokens
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.label_index = self._label_index(clf, model.config)

    @staticmethod
    def _label_index(clf: QualityClassifier, config: Any) -> int | None:
        n = int(config.num_labels)
        if n == 1:
            if clf.label is not None:
                raise ValueError(f"classifier {clf.name}: the model has one output (regression); remove label")
            return None
        names = {str(v): int(k) for k, v in (config.id2label or {}).items()}
        if clf.label in names:
            return names[clf.label]
        if clf.label is not None and clf.label.isdigit() and int(clf.label) < n:
            return int(clf.label)
        raise ValueError(f"classifier {clf.name}: the model has {n} labels; set label to one of "
                         f"{sorted(names, key=names.__getitem__)} (got {clf.label!r})")

    def score(self, texts: list[str]) -> npt.NDArray[np.float64]:
        if not texts:
            return np.zeros(0, dtype=np.float64)
        chunks = [texts[i : i + CHUNK] for i in range(0, len(texts), CHUNK)]
        out: list[npt.NDArray[np.float64]] = []
        budget = BATCH_TOKENS["cuda" if self.device.startswith("cuda") else "cpu"]
        with ThreadPoolExecutor(1) as pool:  # tokenizes chunk i+1 while the model runs chunk i
            pending = pool.submit(Q.tokenize, self.tokenizer, chunks[0], self.max_tokens)
            for i in range(len(chunks)):
                ids = pending.result()
                if i + 1 < len(chunks):
                    pending = pool.submit(Q.tokenize, self.tokenizer, chunks[i + 1], self.max_tokens)
                out.append(Q.classifier_scores(self.model, ids, pad_id=self.pad_id, label_index=self.label_index,
                                               batch_tokens=budget, device=self.device))
        return np.concatenate(out)


_LOADED: dict[tuple[str, ...], Scorer] = {}


def load_scorer(clf: QualityClassifier, execution: ExecutionParams) -> Scorer:
    """The scorer of one classifier, loaded once per process (per model content and device)."""
    device = resolve(execution.backend).device if clf.kind == "hf" else "cpu"
    key = (clf.kind, clf.path, clf.fingerprint, clf.label or "", str(clf.max_tokens), device)
    if key not in _LOADED:
        if len(_LOADED) >= 2:
            _LOADED.clear()
        _LOADED[key] = FastTextScorer(clf) if clf.kind == "fasttext" else HFScorer(clf, device)
    return _LOADED[key]


SCORE_ROWS = pa.schema([("text_hash", pa.binary(16)), ("score", pa.float64())])


class ScoreCache:
    """Cached scores of one classifier on one source's texts (text hash -> score), a
    ``RowCache`` whose key hashes the scorer version, the model's content fingerprint, its label
    and truncation: never a threshold, never the survivor set."""

    def __init__(self, store: Store, clf: QualityClassifier, partition: Partition) -> None:
        ident = f"{SCORER_VERSION}/{clf.kind}/{clf.fingerprint}/{clf.label}/{clf.max_tokens}"
        self.rows = RowCache(store, SCORES, ident, partition.crawl, partition.source, SCORE_ROWS,
                             key_column="text_hash", table="scores")
        self.scores = self.rows.table["score"].to_numpy()

    def lookup(self, keys: pa.Array) -> npt.NDArray[np.float64]:
        """float64 (n,): cached score per text key, NaN where the cache has none."""
        pos = self.rows.find(keys)
        out = np.full(len(keys), np.nan)
        out[pos >= 0] = self.scores[pos[pos >= 0]]
        return out

    def add(self, keys: pa.Array, scores: npt.NDArray[np.float64]) -> None:
        self.rows.add(pa.table({"text_hash": keys, "score": pa.array(scores, pa.float64())}))

    def save(self, compression: str = "auto") -> None:
        self.rows.save(compression=compression)


def _empty(output: PartitionWriter, names: list[str]) -> None:
    cols: dict[str, pa.Array] = {"doc_id": pa.array([], pa.string())}
    cols.update({n: pa.array([], pa.float64()) for n in names})
    output.write("scores", pa.table(cols))
    output.write("removed", REMOVED.empty_table())


def run(
    params: QualityScoresParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> QualityScoresReport:
    """Report: input, kept, removed, removed_per_reason and, per classifier, its thresholds for
    this source, scored/cached counts, removed count, seconds, docs/s and a score histogram."""
    source = partition.source
    assert source is not None
    if not params.enabled:
        _empty(output, [])
        return QualityScoresReport(enabled=False, input=0, kept=0, removed=0, removed_per_reason={})
    if not params.classifiers:
        n = survivor_count(inputs, source)
        _empty(output, [])
        return QualityScoresReport(enabled=True, note=NO_MODEL, input=n, kept=n, removed=0, removed_per_reason={})

    clfs = list(params.classifiers)
    caches = [ScoreCache(inputs.store, c, partition) for c in clfs]
    scorers: list[Scorer | None] = [None] * len(clfs)  # loaded on first use: a fully cached run loads none
    stats = [{"scored": 0, "cached": 0, "computed": 0, "removed": 0, "seconds": 0.0} for _ in clfs]
    all_scores: list[list[npt.NDArray[np.float64]]] = [[] for _ in clfs]
    total = kept = 0
    removed_tables: list[pa.Table] = []
    wrote_scores = False
    for table in survivors(inputs, source, ["doc_id", "text"], execution.batch_rows, progress=partition.progress):
        n = table.num_rows
        total += n
        ids = table["doc_id"].combine_chunks()
        texts = table["text"].to_pylist()
        keys = text_keys(texts)
        alive = np.ones(n, dtype=bool)
        reason = np.full(n, None, dtype=object)
        decided = np.full(n, np.nan)
        columns: dict[str, npt.NDArray[np.float64]] = {}
        for k, clf in enumerate(clfs):
            rows = np.flatnonzero(alive)
            s = np.full(n, np.nan)
            got = caches[k].lookup(keys.take(pa.array(rows))) if len(rows) else np.zeros(0)
            missing = rows[np.isnan(got)]
            s[rows] = got
            if len(missing):
                t0 = time.perf_counter()
                if scorers[k] is None:
                    scorers[k] = load_scorer(clf, execution)
                scorer = scorers[k]
                assert scorer is not None
                fresh = scorer.score([texts[i] for i in missing.tolist()])
                stats[k]["seconds"] += time.perf_counter() - t0
                s[missing] = fresh
                caches[k].add(keys.take(pa.array(missing)), fresh)
            lo, hi = clf.bounds(source)
            keep = Q.keep_mask(s[rows], lo, hi)
            gone = rows[~keep]
            reason[gone] = f"quality:{clf.name}"
            decided[gone] = s[gone]
            alive[gone] = False
            stats[k]["scored"] += len(rows)
            stats[k]["cached"] += len(rows) - len(missing)
            stats[k]["computed"] += len(missing)
            stats[k]["removed"] += len(gone)
            all_scores[k].append(s[rows])
            columns[clf.name] = s
        kept += int(alive.sum())
        cols: dict[str, pa.Array] = {"doc_id": ids}
        cols.update({name: pa.array(v, pa.float64(), mask=np.isnan(v)) for name, v in columns.items()})
        output.write("scores", pa.table(cols))
        wrote_scores = True
        gone_rows = np.flatnonzero(~alive)
        if len(gone_rows):
            removed_tables.append(removal_table(
                ids.take(pa.array(gone_rows)).to_numpy(zero_copy_only=False), np.full(len(gone_rows), source, object),
                "", None, None, decided[gone_rows], reasons=reason[gone_rows],
            ))
    if not wrote_scores:
        _empty(output, [c.name for c in clfs])
    else:
        output.write("removed", pa.concat_tables(removed_tables) if removed_tables else REMOVED.empty_table())
    for cache in caches:
        cache.save(compression=execution.intermediate_compression)

    report_clfs: dict[str, ClassifierStats] = {}
    for k, clf in enumerate(clfs):
        lo, hi = clf.bounds(source)
        st = stats[k]
        scores = np.concatenate(all_scores[k]) if all_scores[k] else np.zeros(0)
        report_clfs[clf.name] = ClassifierStats(
            kind=clf.kind, min_score=lo, max_score=hi, scored=int(st["scored"]), cached=int(st["cached"]),
            computed=int(st["computed"]), removed=int(st["removed"]), seconds=round(float(st["seconds"]), 3),
            docs_per_s=round(st["computed"] / st["seconds"], 1) if st["seconds"] > 0 else None,
            histogram=Q.histogram(scores),
        )
    unknown = sorted({s for c in clfs for s in (*c.min_score_per_source, *c.max_score_per_source)}
                     - set(partition.spec.sources))
    # Where the model classifiers ran (fastText is CPU code): it becomes the report's backend.
    devices = {sc.device for sc in scorers if sc is not None}
    optional: dict[str, Any] = {"unknown_sources_in_thresholds": unknown} if unknown else {}  # set only if any
    return QualityScoresReport(
        enabled=True,
        device=next((d for d in sorted(devices) if d.startswith("cuda")), "cpu"),
        input=total,
        kept=kept,
        removed=total - kept,
        removed_per_reason={f"quality:{c.name}": report_clfs[c.name].removed for c in clfs
                            if report_clfs[c.name].removed},
        classifiers=report_clfs,
        **optional,
    )
