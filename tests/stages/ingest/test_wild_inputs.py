"""Inputs from the wild (issue: nothing lost, nothing stale): every record that parses is judged
on its own, every file is read or refused, damage is reported (never hidden in a quarantine row),
the store's transient errors are retried, and a file's fingerprint sees every change.
"""

from __future__ import annotations

import bz2
import gzip
import http.server
import json
import logging
import lzma
import os
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from stages.dataroot import DataRoot
from stages.execute import execute
from stages.ingest import streams
from stages.ingest.files import UnsupportedFileError, fingerprint
from stages.ingest.streams import InputReadError
from stages.params import ExecutionParams, RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import Store

PROSE = "A perfectly ordinary sentence about the weather, which was fine."


def rec(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"r{i}", "text": f"{PROSE} Number {i}.", **extra}


def jsonl(*records: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


class Got:
    def __init__(self, store: Store, spec: CrawlSpec, source: str) -> None:
        execution = ExecutionParams(batch_rows=50, workers=1)
        self.report = execute(store, spec, "raw_documents", source, execution).manifest.report
        pdir = DataRoot(store).output_dir(spec, "raw_documents", source)
        self.docs = store.read_table(pdir, "documents").to_pylist()
        self.bad = store.read_table(pdir, "quarantine").to_pylist()

    @property
    def reasons(self) -> Counter[str]:
        return Counter(b["reason"] for b in self.bad)


def ingest(tmp_path: Path, url: str | Path, **params: Any) -> Got:
    spec = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(url), **params)})
    return Got(Store(str(tmp_path / "data")), spec, "s")


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    compress = {".gz": lambda d: gzip.compress(d, mtime=0), ".bz2": bz2.compress, ".xz": lzma.compress}
    if path.suffix == ".lz4":
        import lz4.frame

        data = lz4.frame.compress(data)
    elif path.suffix == ".zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    elif path.suffix in compress:
        data = compress[path.suffix](data)
    path.write_bytes(data)
    return path


# --- every record that parses is judged on its own ------------------------------------------------


def deep(levels: int) -> bytes:
    return b'{"id": "deep", "text": "nested", "m": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst"])
def test_a_deeply_nested_record_costs_no_neighbour(tmp_path: Path, name: str) -> None:
    lines: list[Any] = [rec(i) for i in range(1000)] + [deep(300)] + [rec(i) for i in range(1000, 2000)]
    lines.insert(1500, deep(100_000))  # beyond any parser's recursion limit
    write(tmp_path / "in" / name, jsonl(*lines))
    got = ingest(tmp_path, tmp_path / "in" / name)
    assert got.report["input"] == 2002 and not got.report["damaged_files"]
    assert len(got.docs) == 2001  # the 300-level record is a document like any other
    assert got.reasons == {"too_deeply_nested": 1}
    assert got.bad[0]["detail"].startswith(f"{name}:1501: ")
    assert {d["record_id"] for d in got.docs} == {f"r{i}" for i in range(2000)} | {"deep"}


def test_big_integers_nan_infinity_and_lone_surrogates(tmp_path: Path) -> None:
    lines = [
        b'{"id": 123456789012345678901234567890, "text": "' + PROSE.encode() + b'", "n": 1e999}',
        b'{"id": "nan", "text": "' + PROSE.encode() + b' nan", "score": NaN, "x": -Infinity}',
        b'{"id": "sur", "text": "broken \\ud800 surrogate"}',
        b'{"id": "meta-sur", "text": "' + PROSE.encode() + b' meta", "note": "\\udfff"}',
        jsonl(rec(1)).strip(),
    ]
    got = ingest(tmp_path, write(tmp_path / "a.jsonl", jsonl(*lines)))
    by_id = {d["record_id"]: d for d in got.docs}
    assert set(by_id) == {"123456789012345678901234567890", "nan", "meta-sur", "r1"}
    assert json.loads(by_id["nan"]["metadata"]) == {"score": None, "x": None}
    assert got.reasons == {"invalid_utf8": 1} and got.bad[0]["record_id"] == "sur"
    assert got.report["input"] == 5


def test_ids_1_and_string_1_name_the_same_record_in_jsonl_and_parquet(tmp_path: Path) -> None:
    write(tmp_path / "j" / "a.jsonl", jsonl({"id": 1, "text": PROSE}, {"id": "1", "text": PROSE + " Other."}))
    got = ingest(tmp_path / "j", tmp_path / "j" / "a.jsonl")
    assert got.reasons == {"duplicate_record_id": 1}
    assert [d["record_id"] for d in got.docs] == ["1"]
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": [PROSE, PROSE + " Two."]}), tmp_path / "p" / "a.parquet")
    assert sorted(d["record_id"] for d in ingest(tmp_path / "p", tmp_path / "p" / "a.parquet").docs) == ["1", "2"]


