"""raw_documents: formats, bad records, truncated files, URLs, metadata, and stable doc_ids."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from stages.execute import execute, execute_crawl
from stages.params import ExecutionParams, RawDocumentsParams
from stages.programs.raw_documents import NoInputError, list_files
from stages.spec import CrawlSpec
from stages.store import Store, UnsafeNameError
from tests.support.tiny_corpus import (
    EXPECTED,
    SOURCES,
    TINY,
    config,
    read,
    reshard,
    run_all,
    spec,
    write_compressed,
)


class Ingested:
    def __init__(self, store: Store, crawl_spec: CrawlSpec, source: str) -> None:
        outcome = execute(store, crawl_spec, "raw_documents", source, ExecutionParams(batch_rows=7))
        self.report = outcome.manifest.report
        self.docs = read(store, crawl_spec, "raw_documents", "documents", source).to_pylist()
        self.bad = read(store, crawl_spec, "raw_documents", "quarantine", source).to_pylist()

    @property
    def ids(self) -> set[str]:
        return {d["doc_id"] for d in self.docs}

    @property
    def reasons(self) -> Counter[str]:
        return Counter(b["reason"] for b in self.bad)


def ingest(tmp_path: Path, url: str | Path, crawl: str = "c1", source: str = "s", **params: Any) -> Ingested:
    crawl_spec = CrawlSpec(crawl=crawl, sources={source: RawDocumentsParams(url=str(url), **params)})
    return Ingested(Store(str(tmp_path / "data")), crawl_spec, source)


def jsonl(*records: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


write = write_compressed


GOOD = {"id": "g1", "text": "A perfectly ordinary document."}


# --- bad records -------------------------------------------------------------------------------------

BAD_RECORDS = [
    (b'{"id": "b1", "text": "no closing quote}', "invalid_json"),
    (b'{"id": "b1", "text": "trailing" garbage', "invalid_json"),
    (b'{"id": "b1", "text": "caf\xe9"}', "invalid_utf8"),
    (b'{"id": "b1", "text": "\xff\xfe\xfd"}', "invalid_utf8"),
    (b'{"id": "b1", "text": null}', "missing_text"),
    (b'{"id": "b1", "body": "text in another field"}', "missing_text"),
    (b'{"id": "b1", "text": 42}', "text_not_string"),
    (b'{"id": "b1", "text": 4.5}', "text_not_string"),
    (b'{"id": "b1", "text": true}', "text_not_string"),
    (b'{"id": "b1", "text": ["a", "list"]}', "text_not_string"),
    (b'{"id": "b1", "text": {"an": "object"}}', "text_not_string"),
    (b'{"id": "b1", "text": ""}', "empty_text"),
    (b'{"id": "b1", "text": " \\n\\t "}', "empty_text"),
    (b'{"id": "b1", "text": "a NUL \\u0000 inside"}', "nul_byte"),
    (b'["an", "array", "line"]', "not_an_object"),
    (b'"a string line"', "not_an_object"),
    (b"12345", "not_an_object"),
    (b"null", "not_an_object"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_RECORDS)
def test_bad_record_is_quarantined_with_its_reason(tmp_path: Path, line: bytes, reason: str) -> None:
    path = write(tmp_path / "in" / "part.jsonl", jsonl(GOOD, line, {**GOOD, "id": "g2"}))
    got = ingest(tmp_path, path, id_field="id")
    assert [d["record_id"] for d in got.docs] == ["g1", "g2"]
    assert got.reasons == {reason: 1}
    bad = got.bad[0]
    assert bad["source"] == "s" and bad["detail"].startswith("part.jsonl:2")
    parsed_object = line.startswith(b"{") and reason not in ("invalid_json", "invalid_utf8")
    assert bad["record_id"] == ("b1" if parsed_object else None)
    assert bad["raw"]  # an excerpt of the record, for the ledger and for debugging
    assert got.report["input"] == 3 and got.report["documents"] == 2 and got.report["quarantined"] == 1
    assert got.report["quarantine_reasons"] == {reason: 1}
    assert len({*got.ids, bad["doc_id"]}) == 3


def test_blank_lines_are_not_records(tmp_path: Path) -> None:
    path = write(tmp_path / "part.jsonl", b"\n" + jsonl(GOOD) + b"   \n\r\n" + jsonl({**GOOD, "id": "g2"}))
    got = ingest(tmp_path, path)
    assert len(got.docs) == 2 and not got.bad
    assert got.report["input"] == 2 and got.report["blank_lines"] == 3


def test_crlf_and_a_missing_final_newline(tmp_path: Path) -> None:
    path = write(tmp_path / "part.jsonl", json.dumps(GOOD).encode() + b"\r\n" + json.dumps({**GOOD, "id": 2}).encode())
    got = ingest(tmp_path, path, id_field="id")
    assert [d["record_id"] for d in got.docs] == ["g1", "2"] and not got.bad


# --- damaged files -----------------------------------------------------------------------------------


def many(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct, poorly compressible records (so a cut file still holds whole ones)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    return [{"id": f"r{i:04d}", "text": " ".join(rng.choice(words) for _ in range(40))} for i in range(n)]


def test_truncated_gzip_keeps_the_records_before_the_damage(tmp_path: Path) -> None:
    records = many(400)
    data = gzip.compress(jsonl(*records), mtime=0)
    path = tmp_path / "in" / "cut.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(data[: len(data) // 2])
    got = ingest(tmp_path, path, id_field="id")
    kept = [d["record_id"] for d in got.docs]
    assert 0 < len(kept) < len(records)
    assert kept == [r["id"] for r in records[: len(kept)]]  # a prefix, nothing half-read
    assert not got.bad  # damage is not a record: the file is reported damaged instead
    (damaged,) = got.report["damaged_files"]
    assert damaged["file"] == "cut.jsonl.gz" and "end-of-stream" in damaged["error"]
    assert damaged["size"] == len(data) // 2 and damaged["partial_bytes"] > 0
    assert got.report["unread_bytes"] > 0
    assert got.report["input"] == len(kept)


def test_truncated_zstd_keeps_the_records_before_the_damage(tmp_path: Path) -> None:
    records = many(400)
    c = zstandard.ZstdCompressor()
    first, second = jsonl(*records[:150]), jsonl(*records[150:])
    data = c.compress(first) + c.compress(second)  # two frames, as zstd -T or pzstd write
    path = tmp_path / "in" / "cut.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(data[: len(data) - 100])
    got = ingest(tmp_path, path, id_field="id")
    kept = [d["record_id"] for d in got.docs]
    assert 150 <= len(kept) < len(records)
    assert kept == [r["id"] for r in records[: len(kept)]]
    assert not got.bad
    (damaged,) = got.report["damaged_files"]
    assert damaged["file"] == "cut.jsonl.zst" and "truncated" in damaged["error"]


def test_multi_frame_zstd_is_read_whole(tmp_path: Path) -> None:
    records = many(300)
    c = zstandard.ZstdCompressor()
    data = b"".join(c.compress(jsonl(*records[i : i + 70])) for i in range(0, 300, 70))
    path = tmp_path / "in" / "frames.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(data)
    got = ingest(tmp_path, path, id_field="id")
    assert [d["record_id"] for d in got.docs] == [r["id"] for r in records] and not got.bad


def test_corrupt_files_are_reported_damaged_not_fatal(tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.jsonl", jsonl(GOOD))
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(b"this is not gzip at all")
    (tmp_path / "in" / "c.jsonl.zst").write_bytes(b"nor is this zstd")
    (tmp_path / "in" / "d.parquet").write_bytes(b"PAR1 but not really")
    got = ingest(tmp_path, tmp_path / "in")
    assert len(got.docs) == 1 and not got.bad
    damaged = {d["file"]: d for d in got.report["damaged_files"]}
    assert sorted(damaged) == ["b.jsonl.gz", "c.jsonl.zst", "d.parquet"]
    assert damaged["d.parquet"]["unread_bytes"] == len(b"PAR1 but not really")


def test_parquet_with_a_wrong_typed_text_column_gives_one_row_per_record(tmp_path: Path) -> None:
    path = tmp_path / "in" / "bad.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": [1, 2, 3, 4]}), path)
    pq.write_table(pa.table({"id": ["e", "f"], "body": ["x", "y"]}), tmp_path / "in" / "missing.parquet")
    pq.write_table(pa.table({"id": ["g"], "text": ["fine"]}), tmp_path / "in" / "ok.parquet")
    # two columns named text (Arrow writes it): which is the text cannot be told
    twice = pa.Table.from_arrays([pa.array(["h", "i"]), pa.array(["one", "two"]), pa.array(["un", "deux"])],
                                 names=["id", "text", "text"])
    pq.write_table(twice, tmp_path / "in" / "twice.parquet")
    got = ingest(tmp_path, tmp_path / "in", id_field="id")
    assert got.reasons == {"wrong_schema": 8}
    assert [d["record_id"] for d in got.docs] == ["g"]
    assert got.report["input"] == 9
    assert any("int64" in b["detail"] for b in got.bad) and any("missing" in b["detail"] for b in got.bad)
    assert sorted(b["record_id"] for b in got.bad if "appears 2 times" in b["detail"]) == ["h", "i"]


def test_parquet_records_bad_values_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "in" / "p.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({
        "page_id": ["a", "b", "c", "d"], "text": ["good text", None, "", "nul\x00"],
        "lang": ["en", "en", "de", "fr"], "rev": [1, 2, 3, 4],
    }), path)
    got = ingest(tmp_path, path, id_field="page_id")
    assert got.reasons == {"missing_text": 1, "empty_text": 1, "nul_byte": 1}
    assert [b["record_id"] for b in got.bad] == ["b", "c", "d"]
    (doc,) = got.docs
    assert doc["record_id"] == "a" and json.loads(doc["metadata"]) == {"lang": "en", "rev": 1}


# --- URLs ----------------------------------------------------------------------------------------


def test_glob_and_directory_urls(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "a.jsonl", jsonl({"id": "a", "text": "from a"}))
    write(src / "b.jsonl.gz", jsonl({"id": "b", "text": "from b"}))
    write(src / "_SUCCESS", b"")  # bookkeeping files are passed over (and counted)
    write(src / "sub" / "c.jsonl.zst", jsonl({"id": "c", "text": "from c"}))
    pq.write_table(pa.table({"id": ["d"], "text": ["from d"]}), src / "sub" / "d.parquet")

    def records(url: str | Path, name: str) -> list[str]:
        got = ingest(tmp_path / name, url, id_field="id")
        return sorted(d["record_id"] for d in got.docs)

    assert records(src, "dir") == ["a", "b", "c", "d"]  # a directory is read recursively
    assert records(f"{src}/*.jsonl*", "glob") == ["a", "b"]
    assert records(f"{src}/**/*.parquet", "deep") == ["d"]
    assert records(src / "a.jsonl", "file") == ["a"]
    assert records(f"file://{src}/sub", "url") == ["c", "d"]


@pytest.mark.parametrize("pattern", ["missing/*.jsonl", "missing-dir", "empty", "only-hidden"])
def test_a_url_matching_nothing_is_a_clear_error(tmp_path: Path, pattern: str) -> None:
    (tmp_path / "empty").mkdir()
    write(tmp_path / "only-hidden" / "_SUCCESS", b"")
    url = str(tmp_path / pattern)
    with pytest.raises(NoInputError, match="matches no JSONL or Parquet file") as err:
        ingest(tmp_path, url)
    assert url in str(err.value)
    assert isinstance(err.value, FileNotFoundError)  # the CLI reports it as one line
    with pytest.raises(NoInputError):
        list_files(RawDocumentsParams(url=url))


# --- fields ---------------------------------------------------------------------------------------


def test_fields_record_id_url_and_metadata(tmp_path: Path) -> None:
    rec = {"id": 7, "text": "Body text.", "link": "https://x.example/7", "lang": "en",
           "tags": ["a", "b"], "nested": {"k": 1}, "none": None}
    path = write(tmp_path / "p.jsonl", jsonl(rec, {"text": "no id here"}))
    got = ingest(tmp_path, path, id_field="id", url_field="link")
    first, second = got.docs
    assert first["record_id"] == "7" and first["url"] == "https://x.example/7" and first["text"] == "Body text."
    assert json.loads(first["metadata"]) == {"lang": "en", "tags": ["a", "b"], "nested": {"k": 1}, "none": None}
    assert second["record_id"] is None and second["url"] is None and second["metadata"] is None
    assert all(d["source"] == "s" for d in got.docs)
    assert all(len(d["doc_id"]) == 32 for d in got.docs)


def test_a_custom_text_field(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", jsonl({"body": "the body", "text": "not this"}, {"text": "only text"}))
    got = ingest(tmp_path, path, text_field="body")
    assert [d["text"] for d in got.docs] == ["the body"]
    assert json.loads(got.docs[0]["metadata"]) == {"text": "not this"}
    assert got.reasons == {"missing_text": 1}


# --- stable ids -----------------------------------------------------------------------------------


def corpus() -> list[bytes]:
    """Records as JSONL lines, including identical records, one bad line and varied key order."""
    recs = [json.dumps(r).encode() for r in many(60, seed=3)]
    recs += [json.dumps({"id": "twin", "text": "identical record"}).encode()] * 3
    recs += [b'{"text": "same text, other id", "id": "x1"}', b'{"id":"x2","text":"same text, other id"}']
    return recs


LAYOUTS = {
    "one file": {"all.jsonl": slice(None)},
    "three files": {"p0.jsonl": slice(0, None, 3), "p1.jsonl": slice(1, None, 3), "p2.jsonl": slice(2, None, 3)},
    "gzip": {"all.jsonl.gz": slice(None)},
    "zstd and plain": {"a.jsonl.zst": slice(0, 30), "b/c.jsonl": slice(30, None)},
    "reversed": {"r.jsonl": slice(None, None, -1)},
}


def layout(root: Path, files: dict[str, slice], lines: list[bytes]) -> Path:
    for name, part in files.items():
        write(root / name, b"".join(line + b"\n" for line in lines[part]))
    return root


def test_doc_ids_do_not_depend_on_the_file_layout(tmp_path: Path) -> None:
    lines = corpus()
    shuffled = lines[:]
    random.Random(7).shuffle(shuffled)
    seen = []
    for i, (name, files) in enumerate(LAYOUTS.items()):
        src = layout(tmp_path / f"in{i}", files, shuffled if name == "three files" else lines)
        got = ingest(tmp_path / f"out{i}", src, id_field="id")
        assert len(got.docs) == len(lines) and not got.bad, name
        seen.append((name, {(d["doc_id"], d["record_id"], d["text"]) for d in got.docs}))
    for name, ids in seen[1:]:
        assert ids == seen[0][1], name
    # Whitespace and key order inside a JSON line do not matter either.
    spaced = [orjson.dumps(orjson.loads(line), option=orjson.OPT_INDENT_2).replace(b"\n", b" ") for line in lines]
    got = ingest(tmp_path / "spaced", layout(tmp_path / "in-spaced", {"s.jsonl": slice(None)}, spaced[::-1]),
                 id_field="id")
    assert {(d["doc_id"], d["record_id"], d["text"]) for d in got.docs} == seen[0][1]


def test_jsonl_and_parquet_give_the_same_ids(tmp_path: Path) -> None:
    recs = many(20, seed=5)
    write(tmp_path / "j" / "a.jsonl", jsonl(*recs))
    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pylist(recs[10:]), tmp_path / "p" / "b.parquet")
    pq.write_table(pa.Table.from_pylist(recs[:10]), tmp_path / "p" / "a.parquet")
    a = ingest(tmp_path / "oj", tmp_path / "j")
    b = ingest(tmp_path / "op", tmp_path / "p")
    assert a.ids == b.ids and len(a.ids) == 20


def test_identical_records_get_distinct_ids_and_sources_and_crawls_do_not_collide(tmp_path: Path) -> None:
    twin = {"id": "same", "text": "the same record, three times"}
    path = write(tmp_path / "t.jsonl", jsonl(twin, twin, twin))
    got = ingest(tmp_path / "a", path)
    assert len(got.ids) == 3
    # The same records split over two files get the same three ids.
    write(tmp_path / "split" / "1.jsonl", jsonl(twin))
    write(tmp_path / "split" / "2.jsonl.gz", jsonl(twin, twin))
    assert ingest(tmp_path / "b", tmp_path / "split").ids == got.ids
    # Another source or another crawl: other ids.
    assert not ingest(tmp_path / "c", path, source="other").ids & got.ids
    assert not ingest(tmp_path / "d", path, crawl="c2").ids & got.ids


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", ".hidden", "a b", "/abs", "x" * 129, "a\\b"])
def test_unsafe_source_and_crawl_names_are_rejected(tmp_path: Path, name: str) -> None:
    params = RawDocumentsParams(url=str(tmp_path))
    # Inside the pydantic model the UnsafeNameError surfaces as a ValidationError (a ValueError too).
    with pytest.raises(ValueError, match="invalid source name"):
        CrawlSpec(crawl="c1", sources={name: params})
    with pytest.raises(ValueError, match="invalid crawl name"):
        CrawlSpec(crawl=name, sources={"s": params})
    with pytest.raises(UnsafeNameError):
        Store(str(tmp_path)).partition_dir("raw_documents", "k", "c1", name)


def test_resharding_the_tiny_corpus_changes_no_id_and_no_decision(tmp_path: Path) -> None:
    """End to end (every program, in-process): the tiny corpus and a re-sharded copy of it."""
    original, resharded = spec(), spec(root=reshard(tmp_path / "resharded"))
    a, b = Store(str(tmp_path / "a")), Store(str(tmp_path / "b"))
    report_a, report_b = run_all(a, original), run_all(b, resharded)
    assert report_a["sources"] == report_b["sources"]
    for s in SOURCES:
        ids_a = set(read(a, original, "raw_documents", "documents", s)["doc_id"].to_pylist())
        ids_b = set(read(b, resharded, "raw_documents", "documents", s)["doc_id"].to_pylist())
        assert ids_a == ids_b, s
        kept_a = set(read(a, original, "curated_documents", "documents", s)["doc_id"].to_pylist())
        kept_b = set(read(b, resharded, "curated_documents", "documents", s)["doc_id"].to_pylist())
        assert kept_a == kept_b, s
    assert (tmp_path / "resharded" / "news" / "sub" / "b.jsonl.gz").exists()

    def decisions(store: Store, crawl_spec: CrawlSpec) -> set[tuple[Any, ...]]:
        rows = read(store, crawl_spec, "removal_ledger", "ledger").to_pylist()
        # Quarantined records have no content id (they may not even parse), only counts compare.
        return {(r["doc_id"], r["stage"], r["reason"], r["duplicate_of"]) for r in rows if r["stage"] != "quarantine"}

    assert decisions(a, original) == decisions(b, resharded)
    assert len(decisions(a, original)) == sum(
        r["removed"] for r in report_a["sources"].values())


def mirror_records() -> list[dict[str, Any]]:
    """A fourth source for the full-pipeline test: near-duplicates (one word changed) and exact
    copies of the tiny corpus's kept news texts, and a record id naming two different records."""
    outcomes = EXPECTED["default"]["outcomes"]["news"]
    texts = []
    for line in (TINY / "news" / "news-2024-05.jsonl").read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and outcomes.get(rec.get("id")) == "kept":
            texts.append(rec["text"])
    recs = [{"id": f"m{i}", "text": t.replace(" the ", " a ", 1)} for i, t in enumerate(texts[:6])]
    recs += [{"id": f"c{i}", "text": t} for i, t in enumerate(texts[6:9])]
    recs += [{"id": "clash", "text": texts[0] + " Corrected."}, {"id": "clash", "text": texts[1] + " Corrected."}]
    return recs


