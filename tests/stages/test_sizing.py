"""``curate size``'s arithmetic (``stages.sizing``) against values worked out by hand.

The reference crawl: 1,000,000 documents of 2,000 characters, 260 hashes in 20 bands x 13 rows,
a 10% duplicate rate at Jaccard 0.9, 0.25 tokens per character, MiniLM (22,713,216 parameters)
cut at 256 tokens, a GPU at 150 TFLOP/s and a third of it.
"""

from __future__ import annotations

import pytest

from stages.sizing import (
    MINILM,
    Assumptions,
    Crawl,
    Model,
    Setting,
    candidate_probability,
    flops_per_document,
    gpu_hours,
    size,
)

SEED = Setting(num_perm=260, bands=20, rows=13)
CRAWL = Crawl(docs=1_000_000, mean_chars=2000)
# 0.9 ** 13 = 0.2541865828; 1 - (1 - 0.2541865828) ** 20 = 0.9971646685
S_POW_R = 0.2541865828329001
P_DUP = 0.9971646685128354


def test_signature_table_and_band_keys() -> None:
    s = size(CRAWL, SEED)
    assert s.signatures == {"rows": 1_000_000, "bytes": 1_000_000 * (4 * 260 + 36)}  # 1.076 GB
    assert s.band_keys == {"keys": 20_000_000, "bytes": 1_000_000 * 8 * 21}  # 168 MB


def test_candidates_at_the_lsh_setting() -> None:
    c = size(CRAWL, SEED).candidates
    assert c["threshold"] == pytest.approx(0.7941833348, rel=1e-9)  # (1/20)^(1/13)
    assert c["p_candidate"] == pytest.approx(P_DUP, rel=1e-12)
    assert candidate_probability(0.9, 20, 13) == pytest.approx(P_DUP, rel=1e-12)
    assert c["duplicate_pairs"] == pytest.approx(100_000)
    assert c["candidate_pairs"] == pytest.approx(99_716.46685, rel=1e-9)
    assert c["band_edges"] == pytest.approx(100_000 * 20 * S_POW_R, rel=1e-12)  # 508,373 anchor edges


def test_verification_text_and_spill() -> None:
    v = size(CRAWL, SEED).verification
    assert v["documents"] == pytest.approx(199_432.9337, rel=1e-9)
    assert v["text_bytes"] == pytest.approx(398_865_867.4, rel=1e-9)
    assert v["spill_bytes"] == 0.0  # under text_block_bytes = 512 MiB = 536,870,912
    longer = size(Crawl(1_000_000, 4000), SEED).verification
    assert longer["text_bytes"] == pytest.approx(797_731_734.8, rel=1e-9)
    assert longer["spill_bytes"] == pytest.approx(2 * 797_731_734.8, rel=1e-9)  # gathered + block files
    off = size(CRAWL, Setting(bands=20, rows=13, verify=False)).verification
    assert off == {"documents": 0.0, "text_bytes": 0.0, "spill_bytes": 0.0}


def test_embedding_flops_and_gpu_hours() -> None:
    e = size(CRAWL, SEED).embeddings[MINILM.name]
    assert e["tokens_per_document"] == 256  # min(2000 x 0.25, 256)
    assert e["flops_per_document"] == 2 * 22_713_216 * 256  # 1.163e10
    assert e["documents"] == pytest.approx(1_000_000 - 99_716.46685, rel=1e-9)  # fuzzy's removals not embedded
    assert e["flops"] == pytest.approx(1.0469547187e16, rel=1e-9)
    assert e["gpu_hours"] == pytest.approx(1.0469547187e16 / 50e12 / 3600, rel=1e-9)  # 0.058 h


def test_the_seeds_classifier_example() -> None:
    """The seeds: a 140M-parameter encoder over 512 tokens is ~1.4e11 FLOPs per document, 7e19
    over 500M documents, ~130 GPU-hours at 150 TFLOP/s and ~400 at a third of it."""
    model = Model("classifier", 140_000_000, 512)
    per_doc = flops_per_document(model, mean_chars=4000, tokens_per_char=0.25)
    assert per_doc == 2 * 140e6 * 512 == 1.4336e11
    assert per_doc * 500e6 == pytest.approx(7.168e19)
    assert gpu_hours(per_doc * 500e6, 150, 1.0) == pytest.approx(132.74, rel=1e-4)
    assert gpu_hours(per_doc * 500e6, 150, 1 / 3) == pytest.approx(398.2, rel=1e-4)
    s = size(Crawl(500_000_000, 4000), Setting(models=(model,)), Assumptions(dup_rate=0.0))
    assert s.embeddings["classifier"]["gpu_hours"] == pytest.approx(398.2, rel=1e-4)


def test_memory_per_stage_pod() -> None:
    m = size(CRAWL, SEED).memory_bytes
    assert m["lsh_buckets"] == 1_000_000 * (8 + 72) + 1_000_000 * 8 * 5  # nodes + one task's 5 columns
    assert m["exact_duplicates"] == 2 * 1_000_000 * 52
    assert m["semantic_clusters"] == pytest.approx((1_000_000 - 99_716.46685) * 384 * 6, rel=1e-9)
    assert m["document_embeddings"] == 22_713_216 * 4 + 20_000 * 2000