def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf" + jsonl(rec(0), rec(1))
    for name in ("bom.jsonl", "bom.jsonl.gz"):
        got = ingest(tmp_path / name, write(tmp_path / name / name, data))
        assert [d["record_id"] for d in got.docs] == ["r0", "r1"] and not got.bad
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "utf16.jsonl").write_bytes(b"\xff\xfe" + json.dumps(rec(0)).encode("utf-16-le"))
    with pytest.raises(UnsupportedFileError, match=r"utf16\.jsonl: UTF-16"):
        ingest(tmp_path / "w", tmp_path / "w" / "utf16.jsonl")


@pytest.mark.parametrize("kind", ["dictionary", "large_string", "string_view", "binary"])
def test_parquet_text_columns_of_every_string_type(tmp_path: Path, kind: str) -> None:
    texts = [f"{PROSE} {i % 3}" for i in range(9)]
    arrays = {"dictionary": pa.array(texts).dictionary_encode(), "large_string": pa.array(texts, pa.large_string()),
              "string_view": pa.array(texts, pa.string_view()),
              "binary": pa.array([t.encode() for t in texts], pa.binary())}
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(9)), "text": arrays[kind]}), tmp_path / "in" / "a.parquet")
    got = ingest(tmp_path, tmp_path / "in" / "a.parquet")
    assert [d["text"] for d in got.docs] == texts and not got.bad
    assert [d["locator"] for d in got.docs] == [f"a.parquet#{i}" for i in range(1, 10)]


def test_parquet_values_python_cannot_hold_cost_only_their_row(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    stamps = pa.array([0, 253402300800 * 10**6], pa.timestamp("us"))  # 1970, and year 10000 (no datetime)
    pq.write_table(pa.table({"text": [PROSE, PROSE + " Later."], "at": stamps}), tmp_path / "in" / "t.parquet")
    got = ingest(tmp_path, tmp_path / "in" / "t.parquet")
    assert len(got.docs) == 2 and not got.bad


# --- every input file is read or refused ---------------------------------------------------------------


def test_every_compression_is_read_and_anything_else_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    names = ["a.jsonl", "b.jsonl.bz2", "c.jsonl.gz", "d.jsonl.xz", "e.jsonl.lz4", "f.jsonl.zst", "g.ndjson.gz"]
    for i, name in enumerate(names):
        write(src / name, jsonl(rec(2 * i), rec(2 * i + 1)))
    write(src / "_SUCCESS", b"")
    write(src / ".hidden" / "x.jsonl", jsonl(rec(99)))
    got = ingest(tmp_path, src)
    assert sorted(d["record_id"] for d in got.docs) == sorted(f"r{i}" for i in range(14))
    assert got.report["files"] == len(names)
    assert got.report["ignored_files"] == 2 and sorted(got.report["ignored_examples"]) == [".hidden/x.jsonl",
                                                                                           "_SUCCESS"]
    write(src / "notes.csv", b"a,b\n")
    with pytest.raises(UnsupportedFileError, match=r"^notes.csv: neither JSONL nor Parquet"):
        ingest(tmp_path / "again", src)


def test_multi_frame_and_multi_member_files_are_read_whole(tmp_path: Path) -> None:
    import lz4.frame
    import zstandard

    parts = [jsonl(*(rec(10 * k + i) for i in range(10))) for k in range(3)]
    blobs = {"m.jsonl.zst": b"".join(zstandard.ZstdCompressor().compress(p) for p in parts),
             "m.jsonl.gz": b"".join(gzip.compress(p, mtime=0) for p in parts),
             "m.jsonl.bz2": b"".join(bz2.compress(p) for p in parts),
             "m.jsonl.xz": b"".join(lzma.compress(p) for p in parts),
             "m.jsonl.lz4": b"".join(lz4.frame.compress(p) for p in parts)}
    for name, blob in blobs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / name).write_bytes(blob)
        got = ingest(tmp_path / name, tmp_path / name / name)
        assert len(got.docs) == 30, name


# --- damage is reported, the store's errors retried ---------------------------------------------------


