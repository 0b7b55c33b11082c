"""``curate profile``: where each partition of a crawl spent its time (the seeds' "profile one
partition through every stage").

Per program and partition: documents, bytes, wall time split into read, compute and write (the
``timing`` every partition's report carries since ``stages.timing``: the same figures whichever
way it ran), the CPU seconds spent meanwhile (null for a partition committed before they were
measured), the orchestration overhead, and GPU time where a GPU ran. Overhead is what Dagster
adds around the program: the ``overhead_s`` its materialization carries
(``curation_dagster.run.recorder.recorded_overhead`` reads it: its time outside the program, from
the start of its launch (a Pipes subprocess's interpreter start and imports, a pod's start) to its
record, the manifest commit, the metadata and its checks included), else its step's duration in
the instance's event log minus the program's wall time; a partition with neither (run by
``python -m stages``, or in a deployment whose event log is elsewhere) has ``overhead_s`` null.
This module imports no Dagster: ``profile`` is given the function that reads the overhead.

``documents`` is the partition's input documents as its report counts them (``input``,
``documents`` or ``nodes``; the ledger's sources' inputs); ``bytes`` the Arrow bytes it read from
the data root (its source files' bytes for ``raw_documents``, which reads outside the data root).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stages.catalog import PROGRAMS, partition_name
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec

# (program, crawl, source, data_version, wall_s) -> the partition's orchestration overhead, or None:
# ``curation_dagster.run.recorder.recorded_overhead`` reads it from a Dagster instance.
Overhead = Callable[[str, str, "str | None", str, float], "float | None"]

# GPU seconds a program's report states, where its backend was a GPU (the kernel's own timer).
GPU_SECONDS = {
    "minhash_signatures": "kernel_seconds",
    "document_embeddings": "embed_seconds",
    "semantic_clusters": "kmeans_seconds",
    "semantic_duplicates": "pairwise_seconds",
}
DOCUMENT_KEYS = ("input", "documents", "nodes")


def _documents(report: dict[str, Any]) -> int:
    for key in DOCUMENT_KEYS:
        value = report.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    sources = report.get("sources")  # the ledger: every source's input
    if isinstance(sources, dict):
        return sum(int(row.get("input", 0)) for row in sources.values() if isinstance(row, dict))
    return 0


def _bytes(program: str, report: dict[str, Any]) -> int:
    if program == "raw_documents":  # reads its source files, outside the data root
        return int(report.get("bytes", 0))
    return int(report.get("timing", {}).get("read_bytes", 0))


def _gpu_seconds(program: str, report: dict[str, Any]) -> float | None:
    ran_on_gpu = report.get("backend") == "gpu" or str(report.get("device", "")).startswith("cuda")
    key = GPU_SECONDS.get(program)
    if not ran_on_gpu or key is None or not isinstance(report.get(key), int | float):
        return None
    return float(report[key])


def partition_profile(program: str, report: dict[str, Any], overhead_s: float | None) -> dict[str, Any]:
    """One partition's row: the JSON form's eight figures, and ``gpu_s`` where a GPU ran."""
    timing = report.get("timing", {})
    row: dict[str, Any] = {
        "documents": _documents(report),
        "bytes": _bytes(program, report),
        "wall_s": float(timing.get("wall_s", report.get("seconds", 0.0))),
        "cpu_s": float(timing["cpu_s"]) if isinstance(timing.get("cpu_s"), int | float) else None,
        "read_s": float(timing.get("read_s", 0.0)),
        "compute_s": float(timing.get("compute_s", 0.0)),
        "write_s": float(timing.get("write_s", 0.0)),
        "overhead_s": None if overhead_s is None else round(overhead_s, 4),
    }
    gpu = _gpu_seconds(program, report)
    if gpu is not None:
        row["gpu_s"] = gpu
    return row


def profile(root: DataRoot, crawl: str, overhead: Overhead | None = None) -> dict[str, Any]:
    """``{"crawl": C, "programs": {PROGRAM: {PARTITION: row}}}`` of the committed outputs of the
    crawl's current parameters (a partition is its source, or the crawl for crawl-level ones);
    ``overhead``: where the orchestration overhead is read (none: ``overhead_s`` null)."""
    spec: CrawlSpec = root.spec(crawl)
    programs: dict[str, dict[str, dict[str, Any]]] = {}
    for name in PROGRAMS:
        for source in spec.partitions(name):
            manifest = root.manifest(spec, name, source)
            if manifest is None:
                continue
            wall = float(manifest.report.get("timing", {}).get("wall_s", manifest.report.get("seconds", 0.0)))
            spent = None if overhead is None else overhead(name, crawl, source, manifest.data_version, wall)
            programs.setdefault(name, {})[source or crawl] = partition_profile(name, manifest.report, spent)
    return {"crawl": crawl, "programs": programs}


def measured_sizing(root: DataRoot, crawl: str) -> dict[str, float]:
    """What a fuzzy run of the crawl measured, in ``stages.sizing``'s terms (to check a sizing):
    documents signed and their mean characters (UTF-8 bytes), the Arrow bytes of the signature
    and band-key tables as written, band keys, band edges, candidate pairs and their text bytes."""
    spec = root.spec(crawl)

    def report(program: str, source: str | None) -> dict[str, Any]:
        m = root.manifest(spec, program, source)
        if m is None:
            raise FileNotFoundError(f"{partition_name(program, crawl, source)} has no committed output for the current "
                                    "parameters")
        return {**m.report, "rows": m.rows}

    sigs = [report("minhash_signatures", s) for s in sorted(spec.sources)]
    docs = sum(r.get("documents", 0) for r in sigs)
    lsh = report("lsh_buckets", None)
    comps = report("duplicate_components", None)
    return {
        "documents": float(docs),
        "mean_chars": sum(r.get("bytes", 0) for r in sigs) / docs if docs else 0.0,
        "signature_bytes": float(sum(r.get("timing", {}).get("written_bytes", {}).get("signatures", 0) for r in sigs)),
        "band_keys": float(lsh["rows"].get("band_keys", 0) * lsh.get("bands", 0)),
        "band_key_bytes": float(lsh.get("timing", {}).get("written_bytes", {}).get("band_keys", 0)),
        "band_edges": float(lsh.get("edges", 0)),
        "candidate_pairs": float(comps.get("candidate_pairs", 0)),
        "verification_text_bytes": float(comps.get("candidate_text_bytes", 0)),
    }


def print_profile(result: dict[str, Any]) -> None:
    """The profile as a Rich table: a row per partition, throughput per second of wall time."""
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"crawl {result['crawl']}: where each partition's time went (seconds)")
    for col in ("PROGRAM", "PARTITION", "DOCS", "MB", "WALL", "CPU", "READ", "COMPUTE", "WRITE", "OVERHEAD", "GPU",
                "DOCS/S", "MB/S"):
        table.add_column(col, justify="left" if col in ("PROGRAM", "PARTITION") else "right")
    totals = {"documents": 0, "bytes": 0, "wall_s": 0.0, "cpu_s": 0.0, "read_s": 0.0, "compute_s": 0.0, "write_s": 0.0,
              "overhead_s": 0.0}
    for program, parts in result["programs"].items():
        for partition, row in parts.items():
            wall = row["wall_s"]
            over, cpu = row["overhead_s"], row["cpu_s"]
            table.add_row(
                program, partition, str(row["documents"]), f"{row['bytes'] / 1e6:.2f}", f"{wall:.3f}",
                "-" if cpu is None else f"{cpu:.3f}",
                f"{row['read_s']:.3f}", f"{row['compute_s']:.3f}", f"{row['write_s']:.3f}",
                "-" if over is None else f"{over:.3f}", f"{row['gpu_s']:.3f}" if "gpu_s" in row else "-",
                f"{row['documents'] / wall:.0f}" if wall > 0 else "-",
                f"{row['bytes'] / 1e6 / wall:.1f}" if wall > 0 else "-",
            )
            for key in totals:
                totals[key] += row[key] or 0
    # CPU seconds beside the wall's only where every row has them (partitions committed before
    # they were measured have none)
    every_cpu = all(row["cpu_s"] is not None for parts in result["programs"].values() for row in parts.values())
    table.add_row("TOTAL", "", "", "", f"{totals['wall_s']:.3f}", f"{totals['cpu_s']:.3f}" if every_cpu else "-",
                  f"{totals['read_s']:.3f}",
                  f"{totals['compute_s']:.3f}", f"{totals['write_s']:.3f}", f"{totals['overhead_s']:.3f}", "", "", "",
                  style="bold")
    Console(width=None if sys.stdout.isatty() else 160).print(table)
