"""Records: parse, validate, and turn each into a document row or a quarantine row.

Every record that parses is judged on its own, whatever else is in its file: a record nested
hundreds of levels deep, holding integers beyond 64 bits, NaN or Infinity, a lone surrogate, or
values Arrow cannot turn into Python is accepted or quarantined with a reason, and never costs
its neighbours. orjson parses and serializes the common case; what it refuses (NaN, nesting
deeper than it allows, integers beyond 64 bits) goes to the standard library's ``json``; what
neither can take (nesting beyond the interpreter's recursion limit) is quarantined as
``too_deeply_nested``.

A task's lines, or a Parquet batch, are judged as one block (``Collect.lines_block``,
``Collect.batch``): the texts move as one Arrow column, vectorized checks pick the records that
might be bad, and only those go through the record rule (``judge``), so a block finds exactly
what record-at-a-time judging finds (tests/stages/ingest/test_blocks.py).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from stages.ingest.streams import Overlong
from stages.params import RawDocumentsParams

RAW_EXCERPT = 2000  # characters of a bad record kept in the quarantine table
FAST_BLOCK_BYTES = 1 << 30  # a JSONL block judged as one Arrow column: below string's 2 GiB offsets

# What a task returns per good record; the doc_id is assigned by the ingesting process.
PARSED = pa.schema([
    ("record_id", pa.string()),
    ("url", pa.string()),
    ("text", pa.large_string()),
    ("metadata", pa.string()),
])


class Unserializable(ValueError):
    """A record that no JSON serializer here can write (nested beyond the recursion limit)."""


def _nan_to_null(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_null(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """Canonical JSON (sorted keys) of a parsed value: orjson's, or, for what orjson cannot write
    (nesting beyond 254 levels, integers beyond 64 bits), the standard library's with NaN and
    Infinity as null (as orjson writes them) and non-ASCII escaped (always valid UTF-8)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:
        return json.dumps(_nan_to_null(value), sort_keys=True, separators=(",", ":"), default=str,
                          ensure_ascii=True).encode()
    except RecursionError as exc:
        raise Unserializable("nested deeper than the recursion limit") from exc


def parse(line: bytes) -> tuple[Any, str | None, str]:
    """(value, reason, detail) of one JSON line; ``reason`` is None when it parsed."""
    try:
        return orjson.loads(line), None, ""
    except orjson.JSONDecodeError as exc:
        first = str(exc)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "invalid_utf8", first
    try:  # NaN/Infinity, nesting beyond orjson's 1024 levels, lone surrogates
        return json.loads(text), None, ""
    except RecursionError:
        return None, "too_deeply_nested", "nested deeper than the recursion limit"
    except ValueError:
        return None, "invalid_json", first


def as_id(value: Any) -> str | None:
    """A record id as text: a string as it is, an integer in decimal (so ``1`` and ``"1"`` name
    the same record, in JSONL and Parquet alike), anything else as canonical JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.isascii() else _valid_text(value)  # ASCII (the usual id or url): no surrogate
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    try:
        return canonical(value).decode()
    except Unserializable:
        return None


def _valid_text(value: str) -> str:
    """``value``, with lone surrogates (which no UTF-8 column can hold) escaped."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class Bad:
    """A quarantined record as a task sees it; ``pos`` is relative to the task (1-based line or
    row), the ingesting process turns it into a file position and an id."""

    pos: int
    reason: str
    message: str
    raw: str
    record_id: str | None
    raw_digest: bytes


def judge(rec: Any, params: RawDocumentsParams) -> tuple[dict[str, Any] | None, str | None, str, str | None]:
    """(row, reason, detail, record_id) for one parsed record; ``row`` is None when it is bad."""
    if not isinstance(rec, dict):
        return None, "not_an_object", f"record is a JSON {type(rec).__name__}", None
    record_id = _record_id(rec, params)
    if params.text_field not in rec or rec[params.text_field] is None:
        return None, "missing_text", f"no {params.text_field!r} field", record_id
    text = rec[params.text_field]
    if isinstance(text, bytes):  # a Parquet binary column
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid_utf8", f"{params.text_field!r} is not valid UTF-8", record_id
    if not isinstance(text, str):
        return None, "text_not_string", f"{params.text_field!r} is a {type(text).__name__}", record_id
    if not text.strip():
        return None, "empty_text", "text is empty or whitespace", record_id
    if params.max_chars is not None and len(text) > params.max_chars:
        return None, "text_too_long", f"text has {len(text)} characters, more than max_chars={params.max_chars}", \
            record_id
    if "\x00" in text:
        return None, "nul_byte", "text contains a NUL character", record_id
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None, "invalid_utf8", "text holds a lone surrogate (\\ud800-\\udfff), which is not UTF-8", record_id
    _, url, metadata = _fields(params)(rec)
    return {"record_id": record_id, "url": url, "text": text, "metadata": metadata}, None, "", record_id


