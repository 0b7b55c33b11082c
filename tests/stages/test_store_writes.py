"""How the partition writer writes parts: codecs, what gets dictionaries and statistics, and the
fsyncs of a commit (one per part the manifest names, none for parts it does not)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.store import FINAL_COMPRESSION, MANIFEST, Manifest, Store, intermediate_compression


def _manifest() -> Manifest:
    return Manifest(program="p", params_key="k", data_version="v", crawl="c", source="s", params={})


def _docs(n: int) -> pa.Table:
    return pa.table({
        "doc_id": pa.array([f"{i:032x}" for i in range(n)], pa.string()),
        "source": pa.array(["s"] * n, pa.string()),
        "text": pa.array([f"text number {i} " * 20 for i in range(n)], pa.large_string()),
        "node": pa.array([i % 7 for i in range(n)], pa.int64()),
        "url": pa.array([f"https://example.org/{i}" for i in range(n)], pa.string()),
    })


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files and folders fsynced from now on, in order."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_intermediates_and_outputs_get_their_codecs_and_long_columns_no_dictionary(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    w = store.writer(pdir)
    w.write("t", _docs(50))
    w.compression = FINAL_COMPRESSION
    w.write("t", _docs(50))
    w.commit(_manifest())
    first, second = (pq.ParquetFile(f"{pdir}/{name}").metadata.row_group(0) for name in w.tables["t"])
    codecs = [[first.column(i).compression for i in range(5)], [second.column(i).compression for i in range(5)]]
    assert codecs == [["UNCOMPRESSED"] * 5, [FINAL_COMPRESSION.upper()] * 5]  # intermediates: none on a local root
    doc_id, source, text, node = (first.column(i) for i in range(4))
    assert source.statistics is not None and source.statistics.has_min_max and "RLE_DICTIONARY" in source.encodings
    assert node.statistics is not None and "RLE_DICTIONARY" not in node.encodings  # numbers: no dictionary
    assert doc_id.statistics is None and text.statistics is None
    assert "RLE_DICTIONARY" not in doc_id.encodings and "RLE_DICTIONARY" not in text.encodings
    url = first.column(4)  # a value per row, as record ids and locators: no dictionary, no statistics
    assert url.statistics is None and "RLE_DICTIONARY" not in url.encodings
    assert pq.read_table(f"{pdir}/{w.tables['t'][0]}").equals(_docs(50))


def test_intermediates_are_lz4_on_object_storage_and_the_setting_overrides_auto(tmp_path: Path) -> None:
    local, remote = Store(str(tmp_path / "root")), Store("memory://codec-root")
    assert [intermediate_compression(local), intermediate_compression(remote)] == ["none", "lz4"]
    assert [local.writer(local.partition_dir("p", "k", "c", "s")).compression,
            remote.writer(remote.partition_dir("p", "k", "c", "s")).compression] == ["none", "lz4"]
    assert intermediate_compression(local, "zstd") == intermediate_compression(remote, "zstd") == "zstd"


def test_the_workdirs_setting_picks_the_codec_of_a_programs_parts(tmp_path: Path) -> None:
    from stages.execute import execute
    from stages.params import ExecutionParams, ExecutionTuning, RawDocumentsParams
    from stages.spec import CrawlSpec

    (tmp_path / "in.jsonl").write_text("".join(f'{{"id": "{i}", "text": "document {i}"}}\n' for i in range(5)))
    spec = CrawlSpec(crawl="c", sources={"s": RawDocumentsParams(url=str(tmp_path / "in.jsonl"))})
    execution = ExecutionTuning.model_validate({"intermediate_compression": "snappy"}).apply(ExecutionParams())
    store = Store(str(tmp_path / "root"))
    manifest = execute(store, spec, "raw_documents", "s", execution).manifest
    pdir = store.partition_dir("raw_documents", manifest.params_key, "c", "s")
    (part,) = manifest.tables["documents"]
    meta = pq.ParquetFile(f"{pdir}/{part}").metadata.row_group(0)
    assert {meta.column(i).compression for i in range(meta.num_columns)} == {"SNAPPY"}
    assert pq.read_table(f"{pdir}/{part}")["text"].to_pylist() == [f"document {i}" for i in range(5)]


def test_a_commit_fsyncs_only_the_parts_its_manifest_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    synced = _fsyncs(monkeypatch)
    w = store.writer(pdir)
    w.write("first", _docs(3))  # rewritten below: never named by a manifest
    w.write("first", _docs(3))
    assert synced == []  # nothing while the program computes
    w.write("checked", _docs(2))
    w.rename("checked", "first")
    w.commit(_manifest())
    parts = w.tables["first"]
    assert synced[:len(parts) + 1] == [*parts, pdir.rsplit("/", 1)[-1]]
    assert synced[len(parts) + 1].startswith(f".{MANIFEST}.") and len(synced) == len(parts) + 3 == w.fsyncs


def test_a_table_with_no_rows_has_no_part_and_reads_with_its_schema(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A table that gets no rows writes no Parquet file and costs no fsync: the manifest holds its
    schema, and reading it gives an empty table of that schema, whole or by columns. Rows written
    after an empty write are parts as before; a schema that is not one is a damaged manifest."""
    from stages.errors import DamagedFile

    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    synced = _fsyncs(monkeypatch)
    w = store.writer(pdir)
    w.write("removed", _docs(0))
    w.write("removed", _docs(0))
    assert w.read("removed", ["doc_id"]).equals(_docs(0).select(["doc_id"]))
    w.commit(_manifest())
    assert sorted(os.listdir(pdir)) == [MANIFEST] and w.fsyncs == 2 == len(synced)  # the temporary, the folder
    manifest = store.read_manifest(pdir)
    assert manifest is not None and manifest.tables == {"removed": []} and manifest.rows == {"removed": 0}
    assert manifest.schema("removed") == _docs(0).schema
    assert store.read_table(pdir, "removed").equals(_docs(0))
    assert store.read_table(pdir, "removed", ["text"]).schema == _docs(0).select(["text"]).schema
    assert list(store.iter_batches(pdir, "removed")) == []

    w = store.writer(pdir)
    w.write("documents", _docs(0))
    w.write("documents", _docs(3))
    w.write("removed", _docs(0))
    w.commit(_manifest())
    manifest = store.read_manifest(pdir)
    assert manifest is not None and len(manifest.tables["documents"]) == 1 and manifest.tables["removed"] == []
    assert set(manifest.schemas) == {"removed"} and store.read_table(pdir, "documents").equals(_docs(3))
    monkeypatch.undo()

    path = Path(pdir) / MANIFEST
    path.write_text(path.read_text().replace(manifest.schemas["removed"], "bm90IGEgc2NoZW1h"))
    with pytest.raises(DamagedFile, match="schema of table 'removed' is not an Arrow schema"):
        store.read_manifest(pdir)


