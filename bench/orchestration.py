"""What orchestration costs: a fuzzy-only ``curate run`` (whole process, SQLite Dagster instance)
against rensa (whole process) on the same JSONL files, for crawls of 1 to many sources.

The corpus is ``curate sample``'s real text with ``--copies`` lightly varied copies of each
document (near-duplicates by construction), cut to each shape's megabytes and dealt round-robin
into that shape's sources (one JSONL file each). Per shape:

- ``curate``: ``curate run --stages fuzzy`` in a fresh workdir, then ``curate profile --json`` for
  each partition's step time and its orchestration overhead (its time outside the program up to
  its materialization); the Dagster runs it made, the overhead per partition (mean, worst and
  which), and the wall time beyond the steps per partition: (wall - steps / the processes that
  ran them side by side) / partitions, the whole process's fixed costs included; and the fixed
  cost to the first partition (``to_first_s``): from the process's launch to the start of the
  earliest partition (its manifest's mtime minus its wall time, wherever it ran); and
  ``raw_documents``' rate, MB of text per partition-second and per partition CPU-second (the
  difference: time its partitions waited, for a core shared with the other worker and with the
  run's own process, or for the disk).
- ``rensa``: a subprocess that reads the same files, shingles (char-24), RMinHash (260 perms) and
  RMinHashLSH (20 bands, threshold 0.8), and writes the removed ids: its time includes reading.

Two more corpus shapes: ``--texts files`` takes whole source files of this Python installation
instead (real text of 0.5-14 KB, about 4 KB on average, few near-duplicates: long documents, where
rensa's per-document cost shrinks and a per-document overhead of ours does not), and
``--format parquet`` writes each source as one Parquet file (``id``, ``url``, ``text``; row groups
of 2,000) that rensa reads with pyarrow. ``--baseline TREE`` runs a second checkout's
``curation_dagster`` (``PYTHONPATH=TREE``) on the same files in the same run, for before/after.

Ratio = rensa's wall / ours (> 1: we are faster). Beside the wall time, each side's CPU seconds
(user and system, the whole process tree) and ``cpu_ratio``, rensa's over ours: ``curate run``
spreads its work over the cores, rensa runs on one, so the wall ratio holds on an idle machine and
the CPU ratio is what is left of it where other work takes the other cores. Usage::

    python bench/orchestration.py                       # shapes 1:69,12:169 (sources:MB)
    python bench/orchestration.py --shapes 1000:20 --copies 4
    python bench/orchestration.py --texts files --format parquet --shapes 1:69
    python bench/orchestration.py --texts files --shapes 200:69 --repeat 3 --baseline ../other-checkout

The corpus and every run's workdir go in a temporary folder (``$TMPDIR``, else /tmp). Where
that is ext4 after much deleting (earlier runs' workdirs, test suites), each new file and folder
costs more for some minutes: ext4 passes over the free inodes deleted lately, reading each
(docs/profile.md, fifth session of 2026-12-07). A crawl makes ~3,600 of them at 200 sources and
rensa a handful, so such a phase lowers the ratio, and later rounds read worse than earlier ones.
``TMPDIR=/dev/shm`` (tmpfs) takes the file system out of the comparison.

With ``--repeat N`` each shape runs N rounds of (baseline, ours, rensa) in turn: the seconds and
the ratio are the rounds' medians (a round's ratio: its rensa over its ours), ``ratio_worst`` the
worst round's; ``raw_documents``' rates per partition-second are the rounds' medians (each
round's in ``raw_rounds``; the baseline's medians beside them), the other profile columns the last
round's. Every run's workdir is kept until the
benchmark ends (see ``run_shape``): ~250 MB a run at 70 MB of text, 2 × N runs a shape with
``--baseline``, so several GB for the default shapes with ``--repeat 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from common import CURATE, char_shingles, sample_texts

ROOT = Path(__file__).resolve().parents[1]
SHINGLE, NUM_PERM, BANDS, THRESHOLD = 24, 260, 20, 0.8


def installed_files(min_chars: int = 500, max_chars: int = 14_000) -> Iterator[tuple[str, str]]:
    """(name, text) of the Python source and header files of this installation, in path order:
    long real documents (``--texts files``)."""
    roots = sorted({Path(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"])})
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".pyi", ".h") or not path.is_file():
                continue
            try:
                text = path.read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if min_chars <= len(text) <= max_chars:
                yield str(path.relative_to(root)), text


def deal(texts: Iterable[tuple[str, str]], out: Path, sources: int, mb: float, fmt: str) -> tuple[int, float]:
    """The first ``mb`` megabytes of ``texts`` ((url, text) pairs) dealt into ``sources`` files
    ``out/<source>/part.jsonl`` (or ``.parquet``); (documents, megabytes) written."""
    rows: list[list[dict[str, str]]] = [[] for _ in range(sources)]
    docs, total = 0, 0.0
    for url, text in texts:
        size = len(text.encode("utf-8", "surrogatepass")) / 1e6
        if total + size > mb:
            break
        rows[docs % sources].append({"id": f"d{docs}", "url": url, "text": text})
        docs, total = docs + 1, total + size
    for i, records in enumerate(rows):
        (out / f"s{i:04d}").mkdir(parents=True)
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(records), out / f"s{i:04d}" / "part.parquet", row_group_size=2000)
        else:
            with (out / f"s{i:04d}" / "part.jsonl").open("w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
    return docs, total


def read_records(folder: Path) -> Iterator[dict[str, Any]]:
    """The records of every source file under ``folder`` (JSONL or Parquet), in order."""
    for part in sorted(folder.glob("*/part.*")):
        if part.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(part, columns=["id", "text"]).to_pylist()
        else:
            with part.open() as f:
                yield from map(json.loads, f)


def rensa_child(folder: Path, out: Path) -> None:
    """The rensa contender, in its own process: read, shingle, sign, bucket, query, write ids."""
    from rensa import RMinHash, RMinHashLSH

    ids, texts = [], []
    for record in read_records(folder):
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




def _timed(cmd: list[str], cwd: Path | None = None, tree: Path | None = None) -> tuple[float, str]:
    wall, out, _ = _timed_cpu(cmd, cwd, tree)
    return wall, out


def _timed_cpu(cmd: list[str], cwd: Path | None = None, tree: Path | None = None) -> tuple[float, str, float]:
    """(wall seconds, stdout, CPU seconds) of a command: its user and system time, with every
    process under it that was waited for (``curate run``'s fork server reaps its workers, and the
    command reaps the fork server): what a busy machine takes away from, where the wall time hides
    how many cores it ran on."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}...: failed: {proc.stderr.strip()[-2000:]}")
    return wall, proc.stdout, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def removed_ids(wd: Path, tree: Path | None) -> list[str]:
    """``doc_id stage`` of every document the crawl removed, sorted (``curate ledger``): to
    compare two trees' outputs on the same files."""
    import pyarrow.parquet as pq

    _timed([*CURATE, "ledger", "--workdir", str(wd), "--crawl", "bench",
            "--out", str(wd / "ledger.parquet")], tree=tree)
    ledger = pq.read_table(wd / "ledger.parquet", columns=["doc_id", "stage"])
    return sorted(f"{r['doc_id']} {r['stage']}" for r in ledger.to_pylist())


