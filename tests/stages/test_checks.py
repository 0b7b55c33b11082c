"""Check verdicts with no Dagster (``stages.checks``): a crawl run by ``stages.execute`` is judged
by every check kind that applies to its partitions, in a process that never imports Dagster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS, ChecksConfig, NotMaterialized, Verdict, evaluate_over_deletion
from stages.params import RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store
from tests.support.counting import count_params_validations

ROOT = Path(__file__).resolve().parents[2]
DOCS = 400  # per source, every text twice: exact dedup removes half of each


def _crawl(folder: Path) -> CrawlSpec:
    sources = {}
    for name in ("a", "b"):
        src = folder / "in" / name
        src.mkdir(parents=True)
        lines = [json.dumps({"id": f"{name}{i}", "text": f"{name} document number {i // 2}"}) for i in range(DOCS)]
        (src / "part.jsonl").write_text("\n".join(lines) + "\n")
        sources[name] = RawDocumentsParams(url=str(src))
    return CrawlSpec(crawl="c1", sources=sources, stages=("exact",))


def test_a_check_needs_a_committed_output(tmp_path: Path) -> None:
    with pytest.raises(NotMaterialized, match=r"^raw_documents\[c1\|a\] has no committed output for its current "
                                              r"parameters$"):
        evaluate_over_deletion(Store(str(tmp_path / "data")), _crawl(tmp_path), "exact_duplicates", None,
                               ChecksConfig())


def test_every_check_judges_a_crawl_without_dagster(tmp_path: Path) -> None:
    """The verdicts of every check of every partition, computed in a fresh interpreter that runs
    the crawl (``stages.execute``) and the checks; Dagster is never imported there."""
    script = f"""
import json, sys
from pathlib import Path
from tests.stages.test_checks import _crawl
from stages.catalog import PROGRAMS, partition_name
from stages.checks import CHECK_KINDS, ChecksConfig
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.store import Manifest, Store

spec = _crawl(Path({str(tmp_path)!r}))
store = Store({str(tmp_path / 'data')!r})
execute_crawl(store, spec, ExecutionParams(workers=1))
tight = ChecksConfig.model_validate({{"over_deletion": {{"max_removed_fraction": 0.4, "min_documents": 0}}}})
out = {{}}
for cfg_name, cfg in (("default", ChecksConfig()), ("tight", tight)):
    for program in PROGRAMS.values():
        for kind in CHECK_KINDS:
            if kind.applies(program):
                for source in spec.partitions(program.name):
                    v = kind.evaluate(store, spec, program.name, source, cfg)
                    name = partition_name(program.name, "c1", source)
                    out[f"{{cfg_name}} {{kind.name}} {{name}}"] = [v.passed, v.description]
