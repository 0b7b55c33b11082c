"""MinHash / LSH kernels: the hash family pinned by golden values and a plain-Python spec,
estimator quality against exact Jaccard, buckets, verification and components."""

from __future__ import annotations

import hashlib
import random

import numba
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from stages.kernels import lsh
from stages.kernels import minhash as mh
from stages.params import lsh_curve, lsh_threshold
from tests.support.oracles import signatures_reference

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
PROPS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- the family in plain Python, straight from docs/minhash.md ---------------------------------------


def spec_fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def spec_shingle_hashes(text: str, k: int) -> set[int]:
    digits = [ord(c) + 1 for c in text]
    if not digits:
        return set()
    width = min(k, len(digits))
    out = set()
    for i in range(len(digits) - width + 1):
        p = 0
        for d in digits[i : i + width]:
            p = (p * 0x9E3779B97F4A7C15 + d) & M64
        out.add(spec_fmix64(p))
    return out


def spec_params(num_perm: int, seed: int) -> list[tuple[int, int]]:
    state, params = seed, []
    for _ in range((num_perm + 1) // 2):
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        params.append(((z & M32) | 1, z >> 32))
    return params


def spec_signature(text: str, k: int = 24, num_perm: int = 260, seed: int = 42) -> list[int]:
    xs = [h >> 32 for h in spec_shingle_hashes(text, k)]
    sig = []
    for a, b in spec_params(num_perm, seed):
        ys = [(a * x + b) & M32 for x in xs]
        sig.append(min(ys) if ys else M32)
        sig.append(M32 - max(ys) if ys else M32)
    return sig[:num_perm]


def spec_band_key(row: np.ndarray, band: int, rows: int) -> int:
    h = spec_fmix64(((band + 1) * 0xD6E8FEB86659FD93) & M64)
    for v in row[band * rows : (band + 1) * rows]:
        h = spec_fmix64(h ^ int(v))
    return h


def shingle_set(text: str, k: int) -> set[str]:
    if not text:
        return set()
    if len(text) < k:
        return {text}
    return {text[i : i + k] for i in range(len(text) - k + 1)}


def exact_jaccard(a: str, b: str, k: int) -> float:
    sa, sb = shingle_set(a, k), shingle_set(b, k)
    return 1.0 if not sa and not sb else len(sa & sb) / len(sa | sb)


def mutate(rng: random.Random, text: str, edits: int, alphabet: str = "abcdefghij ") -> str:
    chars = list(text)
    for _ in range(edits):
        i = rng.randrange(len(chars) + 1)
        op = rng.random()
        if op < 0.4 and i < len(chars):
            chars[i] = rng.choice(alphabet)
        elif op < 0.7 and i < len(chars):
            del chars[i]
        else:
            chars.insert(i, rng.choice(alphabet))
    return "".join(chars)


# --- golden values: any change to the family fails here ---------------------------------------------

GOLDEN_TEXTS = [
    "",
    "a",
    "hello world",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "naïve café 😀 中文",
]
GOLDEN_HEAD = [
    [0xFFFFFFFF] * 6,
    [1601113618, 2693853677, 2371233511, 1923733784, 4148270539, 146696756],
    [1050372988, 3244594307, 3056555693, 1238411602, 1524655665, 2770311630],
    [81627322, 62897489, 90454417, 17583884, 57414123, 8576107],
    [1894130083, 2400837212, 3206135310, 1088831985, 3419629314, 875337981],
]
GOLDEN_ROW_SHA = [  # sha256 of each whole row (260 little-endian uint32), first 16 hex digits
    "a096f2c4317dc713",
    "02a1818c057ec944",
    "54b57fdf7129dd71",
    "7f8c3ee340855cd7",
    "435b75958d13fc26",
]


def test_golden_signatures() -> None:
    sigs = mh.signatures(GOLDEN_TEXTS)
    assert sigs.dtype == np.uint32 and sigs.shape == (len(GOLDEN_TEXTS), 260)
    for row, head, digest in zip(sigs, GOLDEN_HEAD, GOLDEN_ROW_SHA, strict=True):
        assert row[:6].tolist() == head
        assert hashlib.sha256(row.astype("<u4").tobytes()).hexdigest()[:16] == digest


def test_golden_shingle_hashes_and_params() -> None:
    assert mh.shingle_hashes("abc", shingle=24).tolist() == [0xBFF6E68A6A023E04]
    assert mh.shingle_hashes("abcd", shingle=3).tolist() == sorted(spec_shingle_hashes("abcd", 3))
    a, b = mh.hash_params(4, 42)
    assert a.tolist() == [803958421, 2993090819] and b.tolist() == [3184996902, 686809907]
    assert mh.splitmix64(0, 1)[0] == 0xE220A8397B1DCDAF  # the published first splitmix64(0) output


def test_golden_band_keys() -> None:
    sig = mh.signatures(["hello world"])
    keys = lsh.band_keys(sig, 20, 13)
    assert keys.dtype == np.uint64 and keys.shape == (1, 20)
    assert int(keys[0, 0]) == 0xA0CCB28A19709B4E
    assert [int(k) for k in keys[0]] == [spec_band_key(sig[0], b, 13) for b in range(20)]


# --- the kernel is the spec ---------------------------------------------------------------------------


@PROPS
@given(
    texts=st.lists(st.text(max_size=60), min_size=1, max_size=4),
    k=st.sampled_from([1, 3, 5, 24]),
    num_perm=st.sampled_from([1, 8, 13]),
    seed=st.integers(0, M64),
)
def test_kernel_matches_spec(texts: list[str], k: int, num_perm: int, seed: int) -> None:
    sigs = mh.signatures(texts, shingle=k, num_perm=num_perm, seed=seed)
    for text, row in zip(texts, sigs, strict=True):
        assert row.tolist() == spec_signature(text, k, num_perm, seed)
        assert set(mh.shingle_hashes(text, shingle=k).tolist()) == spec_shingle_hashes(text, k)


def test_reference_matches_kernel_at_full_size() -> None:
    rng = random.Random(3)
    texts = ["".join(rng.choice("abcdefgh é😀\n") for _ in range(rng.randrange(0, 3000))) for _ in range(20)]
    sigs = mh.signatures(texts)
    for text, row in zip(texts, sigs, strict=True):
        assert np.array_equal(row, signatures_reference(mh.shingle_hashes(text)))


def test_batch_composition_and_threads_do_not_matter() -> None:
    rng = random.Random(5)
    texts = ["".join(rng.choice("xyz abc") for _ in range(rng.randrange(0, 5000))) for _ in range(200)]
    whole = mh.signatures(texts)
    for i in (0, 17, 199):
        assert np.array_equal(mh.signatures([texts[i]])[0], whole[i])
    assert np.array_equal(mh.signatures(texts[::-1])[::-1], whole)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert np.array_equal(mh.signatures(texts), whole)
    finally:
        numba.set_num_threads(before)


# --- short, empty, non-ASCII ----------------------------------------------------------------------------


def test_empty_and_short_texts() -> None:
    sigs = mh.signatures(["", "ab", "ab", "\x00ab", "abc"], shingle=24)
    assert (sigs[0] == mh.EMPTY).all()
    assert mh.shingle_hashes("").size == 0
    assert np.array_equal(sigs[1], sigs[2])
    assert not np.array_equal(sigs[1], sigs[3])  # digits are code point + 1: a leading NUL counts
    assert not np.array_equal(sigs[1], sigs[4])
    assert (
        mh.shingle_hashes("x" * 23).size == 1
        and mh.shingle_hashes("xy" * 12).size == 1
        and mh.shingle_hashes("xy" * 12 + "z").size == 2
    )


def test_code_points_not_bytes() -> None:
    assert mh.shingle_hashes("😀" * 24).size == 1  # 24 code points = one shingle (96 bytes)
    text = "中文😀é" * 10
    assert mh.shingle_hashes(text, shingle=24).size == len(shingle_set(text, 24))
    lone = "\ud800x\udfff"
    assert set(mh.shingle_hashes(lone, shingle=2).tolist()) == spec_shingle_hashes(lone, 2)


def test_arrow_and_invalid_utf8() -> None:
    texts = ["héllo wörld", "", "😀 emoji " * 9, "plain"]
    large = pa.array(texts[2:], type=pa.large_string())
    column = pa.chunked_array([pa.array(texts[:2]), large[0:2].cast(pa.string())])
    assert np.array_equal(mh.signatures(mh.from_arrow(column)), mh.signatures(texts))
    sliced = pa.array(["zero", *texts])[1:]
    assert np.array_equal(mh.signatures(mh.from_arrow(sliced)), mh.signatures(texts))
    with pytest.raises(ValueError, match="nulls"):
        mh.from_arrow(pa.array(["a", None]))
    raw = mh.Utf8Batch(np.frombuffer(b"\xffabc\xe2\x82", np.uint8), np.array([0, 6], np.int64))
    replaced = mh.signatures(["\ufffdabc\ufffd\ufffd"], shingle=3)[0]
    assert np.array_equal(mh.signatures(raw, shingle=3)[0], replaced)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        mh.signatures(["a"], shingle=0)
    with pytest.raises(ValueError):
        mh.signatures(["a"], num_perm=0)
    with pytest.raises(ValueError):
        mh.signatures(["a"], seed=-1)
    with pytest.raises(ValueError):
        lsh.band_keys(np.zeros((2, 260), np.uint32), 21, 13)
    with pytest.raises(ValueError):
        mh.signatures(mh.Utf8Batch(np.zeros(3, np.uint8), np.array([0, 5], np.int64)))


# --- the estimator --------------------------------------------------------------------------------------


@PROPS
@given(
    seed=st.integers(0, 2**32),
    length=st.integers(30, 1500),
    edits=st.integers(0, 60),
    k=st.sampled_from([5, 24]),
)
def test_agreement_estimates_jaccard(seed: int, length: int, edits: int, k: int) -> None:
    rng = random.Random(seed)
    a = "".join(rng.choice("abcdefghij ") for _ in range(length))
    b = mutate(rng, a, edits)
    j = exact_jaccard(a, b, k)
    sigs = mh.signatures([a, b], shingle=k, num_perm=260)
    agree = int((sigs[0] == sigs[1]).sum())
    # min-max entries are at most as variable as independent ones: the binomial bound holds
    lo, hi = binom.interval(1 - 1e-6, 260, j)
    assert lo <= agree <= hi, (j, agree)


def test_estimator_unbiased_over_many_pairs() -> None:
    rng = random.Random(11)
    z = []
    pairs = []
    for _ in range(300):
        a = "".join(rng.choice("abcdefghij ") for _ in range(rng.randrange(200, 1500)))
        pairs.append((a, mutate(rng, a, rng.randrange(1, 40))))
    sigs = mh.signatures([t for p in pairs for t in p], shingle=8)
    for i, (a, b) in enumerate(pairs):
        j = exact_jaccard(a, b, 8)
        if 0.0 < j < 1.0:
            agree = (sigs[2 * i] == sigs[2 * i + 1]).sum()
            z.append((agree - 260 * j) / np.sqrt(260 * j * (1 - j)))
    assert len(z) > 250
    assert abs(np.mean(z)) < 0.25 and np.std(z) < 1.2


# --- buckets -----------------------------------------------------------------------------------------


def test_band_edges_small() -> None:
    keys = np.array([7, 3, 7, 9, 3, 7], np.uint64)
    ids = np.array([50, 10, 20, 30, 40, 5], np.int64)
    src, dst, stats = lsh.band_edges(keys, ids)
    assert sorted(zip(src.tolist(), dst.tolist(), strict=True)) == [(20, 5), (40, 10), (50, 5)]
    assert stats.docs == 6 and stats.buckets == 3 and stats.edges == 3
    assert stats.size_hist[:3].tolist() == [1, 2, 0]
    assert stats.largest == ((3, 7), (2, 3))
    perm = np.random.default_rng(0).permutation(6)
    s2, d2, _ = lsh.band_edges(keys[perm], ids[perm])
    edges = sorted(zip(src.tolist(), dst.tolist(), strict=True))
    assert sorted(zip(s2.tolist(), d2.tolist(), strict=True)) == edges


def test_band_edges_giant_bucket_is_linear() -> None:
    n = 100_000
    ids = np.random.default_rng(1).permutation(n).astype(np.int64) + 1000
    keys = np.full(n, 0xDEADBEEF, np.uint64)
    keys[:10] = np.arange(10, dtype=np.uint64)  # ten singletons beside the giant
    src, dst, stats = lsh.band_edges(keys, ids)
    assert src.shape == (n - 10 - 1,)
    giant = ids[10:]
    assert (dst == giant.min()).all() and set(src.tolist()) == set(giant.tolist()) - {int(giant.min())}
    assert stats.largest[0] == (n - 10, 0xDEADBEEF)
    assert stats.size_hist[16] == 1 and stats.size_hist[0] == 10
    merged = stats.merge(stats)
    assert merged.edges == 2 * stats.edges and merged.as_dict()["largest"][0]["size"] == n - 10


@PROPS
@given(data=st.data(), n=st.integers(1, 300))
def test_band_edges_in_id_order_equal_any_order(data: st.DataObject, n: int) -> None:
    """Rows in ascending id order take a sort of the keys alone; any order a lexsort: the same
    edges, in the same order, and the same stats."""
    keys = np.array(data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), np.uint64)
    ids = np.array(sorted(data.draw(st.sets(st.integers(0, 10**6), min_size=n, max_size=n))), np.int64)
    perm = np.random.default_rng(data.draw(st.integers(0, 2**32))).permutation(n)
    src, dst, stats = lsh.band_edges(keys, ids)
    s2, d2, stats2 = lsh.band_edges(keys[perm], ids[perm])
    assert src.tolist() == s2.tolist() and dst.tolist() == d2.tolist()
    assert stats.largest == stats2.largest and stats.size_hist.tolist() == stats2.size_hist.tolist()


