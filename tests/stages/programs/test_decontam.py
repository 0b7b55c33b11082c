"""Benchmark decontamination: planted benchmark passages inside real documents (the sample corpus)
are found despite small edits and wherever they sit; documents sharing only common phrases are not."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.kernels import decontam as D
from stages.params import Benchmark, ContaminatedDocumentsParams, params_key

# Benchmark passages (invented, encyclopedic): none occurs in Python's docstrings. Two common
# phrases ("it is important to note that", "for more information see the") are shared with
# documents that have nothing to do with the benchmark.
PASSAGES = {
    "geo-1": "The river delta formed over several thousand years as sediment carried from the northern "
             "highlands settled in the shallow bay, and it is important to note that the delta still "
             "grows by roughly forty meters each decade according to the survey of the coastal commission.",
    "geo-2": "Volcanic islands in the southern archipelago rise from a hotspot beneath the oceanic plate; "
             "the oldest island has eroded to a low atoll while the youngest still erupts every few "
             "years, covering its eastern slopes with fresh black basalt.",
    "hist-1": "During the long winter of the siege the townspeople rationed grain by weight, and the "
              "council recorded every sack in a ledger that survives today in the municipal archive; "
              "for more information see the catalogue of the archive.",
    "hist-2": "The merchant guild financed a stone bridge across the estuary after two ferries sank in "
              "the same storm, and the toll it charged paid for the bridge within eleven years of its "
              "opening to carts and foot traffic.",
}
QUESTIONS = {"geo-3": {"question": "Which mineral gives the desert sand of the inland basin its unusual "
                                   "pink colour when the afternoon sun is low?", "answers": ["garnet", "Garnet"]}}


def _write_benchmarks(root: Path) -> list[Benchmark]:
    """geo as JSONL.gz (passages as a list, ids in 'id'), hist as Parquet (passage as a string,
    ids in 'key')."""
    root.mkdir(parents=True, exist_ok=True)
    geo = [{"id": k, "question": "Where?", "passages": [v]} for k, v in PASSAGES.items() if k.startswith("geo")]
    geo += [{"id": k, **v} for k, v in QUESTIONS.items()]
    (root / "geo.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in geo).encode()))
    hist = [{"key": k, "question": "When?", "answers": ["long ago"], "passages": v}
            for k, v in PASSAGES.items() if k.startswith("hist")]
    pq.write_table(pa.Table.from_pylist(hist), root / "hist.parquet")
    return [Benchmark(name="geo", path=str(root / "geo.jsonl.gz")),
            Benchmark(name="hist", path=str(root / "hist.parquet"), id_field="key")]


# --------------------------------------------------------------------------- kernel


def test_words_normalize_case_punctuation_and_width() -> None:
    assert D.words("The Answer, is: 42!\nＦｕｌｌ-width_ok") == ["the", "answer", "is", "42", "full", "width", "ok"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from("ab cd ef gh ij".split()), max_size=12).map(" ".join), max_size=6),
       st.integers(1, 5))
def test_ngram_hashes_never_span_texts(texts: list[str], n: int) -> None:
    h, row = D.ngram_hashes(texts, n)
    assert row.tolist() == sorted(row.tolist())
    for i, text in enumerate(texts):
        alone, _ = D.ngram_hashes([text], n)
        assert h[row == i].tolist() == alone.tolist()  # same n-grams as hashed on its own
        assert len(alone) == max(len(D.words(text)) - n + 1, 0)


def test_match_counts_distinct_ngrams_per_example() -> None:
    a = "one two three four five six seven"
    idx = D.build_index([[a], ["five six seven eight nine"], []], 3)
    assert idx.example_ngrams.tolist() == [5, 3, 0]
    best, count, anyc = D.match(idx, [
        "zero ONE two three, four! one two three",  # 2 distinct grams of example 0; one repeated
        "five six seven eight",  # 'five six seven' is in both examples: tie -> lowest id; 2 of example 1
        "nothing here at all",
    ])
    assert best.tolist() == [0, 1, -1]
    assert count.tolist() == [2, 2, 0]
    assert anyc.tolist() == [2, 2, 0]


def test_min_matches_and_fingerprint_in_key(tmp_path: Path) -> None:
    benchmarks = _write_benchmarks(tmp_path / "bench")
    p1 = ContaminatedDocumentsParams(benchmarks=benchmarks, min_matches=1)
    assert all(b.fingerprint for b in p1.benchmarks)
    k1 = params_key("contaminated_documents", p1)
    # One more example in a benchmark file: its fingerprint and the key change.
    path = tmp_path / "bench" / "geo.jsonl.gz"
    rows = gzip.decompress(path.read_bytes()) + b'{"id": "x", "question": "new"}\n'
    path.write_bytes(gzip.compress(rows))
    p2 = ContaminatedDocumentsParams(benchmarks=benchmarks, min_matches=1)
    assert p2.benchmarks[0].fingerprint != p1.benchmarks[0].fingerprint
    assert params_key("contaminated_documents", p2) != k1
    with pytest.raises(FileNotFoundError):
        ContaminatedDocumentsParams(benchmarks=[Benchmark(name="gone", path=str(tmp_path / "nope.jsonl"))])


# --------------------------------------------------------------------------- the program
