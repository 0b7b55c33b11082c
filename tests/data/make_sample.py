"""Freeze a cut of the sample corpus into ``tests/data/sample/`` for ``tests/e2e/test_sample_ledger.py``.

``curate sample`` builds its corpus from the installation it runs in (the standard library's
docstrings, the installed distributions' licenses and descriptions), so two machines get two
corpora; the golden ledger needs one. Run once (``python tests/data/make_sample.py``) and check
the outputs in, then regenerate the golden ledger (that test's docstring says how).

Per source: the first ``CAPS`` records in the sample's own order (all of ``scraps``, with its
planted bad lines), in two gzipped JSONL parts (gzip without a timestamp); ``benchmarks/`` holds
the sample benchmark of edited docstring passages, written from the cut docstrings.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

from curation_dagster.tools.sample import build_sample
from stages.decontam_sets import SAMPLE_BENCHMARK, sample_benchmark

OUT = Path(__file__).resolve().parent / "sample"
# package descriptions run to ~9 KB a record and licenses to ~6 KB: few of them keep the corpus ~200 KB
CAPS: dict[str, int | None] = {"docstrings": 300, "licenses": 100, "package_docs": 40, "scraps": None}


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_sample(Path(tmp), max_docs_per_source=max(c for c in CAPS.values() if c))
        for name, cap in CAPS.items():
            lines: list[bytes] = []
            for part in sorted(folders[name].iterdir()):
                data = part.read_bytes()
                lines += (gzip.decompress(data) if part.name.endswith(".gz") else data).splitlines(keepends=True)
            lines = lines[:cap]
            half = (len(lines) + 1) // 2
            (OUT / name).mkdir(parents=True)
            for k, chunk in enumerate((lines[:half], lines[half:])):
                (OUT / name / f"part-{k:05d}.jsonl.gz").write_bytes(gzip.compress(b"".join(chunk), mtime=0))
    sample_benchmark(OUT / "docstrings", OUT / "benchmarks" / f"{SAMPLE_BENCHMARK}.jsonl")


if __name__ == "__main__":
    main()
