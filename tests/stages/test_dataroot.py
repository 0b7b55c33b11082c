"""The data root is the only shared state: crawl specs and the crawl registry live under it
(local and on S3, served by moto on 127.0.0.1), every reader finds a crawl from the data root
alone, and cross-crawl dedup finds earlier crawls in the data root in use and never loses a
document from both crawls when an earlier crawl is rerun with new parameters."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stages.catalog import PROGRAMS, STAGES
from stages.dataroot import CRAWLS_DIR, DataRoot, UnknownCrawl
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.spec import prior_outputs
from stages.store import UnsafeNameError
from tests.support import tiny_corpus as T

# --- the registry -------------------------------------------------------------------------------

BUCKET = "curation-dataroot"
KEY_ID = "AKIADATAROOTTEST"
SECRET = "dataroot-secret-never-written"


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> DataRoot:
    """An empty data root: a local folder, or a prefix of a bucket on the S3 server."""
    if request.param == "local":
        return DataRoot.open(str(tmp_path / "data"))
    options = request.getfixturevalue("s3")
    return DataRoot.open(f"s3://{BUCKET}/{tmp_path.name}", options=options)


def test_no_program_output_folder_can_be_the_registry() -> None:
    assert CRAWLS_DIR.startswith("_") and not any(name.startswith("_") for name in PROGRAMS)


def test_registry_keeps_registration_order_and_writes_records_whole(root: DataRoot) -> None:
    assert root.records() == [] and root.record("c1") is None
    for crawl in ("c2", "c1", "c3"):  # registration order, not name order
        root.register(T.spec(crawl=crawl))
    assert [(r.crawl, r.sequence) for r in root.records()] == [("c2", 1), ("c1", 2), ("c3", 3)]
    if root.store.is_local:  # file times say the opposite: they are never read
        for age, crawl in enumerate(("c2", "c1", "c3")):
            os.utime(root.record_path(crawl), (2e9 - age, 2e9 - age))
        assert [r.crawl for r in root.records()] == ["c2", "c1", "c3"]
    first = root.record("c1")
    assert first is not None and first.spec == T.spec(crawl="c1")
    assert root.register(T.spec(crawl="c1")) == first  # unchanged: not rewritten
    changed = T.spec(crawl="c1", stages=("exact",))
    again = root.register(changed)  # a new spec keeps the crawl's place
    assert (again.sequence, again.registered_at, again.spec) == (2, first.registered_at, changed)
    assert again.updated_at > first.updated_at
    assert root.spec("c1") == changed and [r.crawl for r in root.records()] == ["c2", "c1", "c3"]
    # One object per crawl, nothing else (no temporary file left visible), plain JSON.
    listed = sorted(p.rsplit("/", 1)[-1] for p in root.store.fs.ls(f"{root.store.root}/{CRAWLS_DIR}", detail=False))
    assert listed == ["c1.json", "c2.json", "c3.json"]
    with root.store.fs.open(root.record_path("c1")) as fh:
        assert set(json.load(fh)) == {"crawl", "sequence", "registered_at", "updated_at", "spec"}
    with pytest.raises(UnknownCrawl, match="crawl 'c9' is not registered in"):
        root.spec("c9")
    with pytest.raises(UnsafeNameError):
        root.record_path("../c1")


def test_published_crawls_are_the_earlier_crawls(root: DataRoot) -> None:
    c1 = T.spec(crawl="c1", stages=("exact",))
    root.register(c1)
    root.register(T.spec(crawl="c2"))  # registered, never run
    assert not root.published(c1) and root.earlier_crawls("c3") == []
    execute_crawl(root.store, c1, ExecutionParams(workers=1))
    assert root.published(c1) and not root.published(root.spec("c2"))
    assert root.earlier_crawls("c3") == ["c1"]  # a crawl not registered yet: every published one
    assert root.earlier_crawls("c1") == [] and root.earlier_crawls("c2") == ["c1"]
    spec = root.build_spec("c3", {"web": {"url": "s3://b/c3/web"}})
    assert spec.dedup_against == {"c1": prior_outputs(c1)} and spec.stages == tuple(STAGES)
    assert root.build_spec("c3", {"web": {"url": "s3://b/c3/web"}}, against=[]).dedup_against == {}
    with pytest.raises(ValueError, match="against itself"):
        root.build_spec("c1", {"web": {"url": "x"}}, against=["c1"])


# --- reading a crawl from the data root alone ---------------------------------------------------


# --- cross-crawl dedup when an earlier crawl is rerun ---------------------------------------------