def test_a_manifest_written_before_schemas_reads_its_empty_parts(tmp_path: Path) -> None:
    """Before a table with no rows had no part, it had an empty one and the manifest no
    ``schemas``: read with that part's schema. A manifest without an empty table writes no
    ``schemas`` (earlier versions refuse a field they do not know)."""
    store = Store(str(tmp_path / "root"))
    pdir = store.partition_dir("p", "k", "c", "s")
    os.makedirs(pdir)
    pq.write_table(_docs(0), f"{pdir}/removed-old-00000.parquet")
    old = _manifest()
    old.tables, old.rows = {"removed": ["removed-old-00000.parquet"]}, {"removed": 0}
    text = old.to_json()
    assert '"schemas"' not in text
    (Path(pdir) / MANIFEST).write_text(text)
    manifest = store.read_manifest(pdir)
    assert manifest is not None and manifest.schemas == {} and manifest.schema("removed") is None
    assert store.read_table(pdir, "removed").equals(_docs(0))
    assert store.read_table(pdir, "removed", ["doc_id", "gone"]).column_names == ["doc_id"]


def _staged_pair(store: Store) -> tuple[str, str]:
    """Two partitions: the first committed once before (its old manifest), the second never."""
    first, second = (store.partition_dir("p", "k", "c", s) for s in ("s1", "s2"))
    old = store.writer(first)
    old.write("documents", _docs(1))
    old.commit(_manifest())
    return first, second


