"""The block path (a JSONL task's lines, a Parquet batch, judged with one Arrow text column) finds
exactly what the record-at-a-time path finds: the same documents, digests, positions, quarantine
entries and counts, record by record, whatever mix of good and bad records a block holds."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import stages.ingest.records as records
from stages.ingest.records import Collect, Done
from stages.ingest.tasks import _valid_text_column, plain_fields, rows
from stages.params import RawDocumentsParams

PARAMS = RawDocumentsParams(url="unused", id_field="id", url_field="url", max_chars=40)

# Lines the block path must hand to the line rule, or judge as the record rule would.
PLANTED = [
    b'{"id": "a", "text": "plain"}',
    b'{"id": "b", "text": "with\\r\\nCRLF"}\r',
    b"",
    b"   \t",
    b'{"id": "c", "text": "   "}',
    b'{"id": "d", "text": "\\u00a0\\u2003"}',  # Unicode whitespace only: empty_text
    b'{"id": "e", "text": "\\u00e9t\\u00e9 first char not ASCII"}',
    b'{"id": "f", "text": "  \\n leading space, then text"}',
    b'{"id": "g", "text": "nul \\u0000 inside"}',
    b'{"id": "h", "text": "' + b"x" * 41 + b'"}',  # beyond max_chars
    b'{"id": "\\ud800", "text": "a lone surrogate in the id"}',
    b'{"id": "i", "text": "a lone surrogate \\udc00 in the text"}',
    b'{"id": 7, "text": "an integer id", "url": 12}',
    b'{"id": "j", "text": "metadata", "lang": "en", "score": 0.5, "tags": [1, 2]}',
    b'{"id": "k", "text": 42}',
    b'{"id": "l"}',
    b"[1, 2]",
    b"null",
    b'{"id": "m", "text": "not json"',
    b'{"id": "n", "text": NaN}',
    b'{"id": "o", "text": "big int", "n": 123456789012345678901234567890}',
    b'{"id": "a", "text": "plain"}',  # a repeat of the first record
    b'{"text": "no id", "url": "https://example.org/x"}',
]


def _done_as_dict(done: Done) -> dict[str, Any]:
    return {
        "docs": done.docs.to_pylist(), "digests": done.digests, "positions": done.positions.tolist(),
        "bad": [vars(b) for b in done.bad], "lines": done.lines, "blank": done.blank, "chars": done.chars,
    }


def _both_ways(lines: list[bytes], params: RawDocumentsParams = PARAMS) -> tuple[dict[str, Any], dict[str, Any]]:
    one = Collect(params)
    for line in lines:
        one.line(line)
    block = Collect(params)
    block.lines_block(lines)
    return _done_as_dict(one.done()), _done_as_dict(block.done())


def test_planted_jsonl_block_is_judged_record_by_record() -> None:
    one, block = _both_ways(PLANTED)
    assert block == one
    assert len(one["docs"]) == 10 and len(one["bad"]) == 11 and one["blank"] == 2  # the mix is a mix


def test_a_block_with_a_lone_surrogate_text_falls_back_whole() -> None:
    lines = [b'{"id": "x", "text": "fine"}', b'{"id": "y", "text": "\\ud83d alone"}']
    one, block = _both_ways(lines)
    assert block == one
    assert [b["reason"] for b in one["bad"]] == ["invalid_utf8"]


def test_blocks_of_several_tasks_number_lines_on() -> None:
    got = Collect(PARAMS)
    got.lines_block(PLANTED[:5])
    got.lines_block(PLANTED[5:])
    one = Collect(PARAMS)
    for line in PLANTED:
        one.line(line)
    assert _done_as_dict(got.done()) == _done_as_dict(one.done())


def test_a_clean_block_with_one_record_orjson_cannot_write_goes_record_by_record(monkeypatch: Any) -> None:
    # Every text passes the vectorized checks, so the block is judged whole (``_unbranched``);
    # a record nested deeper than orjson writes (it reads 1,024 levels, writes 254) makes that
    # fail, and the block goes record by record, where the record rule's own canonical JSON
    # takes it: a document like the others.
    deep = b'{"id": "deep", "text": "fine text", "m": ' + b"[" * 300 + b"]" * 300 + b"}"
    lines = [b'{"id": "a", "text": "one"}', deep, b'{"id": "b", "text": "two", "lang": "en"}']
    whole = []
    unbranched = records._unbranched
    monkeypatch.setattr(records, "_unbranched", lambda *a: whole.append(got := unbranched(*a)) or got)
    one, block = _both_ways(lines)
    assert block == one
    assert whole == [None]  # the block was offered whole, and declined
    assert [d["record_id"] for d in one["docs"]] == ["a", "deep", "b"] and not one["bad"]
    whole.clear()
    one, block = _both_ways([lines[0], lines[2]])
    assert block == one and len(whole) == 1 and whole[0] is not None  # taken whole


_values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3))
# texts that pass the vectorized checks (printable ASCII first) too, so records reach the inline path
_texts = st.one_of(st.text(max_size=50), st.from_regex(r"[ \t]?[!-~][^\x00]{0,30}", fullmatch=True),
                   st.sampled_from(["", " ", "\x00", "ok", "\n\tx", "\u3000"]), _values)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({"text": _texts}, optional={"id": _values, "url": _values, "extra": _values}),
                min_size=1, max_size=12),
       st.sampled_from([("id", "url"), ("id", None), (None, "url"), (None, None)]), st.booleans())
def test_random_jsonl_blocks(records: list[dict[str, Any]], fields: tuple[str | None, str | None],
                             escaped: bool) -> None:
    # without an id or url field, a record's "id" or "url" is metadata: the block's inline judging
    # of the usual record (those fields alone, id and url strings) must not take it for one
    lines = [json.dumps(r, ensure_ascii=escaped).encode() for r in records]
    params = RawDocumentsParams(url="unused", id_field=fields[0], url_field=fields[1], max_chars=40)
    one, block = _both_ways(lines, params)
    assert block == one


def _batch_both_ways(table: pa.Table | pa.RecordBatch, params: RawDocumentsParams = PARAMS
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Parquet batch (a table's first) judged record by record, and as ``ParquetTask`` judges
    it (one block, its ids and urls taken whole where ``plain_fields`` can)."""
    batch = table if isinstance(table, pa.RecordBatch) else table.to_batches()[0]
    recs = rows(batch, "text")
    one = Collect(params)
    for i, rec in enumerate(recs):
        one.record(rec, i + 1)
    text = _valid_text_column(batch, "text")
    assert text is not None
    block = Collect(params)
    block.batch(recs, text, 1, plain_fields(batch, params))
    return _done_as_dict(one.done()), _done_as_dict(block.done())


