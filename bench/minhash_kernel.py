"""Micro-benchmark of the MinHash signature kernel (char-24 shingles x 260 hashes).

Corpus: the Python standard library's .py files (real text, ~60% of lines code, ~40% prose and
comments), read in path order until ``--mb`` megabytes of UTF-8. Prints MB/s per core for one
numba thread and for all of them (wall clock and CPU time: on a shared machine the CPU-time
figure is the kernel's own speed), the cost of exact Jaccard verification of every document
once, and datasketch / rensa on a subset when they are installed (``pip install .[bench]``).

    python bench/minhash_kernel.py [--mb 50] [--peer-mb 2]
"""

from __future__ import annotations

import argparse
import glob
import os
import sysconfig
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numba
import numpy as np
from common import char_shingles

from stages.kernels import lsh
from stages.kernels import minhash as mh

SHINGLE, NUM_PERM, SEED = 24, 260, 42


def stdlib_corpus(megabytes: float) -> list[str]:
    """Texts of stdlib .py files, in path order, until ``megabytes`` of UTF-8."""
    root = sysconfig.get_paths()["stdlib"]
    texts: list[str] = []
    total = 0
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text.encode("utf-8", "surrogatepass"))
        if total >= megabytes * 1e6:
            break
    return texts


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) over ``repeat`` runs."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def peer_datasketch(texts: list[str]) -> None:
    from datasketch import MinHash

    for text in texts:
        m = MinHash(num_perm=NUM_PERM, seed=SEED)
        m.update_batch([s.encode("utf-8", "surrogatepass") for s in char_shingles(text)])
        m.digest()


def peer_rensa(texts: list[str]) -> None:
    from rensa import RMinHash

    for text in texts:
        m = RMinHash(num_perm=NUM_PERM, seed=SEED)
        m.update(char_shingles(text))
        m.digest()


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size for our kernel (MB of UTF-8)")
    parser.add_argument("--peer-mb", type=float, default=2.0, help="subset size for datasketch/rensa")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    texts = stdlib_corpus(args.mb)
    batch = mh.encode_texts(texts)
    mb = batch.data.shape[0] / 1e6
    cores = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    print(f"corpus: {len(texts)} stdlib files, {mb:.1f} MB UTF-8; char-{SHINGLE} x {NUM_PERM}; {cores} cores")

    enc_wall, _ = best_of(lambda: mh.encode_texts(texts), args.repeat)
    print(f"encode_texts (str -> UTF-8 buffer)      {mb / enc_wall:8.1f} MB/s")

    mh.signatures(texts[:2])  # compile or load from cache
    rows = []
    for threads in sorted({1, cores}):
        numba.set_num_threads(threads)
        wall, cpu = best_of(lambda: mh.signatures(batch), args.repeat)
        rows.append((threads, mb / wall, mb / wall / threads, mb / cpu))
    numba.set_num_threads(cores)
    for threads, total, per_core_wall, per_cpu_s in rows:
        print(
            f"signatures, {threads} thread(s): {total:8.1f} MB/s total,"
            f" {per_core_wall:6.1f} MB/s per core (wall), {per_cpu_s:6.1f} MB/s per CPU-second"
        )
    sig_cpu_mbs = rows[0][3]

    # exact verification, every document hashed once: each is paired with a near-copy of itself
    # (0.2% of its characters replaced: mostly shared shingles) or with an unrelated document
    rng = np.random.default_rng(0)
    doubled: list[str] = []
    for text in texts:
        chars = list(text)
        for i in rng.integers(0, max(len(chars), 1), size=len(chars) // 500):
            chars[i] = "#"
        doubled += [text, "".join(chars)]
    pairs_batch = mh.encode_texts(doubled)
    pairs_mb = pairs_batch.data.shape[0] / 1e6
    n = len(doubled)
    anchors = np.arange(0, n, 2, dtype=np.int64)
    lsh.pair_jaccard(texts[:2], np.array([1]), np.array([0]))
    numba.set_num_threads(1)
    for label, members in (("a near-copy", anchors + 1), ("an unrelated doc", (anchors + 3) % n)):
        verify = partial(lsh.pair_jaccard, pairs_batch, members, anchors)
        _, ver_cpu = best_of(verify, args.repeat)
        speed = pairs_mb / ver_cpu
        print(
            f"pair_jaccard vs {label:16s} 1 thread: {speed:6.1f} MB/s per CPU-second"
            f" ({sig_cpu_mbs / speed:.2f}x the signature pass per byte)"
        )
    numba.set_num_threads(cores)

    subset = stdlib_corpus(args.peer_mb)
    sub_mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in subset) / 1e6
    numba.set_num_threads(1)
    _, ours = best_of(lambda: mh.signatures(subset), 1)
    numba.set_num_threads(cores)
    print(f"peers on {sub_mb:.1f} MB, 1 core (Python shingling included), ours {sub_mb / ours:.1f} MB/s:")
    for name, fn in (("datasketch", peer_datasketch), ("rensa", peer_rensa)):
        try:
            _, cpu = best_of(partial(fn, subset), 1)
        except ImportError:
            print(f"  {name:10s} not installed")
            continue
        print(f"  {name:10s} {sub_mb / cpu:8.2f} MB/s per core; ours is {cpu / ours:6.1f}x faster")


if __name__ == "__main__":
    main()