def test_commits_made_together_are_published_together_parts_first(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Within ``commits_together`` a commit that asks for it is staged: nothing is renamed and no
    other attempt can take the partition until the block ends, while this process reads its new
    manifest. At the end, in this order: every part, its folder and every manifest temporary
    synced, the renames, the folders synced again (here an fsync each: no ``syncfs``); then the
    unnamed parts removed and the partitions released."""
    import stages.store as store_module
    from stages.store import PartitionBusy, commits_together

    store = Store(str(tmp_path / "root"))
    first, second = _staged_pair(store)
    old_parts = store.read_manifest(first).parts()  # type: ignore[union-attr]
    monkeypatch.setattr(store_module, "_libc", lambda: None)  # no syncfs: each fsync seen
    synced = _fsyncs(monkeypatch)  # fsyncs and renames, in one order
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (synced.append(f"rename {Path(a).name}"), real_replace(a, b)))
    with commits_together(store):
        writers = []
        for pdir, rows in ((first, 2), (second, 3)):
            w = store.writer(pdir)
            w.write("documents", _docs(rows))
            w.write("removed", _docs(0))
            w.commit(_manifest(), together=True)
            writers.append(w)
        assert synced == [] and not (Path(second) / MANIFEST).exists()
        assert store.read_manifest(first).rows == {"documents": 2, "removed": 0}  # type: ignore[union-attr]
        on_disk = Manifest.from_json((Path(first) / MANIFEST).read_text(), first)  # what other processes read
        assert on_disk.rows == {"documents": 1}
        with pytest.raises(PartitionBusy):
            Store(store.root).writer(second)
    renames = [i for i, name in enumerate(synced) if name.startswith("rename ")]
    temporaries = [synced[i].removeprefix("rename ") for i in renames]
    assert len(renames) == 2 and all(t.startswith(f".{MANIFEST}.") for t in temporaries)
    parts = [n for w in writers for n in w.tables["documents"]]
    assert sorted(synced[:renames[0]]) == sorted([*parts, "s1", "s2", *temporaries])  # all before any rename
    assert renames == [len(parts) + 4, len(parts) + 5] and synced[renames[-1] + 1:] == ["s1", "s2"]
    assert [w.fsyncs for w in writers] == [0, 0]
    fresh = Store(store.root)
    for w, rows in zip(writers, (2, 3), strict=True):
        assert fresh.read_table(w.pdir, "documents").equals(_docs(rows))
        assert sorted(os.listdir(w.pdir)) == sorted([MANIFEST, *w.tables["documents"]])  # old part removed
        fresh.writer(w.pdir).close()  # released
    assert not set(old_parts) & set(os.listdir(first))


def test_commits_made_together_sync_once_with_syncfs_on_the_root_opened_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the C library's ``syncfs`` (Linux 5.8 or later) on a filesystem that honours it: two
    calls for the whole block, before the renames and after, on the data root opened before
    anything was staged (its ``syncfs`` reports a write error since), no fsync. On another
    filesystem, and on an older kernel (whose ``syncfs`` reports no write error): an fsync each."""
    import stages.store as store_module
    from stages.store import commits_together

    store = Store(str(tmp_path / "root"))
    os.makedirs(store.root)
    fd = store_module._syncfs_root(store.root)
    if fd is None:
        pytest.skip("no syncfs to trust here (not Linux 5.8 or later, or not ext4, XFS, Btrfs, F2FS, tmpfs)")
    os.close(fd)
    libc, calls = store_module._libc(), []

    class Recording:
        fstatfs = libc.fstatfs

        def syncfs(self, fd: int) -> int:
            calls.append(os.readlink(f"/proc/self/fd/{fd}"))
            return int(libc.syncfs(fd))

    cached = store_module._libc
    monkeypatch.setattr(store_module, "_libc", Recording)
    synced = _fsyncs(monkeypatch)
    with commits_together(store):
        for source in ("s1", "s2", "s3"):
            w = store.writer(store.partition_dir("p", "k", "c", source))
            w.write("documents", _docs(2))
            w.commit(_manifest(), together=True)
    assert calls == [store.root, store.root] and synced == []
    assert all(Store(store.root).read_table(store.partition_dir("p", "k", "c", s), "documents").num_rows == 2
               for s in ("s1", "s2", "s3"))
    monkeypatch.setattr(store_module, "_SYNCFS_FILESYSTEMS", set())  # a filesystem syncfs is not trusted on
    with commits_together(store):
        w = store.writer(store.partition_dir("p", "k", "c", "s4"))
        w.write("documents", _docs(2))
        w.commit(_manifest(), together=True)
    assert len(calls) == 2 and sorted(synced) == sorted([*w.tables["documents"], "s4", "s4", synced[2]])
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "h", "5.4.0-150-generic", "", "x86_64")))
    assert cached.__wrapped__() is None


