"""torch twin of ``stages.kernels.minhash``: the same signatures, bit for bit, on any torch device.

The hash family is docs/minhash.md's; only the evaluation order differs, never a value. Documents
are processed in chunks of whole documents (about ``chunk_bytes`` of UTF-8, a larger document
alone), so device memory is bounded by the chunk, not the batch:

1. **Decode** (§1). A byte's sequence length depends only on the byte and the three after it;
   the CPU decoder visits every non-continuation byte, and a continuation byte is skipped exactly
   when a *valid* lead byte 1–3 places before it covers it. So "starts a code point" is
   ``not covered``, a vectorised test; values come from the payload bits, U+FFFD otherwise.
   An all-ASCII chunk skips all of it.
2. **Polynomials** (§2) from one prefix sum instead of a roll: B is odd, so invertible mod
   2**64; with ``S_t = sum_{s<t} d_s * B**-s`` every window is
   ``P_i = B**(i+L-1) * (S_{i+L} - S_i) mod 2**64``, the same number the CPU kernel rolls to.
   uint64 arithmetic runs on int64 tensors (add, multiply, xor and cumsum wrap alike).
3. ``H = fmix64(P)`` with logical shifts emulated by masking; MinHash input ``x = H >> 32``.
4. **Min-max** (§3): each document's windows are padded to blocks of ``block`` windows by
   repeating its last window (a repeat changes neither min nor max), ``y = a*x + b`` is computed
   in int32 (multiplication wraps mod 2**32) and compared in unsigned order by flipping the sign
   bit (folded into b); ``aminmax`` reduces each block, one scatter per block reduces into its
   document.
   Functions x blocks are evaluated in tiles of at most ``tile`` elements.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import torch

from stages.kernels.minhash import ROLL_BASE, Docs, as_utf8, hash_params

_M64 = (1 << 64) - 1
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
MAX_BLOCK = 32  # windows per min-max block (smaller when documents are short)


def s64(value: int) -> int:
    """The int64 whose bits are ``value mod 2**64`` (torch has no uint64 arithmetic)."""
    value &= _M64
    return value - (1 << 64) if value >= 1 << 63 else value


_B = s64(ROLL_BASE)
_M1 = s64(0xFF51AFD7ED558CCD)
_M2 = s64(0xC4CEB9FE1A85EC53)


def shr(h: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of uint64 bits held in int64 (``>>`` on int64 is arithmetic), 0 < s < 64."""
    return (h >> s) & ((1 << (64 - s)) - 1)


def fmix64(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finalizer on int64 (uint64 bits); ``h`` is not modified."""
    h = h ^ shr(h, 33)
    h *= _M1
    h ^= shr(h, 33)
    h *= _M2
    h ^= shr(h, 33)
    return h


def to_device(arr: npt.NDArray[np.generic], device: str | torch.device) -> torch.Tensor:
    """A numpy array on ``device`` (unsigned 32/64-bit arrays as their signed views)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype == np.uint64:
        arr = arr.view(np.int64)
    elif arr.dtype == np.uint32:
        arr = arr.view(np.int32)
    with warnings.catch_warnings():  # read-only inputs are only ever read (copied to the device)
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr).to(device)


def powers(base: int, count: int, device: str | torch.device) -> torch.Tensor:
    """int64 (count,): ``base**t mod 2**64`` for t = 0 .. count-1, by doubling (log2(count) steps)."""
    out = torch.empty(count, dtype=torch.int64, device=device)
    if count:
        out[0] = 1
    filled = 1
    while filled < count:
        take = min(filled, count - filled)
        torch.mul(out[:take], s64(pow(base, filled, 1 << 64)), out=out[filled : filled + take])
        filled += take
    return out


def device_defaults(device: str | torch.device) -> tuple[int, int]:
    """(chunk_bytes, tile) for a device: large on a GPU, cache-sized on a CPU."""
    return (1 << 26, 1 << 28) if torch.device(device).type == "cuda" else (1 << 21, 1 << 21)


