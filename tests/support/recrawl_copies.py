"""Two crawls of the same sources, the second with planted verbatim copies of the first's
documents: the question "why did a source shrink?" with a known answer.

``c1``: 80 docstrings and 40 license-like documents of this Python installation (``curate
sample``'s sources). ``c2``: 60 new docstrings plus ``COPIES`` verbatim copies of ``c1``'s first
docstrings under new record ids, and the same 40 licenses. ``curate run`` with stages heuristic,
exact, fuzzy: c2's docstrings lose the copies to fuzzy as ``near_duplicate_of_earlier_crawl`` of
crawl c1 (exact compares one crawl's documents only).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.tiny_corpus import curate

COPIES = 30
STAGES = "heuristic,exact,fuzzy"


@dataclass
class Recrawl:
    workdir: Path
    copies: list[dict[str, Any]]  # the planted c2 records: id "copy-<c1 id>", text of that c1 record
    c1_run: str  # curate run's output for each crawl
    c2_run: str


def _records(folder: Path) -> list[dict[str, Any]]:
    docs = []
    for part in sorted(folder.iterdir()):
        data = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
        docs.extend(json.loads(line) for line in data.decode().splitlines() if line.strip())
    return docs


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "part.jsonl").write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in records))


def build(root: Path) -> Recrawl:
    """Both crawls run with ``curate run`` into ``root/workdir`` (a SQLite Dagster instance)."""
    from curation_dagster.tools.sample import build_sample

    folders = build_sample(root / "sample", max_docs_per_source=1000)
    # long docstrings, none a near copy of another
    docs = [d for d in _records(folders["docstrings"]) if 400 < len(d["text"]) < 4000]
    seen, distinct = set(), []
    for d in docs:
        if d["text"][:200] not in seen:
            seen.add(d["text"][:200])
            distinct.append(d)
    first, new = distinct[:80], distinct[80:140]
    assert len(new) == 60, f"only {len(distinct)} usable docstrings in this Python installation"
    licenses = _records(folders["licenses"])[:40]
    _write(root / "c1" / "docstrings", first)
    _write(root / "c1" / "licenses", licenses)
    workdir = root / "workdir"
    c1_run = _run(root, workdir, "c1")
    # copies of documents c1 kept (a copy of one its heuristics removed would be removed again)
    kept = set(_kept_record_ids(workdir, "c1", "docstrings"))
    copies = [{"id": f"copy-{d['id']}", "text": d["text"]} for d in first if d["id"] in kept][:COPIES]
    assert len(copies) == COPIES, f"c1 kept only {len(kept)} docstrings"
    _write(root / "c2" / "docstrings", new + copies)
    _write(root / "c2" / "licenses", licenses)
    return Recrawl(workdir, copies, c1_run, _run(root, workdir, "c2"))


def _run(root: Path, workdir: Path, crawl: str) -> str:
    code, stdout, stderr = curate(
        "run", "--workdir", str(workdir), "--crawl", crawl, "--stages", STAGES, "--id-field", "id", "--quiet",
        "--source", f"docstrings={root / crawl / 'docstrings'}", "--source", f"licenses={root / crawl / 'licenses'}")
    assert code == 0, stderr
    return stdout


def _kept_record_ids(workdir: Path, crawl: str, source: str) -> list[str]:
    from stages.dataroot import DataRoot

    root = DataRoot.open(None, workdir)
    pdir = DataRoot(root.store).output_dir(root.spec(crawl), "curated_documents", source)
    return [str(r) for r in root.store.read_table(pdir, "documents", ["record_id"])["record_id"].to_pylist()]