print(json.dumps({{"dagster": sorted(m for m in sys.modules if m.split(".")[0] == "dagster"), "verdicts": out,
                  "off": [p for p in PROGRAMS if spec.switched_off(p)]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["dagster"] == []
    verdicts = result["verdicts"]
    # Every check of every program the crawl runs; a switched-off program has no partition to judge.
    assert result["off"] and set(result["off"]) < set(PROGRAMS)
    expected = {(kind.name, p.name) for p in PROGRAMS.values() for kind in CHECK_KINDS
                if kind.applies(p) and p.name not in result["off"]}
    assert {(k.split(" ")[1], k.split(" ")[2].split("[")[0]) for k in verdicts} == expected
    failed = {k: d for k, (ok, d) in verdicts.items() if not ok}
    # At the default bounds every check passes; at 40% exact dedup's 50% of each source fails.
    assert set(failed) == {"tight over_deletion exact_duplicates[c1]"}
    assert failed["tight over_deletion exact_duplicates[c1]"].startswith(
        f"stage exact removed more than 40.0% of: a 50.0% ({DOCS // 2:,} of {DOCS:,}); "
        f"b 50.0% ({DOCS // 2:,} of {DOCS:,}); not applied")
    assert verdicts["default doc_id_unique raw_documents[c1|a]"] == [True, f"{DOCS:,} rows, every doc_id distinct"]
    assert verdicts["default ledger_consistency removal_ledger[c1]"][0] is True


def test_a_partitions_checks_read_each_manifest_once_within_manifests_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``over_deletion`` and ``empty_result`` of the crawl-wide remover read every source's
    ingestion and earlier removals: within ``manifests_read_once`` once for both (the same
    verdicts), outside it and after it as often as before (a manifest may change between evaluations)."""
    from stages.checks import manifests_read_once
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    reads: list[str] = []  # the manifest files read from the data root
    real = Store.read_text

    def counted(self: Store, path: str) -> str | None:
        if path.endswith(MANIFEST):
            reads.append(path)
        return real(self, path)

    monkeypatch.setattr(Store, "read_text", counted)
    kinds = [k for k in CHECK_KINDS if k.name in ("over_deletion", "empty_result")]

    def judged() -> list[object]:
        return [k.evaluate(store, spec, "exact_duplicates", None, ChecksConfig()) for k in kinds]

    alone = judged()
    repeated = len(reads) - len(set(reads))
    assert repeated > 0
    reads.clear()
    with manifests_read_once():
        held = judged()
        assert len(reads) == len(set(reads))
        first = len(reads)
        judged()
        assert len(reads) == first  # a second evaluation in the block reads nothing again
    assert held == alone
    reads.clear()
    judged()
    assert len(reads) - len(set(reads)) == repeated  # nothing is held beyond the block


def test_a_partitions_checks_derive_the_keys_once_within_manifests_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each manifest's folder is named by its partition's key: within ``manifests_read_once`` the
    keys are looked up once for all of them (checking that cached keys still hold validates every
    program's params again), outside it once per manifest, as before."""
    from stages.checks import manifests_read_once
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    validated = count_params_validations(monkeypatch)
    kinds = [k for k in CHECK_KINDS if k.name in ("over_deletion", "empty_result")]

    def judged() -> list[object]:
        return [k.evaluate(store, spec, "exact_duplicates", None, ChecksConfig()) for k in kinds]

    alone = judged()
    outside = len(validated)
    validated.clear()
    with manifests_read_once():
        assert judged() == alone
    assert 0 < len(validated) <= len(PROGRAMS)  # one key_map: each program's params once
    assert outside > 2 * len(PROGRAMS)
    validated.clear()
    judged()
    assert len(validated) == outside  # nothing is held beyond the block


def test_doc_id_unique_judges_a_part_just_written_as_written_and_read_back_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition described where it ran takes its doc_ids as it wrote them
    (``stages.store.written_ids``), not read back: the same verdict, every figure alike, as a
    process that reads the part file, for a clean partition and one rewritten with a repeated id."""
    import dataclasses

    import pyarrow as pa

    import stages.store
    from stages.checks import evaluate_doc_id_unique
    from stages.dataroot import DataRoot
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    manifest = DataRoot(store).manifest(spec, "raw_documents", "a")
    assert manifest is not None
    pdir = DataRoot(store).output_dir(spec, "raw_documents", "a")
    documents = store.read_table(pdir, "documents")
    # The partition again, its second row's id on its third row too.
    ids = documents["doc_id"].to_pylist()
    writer = store.writer(pdir)
    writer.write("documents", documents.set_column(0, "doc_id", pa.array([*ids[:2], ids[1], *ids[3:]])))
    writer.commit(dataclasses.replace(manifest, tables={}, rows={}))
    writer.close()

    def judged() -> list[Verdict]:
        return [evaluate_doc_id_unique(store, spec, "raw_documents", s, ChecksConfig()) for s in ("a", "b")]

    def unread(self: Store, path: str, *args: object, **kwargs: object) -> object:
        raise AssertionError(f"read back: {path}")

    with monkeypatch.context() as m:
        m.setattr(Store, "part_batches", unread)  # every part was written by this process
        held = judged()
    monkeypatch.setattr(stages.store, "_WRITTEN", stages.store._Written())  # another process: nothing held
    assert judged() == held
    repeated, clean = held  # sources a (rewritten) and b
    assert clean.passed and clean.metadata == {"rows": DOCS, "distinct": DOCS, "duplicated_ids": 0}
    assert not repeated.passed and repeated.metadata == {"rows": DOCS, "distinct": DOCS - 1, "duplicated_ids": 1}
    assert repeated.description.startswith(f"1 doc_id(s) occur more than once in raw_documents.documents: {ids[1]}")


def test_what_a_process_wrote_is_held_for_its_latest_parts_within_a_byte_bound(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stages.store._Written``: the latest ``PARTS`` parts' schemas, their ids within
    ``ID_BYTES`` of buffers (a slice counts its whole buffers), a schema only where a Parquet read
    gives it back (a list column's item field comes back renamed)."""
    import pyarrow as pa

    from stages.store import _Written

    parts = {f"p{i}": pa.table({"doc_id": [f"{i:032d}"] * 100, "n": list(range(100))}) for i in range(6)}
    size = parts["p5"]["doc_id"].get_total_buffer_size()
    monkeypatch.setattr(_Written, "PARTS", 4)
    monkeypatch.setattr(_Written, "ID_BYTES", 3 * size)
    written = _Written()
    for path, table in parts.items():
        written.add(path, table)
    assert list(written.schemas) == ["p2", "p3", "p4", "p5"]
    assert list(written.ids) == ["p3", "p4", "p5"] and written.id_bytes == 3 * size
    assert written.ids["p5"].equals(parts["p5"]["doc_id"]) and written.schemas["p2"] == parts["p2"].schema
    written.add("q", pa.table({"text": ["x"]}))  # no doc_id: its schema alone
    assert list(written.schemas) == ["p3", "p4", "p5", "q"] and list(written.ids) == ["p3", "p4", "p5"]
    written.add("r", pa.table({"n": [1]}))  # p3's schema leaves, and its ids with it
    assert list(written.ids) == ["p4", "p5"] and written.id_bytes == 2 * size
    # Five ids sliced from 1,000 hold the 1,000's buffers: more than the bound, not held.
    big = pa.table({"doc_id": [f"{i:032d}" for i in range(1000)]}).slice(0, 5)
    written.add("s", big)  # p4 leaves
    assert list(written.ids) == ["p5"] and written.id_bytes == size and written.schemas["s"] == big.schema
    written.add("e", pa.table({"doc_id": ["x"], "e": pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))}))
    assert list(written.schemas) == ["q", "r", "s", "e"] and written.schemas["e"] is None
    assert list(written.ids) == ["e"]


def test_a_held_part_deleted_since_is_read_and_told_damaged(tmp_path: Path) -> None:
    """A part this process wrote and then lost (deleted, truncated) is not judged from what it
    wrote: its read tells it damaged, as in any other process."""
    from stages.checks import evaluate_doc_id_unique
    from stages.dataroot import DataRoot
    from stages.errors import DamagedFile
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    manifest = DataRoot(store).manifest(spec, "raw_documents", "a")
    assert manifest is not None
    part = Path(DataRoot(store).output_dir(spec, "raw_documents", "a")) / manifest.tables["documents"][0]
    assert evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig()).passed
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(DamagedFile, match="not whole Parquet"):
        evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig())
    part.unlink()
    with pytest.raises(DamagedFile, match="missing"):
        evaluate_doc_id_unique(store, spec, "raw_documents", "a", ChecksConfig())