def doc_chunks(offsets: npt.NDArray[np.int64], chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Document ranges [d0, d1) of at most ``chunk_bytes`` bytes each (a larger document alone)."""
    n = offsets.shape[0] - 1
    d0 = 0
    while d0 < n:
        d1 = int(np.searchsorted(offsets, offsets[d0] + chunk_bytes, side="right")) - 1
        d1 = min(max(d1, d0 + 1), n)
        yield d0, d1
        d0 = d1


# --- steps 1-3: bytes -> code points -> window hashes ------------------------------------------------


def code_points(data: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode a chunk: (code points int64 (c,), code points per document int64 (nd,)).

    data: uint8 (nbytes,) the documents' bytes back to back; lengths: int64 (nd,) bytes per
    document. Same lenient rules as the CPU ``_decode`` (docs/minhash.md §1).
    """
    b = data.to(torch.int32)
    nbytes = b.shape[0]
    if nbytes == 0 or int(b.max()) < 0x80:
        return b.to(torch.int64), lengths.clone()
    dev = b.device
    nd = lengths.shape[0]
    doc = torch.repeat_interleave(torch.arange(nd, device=dev), lengths, output_size=nbytes)
    end = torch.cumsum(lengths, 0)[doc]  # exclusive end of each byte's document
    idx = torch.arange(nbytes, device=dev)
    cont = (b & 0xC0) == 0x80
    # continuation bytes a lead byte asks for: 1 (0xC0-0xDF), 2 (0xE0-0xEF), 3 (0xF0-0xF7), else 0
    need = torch.bucketize(b, torch.tensor([0xC0, 0xE0, 0xF0, 0xF8], dtype=torch.int32, device=dev), right=True)
    need = torch.where(need == 4, 0, need).to(torch.int32)
    cpad = torch.cat([cont, torch.zeros(3, dtype=torch.bool, device=dev)])
    valid = (need >= 1) & (idx + need < end) & cpad[1 : nbytes + 1]
    valid &= (need < 2) | cpad[2 : nbytes + 2]
    valid &= (need < 3) | cpad[3 : nbytes + 3]
    # byte j is consumed by the valid lead at j-1, j-2 or j-3 whose sequence reaches it
    vpad = torch.cat([torch.zeros(3, dtype=torch.bool, device=dev), valid])
    npad = torch.cat([torch.zeros(3, dtype=torch.int32, device=dev), need])
    covered = vpad[2 : nbytes + 2] | (vpad[1 : nbytes + 1] & (npad[1 : nbytes + 1] >= 2))
    covered |= vpad[0:nbytes] & (npad[0:nbytes] >= 3)
    start = ~covered
    bpad = torch.cat([b, torch.zeros(3, dtype=torch.int32, device=dev)])
    b1 = bpad[1 : nbytes + 1] & 0x3F
    b2 = bpad[2 : nbytes + 2] & 0x3F
    b3 = bpad[3 : nbytes + 3] & 0x3F
    multi = torch.where(
        need == 1,
        ((b & 0x1F) << 6) | b1,
        torch.where(need == 2, ((b & 0x0F) << 12) | (b1 << 6) | b2, ((b & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3),
    )
    single = torch.where(b < 0x80, b, torch.full_like(b, 0xFFFD))
    value = torch.where(valid, multi, single)
    counts = torch.bincount(doc[start], minlength=nd)
    return value[start].to(torch.int64), counts


def window_hashes(
    cps: torch.Tensor, counts: torch.Tensor, shingle: int, bpow: torch.Tensor, binvpow: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H int64 (w,) per window in text order, windows per document int64 (nd,)).

    cps: int64 (c,) code points of nd documents back to back, counts: int64 (nd,) per document;
    bpow/binvpow: int64 powers of B and B**-1 mod 2**64, at least c of each.
    """
    dev = cps.device
    c = cps.shape[0]
    width = counts.clamp(max=shingle)
    ns = torch.where(counts > 0, counts - width + 1, torch.zeros_like(counts))
    w = int(ns.sum())
    nd = counts.shape[0]
    if w == 0:
        return torch.zeros(0, dtype=torch.int64, device=dev), ns
    win_doc = torch.repeat_interleave(torch.arange(nd, device=dev), ns, output_size=w)
    first = (torch.cumsum(counts, 0) - counts - (torch.cumsum(ns, 0) - ns))[win_doc]
    i = torch.arange(w, device=dev) + first  # first code point of each window
    span = width[win_doc]
    prefix = torch.zeros(c + 1, dtype=torch.int64, device=dev)
    torch.cumsum((cps + 1) * binvpow[:c], 0, out=prefix[1:])  # S_t, wrapping mod 2**64
    poly = bpow[i + span - 1] * (prefix[i + span] - prefix[i])
    return fmix64(poly), ns


class _Chunks:
    """Iterates a batch's chunks as (d0, d1, H, ns) with the powers of B shared by all chunks.

    data: uint8 (total_bytes,) the batch's bytes, already on the device; offsets: int64 (n + 1,)
    on the host.
    """

    def __init__(self, data: torch.Tensor, offsets: npt.NDArray[np.int64], shingle: int, chunk_bytes: int) -> None:
        self.data = data
        self.offsets = offsets
        self.shingle = shingle
        self.ranges = list(doc_chunks(offsets, chunk_bytes))
        most = max((int(offsets[d1] - offsets[d0]) for d0, d1 in self.ranges), default=0)
        self.bpow = powers(ROLL_BASE, most, data.device)
        self.binvpow = powers(pow(ROLL_BASE, -1, 1 << 64), most, data.device)

    def __iter__(self) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        offs = self.offsets
        for d0, d1 in self.ranges:
            raw = self.data[int(offs[d0]) : int(offs[d1])]
            lengths = torch.from_numpy(np.diff(offs[d0 : d1 + 1])).to(self.data.device)
            cps, counts = code_points(raw, lengths)
            h, ns = window_hashes(cps, counts, self.shingle, self.bpow, self.binvpow)
            yield d0, d1, h, ns


def _on_device(docs: Docs, device: str | torch.device) -> tuple[torch.Tensor, npt.NDArray[np.int64]]:
    """(uint8 bytes on ``device``, int64 offsets on the host, from 0) of a batch."""
    batch = as_utf8(docs)
    lo, hi = int(batch.offsets[0]), int(batch.offsets[-1])
    return to_device(batch.data[lo:hi], device), batch.offsets - lo


def shingle_hashes(
    docs: Docs, *, shingle: int = 24, device: str | torch.device = "cpu", chunk_bytes: int | None = None
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """(H uint64 (w,), windows per document int64 (n,)): every window's 64-bit shingle hash, in
    text order, document after document (repeats included): what the CPU ``_doc_shingle_hashes``
    gives per document, concatenated."""
    if shingle < 1:
        raise ValueError("shingle must be >= 1")
    data, offsets = _on_device(docs, device)
    chunks = _Chunks(data, offsets, shingle, chunk_bytes or device_defaults(device)[0])
    hs: list[npt.NDArray[np.int64]] = [np.zeros(0, np.int64)]
    ns = np.zeros(offsets.shape[0] - 1, dtype=np.int64)
    for d0, d1, h, n in chunks:
        hs.append(h.cpu().numpy())
        ns[d0:d1] = n.cpu().numpy()
    return np.concatenate(hs).view(np.uint64), ns


# --- step 4: min-max signatures ----------------------------------------------------------------------


def _minmax(
    x: torch.Tensor, ns: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(min key, max key), int32 (F, nd) each: the per-document min and max of ``y = a*x + b mod 2**32``
    in sign-flipped form (``y ^ 0x80000000``, whose signed order is y's unsigned order).

    x: int32 (w,) MinHash inputs (bits of ``H >> 32``) of nd documents back to back, ns: int64
    (nd,) windows per document; a, b: int32 (F, 1, 1). A document without windows gets
    (INT32_MAX, INT32_MIN), the keys of (0xFFFFFFFF, 0).
    """
    dev = x.device
    nd = ns.shape[0]
    f = a.shape[0]
    lo = torch.full((f, nd), _I32_MAX, dtype=torch.int32, device=dev)
    hi = torch.full((f, nd), _I32_MIN, dtype=torch.int32, device=dev)
    w = x.shape[0]
    if w == 0:
        return lo, hi
    # short documents waste most of a padded block: use blocks of about an eighth of the mean
    block = 1
    while block < MAX_BLOCK and block * 16 <= w // max(int((ns > 0).sum()), 1):
        block *= 2
    nb = (ns + block - 1) // block
    total = int(nb.sum())
    blk_doc = torch.repeat_interleave(torch.arange(nd, device=dev), nb, output_size=total)
    slot = ((torch.arange(total, device=dev) - (torch.cumsum(nb, 0) - nb)[blk_doc]) * block)[:, None]
    slot = torch.minimum(slot + torch.arange(block, device=dev)[None, :], (ns[blk_doc] - 1)[:, None])
    xp = x[(torch.cumsum(ns, 0) - ns)[blk_doc][:, None] + slot]  # int32 (total, block)
    step = max(1, tile // (f * block))
    b_key = b ^ _I32_MIN  # y ^ 0x80000000 == y + 0x80000000 (mod 2**32): the flip folds into b
    for b0 in range(0, total, step):
        key = torch.addcmul(b_key, xp[b0 : b0 + step].unsqueeze(0), a)  # int32 (F, blocks, block), wraps
        mn, mx = torch.aminmax(key, dim=2)
        target = blk_doc[b0 : b0 + step].unsqueeze(0).expand(f, -1)
        lo.scatter_reduce_(1, target, mn, "amin")
        hi.scatter_reduce_(1, target, mx, "amax")
    return lo, hi


def signatures(
    docs: Docs,
    *,
    shingle: int = 24,
    num_perm: int = 260,
    seed: int = 42,
    device: str | torch.device = "cpu",
    chunk_bytes: int | None = None,
    tile: int | None = None,
) -> npt.NDArray[np.uint32]:
    """MinHash signatures: uint32 (n, num_perm), row i for ``docs[i]``; equal, bit for bit, to
    ``stages.kernels.minhash.signatures`` with the same arguments, on any ``device``.

    chunk_bytes: bytes of text per device pass (documents are never split; default by device);
    tile: int32 elements of the largest temporary (functions x windows). Neither changes a bit.
    The batch's bytes are copied to the device once; the signatures come back once.
    """
    data, offsets = _on_device(docs, device)
    sig = signatures_tensor(data, offsets, shingle=shingle, num_perm=num_perm, seed=seed,
                            chunk_bytes=chunk_bytes, tile=tile)
    return sig.cpu().numpy().view(np.uint32)


def signatures_tensor(
    data: torch.Tensor,
    offsets: npt.NDArray[np.int64],
    *,
    shingle: int = 24,
    num_perm: int = 260,
    seed: int = 42,
    chunk_bytes: int | None = None,
    tile: int | None = None,
) -> torch.Tensor:
    """``signatures`` with the text already on the device: data uint8 (total_bytes,) on the
    device, offsets int64 (n + 1,) on the host, starting at 0. Returns int32 (n, num_perm) on the
    device, the uint32 signature bits (``.view(np.uint32)`` of its numpy copy)."""
    if shingle < 1:
        raise ValueError("shingle must be >= 1")
    if offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] > data.shape[0]:
        raise ValueError("offsets must start at 0 and end within data")
    default_chunk, default_tile = device_defaults(data.device)
    a_np, b_np = hash_params(num_perm, seed)
    a = to_device(a_np, data.device).view(-1, 1, 1)
    b = to_device(b_np, data.device).view(-1, 1, 1)
    out = torch.empty((offsets.shape[0] - 1, num_perm), dtype=torch.int32, device=data.device)
    half = num_perm // 2
    for d0, d1, h, ns in _Chunks(data, offsets, shingle, chunk_bytes or default_chunk):
        lo, hi = _minmax((h >> 32).to(torch.int32), ns, a, b, tile or default_tile)
        out[d0:d1, 0::2] = (lo ^ _I32_MIN).T
        out[d0:d1, 1::2] = (~(hi ^ _I32_MIN)).T[:, :half]
    return out