class Flaky(MemoryFileSystem):
    """A memory filesystem whose files fail ``fail`` reads with ``error``, then work (or vanish)."""

    protocol = "flaky"
    fail = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.removeprefix(f"{cls.protocol}://")))

    error: type[Exception] = ConnectionResetError
    reads = 0

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        fh = super()._open(path, mode, **kwargs)
        if "r" not in mode:
            return fh
        owner = type(self)
        inner = fh.read

        def read(n: int = -1) -> bytes:
            owner.reads += 1
            if owner.fail > 0:
                owner.fail -= 1
                raise owner.error("connection reset by peer" if owner.error is ConnectionResetError else path)
            return bytes(inner(n))

        fh.read = read
        return fh


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Flaky]]:
    fsspec.register_implementation("flaky", Flaky, clobber=True)
    monkeypatch.setattr(streams, "RETRY_DELAY", 0.001)
    Flaky.store = {}
    Flaky.pseudo_dirs = [""]
    Flaky.fail, Flaky.reads, Flaky.error = 0, 0, ConnectionResetError
    yield Flaky


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.parquet"])
def test_transient_read_errors_are_retried_and_the_result_is_whole(tmp_path: Path, flaky: type[Flaky],
                                                                   name: str) -> None:
    fs = flaky()
    records = [rec(i) for i in range(300)]
    if name.endswith(".parquet"):
        path = tmp_path / "a.parquet"
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=50)
        data = path.read_bytes()
    else:
        data = jsonl(*records)
        data = gzip.compress(data, mtime=0) if name.endswith(".gz") else data
    fs.pipe(f"/src/{name}", data)
    flaky.fail = 2
    got = ingest(tmp_path, f"flaky:///src/{name}")
    assert [d["record_id"] for d in got.docs] == [r["id"] for r in records]
    assert not got.bad and not got.report["damaged_files"] and flaky.fail == 0


@pytest.mark.parametrize("error", [ConnectionResetError, FileNotFoundError, PermissionError])
def test_a_store_that_keeps_failing_fails_the_partition_in_one_line(tmp_path: Path, flaky: type[Flaky],
                                                                    error: type[Exception]) -> None:
    flaky().pipe("/src/a.jsonl.gz", gzip.compress(jsonl(*(rec(i) for i in range(50))), mtime=0))
    flaky.fail, flaky.error = 10**6, error
    with pytest.raises(InputReadError) as err:
        ingest(tmp_path, "flaky:///src/a.jsonl.gz")
    message = str(err.value)
    assert message.startswith(f"a.jsonl.gz: {error.__name__}") and "\n" not in message
    attempts = 1 if error is PermissionError else streams.READ_ATTEMPTS
    assert flaky.reads == attempts and (attempts == 1 or f"after {attempts} attempts" in message)


# --- fingerprints see every change ----------------------------------------------------------------


def test_a_local_rewrite_with_the_same_size_and_mtime_changes_the_fingerprint(tmp_path: Path) -> None:
    path = write(tmp_path / "src" / "a.jsonl", jsonl(rec(1)))
    params = RawDocumentsParams(url=str(tmp_path / "src"))
    before, st = fingerprint(params), path.stat()
    path.write_bytes(jsonl(rec(2)))  # cp -p: same size, same inode, mtime restored
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert fingerprint(params) != before
    middle = fingerprint(params)
    tmp = tmp_path / "src" / ".a.jsonl.tmp"  # rsync -a: a new file renamed over the old one
    tmp.write_bytes(jsonl(rec(3)))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    tmp.replace(path)
    assert fingerprint(params) != middle
    assert fingerprint(params) == fingerprint(params)


def test_a_partition_lists_its_source_once_and_a_rerun_sees_a_new_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its data version and its run read one listing (the version names the files the run read);
    the next run lists again, so a file added since is fingerprinted and ingested."""
    from stages.ingest import files

    listed: list[str] = []
    real = files._list_files
    monkeypatch.setattr(files, "_list_files", lambda params: listed.append(params.url) or real(params))
    write(tmp_path / "src" / "a.jsonl", jsonl(rec(1), rec(2)))
    spec = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(tmp_path / "src"))})
    store = Store(str(tmp_path / "data"))
    first = execute(store, spec, "raw_documents", "s")
    assert len(listed) == 1 and first.manifest.rows["documents"] == 2
    write(tmp_path / "src" / "b.jsonl", jsonl(rec(3)))
    second = execute(store, spec, "raw_documents", "s")
    assert len(listed) == 2 and not second.skipped and second.manifest.rows["documents"] == 3
    assert second.manifest.data_version != first.manifest.data_version
    third = execute(store, spec, "raw_documents", "s")
    assert len(listed) == 3 and third.skipped  # listed once to know it is current
    assert fingerprint(spec.sources["s"]) == fingerprint(spec.sources["s"]) and len(listed) == 5  # outside: each time


class _Shaped(MemoryFileSystem):
    """A memory filesystem whose ``info`` carries one object store's identity fields."""

    fields: ClassVar[dict[str, Any]] = {}

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.removeprefix(f"{cls.protocol}://")))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        out = dict(super().info(path, **kwargs))
        if out.get("type") == "file":
            out.update(self.fields.get(self._strip_protocol(path), {}))
        return out

    def find(self, path: str, *args: Any, detail: bool = False, **kwargs: Any) -> Any:
        found = super().find(path, *args, detail=True, **kwargs)
        for p, info in found.items():
            info.update(self.fields.get(p, {}))
        return found if detail else sorted(found)