def test_a_block_that_fails_still_publishes_and_a_failed_publish_keeps_the_old_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What was staged before an error in the block is published at its end. An error while
    publishing raises ``PublishFailed`` naming the manifests not renamed: such a partition keeps
    its earlier manifest, is released, and its next attempt removes what the failed one left; one
    renamed before the error is committed. A commit that does not ask to be staged, and a commit
    on object storage, are published at once. Removing unnamed parts after a publish is best
    effort."""
    from stages.store import PublishFailed, commits_together

    store = Store(str(tmp_path / "root"))
    first, second = _staged_pair(store)
    with pytest.raises(RuntimeError, match="the program failed"), commits_together(store):
        w = store.writer(second)
        w.write("documents", _docs(3))
        w.commit(_manifest(), together=True)
        raise RuntimeError("the program failed")
    assert Store(store.root).read_table(second, "documents").equals(_docs(3))

    real_replace = os.replace
    renamed: list[str] = []

    def second_fails(a: str, b: str) -> None:
        if renamed:
            raise OSError("disk gone")
        renamed.append(b)
        real_replace(a, b)

    third = store.partition_dir("p", "k", "c", "s3")
    with pytest.raises(PublishFailed, match="disk gone") as failed, commits_together(store):
        for pdir, rows in ((third, 6), (first, 5)):
            w = store.writer(pdir)
            w.write("documents", _docs(rows))
            w.commit(_manifest(), together=True)
        plain = store.writer(second)
        plain.write("documents", _docs(4))
        plain.commit(_manifest())  # not staged: published at once
        monkeypatch.setattr(os, "replace", second_fails)
    monkeypatch.setattr(os, "replace", real_replace)
    assert [m.rows for m in failed.value.unpublished] == [{"documents": 5}]
    fresh = Store(store.root)
    assert fresh.read_table(third, "documents").equals(_docs(6))  # renamed before the error
    assert fresh.read_table(first, "documents").equals(_docs(1))
    assert fresh.read_table(second, "documents").equals(_docs(4))
    again = fresh.writer(first)  # released; what the failed attempt left is removed
    assert any(n.startswith(f".{MANIFEST}.") for n in again.leftovers) and len(again.leftovers) == 2
    again.close()

    import stages.store as store_module

    # The folders' sync after the renames fails: renamed, not durable, so none is published.
    real_sync = store_module._sync
    monkeypatch.setattr(store_module, "_sync", lambda paths, fd: (_ for _ in ()).throw(OSError("late"))
                        if all(not Path(p).is_file() for p in paths) else real_sync(paths, fd))
    with pytest.raises(PublishFailed, match="late") as failed, commits_together(store):
        for pdir in (third, first):
            w = store.writer(pdir)
            w.write("documents", _docs(8))
            w.commit(_manifest(), together=True)
    assert len(failed.value.unpublished) == 2
    # The block's own error (an interrupt) is the one told, not one publishing.
    monkeypatch.setattr(store_module, "_sync", lambda paths, fd: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(KeyboardInterrupt), commits_together(store):
        w = store.writer(first)
        w.write("documents", _docs(9))
        w.commit(_manifest(), together=True)
        raise KeyboardInterrupt
    monkeypatch.setattr(store_module, "_sync", real_sync)

    def cannot(self: object) -> None:
        raise OSError("read-only")

    real_remove = store_module.PartitionWriter._remove_unnamed
    monkeypatch.setattr(store_module.PartitionWriter, "_remove_unnamed", cannot)
    with commits_together(store):
        w = store.writer(first)
        w.write("documents", _docs(7))
        w.commit(_manifest(), together=True)
    assert Store(store.root).read_table(first, "documents").equals(_docs(7))
    monkeypatch.setattr(store_module.PartitionWriter, "_remove_unnamed", real_remove)

    memory = Store("memory://together-test/root")
    with commits_together(memory) as group:
        assert group is None
        w = memory.writer(memory.partition_dir("p", "k", "c", "s"))
        w.write("documents", _docs(2))
        w.commit(_manifest(), together=True)
        assert Store("memory://together-test/root").read_manifest(w.pdir) is not None
