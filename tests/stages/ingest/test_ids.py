"""Content-derived doc_ids: the block-built id digests are the per-record formula's, and
occurrence numbers run across batches."""

from __future__ import annotations

from collections import Counter

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.ingest.ids import Counts, Ids, grouped, id_digests


def _one(prefix: bytes, digest: bytes, k: int) -> bytes:
    """The doc_id formula, one record at a time (stages/ingest/ids.py's docstring)."""
    return xxhash.xxh3_128_digest(prefix + digest + b"\x00" + str(k).encode())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 1200)), min_size=1, max_size=60),
       st.text("abcxyz019._-", min_size=1, max_size=12))
def test_block_built_id_digests_are_the_per_record_formulas(records: list[tuple[bytes, int]], name: str) -> None:
    prefix = f"{name}\x00s\x00".encode()
    digests = b"".join(d for d, _ in records)  # NULs anywhere, at the end too
    ks = np.array([k for _, k in records], np.int64)
    assert id_digests(prefix, digests, ks) == b"".join(_one(prefix, d, k) for d, k in records)


def test_identical_records_are_numbered_across_batches() -> None:
    ids = Ids("c", "s")
    a, b = b"\x00" * 16, b"\x01" * 15 + b"\x00"
    first = ids.assign(a + b + a)
    second = ids.assign(a + b)
    prefix = b"c\x00s\x00"
    assert first + second == b"".join(_one(prefix, d, k) for d, k in [(a, 0), (b, 0), (a, 1), (a, 2), (b, 1)])
    assert len(set(first[i:i + 16] for i in range(0, 48, 16)) | {second[:16], second[16:]}) == 5


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), max_size=40), min_size=1, max_size=12))
def test_counts_number_each_digest_by_its_earlier_occurrences(batches: list[list[int]]) -> None:
    # 12 digests: some share their first 8 bytes (the integer sort's tie, sorted by all 16 then),
    # some differ only in a trailing NUL, one has its high bit set
    pool = [bytes([0] * 8 + [i] * 8) for i in range(4)] + [bytes([i] * 16) for i in range(4)] + \
        [b"\x01" * 15 + b"\x00", b"\x01" * 14 + b"\x00\x00", b"\xff" * 16, b"\x80" + b"\x00" * 15]
    counts, seen = Counts(), Counter[bytes]()
    for batch in batches:
        digests = np.frombuffer(b"".join(pool[i] for i in batch), "S16") if batch else np.zeros(0, "S16")
        want = []
        for i in batch:
            want.append(seen[pool[i]])
            seen[pool[i]] += 1
        assert counts.number(digests).tolist() == want
    assert sum(int(c.sum()) for _, c in counts.runs) == sum(seen.values())


def test_grouped_sorts_digests_by_their_bytes() -> None:
    rng = np.random.default_rng(7)
    digests = np.frombuffer(rng.bytes(16 * 5000), "S16").copy()
    digests[::9] = digests[4]
    order, first = grouped(digests)
    ranked = [d.ljust(16, b"\x00") for d in digests[order].tolist()]
    assert ranked == sorted(d.ljust(16, b"\x00") for d in digests.tolist())
    groups = np.cumsum(first) - 1
    for g in np.unique(groups[~first])[:50]:
        rows = order[groups == g]
        assert (np.diff(rows) > 0).all()
    assert int(first.sum()) == len(set(ranked))
