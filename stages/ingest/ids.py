"""Content-derived document ids and the occurrence numbers that make them unique.

The ``doc_id`` is 32 hex chars of xxh3-128 over ``crawl, source, canonical JSON of the whole
record, occurrence``: the canonical JSON has sorted keys, so whitespace or key order in the input
does not matter, and ``occurrence`` numbers identical records within the source (identical records
are interchangeable, so which copy gets which number does not matter). Splitting, merging or
reordering the input files therefore leaves every id unchanged. A collision is an error, never
an overwrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xxhash


class Counts:
    """How often each 16-byte digest has been seen: sorted runs of ("S16" key, int64 count),
    merged LSM-style (a run is merged into the one before when it grows to half its size), so
    numbering n digests costs O(n log n) time and ~24 bytes per distinct digest."""

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def number(self, digests: np.ndarray) -> np.ndarray:
        """int64 (n,): for each of ``digests`` ("S16", in input order) the number of earlier
        occurrences, this batch's earlier rows included; the batch is then counted."""
        n = len(digests)
        if n == 0:
            return np.zeros(0, np.int64)
        order, first = grouped(digests)
        starts = np.flatnonzero(first)
        group = np.cumsum(first) - 1  # of each sorted row
        uniq, cnt = digests[order[starts]], np.diff(np.append(starts, n))
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n) - starts[group]
        inverse = np.empty(n, np.int64)
        inverse[order] = group
        base = np.zeros(len(uniq), np.int64)
        for keys, counts in self.runs:
            pos = np.searchsorted(keys, uniq)
            hit = pos < len(keys)
            hit[hit] = keys[pos[hit]] == uniq[hit]
            base[hit] += counts[pos[hit]]
        self.runs.append((uniq, cnt.astype(np.int64)))
        while len(self.runs) > 1 and 2 * len(self.runs[-1][0]) >= len(self.runs[-2][0]):
            (k2, c2), (k1, c1) = self.runs.pop(), self.runs.pop()
            keys, counts = np.concatenate([k1, k2]), np.concatenate([c1, c2])
            order, first = grouped(keys)
            starts = np.flatnonzero(first)
            self.runs.append((keys[order[starts]], np.add.reduceat(counts[order], starts).astype(np.int64)))
        return base[inverse] + rank


def grouped(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, first) of ``digests`` ("S16", n >= 1): int64 (n,), the rows sorted by their bytes
    (numpy's order of "S16"), equal digests together in input order; bool (n,), whether each
    sorted row starts its group. Sorted by the first 8 bytes as a big-endian integer (an
    integer sort, half the time of a 16-byte one): that is the bytes' order wherever no two
    distinct digests share their first 8 bytes (a 2^-64 chance per pair), checked; else by all 16."""
    n = len(digests)
    halves = np.ascontiguousarray(digests).view(">u8").reshape(n, 2)
    order = np.argsort(halves[:, 0], kind="stable")
    high, low = halves[order, 0], halves[order, 1]
    first = np.ones(n, bool)
    first[1:] = high[1:] != high[:-1]
    if (~first[1:] & (low[1:] != low[:-1])).any():
        order = np.argsort(digests, kind="stable")
        ranked = digests[order]
        first[1:] = ranked[1:] != ranked[:-1]
    return order, first


@dataclass
class Ids:
    """Assigns content-derived doc_ids and detects collisions within one source."""

    crawl: str
    source: str
    seen: Counts = field(default_factory=Counts)
    issued: Counts = field(default_factory=Counts)

    def assign(self, digests: bytes) -> bytes:
        """doc_ids (16 raw bytes each, concatenated; the doc_id is their hex) of records with these
        content digests (16 bytes each, concatenated), in order."""
        if not digests:
            return b""
        ks = self.seen.number(np.frombuffer(digests, "S16"))
        raw = id_digests(f"{self.crawl}\x00{self.source}\x00".encode(), digests, ks)
        again = self.issued.number(np.frombuffer(raw, "S16"))
        if again.any():
            i = int(np.argmax(again))
            raise RuntimeError(f"doc_id collision in source {self.source!r}: {raw[16 * i:16 * i + 16].hex()}")
        return raw


def id_digests(prefix: bytes, digests: bytes, ks: np.ndarray) -> bytes:
    """For each record, xxh3-128 of ``prefix``, its content digest (16 bytes of ``digests``), a NUL
    and its occurrence number ``ks[i]`` in decimal; concatenated (16 bytes each). The inputs of the
    records seen fewer than 10 times before (nearly all) are built as one numpy block and hashed by
    ``map``, not concatenated one by one (5x less time)."""
    n = len(ks)
    lp = len(prefix)
    rows = np.empty((n, lp + 18), np.uint8)
    rows[:, :lp] = np.frombuffer(prefix, np.uint8)
    rows[:, lp:lp + 16] = np.frombuffer(digests, np.uint8).reshape(n, 16)
    rows[:, lp + 16] = 0
    rows[:, lp + 17] = ord("0") + np.minimum(ks, 9)
    # numpy drops trailing NULs of each "S" item; the last byte is a digit, so none is dropped
    hashes = list(map(xxhash.xxh3_128_digest, rows.view(f"S{lp + 18}").ravel().tolist()))
    for i in np.flatnonzero(ks >= 10).tolist():
        hashes[i] = xxhash.xxh3_128_digest(prefix + digests[16 * i:16 * i + 16] + b"\x00" + str(int(ks[i])).encode())
    return b"".join(hashes)


def bad_digest(where: str, raw_digest: bytes) -> bytes:
    """Content digest of a quarantined record: from its file-relative position and bytes (not
    stable across re-sharding, which is fine: nothing downstream joins on it)."""
    return xxhash.xxh3_128_digest(b"\x01quarantine\x00" + where.encode() + b"\x00" + raw_digest)
