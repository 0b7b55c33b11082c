"""``finish``: one partition run in this process and described, as a pool worker does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from curation_dagster.defs.resources import CurationResource
from curation_dagster.run.partition import finish, step_judge
from stages.catalog import PROGRAMS
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from tests.stages.test_checks import _crawl
from tests.support.counting import count_params_validations


@pytest.mark.parametrize(("program", "source"), [("raw_documents", "a"), ("exact_duplicates", None),
                                                 ("curated_documents", "b")])
def test_a_partition_derives_its_keys_once_for_its_run_and_its_description(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str, source: str | None
) -> None:
    """Its run resolves the partition's inputs by their keys, its description (metadata, checks)
    names every folder it reads by them: one derivation for both (each validates every program's
    params again; 1 ms at 200 sources), and for its checks' evaluator's equal spec."""
    resource = CurationResource(workdir=str(tmp_path))
    spec = _crawl(tmp_path)
    resource.dataroot().register(spec)
    store = resource.store()
    execute_crawl(store, spec, ExecutionParams(workers=1))
    judge = step_judge(resource, spec.crawl)  # a pool worker's: its spec read from the data root, equal
    validated = count_params_validations(monkeypatch)
    done = finish(resource, store, spec, program, source, ExecutionParams(workers=1), force=True, judge=judge)
    assert done.error is None
    assert done.verdicts and all(verdict.passed for _, _, verdict in done.verdicts)
    assert 0 < len(validated) <= len(PROGRAMS)  # one key_map: each program's params once


def test_a_partition_described_where_it_ran_has_the_metadata_of_one_described_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where it ran, a partition's column schema and doc_ids are taken as it wrote them
    (``stages.store.written_schema``, ``written_ids``); described by another process, read back
    from its files: the same metadata and verdicts, for every program of the crawl."""
    import pyarrow.parquet

    import stages.store
    from curation_dagster.run.partition import describe
    from stages.execute import execute
    from stages.store import Store

    def unread(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"read back: {args}")

    batches = Store.part_batches

    def no_ids(self: Store, path: str, columns: list[str] | None = None, *args: Any) -> Any:
        assert columns != ["doc_id"], f"ids read back: {path}"  # the ledger's examples read its rows
        return batches(self, path, columns, *args)

    resource = CurationResource(workdir=str(tmp_path))
    spec = _crawl(tmp_path)
    resource.dataroot().register(spec)
    store = resource.store()
    judge = step_judge(resource, spec.crawl)
    for program in PROGRAMS:
        for source in spec.partitions(program):
            outcome = execute(store, spec, program, source, ExecutionParams(workers=1))
            with monkeypatch.context() as m:  # here, nothing of its own output is read back
                m.setattr(pyarrow.parquet, "read_schema", unread)
                m.setattr(Store, "part_batches", no_ids)
                here = describe(resource, spec, program, source, outcome, 0.0, judge=judge, store=store)
            with monkeypatch.context() as m:
                m.setattr(stages.store, "_WRITTEN", stages.store._Written())
                elsewhere = describe(resource, spec, program, source, outcome, 0.0, judge=judge, store=store)
            assert here.verdicts == elsewhere.verdicts, (program, source)
            assert here.meta == elsewhere.meta, (program, source)
