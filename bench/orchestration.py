"""What orchestration costs: a fuzzy-only ``curate run`` (whole process, SQLite Dagster instance)
against rensa (whole process) on the same JSONL files, for crawls of 1 to many sources.

The corpus is ``curate sample``'s real text with ``--copies`` lightly varied copies of each
document (near-duplicates by construction), cut to each shape's megabytes and dealt round-robin
into that shape's sources (one JSONL file each). Per shape:

- ``curate``: ``curate run --stages fuzzy`` in a fresh workdir, then ``curate profile --json`` for
  each partition's step time and its orchestration overhead (its time outside the program up to
  its materialization); the Dagster runs it made, the overhead per partition (mean, worst and
  which), and the wall time beyond the steps per partition: (wall - steps / the processes that
  ran them side by side) / partitions, the whole process's fixed costs included.
- ``rensa``: a subprocess that reads the same files, shingles (char-24), RMinHash (260 perms) and
  RMinHashLSH (20 bands, threshold 0.8), and writes the removed ids: its time includes reading.

Ratio = rensa's wall / ours (> 1: we are faster). Usage::

    python bench/orchestration.py                       # shapes 1:69,12:169 (sources:MB)
    python bench/orchestration.py --shapes 1000:20 --copies 4
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import char_shingles, sample_texts

ROOT = Path(__file__).resolve().parents[1]
SHINGLE, NUM_PERM, BANDS, THRESHOLD = 24, 260, 20, 0.8


def deal(corpus: Path, out: Path, sources: int, mb: float) -> tuple[int, float]:
    """The first ``mb`` megabytes of the corpus's texts dealt into ``sources`` JSONL files under
    ``out/<source>/part.jsonl``; (documents, megabytes) written."""
    files = []
    for i in range(sources):
        (out / f"s{i:04d}").mkdir(parents=True)
        files.append((out / f"s{i:04d}" / "part.jsonl").open("w"))
    docs, total = 0, 0.0
    for text in sample_texts(corpus):
        size = len(text.encode("utf-8", "surrogatepass")) / 1e6
        if total + size > mb:
            break
        files[docs % sources].write(json.dumps({"id": f"d{docs}", "text": text}) + "\n")
        docs, total = docs + 1, total + size
    for f in files:
        f.close()
    return docs, total


def rensa_child(folder: Path, out: Path) -> None:
    """The rensa contender, in its own process: read, shingle, sign, bucket, query, write ids."""
    from rensa import RMinHash, RMinHashLSH

    ids, texts = [], []
    for part in sorted(folder.glob("*/part.jsonl")):
        for line in part.open():
            record = json.loads(line)
            ids.append(record["id"])
            texts.append(record["text"])
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=BANDS)
    hashes = []
    for i, text in enumerate(texts):
        m = RMinHash(num_perm=NUM_PERM, seed=42)
        m.update(char_shingles(text, SHINGLE))
        hashes.append(m)
        lsh.insert(i, m)
    removed = {max(i, j) for i, m in enumerate(hashes) for j in lsh.query(m) if j != i}
    out.write_text("\n".join(ids[i] for i in sorted(removed)))


def _timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}...: failed: {proc.stderr.strip()[-2000:]}")
    return wall, proc.stdout


def run_shape(corpus: Path, work: Path, sources: int, mb: float) -> dict[str, Any]:
    data = work / "data"
    docs, written = deal(corpus, data, sources, mb)
    cfg = {"sources": {p.name: {"url": str(p), "id_field": "id"} for p in sorted(data.iterdir())}}
    (work / "curate.json").write_text(json.dumps(cfg))
    wd = work / "wd"
    wd.mkdir()
    # The corpus is copies of copies by construction: lift the over-deletion guard for it.
    (wd / "curate.yaml").write_text("checks:\n  over_deletion:\n    max_removed_fraction: 1.0\n")
    curate = [sys.executable, "-m", "curation_dagster.cli"]
    ours, _ = _timed([*curate, "run", "--workdir", str(wd), "--crawl", "bench", "--config", str(work / "curate.json"),
                      "--stages", "fuzzy", "--quiet"])
    _, out = _timed([*curate, "profile", "--workdir", str(wd), "--crawl", "bench", "--json"])
    profile = json.loads(out)
    rows = {f"{program}[{part}]": p for program, parts in profile["programs"].items() for part, p in parts.items()}
    overhead = [p["overhead_s"] for p in rows.values() if p.get("overhead_s") is not None]
    worst = max((name for name in rows if rows[name].get("overhead_s") is not None),
                key=lambda name: rows[name]["overhead_s"], default=None)
    steps = sum(p["wall_s"] for p in rows.values())
    # What the crawl cost beyond its steps, per partition: the wall time minus the steps' time
    # spread over the processes that ran them side by side (one per core, at most one per source).
    side_by_side = min(len(os.sched_getaffinity(0)), sources)
    with sqlite3.connect(wd / "dagster" / "history" / "runs.db") as db:  # the SQLite instance's run table
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    rensa, _ = _timed([sys.executable, __file__, "--rensa", str(data), str(work / "rensa.txt")])
    return {
        "sources": sources, "docs": docs, "mb": round(written, 1), "curate_s": round(ours, 2),
        "rensa_s": round(rensa, 2), "ratio": round(rensa / ours, 2), "runs": runs,
        "partitions": sum(len(parts) for parts in profile["programs"].values()),
        "steps_s": round(steps, 2),
        "overhead_mean_ms": round(1000 * sum(overhead) / len(overhead), 1) if overhead else None,
        "overhead_max_ms": round(1000 * max(overhead), 1) if overhead else None, "worst": worst,
        "beyond_steps_ms": round(1000 * (ours - steps / side_by_side) / len(rows), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1:69,12:169", help="comma-separated SOURCES:MB")
    ap.add_argument("--copies", type=int, default=48, help="varied copies per sample document")
    ap.add_argument("--max-docs", type=int, default=1500)
    ap.add_argument("--rensa", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rensa:
        rensa_child(Path(args.rensa[0]), Path(args.rensa[1]))
        return
    shapes = [(int(s), float(m)) for s, m in (x.split(":") for x in args.shapes.split(","))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from curation_dagster.sample import build_sample

        build_sample(root / "corpus", max_docs_per_source=args.max_docs, copies=args.copies)
        for i, (sources, mb) in enumerate(shapes):
            rows.append(run_shape(root / "corpus", root / f"shape{i}", sources, mb))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'sources':>7} {'docs':>7} {'MB':>6} {'curate s':>9} {'rensa s':>8} {'ratio':>6} {'runs':>5} "
          f"{'partitions':>10} {'steps s':>8} {'overhead/partition ms (mean, max)':>34} {'beyond steps ms':>15}  worst")
    for r in rows:
        print(f"{r['sources']:>7} {r['docs']:>7} {r['mb']:>6} {r['curate_s']:>9} {r['rensa_s']:>8} {r['ratio']:>6} "
              f"{r['runs']:>5} {r['partitions']:>10} {r['steps_s']:>8} "
              f"{str(r['overhead_mean_ms']) + ', ' + str(r['overhead_max_ms']):>34} {r['beyond_steps_ms']:>15}  "
              f"{r['worst']}")
    ratios = [r["ratio"] for r in rows]
    print(f"ratio rensa/curate: worst {min(ratios)}, best {max(ratios)}")


if __name__ == "__main__":
    main()