def run_curate(work: Path, name: str, tree: Path | None, written: float) -> tuple[float, Path, float, float, Rates]:
    """Wall seconds of one fuzzy-only ``curate run`` of ``work``'s crawl (a fresh workdir), the
    workdir, the seconds from its launch to its first partition's start, its CPU seconds, and
    ``raw_documents``' rates (``written`` MB of text)."""
    wd = work / name
    wd.mkdir()
    # The corpus is copies of copies by construction: lift the over-deletion guard for it.
    (wd / "curate.yaml").write_text("checks:\n  over_deletion:\n    max_removed_fraction: 1.0\n")
    launched = time.time()
    wall, _, cpu = _timed_cpu([*CURATE, "run", "--workdir", str(wd), "--crawl", "bench", "--config",
                               str(work / "curate.json"), "--stages", "fuzzy", "--quiet"], tree=tree)
    first, rates = from_manifests(wd, written)
    return wall, wd, first - launched, cpu, rates


Rates = tuple[float | None, float | None]  # MB of text per partition-second: wall, CPU


def from_manifests(wd: Path, written: float) -> tuple[float, Rates]:
    """Over a run's committed manifests, read once: when its earliest partition started (epoch
    seconds: the file's mtime, written at commit, the partition's end, less its wall time), and
    ``raw_documents``' MB of text (``written``) over its partitions' summed wall seconds and
    summed CPU seconds."""
    starts, wall, cpu = [], 0.0, 0.0
    for path in (wd / "data").glob("*/*/bench/**/_manifest.json"):
        timing = json.loads(path.read_text())["report"].get("timing", {})
        if timing.get("wall_s") is None:
            continue
        starts.append(path.stat().st_mtime - timing["wall_s"])
        if path.relative_to(wd / "data").parts[0] == "raw_documents":
            wall += timing["wall_s"]
            cpu += timing.get("cpu_s") or 0.0
    return min(starts), (round(written / wall, 1) if wall else None, round(written / cpu, 1) if cpu else None)