def test_parquet_batch_is_judged_record_by_record() -> None:
    table = pa.table({
        "id": pa.array([1, 2, None, 4, 5, 6], pa.int64()),
        "text": pa.array(["good", "", None, "nul\x00", "x" * 41, " \u00e9 fine"], pa.large_string()),
        "lang": pa.array(["en", None, "de", "fr", "en", "fr"]),
    })
    one, block = _batch_both_ways(table)
    assert block == one
    assert [d["record_id"] for d in one["docs"]] == ["1", "6"]


def test_block_ids_and_urls_are_the_record_rules() -> None:
    # A block judges the usual record (text, id and url alone; id and url strings) inline,
    # any other through the record rule: ids and urls of these kinds must come out the same,
    # a surrogate (which no reader here produces, but a caller's dict may hold) escaped.
    values = ["ascii", "\u00e9t\u00e9", "lone \ud800", 7, True, None, ["a"], {"k": 1}]
    recs = [{"text": f"text {i}", "id": rid, "url": url} for i, (rid, url) in
            enumerate((rid, url) for rid in values for url in values)]
    recs += [{"text": "only text"}, {"text": "with metadata", "id": "x", "lang": "en"}]
    one = Collect(PARAMS)
    for i, rec in enumerate(recs):
        one.record(dict(rec), i + 1)
    block = Collect(PARAMS)
    block.batch([dict(rec) for rec in recs], pa.array([rec["text"] for rec in recs], pa.large_string()), 1)
    got, want = _done_as_dict(block.done()), _done_as_dict(one.done())
    assert got == want
    assert {d["record_id"] for d in want["docs"]} >= {"ascii", "\u00e9t\u00e9", "lone \\ud800", "7", "true"}
    assert want["docs"][-1]["metadata"] == '{"lang":"en"}' and want["docs"][-2]["record_id"] is None


def test_parquet_dictionary_text_is_taken_as_it_is() -> None:
    text = pa.array(["same", "same", "other"]).dictionary_encode()
    one, block = _batch_both_ways(pa.table({"text": text, "url": ["u1", "u2", "u3"]}))
    assert block == one and len(one["docs"]) == 3


def test_binary_or_invalid_utf8_text_is_left_to_the_record_rule() -> None:
    batch = pa.table({"text": pa.array([b"ok", b"\xff"], pa.binary())}).to_batches()[0]
    assert _valid_text_column(batch, "text") is None
    bad = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(b"\x00\x00\x00\x00\x01\x00\x00\x00"),
                                                 pa.py_buffer(b"\xff")])
    assert _valid_text_column(pa.record_batch({"text": bad}), "text") is None


