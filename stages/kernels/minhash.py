"""MinHash signatures of character shingles: one compiled pass from UTF-8 bytes to signatures.

The hash family is written down in ``docs/minhash.md`` precisely enough for a GPU twin to
reproduce it bit for bit; in short:

* A document is its sequence of Unicode code points ``c_0 .. c_{n-1}`` (UTF-8 decoded; lone
  surrogates are kept as code points). Digits are ``d_i = c_i + 1`` (so a leading U+0000 counts).
* Shingles are the windows of ``L = min(shingle, n)`` code points: ``n - L + 1`` windows, so a text
  shorter than ``shingle`` is one shingle (the whole text) and an empty text has none.
* The shingle's polynomial ``P = sum_j d_{i+j} * B**(L-1-j) mod 2**64`` with ``B = ROLL_BASE`` is
  rolled (Rabin-Karp: ``P' = P*B + d_in - d_out*B**L``), then ``H = fmix64(P)`` (MurmurHash3's
  finalizer, a bijection) is the 64-bit shingle hash used by exact verification.
* MinHash input ``x = H >> 32``. Hash function ``f`` is ``y_f(x) = (a_f*x + b_f) mod 2**32`` with
  ``(a_f, b_f)`` drawn from a splitmix64 stream seeded with ``seed``. Each function yields two
  signature entries (min-max hashing, Ji et al., ICDM 2013): ``sig[2f] = min y_f`` and
  ``sig[2f+1] = min (~y_f) = ~max y_f`` over the document's shingles. An empty text's signature
  is all ``0xFFFFFFFF``.

Why min-max: each 32-bit multiply feeds two entries, halving the arithmetic per entry, and the
min and the max of one function are two distinct elements of the shingle set, so each entry
still matches with probability Jaccard and the pair is no worse than two independent functions.
The inner loop is a reduction over shingles that LLVM vectorises (vpmulld, vpminud, vpmaxud).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba import njit, prange

ROLL_BASE = 0x9E3779B97F4A7C15  # B: odd, so every digit reaches the high bits
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
BAND_SEED_MULT = 0xD6E8FEB86659FD93  # band b's key chain starts at fmix64((b + 1) * this)
EMPTY = 0xFFFFFFFF  # every entry of an empty text's signature
_BLOCK = 4096  # shingles hashed per block: 16 KiB of x values stay in L1 across all functions
_TASKS_PER_THREAD = 4  # byte-balanced tasks per numba thread (documents vary wildly in size)

_B = np.uint64(ROLL_BASE)
_U64_1 = np.uint64(1)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)


@dataclass(frozen=True)
class Utf8Batch:
    """Texts as one UTF-8 buffer: text i is ``data[offsets[i]:offsets[i + 1]]``; len() = n texts.

    data: uint8 (total_bytes,); offsets: int64 (n + 1,), non-decreasing. This is the layout of an
    Arrow (large_)string column, so Parquet text reaches the kernel without a copy.
    """

    data: npt.NDArray[np.uint8]
    offsets: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1


Docs = Sequence[str] | Utf8Batch


def encode_texts(texts: Sequence[str]) -> Utf8Batch:
    """UTF-8 encode ``texts`` into one buffer (lone surrogates pass through, as code points).

    Per-text ``encode`` is a memcpy for ASCII strings; encoding to UTF-32 instead runs at
    40-80 MB/s in CPython and would cost as much as the signatures themselves.
    """
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return Utf8Batch(data, offsets)


def from_arrow(column: Any) -> Utf8Batch:
    """Zero-copy view of a pyarrow ``string``/``large_string`` Array or ChunkedArray.

    Raises ValueError on nulls: a missing text is the caller's decision (drop or quarantine),
    never silently an empty document.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"text column has {column.null_count} nulls")
    if pa.types.is_string(column.type):
        off_dtype: Any = np.int32
    elif pa.types.is_large_string(column.type):
        off_dtype = np.int64
    else:
        raise TypeError(f"expected a string column, got {column.type}")
    _, off_buf, data_buf = column.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_dtype)[column.offset : column.offset + len(column) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return Utf8Batch(data, offsets.astype(np.int64))


def _readonly(arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view: kernels then see one array type (one compilation), writable or not."""
    view = arr.view()
    view.flags.writeable = False
    return view


def as_utf8(docs: Docs) -> Utf8Batch:
    """``docs`` as a read-only Utf8Batch (encoding a sequence of str, checking a given batch)."""
    if not isinstance(docs, Utf8Batch):
        docs = encode_texts(docs)
    data = np.ascontiguousarray(docs.data, dtype=np.uint8)
    offsets = np.ascontiguousarray(docs.offsets, dtype=np.int64)
    if data.ndim != 1 or offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError("data must be 1-D and offsets 1-D with n + 1 entries")
    if len(offsets) > 1 and (offsets[0] < 0 or offsets[-1] > data.shape[0] or np.any(np.diff(offsets) < 0)):
        raise ValueError("offsets must be non-decreasing and within data")
    return Utf8Batch(_readonly(data), _readonly(offsets))


def splitmix64(seed: int, count: int) -> npt.NDArray[np.uint64]:
    """uint64 (count,): outputs 1..count of splitmix64 started from state ``seed``."""
    mask = (1 << 64) - 1
    state = seed & mask
    out = np.empty(count, dtype=np.uint64)
    for i in range(count):
        state = (state + SPLITMIX_GAMMA) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out[i] = z ^ (z >> 31)
    return out


def hash_params(num_perm: int, seed: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """The multipliers and addends of the ``ceil(num_perm / 2)`` hash functions.

    Function f takes ``z = splitmix64(seed)[f]``: ``a_f = (z & 0xFFFFFFFF) | 1`` (odd, so
    ``x -> a_f*x + b_f`` is a bijection of uint32) and ``b_f = z >> 32``.
    Returns (a, b), each uint32 (ceil(num_perm / 2),).
    """
    if num_perm < 1:
        raise ValueError("num_perm must be >= 1")
    if not 0 <= seed < 1 << 64:
        raise ValueError("seed must be in [0, 2**64)")
    z = splitmix64(seed, (num_perm + 1) // 2)
    a = ((z & np.uint64(0xFFFFFFFF)) | np.uint64(1)).astype(np.uint32)
    b = (z >> np.uint64(32)).astype(np.uint32)
    return a, b


# --- compiled kernels ---------------------------------------------------------------------------


@njit(inline="always")
def _fmix64(h: Any) -> Any:
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return h


@njit(inline="always")
def _is_cont(byte: Any) -> Any:
    return (byte & 0xC0) == 0x80


@njit
def _decode(data: Any, lo: int, hi: int, cps: Any) -> int:
    """Code points of ``data[lo:hi]`` into ``cps`` (len >= hi - lo); returns how many.

    Lenient: a lead byte with the right number of continuation bytes decodes by bit layout
    (overlong forms and surrogates are not rejected, so any str encoded with surrogatepass
    round-trips); any other byte becomes U+FFFD and consumes one byte.
    """
    acc = np.uint8(0)
    for i in range(lo, hi):
        acc |= data[i]
    if acc < 0x80:  # all ASCII: a widening copy that vectorises
        for i in range(hi - lo):
            cps[i] = data[lo + i]
        return hi - lo
    n = 0
    i = lo
    while i < hi:
        c = np.uint32(data[i])
        i += 1
        if c >= 0x80:
            if 0xC0 <= c < 0xE0 and i < hi and _is_cont(data[i]):
                c = ((c & 0x1F) << 6) | (np.uint32(data[i]) & 0x3F)
                i += 1
            elif 0xE0 <= c < 0xF0 and i + 1 < hi and _is_cont(data[i]) and _is_cont(data[i + 1]):
                c = ((c & 0x0F) << 12) | ((np.uint32(data[i]) & 0x3F) << 6) | (np.uint32(data[i + 1]) & 0x3F)
                i += 2
            elif (
                0xF0 <= c < 0xF8
                and i + 2 < hi
                and _is_cont(data[i])
                and _is_cont(data[i + 1])
                and _is_cont(data[i + 2])
            ):
                c = (
                    ((c & 0x07) << 18)
                    | ((np.uint32(data[i]) & 0x3F) << 12)
                    | ((np.uint32(data[i + 1]) & 0x3F) << 6)
                    | (np.uint32(data[i + 2]) & 0x3F)
                )
                i += 3
            else:
                c = np.uint32(0xFFFD)
        cps[n] = np.uint32(c)
        n += 1
    return n


@njit(inline="always")
def _pow_base(e: int) -> Any:
    p = _U64_1
    for _ in range(e):
        p *= _B
    return p


@njit
def _roll(cps: Any, n: int, k: int, s0: int, s1: int, prev: Any, bk: Any, out: Any, shift: Any) -> Any:
    """Shingle hashes ``H >> shift`` of shingles ``s0 .. s1-1`` into ``out[0 : s1 - s0]``.

    Shingles are the windows of ``L = min(k, n)`` code points (n >= 1). ``prev`` is the
    polynomial of shingle ``s0 - 1`` (ignored when s0 == 0); the polynomial of shingle
    ``s1 - 1`` is returned so the next block continues the roll. ``bk`` = B**k mod 2**64.
    shift = 0 with a uint64 ``out`` gives H; shift = 32 with uint32 gives the MinHash input.
    """
    h = prev
    start = s0
    if s0 == 0:
        h = np.uint64(0)
        for j in range(min(k, n)):
            h = h * _B + np.uint64(cps[j]) + _U64_1
        out[0] = _fmix64(h) >> shift
        start = 1
    for i in range(start, s1):
        # P_i = P_{i-1} * B + d_{i+k-1} - d_{i-1} * B^k  (mod 2^64)
        h = h * _B + ((np.uint64(cps[i + k - 1]) + _U64_1) - (np.uint64(cps[i - 1]) + _U64_1) * bk)
        out[i - s0] = _fmix64(h) >> shift
    return h


@njit
def _minmax(xs: Any, ns: int, a: Any, b: Any, num_perm: int, sig: Any) -> None:
    """Fold ``ns`` MinHash inputs into ``sig`` (uint32 (num_perm,)), min-max per function."""
    nf = a.shape[0]
    for f in range(nf):
        af = a[f]
        bf = b[f]
        lo = np.uint32(0xFFFFFFFF)
        hi = np.uint32(0)
        for t in range(ns):
            v = np.uint32(af * xs[t] + bf)
            lo = min(lo, v)
            hi = max(hi, v)
        sig[2 * f] = min(sig[2 * f], lo)
        if 2 * f + 1 < num_perm:
            sig[2 * f + 1] = min(sig[2 * f + 1], np.uint32(~hi))


@njit
def _sign_docs(
    data: Any,
    offsets: Any,
    d0: int,
    d1: int,
    k: int,
    a: Any,
    b: Any,
    num_perm: int,
    out: Any,
) -> None:
    """Signatures of documents d0 .. d1-1 into their rows of ``out``."""
    bk = _pow_base(k)
    xs = np.empty(_BLOCK, dtype=np.uint32)
    cps = np.empty(0, dtype=np.uint32)
    for d in range(d0, d1):
        lo = offsets[d]
        hi = offsets[d + 1]
        if hi - lo > cps.shape[0]:
            cps = np.empty(max(hi - lo, 2 * cps.shape[0]), dtype=np.uint32)
        n = _decode(data, lo, hi, cps)
        sig = out[d]
        for j in range(num_perm):
            sig[j] = np.uint32(0xFFFFFFFF)
        ns = max(n - k + 1, 1) if n else 0
        h = np.uint64(0)
        for s0 in range(0, ns, _BLOCK):
            s1 = min(ns, s0 + _BLOCK)
            h = _roll(cps, n, k, s0, s1, h, bk, xs, _S32)
            _minmax(xs, s1 - s0, a, b, num_perm, sig)


@njit(cache=True, parallel=True)
def _signatures_kernel(
    data: Any,
    offsets: Any,
    bounds: Any,
    k: int,
    a: Any,
    b: Any,
    num_perm: int,
    out: Any,
) -> None:
    for task in prange(bounds.shape[0] - 1):  # the body is one call: parfors compiles it fast
        _sign_docs(data, offsets, bounds[task], bounds[task + 1], k, a, b, num_perm, out)


@njit(cache=True)
def _doc_shingle_hashes(data: Any, lo: int, hi: int, k: int) -> Any:
    """uint64 (m,): H of every shingle of one document, in text order (repeats included)."""
    cps = np.empty(hi - lo, dtype=np.uint32)
    n = _decode(data, lo, hi, cps)
    ns = max(n - k + 1, 1) if n else 0
    out = np.empty(ns, dtype=np.uint64)
    if ns:
        _roll(cps, n, k, 0, ns, np.uint64(0), _pow_base(k), out, np.uint64(0))
    return out


# --- public API ---------------------------------------------------------------------------------


def _check_shingle(shingle: int) -> None:
    if shingle < 1:
        raise ValueError("shingle must be >= 1")


def task_bounds(offsets: npt.NDArray[np.int64], tasks: int) -> npt.NDArray[np.int64]:
    """int64 (tasks' + 1,): document ranges of about equal byte size, for static scheduling."""
    n = offsets.shape[0] - 1
    cuts = np.linspace(offsets[0], offsets[-1], max(tasks, 1) + 1)
    bounds = np.searchsorted(offsets[:-1], cuts, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n
    return np.unique(np.maximum.accumulate(bounds))


def signatures(
    docs: Docs,
    *,
    shingle: int = 24,
    num_perm: int = 260,
    seed: int = 42,
) -> npt.NDArray[np.uint32]:
    """MinHash signatures: uint32 (n, num_perm), row i for ``docs[i]``.

    docs: a sequence of str, or a Utf8Batch (e.g. ``from_arrow(column)``) to skip encoding.
    A row depends only on its own text, ``shingle``, ``num_perm`` and ``seed``: never on batch
    composition or thread count. Runs on numba's current thread count.
    """
    _check_shingle(shingle)
    a, b = hash_params(num_perm, seed)
    batch = as_utf8(docs)
    n = len(batch)
    out = np.empty((n, num_perm), dtype=np.uint32)
    if n:
        bounds = task_bounds(batch.offsets, numba.get_num_threads() * _TASKS_PER_THREAD)
        _signatures_kernel(batch.data, batch.offsets, bounds, shingle, a, b, num_perm, out)
    return out


def shingle_hashes(text: str, *, shingle: int = 24) -> npt.NDArray[np.uint64]:
    """uint64 (m,): the set of 64-bit shingle hashes H of ``text``, sorted, unique.

    The values the signature kernel uses (its MinHash input is ``H >> 32``) and exact
    verification compares. Empty text: an empty array.
    """
    _check_shingle(shingle)
    batch = as_utf8([text])
    return np.unique(_doc_shingle_hashes(batch.data, 0, batch.data.shape[0], shingle))
