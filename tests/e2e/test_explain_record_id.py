"""``curate explain`` by record id, and the kept document named in a ``duplicate_record_id``
ledger row's ``duplicate_of`` (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from curation_dagster.defs.resources import load_spec
from stages.store import Store
from tests.support.tiny_corpus import curate, read


def test_explain_a_record_id_lists_every_document_that_carries_it(tmp_path: Path) -> None:
    """r5 names three records: two identical (one removed by the exact stage) and one different
    (quarantined as duplicate_record_id). Both ledger rows name the kept document in duplicate_of,
    and ``curate explain r5`` lists all three."""
    text = "The harbour was quiet that morning, and the boats lay still under a pale grey sky. " * 3
    other = "A different record entirely, about trains and the long rails across the plains. " * 3
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "r5", "text": text}, {"id": "r5", "text": text}, {"id": "r5", "text": other},
        {"id": "r6", "text": other + " And more."}]))
    work = tmp_path / "w"
    config = tmp_path / "crawl.json"
    config.write_text(json.dumps({"sources": {"s": {"url": str(src), "id_field": "id"}}, "stages": ["exact"]}))
    code, _, err = curate("run", "--workdir", str(work), "--crawl", "c1", "--config", str(config), "--quiet")
    assert code == 0, err
    out = work / "ledger.parquet"
    assert curate("ledger", "--workdir", str(work), "--crawl", "c1", "--out", str(out))[0] == 0
    rows = pq.read_table(out).to_pylist()
    store, spec = Store(str(work / "data")), load_spec(work, "c1")
    kept = [d for d in read(store, spec, "curated_documents", "documents", "s").to_pylist() if d["record_id"] == "r5"]
    assert len(kept) == 1
    r5 = sorted((r["reason"], r["duplicate_of"], r["duplicate_of_record_id"]) for r in rows if r["record_id"] == "r5")
    assert len(r5) == 2 and r5[0][0] == "duplicate_record_id"  # the other: the exact stage's removal
    assert [dup for _, dup, _ in r5] == [kept[0]["doc_id"]] * 2
    assert {rid for _, _, rid in r5} == {"r5"}
    code, shown, err = curate("explain", "r5", "--workdir", str(work), "--crawl", "c1")
    assert code == 0, err
    ids = {kept[0]["doc_id"], *(r["doc_id"] for r in rows if r["record_id"] == "r5")}
    assert len(ids) == 3 and shown.startswith("record_id r5: 3 document(s)")
    for doc_id in ids:
        assert f"{doc_id}: " in shown
    assert shown.count(f"duplicate of: {kept[0]['doc_id']}") == 2 and "kept (source s" in shown
    code, shown, _ = curate("explain", "r404", "--workdir", str(work), "--crawl", "c1")
    assert code == 1 and "r404" in shown