def test_a_range_read_whole_is_judged_as_one_streamed_line_by_line(tmp_path: Any, monkeypatch: Any) -> None:
    """RangeTask reads a small range whole (one block); streamed (split_lines, line by line) it
    finds the same: a byte-order mark, CRLF, blank lines, no final newline, a NUL line."""
    from stages.ingest import tasks
    from stages.ingest.files import InputFile

    data = b"\xef\xbb\xbf" + b"\r\n".join(PLANTED) + b"\n\n\x00\n" + PLANTED[0]
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    task = tasks.RangeTask(PARAMS, InputFile(str(path), "a.jsonl", len(data), "jsonl", None), start=0,
                           stop=len(data))
    whole = _done_as_dict(task.run())
    monkeypatch.setattr(tasks, "WHOLE_RANGE_BYTES", -1)  # streamed
    assert _done_as_dict(task.run()) == whole
    assert whole["lines"] == len(PLANTED) + 3 and len(whole["docs"]) == 11  # a repeat is one more here


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=50), st.sampled_from(["", " ", "a\x00", "\u3000x"])),
                          st.one_of(st.none(), st.integers(-5, 5)), st.one_of(st.none(), st.floats(allow_nan=True))),
                min_size=1, max_size=12), st.booleans())
def test_random_parquet_batches(values: list[tuple[str | None, int | None, float | None]], dictionary: bool) -> None:
    text = pa.array([v[0] for v in values], pa.large_string())
    table = pa.table({"text": text.cast(pa.string()).dictionary_encode() if dictionary else text,
                      "id": pa.array([v[1] for v in values], pa.int64()),
                      "score": pa.array([v[2] for v in values], pa.float64())})
    one, block = _batch_both_ways(table)
    assert block == one


_IDS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
                 st.sampled_from(["", "\u00e9t\u00e9", "pair \U0001f600", "a\x00b"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=30), st.sampled_from(["", " ", "a\x00", "x" * 41])),
                          _IDS, _IDS), min_size=1, max_size=10),
       st.sampled_from(["string", "large_string", "dictionary", "int64", "uint8", "nulls", "absent"]),
       st.sampled_from(["string", "string_view", "absent"]), st.sampled_from(["id", None]),
       st.sampled_from(["url", None]))
def test_a_batch_of_text_id_and_url_alone_takes_its_ids_whole(
        values: list[tuple[str | None, Any, Any]], id_kind: str, url_kind: str, id_field: str | None,
        url_field: str | None) -> None:
    """A batch whose columns are its text, id and url fields alone, ids and urls strings or
    integers however stored, has its ids and urls taken as columns (``plain_fields``): the same
    documents, ids, urls, digests and quarantine as each record judged on its own. With an id or
    url column the source's fields do not name (then metadata), ``plain_fields`` declines (other
    columns and other types: ``test_plain_fields_declines_other_columns_and_other_ids``)."""
    ints = id_kind in ("int64", "uint8")
    ids = [v[1] if not ints or isinstance(v[1], int) or v[1] is None else len(v[1]) for v in values]
    if id_kind == "uint8":
        ids = [None if i is None else abs(i) % 256 for i in ids]
    ids = [None if i is None else (i if ints else str(i)) for i in ids]
    urls = [None if v[2] is None else str(v[2]) for v in values]
    columns: dict[str, pa.Array] = {"text": pa.array([v[0] for v in values], pa.string())}
    if id_kind != "absent":
        columns["id"] = {"string": lambda: pa.array(ids, pa.string()),
                         "large_string": lambda: pa.array(ids, pa.large_string()),
                         "dictionary": lambda: pa.array(ids, pa.string()).dictionary_encode(),
                         "int64": lambda: pa.array(ids, pa.int64()), "uint8": lambda: pa.array(ids, pa.uint8()),
                         "nulls": lambda: pa.nulls(len(ids), pa.string())}[id_kind]()
    if url_kind != "absent":
        kind = pa.string_view() if url_kind == "string_view" else pa.string()
        columns["url"] = pa.array(urls, pa.string()).cast(kind)
    params = RawDocumentsParams(url="unused", id_field=id_field, url_field=url_field, max_chars=40)
    table = pa.table(columns)
    plain = plain_fields(table.to_batches()[0], params)
    assert (plain is None) == (("id" in columns and id_field is None) or ("url" in columns and url_field is None))
    one, block = _batch_both_ways(table, params)
    assert block == one


