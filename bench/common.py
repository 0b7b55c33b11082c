"""Helpers the benchmark scripts share (they run as ``python bench/NAME.py``, so this folder is on
``sys.path``). Plain Python on purpose: the peers and the oracles must not go through our kernels.
"""

from __future__ import annotations

import gzip
import json
import resource
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

# The ``curate`` console script's entry point (``curation_dagster.console:main``), as a user runs
# it: ``python -m curation_dagster.cli`` imports the whole CLI before its first line, and so is not
# what a user waits for. -P: not the current folder first on sys.path. Run from the checkout, the
# checkout's curation_dagster came ahead of ``PYTHONPATH``: a ``--baseline`` tree ran this one.
CURATE = [sys.executable, "-P", "-c", "from curation_dagster.console import main; main()"]
SHINGLE = 24  # code points per shingle, the project's default (docs/minhash.md §2)
SKIPPED_SOURCES = ("scraps", "benchmarks")  # `curate sample`'s broken records and its benchmark


def source_texts(folder: Path) -> Iterator[str]:
    """The ``text`` of every record in one source folder of ``curate sample``'s output."""
    for part in sorted(p for p in folder.iterdir() if p.is_file()):
        data = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
        yield from (json.loads(line)["text"] for line in data.decode().splitlines() if line.strip())


def sample_texts(folder: Path) -> Iterator[str]:
    """The texts of every real-text source of a ``curate sample`` folder, source by source."""
    for source in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in SKIPPED_SOURCES):
        yield from source_texts(source)


def char_shingles(text: str, k: int = SHINGLE) -> list[str]:
    """Code-point k-grams; a shorter non-empty text is one shingle, an empty one has none."""
    if len(text) < k:
        return [text] if text else []
    return [text[i : i + k] for i in range(len(text) - k + 1)]


def components(n: int, pairs: Iterable[tuple[int, int]]) -> list[int]:
    """Union-find; the label of a node is the smallest index in its component."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in pairs:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    return [find(i) for i in range(n)]


def peak_self_kib() -> int:
    """This process's own high-water mark (VmHWM): ru_maxrss would carry the parent's over."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