class GcsShaped(_Shaped):
    protocol = "gcsshaped"  # gcsfs: generation, md5Hash, crc32c, etag


class AdlShaped(_Shaped):
    protocol = "adlshaped"  # adlfs: lower-case etag, last_modified


class Bare(_Shaped):
    protocol = "bare"  # no identity field at all: a content hash


@pytest.mark.parametrize(("cls", "before", "after"), [
    (GcsShaped, {"generation": "1", "md5Hash": "aaa", "etag": "CAE="}, {"generation": "2", "md5Hash": "bbb",
                                                                         "etag": "CAI="}),
    (AdlShaped, {"etag": '"0x8D1"', "last_modified": "x"}, {"etag": '"0x8D2"', "last_modified": "x"}),
    (Bare, {}, {}),
])
def test_object_store_fingerprints_follow_their_identity_fields(cls: type[_Shaped], before: dict[str, Any],
                                                                after: dict[str, Any]) -> None:
    fsspec.register_implementation(cls.protocol, cls, clobber=True)
    fs = cls()
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    cls.fields = {"/src/a.jsonl": before}
    fs.pipe("/src/a.jsonl", jsonl(rec(1)))
    params = RawDocumentsParams(url=f"{cls.protocol}:///src")
    first = fingerprint(params)
    fs.pipe("/src/a.jsonl", jsonl(rec(2)))  # same size
    cls.fields = {"/src/a.jsonl": after}
    assert fingerprint(params) != first


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, bool]]]:
    """A local HTTP server over a folder; ``etag["on"]`` switches the ETag header."""
    root = tmp_path_factory.mktemp("http")
    etag = {"on": True}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def end_headers(self) -> None:
            if etag["on"]:
                path = Path(self.translate_path(self.path))
                if path.is_file():
                    self.send_header("ETag", f'"{hash(path.read_bytes()) & 0xFFFFFFFF:x}"')
            super().end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}", etag
    finally:
        server.shutdown()


@pytest.mark.parametrize("with_etag", [True, False])
def test_http_fingerprints_use_the_etag_or_the_content(http_root: tuple[Path, str, dict[str, bool]],
                                                       with_etag: bool) -> None:
    root, base, etag = http_root
    etag["on"] = with_etag
    path = write(root / f"e{with_etag}.jsonl", jsonl(rec(1)))
    st = path.stat()
    params = RawDocumentsParams(url=f"{base}/{path.name}")
    first = fingerprint(params)
    path.write_bytes(jsonl(rec(2)))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same Last-Modified, same size
    assert fingerprint(params) != first


@pytest.fixture(scope="module")
def s3_fs() -> Iterator[Any]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
            fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = f"http://{host}:{port}"
            fs = fsspec.filesystem("s3", skip_instance_cache=True)
            fs.mkdir("wild")
            yield fs
            fsspec.config.conf.clear()
            fsspec.config.conf.update(saved)
        finally:
            server.stop()


def test_s3_fingerprints_follow_the_etag(s3_fs: Any) -> None:
    s3_fs.pipe("wild/src/a.jsonl", jsonl(rec(1)))
    params = RawDocumentsParams(url="s3://wild/src")
    first = fingerprint(params)
    s3_fs.pipe("wild/src/a.jsonl", jsonl(rec(2)))  # same size, a new ETag
    assert fingerprint(params) != first


def test_s3_sources_are_read_with_every_compression(tmp_path: Path, s3_fs: Any) -> None:
    for name in ("a.jsonl.bz2", "b.jsonl.zst", "c.jsonl"):
        local = write(tmp_path / name, jsonl(rec(ord(name[0]))))
        s3_fs.put_file(str(local), f"wild/mixed/{name}")
    got = ingest(tmp_path, "s3://wild/mixed")
    assert sorted(d["record_id"] for d in got.docs) == ["r97", "r98", "r99"]
    shutil.rmtree(tmp_path / "data")