def _record_id(rec: dict[str, Any], params: RawDocumentsParams) -> str | None:
    """A record object's id as its document row holds it (``as_id``; None: no id field)."""
    return as_id(rec.get(params.id_field)) if params.id_field else None


@functools.lru_cache(maxsize=16)
def _fields_reader(text_field: str, id_field: str | None, url_field: str | None
                   ) -> Callable[[dict[str, Any]], tuple[str | None, str | None, str | None]]:
    """``fields(rec)``: (record_id, url, metadata) of a record object as its document row holds
    them, the id and url through ``as_id``, every field but text, id and url as canonical JSON
    (None: there is none). The record rule and the block path both use it (``_fields``), so a
    block's rows are the record rule's. One function per source's field names, which it holds:
    read from the params for each record, they cost as much again as the rest (0.21 against 0.11 ms
    for 390 records)."""
    named = frozenset(f for f in (text_field, id_field, url_field) if f is not None)

    def fields(rec: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
        rid = rec.get(id_field) if id_field else None
        url = rec.get(url_field) if url_field else None
        # The usual record, those fields alone, has no metadata: one comparison of its keys, not a
        # dict built per record; and its id and url, ASCII strings or absent, are ``as_id``'s own,
        # taken with no call (0.84 us a record of the ~4 a short document costs in a block).
        if rec.keys() <= named:
            if (rid is None or (type(rid) is str and rid.isascii())) and \
                    (url is None or (type(url) is str and url.isascii())):
                return rid, url, None
            return as_id(rid), as_id(url), None
        meta = {k: v for k, v in rec.items() if k not in named}
        return as_id(rid), as_id(url), canonical(meta).decode()

    return fields


def _fields(params: RawDocumentsParams) -> Callable[[dict[str, Any]], tuple[str | None, str | None, str | None]]:
    """The ``fields(rec)`` of a source's params (``_fields_reader``)."""
    return _fields_reader(params.text_field, params.id_field, params.url_field)


def _needs_judge(texts: pa.Array, lengths: np.ndarray, max_chars: int | None) -> np.ndarray:
    """bool (n,): records the vectorized checks cannot pass for certain: no string text, a NUL,
    more than ``max_chars`` characters (``lengths``: int64 (n,), each text's), or a text that may
    be blank (it does not start, after ASCII whitespace, with a printable ASCII character, which
    ``str.strip`` never removes)."""
    careful = ~np.asarray(pc.fill_null(pc.match_substring_regex(texts, r"^\s*[!-~]"), False))
    data = texts.buffers()[2]
    if data is not None and len(data) and np.frombuffer(data, np.uint8).min() == 0:  # rare: find the rows
        careful |= np.asarray(pc.fill_null(pc.match_substring(texts, "\x00"), False))
    if max_chars is not None:
        careful |= lengths > max_chars
    return careful


def _lengths(texts: Iterable[Any], n: int) -> np.ndarray:
    """int64 (n,): the characters of each of ``n`` texts, 0 where one is not a ``str``: ``len``
    counts code points, as ``utf8_length`` would in their Arrow column, which costs more (0.15
    against 0.01 ms for 0.35 MB of text)."""
    return np.fromiter((len(t) if type(t) is str else 0 for t in texts), np.int64, n)


def _unbranched(recs: list[Any], params: RawDocumentsParams, fielded: bool
                ) -> tuple[list[str | None], list[str | None], list[str | None], list[bytes]] | None:
    """(ids, urls, metadata, digests) of a block's records where every one passes the
    vectorized checks (``Collect._block``), each a list comprehension, not a branch per record
    (a block of 390 short records, medians over 50 blocks in 15 alternated rounds, two runs: a
    Parquet batch 0.51-0.54 -> 0.42-0.46 ms, JSONL lines 1.26-1.31 -> 1.17-1.20 ms); the ids,
    urls and metadata only where ``fielded`` (else empty: the block's columns have them). None
    where any record raises (a value orjson reads but cannot write: nesting deeper than 254
    levels): the block then goes record by record, where the record rule says what each is."""
    dumps, digest, sort_keys = orjson.dumps, xxhash.xxh3_128_digest, orjson.OPT_SORT_KEYS
    try:
        digests = [digest(dumps(rec, option=sort_keys, default=str)) for rec in recs]
        if not fielded:
            return [], [], [], digests
        fields = _fields(params)
        got = [fields(rec) for rec in recs]
    except Exception:
        return None
    return [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], digests


def _no_fields(rec: dict[str, Any]) -> tuple[None, None, None]:
    """``Collect._block``'s ``fields`` where the block's ids and urls are columns already."""
    return None, None, None


class Collect:
    """What one task finds: good records as ``PARSED`` columns with their content digests, bad
    records, and the lines it read (to number lines across the tasks of one file)."""

    def __init__(self, params: RawDocumentsParams) -> None:
        self.params = params
        self.cols: dict[str, list[Any]] = {n: [] for n in PARSED.names}  # rows judged one at a time
        self.segments: list[pa.Table] = []  # PARSED tables, in input order
        self.positions: list[int] = []
        self.digests: list[bytes] = []
        self.bad: list[Bad] = []
        self.lines = 0
        self.blank = 0
        self.chars = 0

    def record(self, rec: Any, pos: int, raw: bytes | None = None, wrong_schema: str | None = None) -> None:
        """Judge one parsed record found at ``pos`` (task-relative line or row); ``raw`` is its
        input bytes, for the excerpt of a record that cannot be serialized; ``wrong_schema``: why
        the record's file cannot hold a text (quarantined as ``wrong_schema``, with its own id
        and excerpt)."""
        self._keep(self._judge_one(rec, pos, raw, wrong_schema), pos)

    def _keep(self, got: tuple[dict[str, Any], bytes] | None, pos: int) -> None:
        """A good row judged on its own (None: nothing, the record was quarantined)."""
        if got is None:
            return
        row, digest = got
        for name in ("record_id", "url", "text", "metadata"):
            self.cols[name].append(row[name])
        self.positions.append(pos)
        self.digests.append(digest)
        self.chars += len(row["text"])

    def _judge_one(self, rec: Any, pos: int, raw: bytes | None, wrong_schema: str | None = None
                   ) -> tuple[dict[str, Any], bytes] | None:
        """(row, content digest) of a good record; a bad one is added to ``bad`` (None)."""
        try:
            canon = canonical(rec)
        except Unserializable as exc:
            excerpt = (raw or b"")[:4 * RAW_EXCERPT]
            self.bad.append(Bad(pos, "too_deeply_nested", str(exc), excerpt.decode(errors="backslashreplace"),
                                None, xxhash.xxh3_128_digest(raw or b"")))
            return None
        row: dict[str, Any] | None
        reason: str | None
        record_id: str | None
        try:
            if wrong_schema is not None:
                rid = _record_id(rec, self.params) if isinstance(rec, dict) else None
                row, reason, detail, record_id = None, "wrong_schema", wrong_schema, rid
            else:
                row, reason, detail, record_id = judge(rec, self.params)
        except Exception as exc:  # a value no rule foresaw: this record only
            row, reason, detail, record_id = None, "invalid_record", f"{type(exc).__name__}: {exc}", None
        if row is None:
            assert reason is not None
            self.bad.append(Bad(pos, reason, detail, canon[:4 * RAW_EXCERPT].decode(errors="backslashreplace"),
                                record_id, xxhash.xxh3_128_digest(canon)))
            return None
        return row, xxhash.xxh3_128_digest(canon)

    def line(self, line: bytes | Overlong) -> None:
        """Judge one JSONL line (the file's first line without its byte-order mark)."""
        self.lines += 1
        self._keep(self._line(line, self.lines), self.lines)

    def _line(self, line: bytes | Overlong, pos: int) -> tuple[dict[str, Any], bytes] | None:
        """(row, content digest) of the good record on a line; anything else is counted (None)."""
        if isinstance(line, Overlong):
            self.bad.append(Bad(pos, "record_too_large", f"a line of {line.size} bytes, more than the "
                                f"{max_line_bytes(self.params)} bytes a record within max_chars can take",
                                line.head.decode(errors="backslashreplace"), None,
                                xxhash.xxh3_128_digest(line.head + str(line.size).encode())))
            return None
        line = line.rstrip(b"\r\n")
        if not line.strip():
            self.blank += 1
            return None
        rec, reason, detail = parse(line)
        if reason is not None:
            raw = line[:4 * RAW_EXCERPT].decode("utf-8", errors="backslashreplace")
            self.bad.append(Bad(pos, reason, detail, raw, None, xxhash.xxh3_128_digest(line)))
            return None
        return self._judge_one(rec, pos, line)

    def lines_block(self, lines: list[bytes]) -> None:
        """Judge JSONL lines (none ``Overlong``, the first without its byte-order mark) exactly as
        ``line`` judges each, with the texts moved as one Arrow column: what the block path
        cannot take (a line that is blank or does not parse, a record that is no object or has no
        string text, a lone surrogate anywhere) goes through ``line``, that line (or block) only."""
        texts: list[str | None] = []
        recs: list[Any] = []
        raws: list[bytes] = []
        parsed = 0
        loads = orjson.loads
        tf = self.params.text_field
        for line in lines:
            if line[-1:] == b"\r":
                line = line.rstrip(b"\r\n")
            rec = None
            if line and not line.isspace():  # bytes.isspace: what bytes.strip removes, all of it
                try:
                    rec = loads(line)
                    parsed += 1
                except orjson.JSONDecodeError:
                    pass
            text = rec.get(tf) if type(rec) is dict else None
            recs.append(rec)
            raws.append(line)
            texts.append(text if type(text) is str else None)
        column = None
        if parsed and sum(map(len, raws)) < FAST_BLOCK_BYTES:
            try:
                column = pa.array(texts, pa.string())
            except (UnicodeEncodeError, pa.ArrowException):  # a lone surrogate: not UTF-8
                column = None
        if column is None:
            for line in lines:
                self.line(line)
            return
        base = self.lines
        self.lines += len(lines)
        self._block(recs, column, base + 1, raws, _lengths(texts, len(texts)))

    def batch(self, recs: list[dict[str, Any]], text: pa.Array, pos: int,
              plain: tuple[pa.Array, pa.Array] | None = None) -> None:
        """Judge the records of one Parquet batch (rows ``pos ..``) exactly as ``record`` judges
        each, with ``text`` (their text column: string or large_string, valid UTF-8) moved as it is;
        ``recs`` hold its values as ``str`` (None where null). ``plain``: the batch's record ids and
        urls, where no record has metadata (``tasks.plain_fields``), taken as they are."""
        tf = self.params.text_field
        self._block(recs, text, pos, None, _lengths((rec[tf] for rec in recs), len(recs)), plain)

    def _block(self, recs: list[Any], texts: pa.Array, pos: int, lines: list[bytes] | None,
               lengths: np.ndarray, plain: tuple[pa.Array, pa.Array] | None = None) -> None:
        """Records ``recs`` found at ``pos, pos + 1, ..``; ``texts``: the string column of their
        texts (null where a record has no string text), ``lengths``: int64 (n,), the characters of
        each (0 where null); ``plain``: string (n,) each, their ids and urls as ``_fields`` gives
        them where none has metadata (a Parquet batch's columns), else None. A record every
        vectorized check passes (string text, not blank, no NUL, within ``max_chars``) is judged
        here, its fields taken by ``_fields`` unless ``plain`` has them (then it costs its
        canonical JSON and digest alone), the whole block at once where every record does
        (``_unbranched``); any other record by ``judge`` (the same rules, in their order, so the
        same reason, and the same ``as_id``)."""
        n = len(recs)
        careful_rows = _needs_judge(texts, lengths, self.params.max_chars)
        unbranched = None if careful_rows.any() else _unbranched(recs, self.params, plain is None)
        if unbranched is not None:
            good: Sequence[int] = range(n)  # rows of ``recs`` that are documents
            rids, urls, metas, digests = unbranched
            extra: dict[int, str] = {}  # texts ``texts`` lacks, by their row's place in ``good``
        else:
            good, rids, urls, metas, digests, extra = self._branched(recs, texts, pos, lines, careful_rows.tolist(),
                                                                     plain)
        if not good:
            return
        self._seal()
        # where each good row's text is: its row of ``texts``, or ``n + j`` for the j-th extra text
        take = good
        if extra:
            take = list(good)
            for j, at in enumerate(extra):
                take[at] = n + j
            texts = pa.concat_arrays([texts.cast(pa.large_string()), pa.array(list(extra.values()), pa.large_string())])
        whole = len(good) == n and not extra
        text = texts if whole else texts.take(pa.array(take, pa.int64()))
        if plain is None:
            columns = [pa.array(values, pa.string()) for values in (rids, urls, metas)]
        else:  # ``plain``'s rows of the good records (no extra text: not a JSONL block), no metadata
            columns = [c if whole else c.take(pa.array(good, pa.int64())) for c in plain]
            columns.append(pa.nulls(len(good), pa.string()))
        self.segments.append(pa.table({
            "record_id": columns[0], "url": columns[1], "text": text.cast(pa.large_string()), "metadata": columns[2],
        }, schema=PARSED))
        self.digests.extend(digests)
        if whole:
            self.positions.extend(range(pos, pos + n))
            self.chars += int(lengths.sum())
            return
        self.positions.extend(i + pos for i in good)
        taken = np.array(take, np.int64)
        self.chars += int(lengths[taken[taken < n]].sum()) + sum(map(len, extra.values()))

    def _branched(self, recs: list[Any], texts: pa.Array, pos: int, lines: list[bytes] | None, careful: list[bool],
                  plain: tuple[pa.Array, pa.Array] | None,
                  ) -> tuple[list[int], list[str | None], list[str | None], list[str | None], list[bytes],
                             dict[int, str]]:
        """``_block``'s records one at a time (``careful``: those the vectorized checks cannot
        pass): the rows of ``recs`` that are documents, their ids, urls, metadata (unused where
        ``plain`` has them) and digests, and the texts ``texts`` lacks, by their row's place among
        the documents."""
        good: list[int] = []
        extra: dict[int, str] = {}
        rids: list[str | None] = []
        urls: list[str | None] = []
        metas: list[str | None] = []
        digests: list[bytes] = []
        dumps, digest, sort_keys = orjson.dumps, xxhash.xxh3_128_digest, orjson.OPT_SORT_KEYS
        fields = _fields(self.params) if plain is None else _no_fields
        for i in range(len(recs)):
            rec = recs[i]
            if not careful[i]:  # a dict with a string text
                try:
                    canon = dumps(rec, option=sort_keys, default=str)
                    rid, url, meta = fields(rec)
                except Exception:  # anything unusual: the record rule says what it is
                    pass
                else:
                    good.append(i)
                    rids.append(rid)
                    urls.append(url)
                    metas.append(meta)
                    digests.append(digest(canon))
                    continue
            if lines is not None and rec is None:  # blank, or not orjson's JSON: the line rule
                got = self._line(lines[i], pos + i)
            else:
                got = self._judge_one(rec, pos + i, lines[i] if lines is not None else None)
            if got is not None:
                row, d = got
                if not texts[i].is_valid:  # a line json parsed and orjson did not
                    extra[len(good)] = row["text"]
                good.append(i)
                rids.append(row["record_id"])
                urls.append(row["url"])
                metas.append(row["metadata"])
                digests.append(d)
        return good, rids, urls, metas, digests, extra

    def _seal(self) -> None:
        """The rows collected one at a time so far, as a segment (to keep rows in input order)."""
        if self.cols["text"]:
            self.segments.append(pa.table({n: pa.array(self.cols[n], PARSED.field(n).type) for n in PARSED.names},
                                          schema=PARSED))
            self.cols = {n: [] for n in PARSED.names}

    def done(self, damage: dict[str, Any] | None = None) -> Done:
        self._seal()
        docs = pa.concat_tables(self.segments) if self.segments else PARSED.empty_table()
        return Done(docs, b"".join(self.digests), np.asarray(self.positions, np.int64), self.bad, self.lines,
                    self.blank, self.chars, damage)


def max_line_bytes(params: RawDocumentsParams) -> int | None:
    """Longest JSONL line read whole: a valid record within ``max_chars`` fits (a character is at
    most 12 bytes of JSON, a surrogate pair of ``\\u`` escapes), plus 1 MiB for other fields."""
    return None if params.max_chars is None else 12 * params.max_chars + (1 << 20)


@dataclass
class Done:
    """What one task found, ready for the ingesting process."""

    docs: pa.Table
    digests: bytes  # 16 bytes per row of docs: xxh3-128 of its canonical JSON
    positions: np.ndarray  # int64 (rows,): task-relative line or row of each row of docs
    bad: list[Bad] = field(default_factory=list)
    lines: int = 0
    blank: int = 0
    chars: int = 0
    damage: dict[str, Any] | None = None  # the file's damage, when this task found it
    spooled: str | None = None  # docs are in this Arrow IPC file instead (``stages.ingest.spool``)
