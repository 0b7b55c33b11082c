"""The sample corpus: deterministic, real text in every source, planted bad lines exactly once."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from curation_dagster.tools.sample import PLANTED_BAD, SOURCES, build_sample

REAL_SOURCES = ("docstrings", "licenses", "package_docs")


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_sample(tmp_path_factory.mktemp("sample"))


def _raw_lines(folder: Path) -> list[bytes]:
    lines: list[bytes] = []
    for part in sorted(folder.glob("part-*")):
        data = gzip.decompress(part.read_bytes()) if part.name.endswith(".gz") else part.read_bytes()
        lines.extend(data.splitlines())
    return lines


def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line.decode("utf-8")) for line in _raw_lines(folder)]


def _classify(line: bytes) -> str:
    """Which planted bad kind a line is, or 'ok' for a usable record."""
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "invalid_utf8"
    except json.JSONDecodeError:
        return "invalid_json"
    if "text" not in rec:
        return "missing_text"
    if not isinstance(rec["text"], str):
        return "text_not_string"
    return "empty_text" if rec["text"] == "" else "ok"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_is_byte_identical(sample: dict[str, Path], tmp_path: Path) -> None:
    """A second build has the same bytes as the module's (which is the first: two builds here, not three)."""
    root = sample["docstrings"].parent
    assert set(sample) == set(SOURCES) and {folder.parent for folder in sample.values()} == {root}
    a = _tree(root)
    build_sample(tmp_path / "b")
    assert a and _tree(tmp_path / "b") == a
    # Rebuilding into the same folder leaves the same files and no temp files behind.
    build_sample(tmp_path / "b")
    assert _tree(tmp_path / "b") == a


def test_every_source_has_records_in_several_parts(sample: dict[str, Path]) -> None:
    for name in SOURCES:
        parts = sorted(p.name for p in sample[name].iterdir())
        assert 2 <= len(parts) <= 3, (name, parts)
        assert any(p.endswith(".jsonl.gz") for p in parts), (name, parts)
    for name in REAL_SOURCES:
        records = _records(sample[name])
        assert records, name
        # Real sources are clean: every record has non-empty string text, an id and a url.
        assert all(isinstance(r["text"], str) and r["text"].strip() for r in records), name
        assert all(r["id"] and r["url"].startswith("py://") for r in records), name
    assert all(len(r["text"]) >= 200 for r in _records(sample["docstrings"]))
    assert all(r["title"] for r in _records(sample["package_docs"]))


def test_scraps_hold_exactly_the_planted_bad_lines(sample: dict[str, Path]) -> None:
    kinds = Counter(_classify(line) for line in _raw_lines(sample["scraps"]))
    assert {k: n for k, n in kinds.items() if k != "ok"} == {k: 1 for k in PLANTED_BAD}
    assert kinds["ok"] >= 5  # the junk records for the heuristic filters


def test_licenses_have_exact_and_near_duplicates(sample: dict[str, Path]) -> None:
    texts = [r["text"] for r in _records(sample["licenses"])]
    exact = Counter(texts)
    assert any(n > 1 for n in exact.values())
    by_body: dict[str, set[str]] = defaultdict(set)
    for text in texts:
        by_body["\n".join(line for line in text.splitlines() if "Copyright" not in line)].add(text)
    # Near-duplicates: different texts that agree once copyright lines are removed.
    assert any(len(variants) > 1 for variants in by_body.values())


def test_ids_unique_within_each_source(sample: dict[str, Path]) -> None:
    for name in SOURCES:
        ids = []
        for line in _raw_lines(sample[name]):
            try:
                rec = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            ids.append(rec["id"])
        assert len(ids) == len(set(ids)), name


def test_cap_and_copies(tmp_path: Path) -> None:
    base = build_sample(tmp_path / "one", max_docs_per_source=20)
    more = build_sample(tmp_path / "two", max_docs_per_source=20, copies=3)
    for name in REAL_SOURCES:
        originals = _records(base[name])
        copied = _records(more[name])
        assert 0 < len(originals) <= 20
        assert len(copied) == 3 * len(originals)
        assert copied[: len(originals)] == originals  # copy 0 is the unchanged record
        by_id = {r["id"]: r for r in copied}
        for rec in originals:
            for k in (1, 2):
                twin = by_id[f"{rec['id']}#{k}"]
                assert twin["text"] != rec["text"] and twin["text"].startswith(rec["text"])
    # Scraps are never copied, so the planted bad lines stay exactly once.
    assert _raw_lines(base["scraps"]) == _raw_lines(more["scraps"])