@PROPS
@given(data=st.data(), bands=st.integers(0, 6), n=st.integers(1, 200))
def test_distinct_pairs_is_the_sorted_set_of_all_bands_pairs(data: st.DataObject, bands: int, n: int) -> None:
    """Bands of anchor edges (each member once: the scatter) and of any edges (members repeated,
    pairs repeated: the sort), sparse or dense among the ids: the distinct pairs, sorted."""
    stream, every = [], set()
    for band in range(bands):
        e = data.draw(st.integers(0, n))
        if data.draw(st.booleans()):  # anchor edges: distinct members, dense (a scatter) or sparse (a sort)
            top = data.draw(st.sampled_from([2 * e, 20 * n]))
            src = np.array(data.draw(st.lists(st.integers(0, top), min_size=e, max_size=e, unique=True)), np.int64)
        else:
            src = np.array(data.draw(st.lists(st.integers(0, n), min_size=e, max_size=e)), np.int64)
        dst = np.array(data.draw(st.lists(st.integers(0, n * 20), min_size=e, max_size=e)), np.int64)
        stream.append((band, src, dst))
        every.update(zip(src.tolist(), dst.tolist(), strict=True))
    s, d = lsh.distinct_pairs(stream)
    assert list(zip(s.tolist(), d.tolist(), strict=True)) == sorted(every)