_OFFSETS = pa.py_buffer(b"\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00")
_INVALID = pa.Array.from_buffers(pa.string(), 2, [None, _OFFSETS, pa.py_buffer(b"\xffz")])  # "\xff", "z"


@pytest.mark.parametrize(("columns", "fields", "taken"), [
    ({"text": ["t1", "t2"], "id": pa.array([0, 2**64 - 1], pa.uint64())}, ("id", "url"), True),
    ({"text": ["t1", "t2"], "id": pa.array([-(2**63), 2**63 - 1]).dictionary_encode()}, ("id", "url"), True),
    ({"text": ["t1", " "], "url": ["u", None]}, ("text", "url"), True),  # the text is also the id
    ({"text": ["t1", "t2"], "id": ["a", "\u00e9"]}, ("id", "id"), True),  # the id is also the url
    ({"text": pa.array([], pa.string()), "id": pa.array([], pa.string())}, ("id", "url"), True),
    ({"text": ["t1", "t2"], "id": _INVALID.cast(pa.large_string())}, ("id", "url"), False),
    ({"text": ["t1", "t2"], "id": _INVALID.cast(pa.string_view())}, ("id", "url"), False),
])
def test_a_plain_batch_is_judged_as_its_records(columns: dict[str, Any], fields: tuple[str, str], taken: bool) -> None:
    """Ids and urls taken as columns are what each record's ``as_id`` gives, where a field is also
    another (the text an id, the id a url), at the integers' bounds, dictionary-encoded, in an
    empty batch; ids not valid UTF-8, however stored, are left to the record rule."""
    params = RawDocumentsParams(url="unused", id_field=fields[0], url_field=fields[1], max_chars=40)
    batch = pa.record_batch(columns)
    assert (plain_fields(batch, params) is not None) == taken
    one, block = _batch_both_ways(batch, params)
    assert block == one


def test_plain_fields_declines_other_columns_and_other_ids() -> None:
    text = pa.array(["a", "b"])
    assert plain_fields(pa.record_batch({"text": text, "lang": pa.array(["en", "de"])}), PARAMS) is None
    assert plain_fields(pa.record_batch({"text": text, "id": pa.array([1.5, 2.0])}), PARAMS) is None
    assert plain_fields(pa.record_batch({"text": text, "id": pa.array([True, False])}), PARAMS) is None
    assert plain_fields(pa.record_batch({"text": text, "id": _INVALID}), PARAMS) is None
    plain = plain_fields(pa.record_batch({"text": text, "id": pa.array([7, None], pa.int32())}), PARAMS)
    assert plain is not None
    assert plain[0].to_pylist() == ["7", None] and plain[1].to_pylist() == [None, None]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["text", "id", "url", "body", "lang", "ID"]),
                       st.one_of(_values, st.sampled_from(["\u00e9t\u00e9", "lone \ud800", "pair \ud83d\ude00"])),
                       max_size=5),
       st.sampled_from(["text", "body"]), st.sampled_from(["id", "ID", None]), st.sampled_from(["url", None]))
@example({"text": "t", "id": "lone \ud800", "url": "u"}, "text", "id", "url")  # the usual record's shape,
@example({"text": "t", "id": "i", "url": "lone \udc00"}, "text", "id", "url")  # a surrogate in it
def test_a_records_fields_are_as_id_and_every_other_field(rec: dict[str, Any], text_field: str, id_field: str | None,
                                                          url_field: str | None) -> None:
    """A record's id and url as ``as_id`` gives them (the usual record's ASCII strings taken as they
    are, any other value through it: a surrogate escaped), and its metadata: every field but its
    text, id and url fields (whichever the source has), as canonical JSON; None where there is none."""
    from stages.ingest.records import _fields, as_id, canonical

    params = RawDocumentsParams(url="unused", text_field=text_field, id_field=id_field, url_field=url_field)
    rest = {k: v for k, v in rec.items() if k not in (text_field, id_field, url_field)}
    want = (as_id(rec.get(id_field)) if id_field else None, as_id(rec.get(url_field)) if url_field else None,
            canonical(rest).decode() if rest else None)
    assert _fields(params)(rec) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.sampled_from([b"x", b"\r", b"\xe9", b" "])), max_size=12),
       st.booleans())
def test_a_block_is_cut_into_the_lines_bytes_split_gives(lines: list[tuple[int, bytes]], newline_last: bool) -> None:
    """``split_newlines`` (``bytes.find`` where the first line is long) is ``bytes.split``, for
    lines short and long, empty ones, a last line with or without its newline."""
    from stages.ingest.streams import split_newlines

    data = b"\n".join(fill * n for n, fill in lines) + (b"\n" if newline_last else b"")
    assert split_newlines(data) == data.split(b"\n")
