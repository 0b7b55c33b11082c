"""Benchmark n-gram overlap: word n-grams of normalized text, hashed to 64-bit integers.

Normalization (``words``): Unicode NFKC, case-folded, then every run of letters and digits is a
word; punctuation, underscores and whitespace only separate words. So "The Answer, is: 42!"
and "the answer is 42" give the same words, and edits of case or punctuation never break an
n-gram. A word is hashed with xxh3-64; an n-gram hash is a polynomial over its word hashes
(mod 2**64) finished with the splitmix64 mixer. With 64-bit hashes, a false match of one
n-gram between 10**7 benchmark n-grams and 10**11 document n-grams has probability ~5e-2 over
the whole run; ``min_matches`` > 1 makes it negligible.

The benchmark side is an ``NgramIndex``: a sorted uint64 array of n-gram hashes with, for each,
one example that contains it (a hash shared by several examples appears once per example). It
holds 12 bytes per distinct (n-gram, example) pair and never a string.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

from stages import versions

HASH_VERSION = versions.DECONTAM_HASH  # bumped in stages/versions.py when words() or the hashing change
_WORD = re.compile(r"[^\W_]+")
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial is invertible mod 2**64


def words(text: str) -> list[str]:
    """Normalized words of ``text`` (see the module docstring)."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def _mix(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finalizer, elementwise (wrapping uint64 arithmetic)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def ngram_hashes(texts: Sequence[str], n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """All word n-gram hashes of a batch of texts.

    Returns (hashes uint64 (T,), row int64 (T,)): ``row[t]`` is the index in ``texts`` of the
    text n-gram ``t`` comes from, rows ascending, n-grams in text order. A text with fewer than
    ``n`` words has none. N-grams never span two texts.
    """
    counts = np.zeros(len(texts), dtype=np.int64)
    flat: list[str] = []
    for i, text in enumerate(texts):
        ws = words(text)
        counts[i] = len(ws)
        flat.extend(ws)
    # Hash each distinct word once: word frequencies are Zipfian, so this is most of the work saved.
    hash64 = xxhash.xxh3_64_intdigest
    table = {word: hash64(word.encode("utf-8", "surrogatepass")) for word in set(flat)}
    w = np.fromiter(map(table.__getitem__, flat), dtype=np.uint64, count=len(flat))
    m = len(w) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    h = np.zeros(m, dtype=np.uint64)
    for j in range(n):
        h = h * _MULT + w[j : j + m]
    h = _mix(h)
    # Window t starts in text row_of[t]; keep it only if it ends inside the same text.
    ends = np.cumsum(counts)
    row_of = np.repeat(np.arange(len(texts), dtype=np.int64), counts)[:m]
    valid = np.arange(m, dtype=np.int64) + n <= ends[row_of]
    return h[valid], row_of[valid]


@dataclass(frozen=True)
class NgramIndex:
    """Benchmark n-grams. hashes: uint64 (k,) sorted; example: int32 (k,) the example holding
    ``hashes[i]`` (pairs unique, sorted by hash then example); n: the n-gram length;
    example_ngrams: int64 (E,) distinct n-grams per example."""

    hashes: npt.NDArray[np.uint64]
    example: npt.NDArray[np.int32]
    n: int
    example_ngrams: npt.NDArray[np.int64]

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.example.nbytes)


def build_index(examples: Sequence[Sequence[str]], n: int) -> NgramIndex:
    """Index the n-grams of every example; an example is a list of texts (question, answers,
    passages), each hashed on its own so no n-gram spans two fields. Example ids are positions
    in ``examples``."""
    texts: list[str] = []
    owner: list[int] = []
    for e, fields in enumerate(examples):
        texts.extend(fields)
        owner.extend([e] * len(fields))
    hashes, row = ngram_hashes(texts, n)
    example = np.asarray(owner, dtype=np.int64)[row] if len(row) else np.zeros(0, np.int64)
    # Unique (hash, example) pairs, sorted by hash then example.
    order = np.lexsort((example, hashes))
    hashes, example = hashes[order], example[order]
    keep = np.ones(len(hashes), dtype=bool)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (example[1:] != example[:-1])
    hashes, example = hashes[keep], example[keep]
    per_example = np.bincount(example, minlength=len(examples)).astype(np.int64)
    return NgramIndex(hashes, example.astype(np.int32), n, per_example)


def match(
    index: NgramIndex, texts: Sequence[str]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Best-matching benchmark example of each text.

    Returns (example int64 (n,), matches int64 (n,), any_ngrams int64 (n,)): the example with the
    most distinct shared n-grams (ties: the lowest example id; -1 when none), that number, and
    the number of distinct n-grams of the text found in any example.
    """
    size = len(texts)
    best = np.full(size, -1, dtype=np.int64)
    best_count = np.zeros(size, dtype=np.int64)
    any_count = np.zeros(size, dtype=np.int64)
    if size == 0 or len(index.hashes) == 0:
        return best, best_count, any_count
    hashes, row = ngram_hashes(texts, index.n)
    lo = np.searchsorted(index.hashes, hashes, side="left")
    hi = np.searchsorted(index.hashes, hashes, side="right")
    hit = hi > lo
    if not hit.any():
        return best, best_count, any_count
    # Distinct (row, hash) pairs among the hits: a repeated n-gram counts once.
    rows, hh, lo, hi = row[hit], hashes[hit], lo[hit], hi[hit]
    order = np.lexsort((hh, rows))
    rows, hh, lo, hi = rows[order], hh[order], lo[order], hi[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (hh[1:] != hh[:-1])
    rows, lo, hi = rows[first], lo[first], hi[first]
    np.add.at(any_count, rows, 1)
    # Expand each hit to every example holding that hash: (row, example) pairs.
    span = hi - lo
    pair_row = np.repeat(rows, span)
    starts = np.repeat(lo - np.cumsum(span) + span, span)
    pair_ex = index.example[starts + np.arange(len(pair_row))].astype(np.int64)
    # Count per (row, example), then pick each row's best: most matches, then lowest example.
    n_ex = int(index.example_ngrams.shape[0])
    key = pair_row * n_ex + pair_ex
    uniq, cnt = np.unique(key, return_counts=True)
    u_row, u_ex = uniq // n_ex, uniq % n_ex
    order = np.lexsort((u_ex, -cnt, u_row))
    u_row, u_ex, cnt = u_row[order], u_ex[order], cnt[order]
    head = np.ones(len(u_row), dtype=bool)
    head[1:] = u_row[1:] != u_row[:-1]
    best[u_row[head]] = u_ex[head]
    best_count[u_row[head]] = cnt[head]
    return best, best_count, any_count