def full_spec(root: Path, mirror: Path) -> CrawlSpec:
    cfg = config(root)
    sources = {**cfg["sources"], "mirror": {"url": str(mirror), "id_field": "id"}}
    return CrawlSpec(crawl="tiny", sources=sources, keep=cfg["keep"], stages=("heuristic", "exact", "fuzzy"))


@pytest.mark.slow  # the tiny corpus twice through heuristic, exact and fuzzy
def test_split_merged_reordered_inputs_change_no_id_and_no_decision_of_any_stage(tmp_path: Path) -> None:
    """Every stage that runs without a model (heuristic, exact, fuzzy), end to end: the original
    layout against files split, merged, reordered and converted, read in byte-range tasks."""
    recs = mirror_records()
    lines = [json.dumps(r).encode() for r in recs]
    write(tmp_path / "mirror-a" / "one.jsonl", b"".join(x + b"\n" for x in lines[:7]))
    write(tmp_path / "mirror-a" / "two.jsonl.gz", b"".join(x + b"\n" for x in lines[7:]))
    write(tmp_path / "mirror-b" / "all.jsonl", b"".join(x + b"\n" for x in lines[::-1]))
    a = full_spec(TINY, tmp_path / "mirror-a")
    b = full_spec(reshard(tmp_path / "resharded"), tmp_path / "mirror-b")
    store_a, store_b = Store(str(tmp_path / "a")), Store(str(tmp_path / "b"))
    execute_crawl(store_a, a, ExecutionParams(workers=1))
    execute_crawl(store_b, b, ExecutionParams(workers=2, batch_rows=3, ingest_task_bytes=512))

    def ledger(store: Store, crawl: CrawlSpec) -> tuple[set[tuple[Any, ...]], Counter[tuple[str, str]]]:
        rows = read(store, crawl, "removal_ledger", "ledger").to_pylist()
        # Quarantined lines that never parsed have position ids; every other decision is by content.
        by_content = {(r["doc_id"], r["source"], r["stage"], r["reason"], r["duplicate_of"], r["record_id"])
                      for r in rows if r["stage"] != "quarantine" or r["reason"] == "duplicate_record_id"}
        return by_content, Counter((r["source"], r["reason"]) for r in rows)

    decisions_a, counts_a = ledger(store_a, a)
    decisions_b, counts_b = ledger(store_b, b)
    assert decisions_a == decisions_b and counts_a == counts_b
    stages = Counter(d[2] for d in decisions_a)
    assert stages["fuzzy"] >= 5 and stages["exact"] >= 3 and stages["heuristic"] >= 10  # non-trivial
    assert counts_a[("mirror", "duplicate_record_id")] == 1
    for s in (*SOURCES, "mirror"):
        for program in ("raw_documents", "curated_documents"):
            ids_a = read(store_a, a, program, "documents", s)["doc_id"].to_pylist()
            ids_b = read(store_b, b, program, "documents", s)["doc_id"].to_pylist()
            assert sorted(ids_a) == sorted(ids_b) and len(set(ids_a)) == len(ids_a), (program, s)
    report_a = read(store_a, a, "removal_ledger", "ledger").num_rows
    assert report_a == read(store_b, b, "removal_ledger", "ledger").num_rows
