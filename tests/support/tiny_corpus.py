"""Helpers around the checked-in tiny corpus (``tests/data/tiny``, built by ``tests/data/make_tiny.py``)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot
from stages.execute import execute
from stages.params import ExecutionParams, RawDocumentsParams
from stages.reports import RemovalLedgerReport
from stages.spec import CrawlSpec
from stages.store import Store

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny"
EXPECTED: dict[str, Any] = json.loads((TINY / "expected.json").read_text())
CRAWL: str = EXPECTED["crawl"]
SOURCES: tuple[str, ...] = tuple(sorted(EXPECTED["sources"]))
# The removal stages the expected counts are derived for; runs name them explicitly, so that a
# stage added later (fuzzy, quality, ...) does not change what these tests expect.
STAGES: tuple[str, ...] = ("heuristic", "exact")


def curate(*args: str) -> tuple[int, str, str]:
    """``curate ARGS`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from curation_dagster import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


@contextmanager
def fast_tmp(fallback: Path) -> Iterator[Path]:
    """A fresh temporary folder for a Dagster workdir, removed afterwards: on a tmpfs
    (``/dev/shm``) when one with room is available, else ``fallback`` (a pytest tmp_path).

    Dagster's SQLite storage commits (fsync) several times per run, once per event; on a disk
    that makes a run of the tiny corpus 2-3x slower than on a tmpfs.
    """
    shm = Path("/dev/shm")
    try:
        roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 512 << 20
    except OSError:
        roomy = False
    if not roomy:
        fallback.mkdir(parents=True, exist_ok=True)
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="curate-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def source_config(root: Path = TINY, sources: tuple[str, ...] = SOURCES) -> dict[str, dict[str, Any]]:
    """``sources`` section of a curate config for the tiny corpus rooted at ``root``."""
    out = {}
    for name in sources:
        cfg = dict(EXPECTED["sources"][name])
        out[name] = {**{k: v for k, v in cfg.items() if k != "path"}, "url": str(root / cfg.pop("path"))}
    return out


def config(root: Path = TINY, sources: tuple[str, ...] = SOURCES, **extra: Any) -> dict[str, Any]:
    return {"sources": source_config(root, sources), "keep": EXPECTED["keep"], "stages": list(STAGES), **extra}


def write_config(path: Path, root: Path = TINY, **extra: Any) -> Path:
    path.write_text(json.dumps(config(root, **extra), indent=1))
    return path


def spec(root: Path = TINY, sources: tuple[str, ...] = SOURCES, crawl: str = CRAWL, **extra: Any) -> CrawlSpec:
    cfg = config(root, sources, **extra)
    return CrawlSpec(crawl=crawl, sources=cfg["sources"], keep=cfg["keep"], stages=tuple(cfg["stages"]),
                     params=cfg.get("params", {}))


def downstream(*programs: str) -> set[str]:
    """``programs`` and every program that depends on one of them, transitively."""
    out = set(programs)
    for name, program in PROGRAMS.items():  # topological order
        if out & set(program.deps):
            out.add(name)
    return out


def run_all(store: Store, crawl_spec: CrawlSpec, execution: ExecutionParams | None = None) -> dict[str, Any]:
    """Every partition of the crawl in dependency order, in-process without Dagster; the ledger report."""
    for program in PROGRAMS:
        for source in crawl_spec.partitions(program):
            execute(store, crawl_spec, program, source, execution)
    return table_report(store, crawl_spec)


def table_report(store: Store, crawl_spec: CrawlSpec) -> dict[str, Any]:
    manifest = store.read_manifest(output_dir(store, crawl_spec, "removal_ledger"))
    assert manifest is not None
    return manifest.report


def output_dir(store: Store, crawl_spec: CrawlSpec, program: str, source: str | None = None) -> str:
    return DataRoot(store).output_dir(crawl_spec, program, source)


def read(store: Store, crawl_spec: CrawlSpec, program: str, table: str, source: str | None = None) -> pa.Table:
    return store.read_table(output_dir(store, crawl_spec, program, source), table)


def counts(report: dict[str, Any] | RemovalLedgerReport) -> dict[str, Any]:
    """The source x stage counts of a ledger report (the manifest's, or ``curate report --json``'s),
    in the shape of ``expected.json``: ``removed`` per stage."""
    typed = report if isinstance(report, RemovalLedgerReport) else RemovalLedgerReport.model_validate(report)
    return {s: {"input": r.input, "kept": r.kept, "quarantined": r.quarantined, "removed": r.removed_per_stage}
            for s, r in typed.sources.items()}


def assert_counts(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Source x stage counts equal ``want`` exactly; a stage ``want`` does not name removed nothing."""
    assert set(got) == set(want)
    for s, w in want.items():
        g = got[s]
        assert {k: g[k] for k in ("input", "kept", "quarantined")} == \
            {k: w[k] for k in ("input", "kept", "quarantined")}, s
        assert {k: g["removed"].get(k, 0) for k in w["removed"]} == w["removed"], s
        assert not {k: v for k, v in g["removed"].items() if k not in w["removed"] and v}, s
        assert g["input"] == g["kept"] + g["quarantined"] + sum(g["removed"].values()), s


# --- re-sharding ----------------------------------------------------------------------------------


def jsonl_lines(path: Path) -> list[bytes]:
    """The non-empty lines of a JSONL, .jsonl.gz or .jsonl.zst file (raw bytes, no newline)."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [line for line in data.split(b"\n") if line.strip()]


def write_compressed(path: Path, data: bytes) -> Path:
    """``data`` at ``path``, gzip- or zstd-compressed as its name says (deterministic bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_jsonl(path: Path, lines: list[bytes]) -> None:
    write_compressed(path, b"".join(line + b"\n" for line in lines))


def reshard(dest: Path) -> Path:
    """A copy of the tiny corpus with the same records in a different file layout.

    news: split into three files (one gzipped), lines reversed and interleaved; forum: the .gz and
    the .zst file merged into one plain JSONL file in reverse order; wiki: the good Parquet file
    converted to two JSONL files with shuffled rows (the wrong-schema legacy file is kept as is).
    """
    news = jsonl_lines(TINY / "news" / "news-2024-05.jsonl")[::-1]
    write_jsonl(dest / "news" / "a.jsonl", news[0::3])
    write_jsonl(dest / "news" / "sub" / "b.jsonl.gz", news[1::3])
    write_jsonl(dest / "news" / "c.jsonl", news[2::3])
    forum = [line for p in sorted((TINY / "forum").iterdir()) for line in jsonl_lines(p)]
    write_jsonl(dest / "forum" / "all.jsonl", forum[::-1])
    rows = pq.read_table(TINY / "wiki" / "pages-0.parquet").to_pylist()
    lines = [json.dumps(r).encode() for r in rows]
    write_jsonl(dest / "wiki" / "pages-b.jsonl.zst", lines[1::2])
    write_jsonl(dest / "wiki" / "pages-a.jsonl", lines[0::2][::-1])
    shutil.copy(TINY / "wiki" / "legacy-0.parquet", dest / "wiki" / "legacy-0.parquet")
    return dest


def ingest_each(root: Path, src: Path, executions: dict[str, ExecutionParams]
                ) -> dict[str, tuple[dict[str, Any], pa.Table, pa.Table]]:
    """``raw_documents`` of one source ``src`` (id field ``id``) under each of ``executions``, each
    in its own data root under ``root``: its report, documents and quarantine, by name."""
    crawl_spec = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(src), id_field="id")})
    got = {}
    for name, execution in executions.items():
        store = Store(str(root / name))
        report = execute(store, crawl_spec, "raw_documents", "s", execution).manifest.report
        pdir = DataRoot(store).output_dir(crawl_spec, "raw_documents", "s")
        got[name] = (report, store.read_table(pdir, "documents"), store.read_table(pdir, "quarantine"))
    return got