# --- exact verification --------------------------------------------------------------------------------


@PROPS
@given(seed=st.integers(0, 2**32), k=st.sampled_from([2, 5, 24]))
def test_pair_jaccard_equals_python_sets(seed: int, k: int) -> None:
    rng = random.Random(seed)
    base = ["".join(rng.choice("abc d😀é") for _ in range(rng.randrange(0, 120))) for _ in range(6)]
    texts = base + [mutate(rng, t, rng.randrange(0, 6), "abc d😀é") for t in base] + ["", ""]
    n = len(texts)
    src = np.array([rng.randrange(n) for _ in range(60)], np.int64)
    dst = np.array([rng.randrange(n) for _ in range(60)], np.int64)
    got = lsh.pair_jaccard(texts, src, dst, shingle=k)
    want = np.array([exact_jaccard(texts[s], texts[d], k) for s, d in zip(src, dst, strict=True)], np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    ok = lsh.jaccard_verify(texts, src, dst, shingle=k, threshold=0.5)
    assert np.array_equal(
        ok, np.array([exact_jaccard(texts[s], texts[d], k) >= 0.5 for s, d in zip(src, dst, strict=True)])
    )


def test_pair_jaccard_many_pairs_per_anchor() -> None:
    rng = random.Random(2)
    anchor = "".join(rng.choice("abcdefgh ") for _ in range(400))
    texts = [anchor] + [mutate(rng, anchor, rng.randrange(0, 30)) for _ in range(600)]
    src = np.arange(1, len(texts), dtype=np.int64)
    got = lsh.pair_jaccard(texts, src, np.zeros_like(src), shingle=10)
    want = np.array([exact_jaccard(t, anchor, 10) for t in texts[1:]], np.float32)
    assert np.array_equal(got, want)


@PROPS
@given(seed=st.integers(0, 2**32), k=st.sampled_from([3, 24]), budget=st.sampled_from([1, 200, 1 << 20]),
       grouping=st.sampled_from(["none", "components", "arbitrary"]))
def test_pair_jaccard_in_blocks_equals_python_sets(seed: int, k: int, budget: int, grouping: str) -> None:
    """Pairs packed into blocks of any size (one pair a block, components split between blocks,
    all in one), by any grouping (none, the pair graph's components, labels that cut them),
    documents in many pairs, repeated pairs, self-pairs and empty texts: each pair's Jaccard is
    the exact one, in the order the pairs came."""
    rng = random.Random(seed)
    base = ["".join(rng.choice("abc d😀é") for _ in range(rng.randrange(0, 150))) for _ in range(5)]
    texts = base + [mutate(rng, t, rng.randrange(0, 8), "abc d😀é") for t in base for _ in range(3)] + ["", ""]
    n = len(texts)
    hub = rng.randrange(n)  # a document in many pairs, as a bucket's anchor is
    pairs = [(rng.randrange(n), hub if rng.random() < 0.4 else rng.randrange(n)) for _ in range(80)]
    pairs += [*pairs[:5], (3, 3)]
    src = np.array([s for s, _ in pairs], np.int64)
    dst = np.array([d for _, d in pairs], np.int64)
    group = {"none": None, "components": lsh.connected_components(n, src, dst)[src],
             "arbitrary": np.array([rng.randrange(3) for _ in pairs], np.int64)}[grouping]
    saved = lsh._BLOCK_MIN, lsh._BLOCK_MAX, lsh._BLOCK_DOCS
    lsh._BLOCK_MIN, lsh._BLOCK_MAX, lsh._BLOCK_DOCS = budget, budget, 0
    try:
        got = lsh._jaccard64(mh.encode_texts(texts), src, dst, k, group)
    finally:
        lsh._BLOCK_MIN, lsh._BLOCK_MAX, lsh._BLOCK_DOCS = saved
    want = [exact_jaccard(texts[s], texts[d], k) for s, d in pairs]
    assert got.tolist() == want


@PROPS
@given(pairs=st.lists(st.tuples(st.integers(0, 19), st.integers(0, 19)), max_size=60), budget=st.integers(1, 300))
def test_block_docs_names_each_pairs_ends(pairs: list[tuple[int, int]], budget: int) -> None:
    """Each block lists its documents once, and a pair's ends are found among its block's."""
    src = np.array([s for s, _ in pairs], np.int64)
    dst = np.array([d for _, d in pairs], np.int64)
    size = np.arange(20, dtype=np.int64) * 7 % 50
    group = lsh.connected_components(20, src, dst)[src]
    order, block, blocks = lsh.pack_blocks(src, dst, group, size, budget)
    a, b = src[order], dst[order]
    docs, doc_start, a_at, b_at = lsh._block_docs(a, b, block, blocks, 20)
    assert doc_start[0] == 0 and doc_start[-1] == len(docs) and (np.diff(doc_start) >= 0).all()
    for x in range(blocks):
        mine = docs[doc_start[x]:doc_start[x + 1]]
        assert len(set(mine.tolist())) == len(mine)
        assert set(mine.tolist()) == set(a[block == x].tolist()) | set(b[block == x].tolist())
    assert (docs[doc_start[block] + a_at] == a).all() and (docs[doc_start[block] + b_at] == b).all()


def _planted_chain() -> list[str]:
    rng = random.Random(7)
    a = "".join(rng.choice("abcdefghij ") for _ in range(2000))
    m1 = a[:1000] + "".join(rng.choice("abcdefghij ") for _ in range(1000))  # J(m1, a) ~ 0.33
    m2 = mutate(rng, m1, 3)  # J(m2, m1) >= 0.9, J(m2, a) ~ 0.3
    unrelated = "".join(rng.choice("klmnopqrst ") for _ in range(2000))
    return [a, m1, m2, unrelated]


def test_verify_candidates_falls_back_to_bucket_mates() -> None:
    texts = _planted_chain()
    assert exact_jaccard(texts[1], texts[0], 24) < 0.8 <= exact_jaccard(texts[2], texts[1], 24)
    keys = np.array([5, 5, 5, 5], np.uint64)  # one bucket of all four, anchor = doc 0
    src, dst, _ = lsh.band_edges(keys, np.arange(4, dtype=np.int64))
    band = np.zeros_like(src)
    s0, _, _ = lsh.verify_candidates(texts, src, dst, band, max_fallback=0)
    assert s0.size == 0  # every member fails against the anchor
    s1, d1, j1 = lsh.verify_candidates(texts, src, dst, band, max_fallback=8)
    assert list(zip(s1.tolist(), d1.tolist(), strict=True)) == [(2, 1)]
    assert j1[0] == np.float32(exact_jaccard(texts[2], texts[1], 24))
    labels = lsh.connected_components(4, s1, d1)
    assert labels.tolist() == [0, 1, 1, 3]


def _fallback_reference(bands: list[np.ndarray], failed: set[tuple[int, int]], label: list[int],
                        k: int) -> set[tuple[int, int]]:
    """The documented bucket-mate rule, spelled out: per band, documents with equal keys form a
    bucket whose anchor is its lowest id; a member at index i of the c non-anchor members (id
    order) whose (member, anchor) pair failed is offered mates i+1, ..., i+min(c-1, k)
    (wrapping); offers within one component (``label``) are dropped; pairs come out (high, low)."""
    out = set()
    for keys in bands:
        buckets: dict[int, list[int]] = {}
        for doc, key in enumerate(keys.tolist()):
            buckets.setdefault(key, []).append(doc)
        for docs in buckets.values():
            anchor, members = sorted(docs)[0], sorted(docs)[1:]
            for i, who in enumerate(members):
                if (who, anchor) in failed:
                    for step in range(1, min(len(members) - 1, k) + 1):
                        mate = members[(i + step) % len(members)]
                        if label[who] != label[mate]:
                            out.add((max(who, mate), min(who, mate)))
    return out


@settings(max_examples=80, deadline=None)
@given(keys=st.lists(st.lists(st.integers(0, 3), min_size=12, max_size=12), min_size=1, max_size=5),
       fail=st.randoms(use_true_random=False), label=st.lists(st.integers(0, 3), min_size=12, max_size=12),
       k=st.integers(1, 4))
def test_streamed_fallback_matches_the_rule(keys: list[list[int]], fail: random.Random, label: list[int],
                                            k: int) -> None:
    """The band-by-band fallback picks exactly the mates the rule picks, whatever order the
    bands' edges come in and whichever anchor pairs failed."""
    bands = [np.array(kk, np.uint64) for kk in keys]
    src, dst, band = [], [], []
    for t, kk in enumerate(bands):
        s, d, _ = lsh.band_edges(kk, np.arange(12, dtype=np.int64))
        src.append(s)
        dst.append(d)
        band.append(np.full(len(s), t, np.int64))
    pairs = sorted({(int(a), int(b)) for a, b in zip(np.concatenate(src), np.concatenate(dst), strict=True)})
    failed = {p for p in pairs if fail.random() < 0.6}
    order = np.random.default_rng(len(keys)).permutation(sum(len(s) for s in src))
    stream = lsh.split_bands(np.concatenate(src)[order], np.concatenate(dst)[order], np.concatenate(band)[order])
    packed = np.array(sorted((a << 31) | b for a, b in failed), np.int64)
    fs, fd = lsh._fallback_pairs(stream(), packed, np.array(label, np.int64), k)
    got = list(zip(fs.tolist(), fd.tolist(), strict=True))
    assert got == sorted(set(got))  # distinct, sorted
    assert set(got) == _fallback_reference(bands, failed, label, k)


def test_fallback_joins_duplicates_that_meet_under_an_unrelated_anchor() -> None:
    """Two near-duplicates A, B that each have another partner meet only in a bucket whose anchor
    is unrelated: they are compared and end in one component (they were not, when only members
    without any passing edge fell back)."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(5000)]

    def text(n: int = 400) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    def edit(t: str, k: int) -> str:
        w = t.split()
        w[-k:] = [f"zzz{i}" for i in range(k)]
        return " ".join(w)

    a = text()
    b = edit(a, 8)
    docs = [text(), a, b, edit(a, 3), edit(b, 3)]
    src = np.array([1, 2, 3, 4], np.int64)  # band 0: bucket {0, 1, 2}; band 1: {1, 3}; band 2: {2, 4}
    dst = np.array([0, 0, 1, 2], np.int64)
    band = np.array([0, 0, 1, 2], np.int64)
    s, d, _ = lsh.verify_candidates(docs, src, dst, band)
    assert lsh.connected_components(5, s, d).tolist() == [0, 1, 1, 1, 1]


def test_verify_candidates_end_to_end_against_oracle() -> None:
    rng = random.Random(13)
    texts = []
    for _ in range(60):
        base = "".join(rng.choice("abcdefghijklmnop \n") for _ in range(rng.randrange(300, 2000)))
        texts.append(base)
        cur = base
        for _ in range(rng.randrange(0, 4)):
            cur = mutate(rng, cur, rng.randrange(1, 8), "abcdefghijklmnop \n")
            texts.append(cur)
    rng.shuffle(texts)
    n = len(texts)
    sigs = mh.signatures(texts)
    keys = lsh.band_keys(sigs, 26, 10)
    parts = [lsh.band_edges(keys[:, b], np.arange(n, dtype=np.int64)) for b in range(26)]
    src = np.concatenate([p[0] for p in parts])
    dst = np.concatenate([p[1] for p in parts])
    band = np.concatenate([np.full(p[0].size, b) for b, p in enumerate(parts)])
    vs, vd, vj = lsh.verify_candidates(texts, src, dst, band, threshold=0.8)
    assert (vj >= 0.8).all()
    for s, d, j in zip(vs.tolist(), vd.tolist(), vj.tolist(), strict=True):
        assert j == pytest.approx(exact_jaccard(texts[s], texts[d], 24), abs=1e-6)
    got = lsh.connected_components(n, vs, vd)
    sets = [shingle_set(t, 24) for t in texts]
    i, j = np.triu_indices(n, 1)
    good = [
        (a, b)
        for a, b in zip(i.tolist(), j.tolist(), strict=True)
        if len(sets[a] & sets[b]) >= 0.8 * len(sets[a] | sets[b])
    ]
    oracle = lsh.connected_components(n, np.array([g[0] for g in good]), np.array([g[1] for g in good]))
    removed, oracle_removed = (got != np.arange(n)).sum(), (oracle != np.arange(n)).sum()
    assert removed <= oracle_removed  # verification never removes more than the oracle would
    assert removed >= 0.97 * oracle_removed


# --- components and the S-curve ------------------------------------------------------------------------


def test_connected_components() -> None:
    src = np.array([4, 1, 7, 6], np.int64)
    dst = np.array([2, 4, 7, 5], np.int64)
    labels = lsh.connected_components(8, src, dst)
    assert labels.dtype == np.int64
    assert labels.tolist() == [0, 1, 1, 3, 1, 5, 5, 7]
    assert np.array_equal(lsh.connected_components(8, dst[::-1], src[::-1]), labels)
    assert lsh.connected_components(3, np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        lsh.connected_components(3, np.array([3]), np.array([0]))


def test_lsh_curve_and_threshold() -> None:
    assert lsh_threshold(20, 13) == pytest.approx(0.7942, abs=1e-4)
    curve = lsh_curve(20, 13)
    assert len(curve) == 21 and curve[0] == (0.0, 0.0) and curve[-1] == (1.0, 1.0)
    probs = [p for _, p in curve]
    assert probs == sorted(probs)
    ((s, p),) = lsh_curve(20, 13, points=[0.8])
    assert s == 0.8 and p == pytest.approx(1 - (1 - 0.8**13) ** 20)