def run_shape(texts: Iterable[tuple[str, str]], work: Path, sources: int, mb: float, fmt: str,
              baseline: Path | None, repeat: int = 1) -> dict[str, Any]:
    data = work / "data"
    docs, written = deal(texts, data, sources, mb, fmt)
    load = os.getloadavg()[0]  # the machine may be shared: the 1-minute load average, before and after
    cfg = {"sources": {p.name: {"url": str(p), "id_field": "id"} for p in sorted(data.iterdir())}}
    (work / "curate.json").write_text(json.dumps(cfg))
    # ``repeat`` rounds of (baseline, ours, rensa), in turn: on a shared machine the three drift
    # together, so a round's ratio compares like with like; the medians are reported, and the
    # worst round's ratio beside them.
    ours_s, firsts, rensa_s, base_s, base_firsts = [], [], [], [], []
    ours_cpu, rensa_cpu, base_cpu = [], [], []
    raw: list[Rates] = []  # each round's raw_documents rates: they move with the machine's phase
    base_raw: list[Rates] = []
    base_removed: list[str] | None = None
    for k in range(repeat):
        if baseline is not None:  # first, so neither tree profits from the other's warm page cache alone
            wall, base_wd, first, cpu, rates = run_curate(work, f"wd-baseline{k}", baseline, written)
            base_s.append(wall)
            base_cpu.append(cpu)
            base_firsts.append(first)
            base_raw.append(rates)
            if base_removed is None:
                base_removed = removed_ids(base_wd, baseline)
        # Workdirs stay until the benchmark ends (the temporary folder; ~250 MB for 70 MB of
        # text): on ext4 without a journal (this machine) the kernel allocates each new file or
        # folder past the inodes freed in the last 60 s or more, checking each, so deleting a
        # workdir (6,300 files) here made the file work of the next run's partitions 0.24-0.37 ms
        # slower each (1,400 partitions' mkdir, create, rename, measured alone): ours, which ran
        # right after; the baseline ran ~30 s after, still within that window from round 2 on.
        wall, wd, first, cpu, rates = run_curate(work, f"wd{k}", None, written)
        ours_s.append(wall)
        ours_cpu.append(cpu)
        firsts.append(first)
        raw.append(rates)
        wall, _, cpu = _timed_cpu([sys.executable, __file__, "--rensa", str(data), str(work / "rensa.txt")])
        rensa_s.append(wall)
        rensa_cpu.append(cpu)
    ours, to_first, rensa = statistics.median(ours_s), statistics.median(firsts), statistics.median(rensa_s)
    ratios = [r / o for r, o in zip(rensa_s, ours_s, strict=True)]
    before: dict[str, Any] = {}
    if baseline is not None:
        before = {"baseline_s": round(statistics.median(base_s), 2),
                  "baseline_cpu_s": round(statistics.median(base_cpu), 2),
                  "baseline_to_first_s": round(statistics.median(base_firsts), 2), "baseline_removed": base_removed}
    _, out = _timed([*CURATE, "profile", "--workdir", str(wd), "--crawl", "bench", "--json"])
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
    # Ingestion's rate, two ways: each partition's input file bytes over its wall time (for
    # Parquet, compressed bytes), averaged (the last round's); and the MB of text dealt over the
    # partitions' summed wall time (MB of text per partition-second, whatever the format), and
    # over their CPU seconds: the wall figure less the time they waited for a core, shared with
    # the other worker and with the run's own process (its imports, then its recording). Those
    # two for every round (``from_manifests``): the rounds' medians, and each round's.
    raw_mb_s = [p["bytes"] / 1e6 / p["wall_s"] for n, p in rows.items()
                if n.startswith("raw_documents[") and p.get("bytes") and p.get("wall_s")]

    def medians(rates: list[Rates]) -> list[float | None]:
        """The rounds' median wall and CPU rates (None where no round had one)."""
        out: list[float | None] = []
        for i in (0, 1):
            got = [v for r in rates if (v := r[i]) is not None]
            out.append(round(statistics.median(got), 1) if got else None)
        return out

    rate = medians(raw)
    if before:
        removed = removed_ids(wd, None)
        before = {"baseline_s": before["baseline_s"], "baseline_cpu_s": before["baseline_cpu_s"],
                  "baseline_ratio": round(statistics.median(r / b for r, b in zip(rensa_s, base_s, strict=True)), 2),
                  "baseline_to_first_s": before["baseline_to_first_s"],
                  "same_removals": removed == before["baseline_removed"], "removed": len(removed),
                  "baseline_raw_text_mb_per_partition_s": medians(base_raw)}
    return {
        "format": fmt, "sources": sources, "docs": docs, "mb": round(written, 1), "curate_s": round(ours, 2),
        "rensa_s": round(rensa, 2), "ratio": round(statistics.median(ratios), 2),
        "ratio_worst": round(min(ratios), 2), "repeat": repeat,
        # CPU seconds (the process trees', medians): rensa's over ours is the ratio on one free core
        "curate_cpu_s": round(statistics.median(ours_cpu), 2), "rensa_cpu_s": round(statistics.median(rensa_cpu), 2),
        "cpu_ratio": round(statistics.median(r / o for r, o in zip(rensa_cpu, ours_cpu, strict=True)), 2),
        "rounds": {"curate_s": [round(x, 2) for x in ours_s], "rensa_s": [round(x, 2) for x in rensa_s],
                   "curate_cpu_s": [round(x, 2) for x in ours_cpu], "rensa_cpu_s": [round(x, 2) for x in rensa_cpu],
                   **({"baseline_s": [round(x, 2) for x in base_s]} if base_s else {})},
        **before, "runs": runs,
        "to_first_s": round(to_first, 2), "load_before": load, "load_after": os.getloadavg()[0],
        "raw_documents_mb_per_partition_s": round(sum(raw_mb_s) / len(raw_mb_s), 1) if raw_mb_s else None,
        "raw_documents_text_mb_per_partition_s": rate[0], "raw_documents_text_mb_per_partition_cpu_s": rate[1],
        "raw_rounds": [list(r) for r in raw],
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
    ap.add_argument("--texts", choices=["sample", "files"], default="sample",
                    help="sample: curate sample's text with varied copies; files: whole installed source files")
    ap.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    ap.add_argument("--baseline", type=Path, help="another checkout to run on the same files (before/after)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of (baseline, curate, rensa) per shape, in turn: medians, and the worst round's ratio")
    ap.add_argument("--rensa", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rensa:
        rensa_child(Path(args.rensa[0]), Path(args.rensa[1]))
        return
    shapes = [(int(s), float(m)) for s, m in (x.split(":") for x in args.shapes.split(","))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.texts == "sample":
            from curation_dagster.tools.sample import build_sample

            build_sample(root / "corpus", max_docs_per_source=args.max_docs, copies=args.copies)
        for i, (sources, mb) in enumerate(shapes):
            texts = (installed_files() if args.texts == "files"
                     else ((f"doc{j}", t) for j, t in enumerate(sample_texts(root / "corpus"))))
            rows.append(run_shape(texts, root / f"shape{i}", sources, mb, args.format, args.baseline, args.repeat))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'sources':>7} {'docs':>7} {'MB':>6} {'curate s':>9} {'rensa s':>8} {'ratio':>6} {'cpu s':>11} "
          f"{'cpu ratio':>9} {'runs':>5} "
          f"{'partitions':>10} {'steps s':>8} {'overhead/partition ms (mean, max)':>34} {'beyond steps ms':>15} "
          f"{'to first s':>10} {'raw MB/s wall, cpu':>18} {'load':>9}  worst")
    for r in rows:
        raw = f"{r['raw_documents_text_mb_per_partition_s']}, {r['raw_documents_text_mb_per_partition_cpu_s']}"
        print(f"{r['sources']:>7} {r['docs']:>7} {r['mb']:>6} {r['curate_s']:>9} {r['rensa_s']:>8} {r['ratio']:>6} "
              f"{str(r['curate_cpu_s']) + '/' + str(r['rensa_cpu_s']):>11} {r['cpu_ratio']:>9} {r['runs']:>5} "
              f"{r['partitions']:>10} {r['steps_s']:>8} "
              f"{str(r['overhead_mean_ms']) + ', ' + str(r['overhead_max_ms']):>34} {r['beyond_steps_ms']:>15} "
              f"{r['to_first_s']:>10} "
              f"{raw:>18} "
              f"{r['load_before']:>4.1f}-{r['load_after']:<4.1f}  {r['worst']}")
    ratios = [r["ratio"] for r in rows]
    print(f"ratio rensa/curate: worst {min(ratios)}, best {max(ratios)}"
          + (f"; worst round {min(r['ratio_worst'] for r in rows)}" if args.repeat > 1 else ""))


if __name__ == "__main__":
    main()
