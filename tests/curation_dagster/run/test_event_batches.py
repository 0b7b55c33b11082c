"""A crawl step commits a partition's events together: its materialization and its check
evaluations in one transaction of the event log (recorded whole or not at all, one commit instead
of one per event), and a step's planned materializations in one. Watched on the SQL the event log
runs (``curate run``'s SQLite storage, ``curation_dagster.ops.event_log``), a real run of the
crawl job on the tiny corpus."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dagster import AssetKey, AssetMaterialization, DagsterInstance, GraphDefinition

from curation_dagster.defs.partitions import partition_key
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.instance import ensure_instance_config
from curation_dagster.run.in_process import run_crawl
from curation_dagster.run.recorder import together
from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS
from tests.support.tiny_corpus import CRAWL, fast_tmp, spec

Row = tuple[str, str | None, str | None]  # (event type, asset key, partition) of an inserted event


@contextmanager
def transactions() -> Iterator[list[list[Row]]]:
    """The events inserted into any event log in this process, by committed transaction."""
    open_: dict[int, list[Row]] = defaultdict(list)
    committed: list[list[Row]] = []

    def executed(conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, _many: bool) -> None:
        found = re.match(r"\s*INSERT INTO event_logs \(([^)]*)\)", statement)
        if found is None:
            return
        columns = [c.strip() for c in found.group(1).split(",")]
        if isinstance(params, dict):
            rows = [params]
        else:  # one row, or several in one statement (their values one after another)
            rows = [dict(zip(columns, params[i:i + len(columns)], strict=True))
                    for i in range(0, len(params), len(columns))]
        open_[id(conn.connection)].extend((values["dagster_event_type"], values.get("asset_key"),
                                           values.get("partition")) for values in rows)

    def commit(conn: Any) -> None:
        rows = open_.pop(id(conn.connection), [])
        if rows:
            committed.append(rows)

    def rollback(conn: Any) -> None:
        open_.pop(id(conn.connection), None)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", executed)
    sa.event.listen(sa.engine.Engine, "commit", commit)
    sa.event.listen(sa.engine.Engine, "rollback", rollback)
    try:
        yield committed
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", executed)
        sa.event.remove(sa.engine.Engine, "commit", commit)
        sa.event.remove(sa.engine.Engine, "rollback", rollback)


def test_a_partitions_events_are_one_transaction_and_a_steps_planned_ones_one(tmp_path: Path) -> None:
    """(Partitions that finish together share theirs: ``curation_dagster.run.crawl_job.Launcher``.)"""
    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work, transactions() as committed:
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=CurationResource(workdir=str(work)))
    materialized = [t for t in committed if any(e == "ASSET_MATERIALIZATION" for e, _, _ in t)]
    expected = {(p, str(partition_key(CRAWL, s))) for p in PROGRAMS for s in crawl.partitions(p)}
    got = [(str(a).strip('["]'), part) for t in materialized for e, a, part in t if e == "ASSET_MATERIALIZATION"]
    assert sorted(got) == sorted(expected)  # each once
    checked = 0
    for rows in materialized:
        # Whole partitions (those that finished together): each one's materialization and every
        # check evaluation of it, nothing else.
        partitions = {(a, part) for e, a, part in rows if e == "ASSET_MATERIALIZATION"}
        checks = [r for r in rows if r[0] == "ASSET_CHECK_EVALUATION"]
        assert len(rows) == len(partitions) + len(checks), rows
        # (an evaluation's row names no asset or partition: Dagster's columns are for asset events)
        assert len(checks) == sum(k.applies(PROGRAMS[str(a).strip('["]')]) for a, _ in partitions
                                  for k in CHECK_KINDS), rows
        checked += len(checks)
    # No check evaluation committed apart from its partition's materialization.
    assert sum(e == "ASSET_CHECK_EVALUATION" for t in committed for e, _, _ in t) == checked > 0
    # A step's planned materializations: one transaction a step at most, for the partitions that
    # had not ended when it began (the pool's workers go down the steps ahead of the recording:
    # those that ended before are recorded done, with none; test_pool_packs.py holds ``run`` to
    # telling which). The first step's partitions run ahead of nothing here (no head start).
    planned = [t for t in committed if any(e == "ASSET_MATERIALIZATION_PLANNED" for e, _, _ in t)]
    per_step = Counter(a for t in planned for _, a, _ in t)
    assert len(planned) == len(per_step) <= len(PROGRAMS)
    assert all(len({a for _, a, _ in t}) == 1 for t in planned)
    assert per_step['["raw_documents"]'] == len(crawl.partitions("raw_documents"))
    assert all(n <= len(crawl.partitions(a.strip('["]'))) for a, n in per_step.items())
    # Stored once the step's partitions are handed over (``Launcher.run``'s ``started``), but
    # before the first of them is recorded.
    for asset in per_step:
        at = [n for n, t in enumerate(committed) for e, a, _ in t if a == asset]
        kinds = [e for t in committed for e, a, _ in t if a == asset]
        assert kinds[0] == "ASSET_MATERIALIZATION_PLANNED" and at[0] < at[kinds.index("ASSET_MATERIALIZATION")]


def test_events_stored_together_are_all_or_none(tmp_path: Path) -> None:
    """A step stopped between a partition's events (its run worker killed, an error): none of them
    is in the event log, so the retry records the partition once."""
    instance = DagsterInstance.from_config(str(ensure_instance_config(tmp_path / "dagster")))

    def report(partition: str) -> None:
        instance.report_runless_asset_event(AssetMaterialization(asset_key="raw_documents", partition=partition))

    with pytest.raises(KeyboardInterrupt), together(instance):
        report("a")
        report("b")
        raise KeyboardInterrupt  # stopped before the rest
    assert instance.fetch_materializations(AssetKey("raw_documents"), limit=10).records == []
    with together(instance):
        report("a")
        report("b")
    records = instance.fetch_materializations(AssetKey("raw_documents"), limit=10).records
    assert [r.partition_key for r in records] == ["b", "a"]  # newest first


def test_a_batch_holds_only_a_partitions_events(tmp_path: Path) -> None:
    """A batch is open across the step's yield: an event Dagster stores meanwhile for itself (here
    an engine event; a step's failure, a run's end) is stored at once, never held with the
    partition's, so it cannot be dropped with a batch that is left."""
    instance = DagsterInstance.from_config(str(ensure_instance_config(tmp_path / "dagster")))
    run = instance.create_run_for_job(GraphDefinition("g").to_job())
    with pytest.raises(KeyboardInterrupt), together(instance):
        instance.report_runless_asset_event(AssetMaterialization(asset_key="raw_documents", partition="a"))
        instance.report_engine_event("the step was interrupted", run)
        raise KeyboardInterrupt
    assert [e.message for e in instance.all_logs(run.run_id)] == ["the step was interrupted"]
    assert instance.fetch_materializations(AssetKey("raw_documents"), limit=10).records == []


def _tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the event log's tables that a batch writes, but the times the database set."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        out = {}
        for table in ("event_logs", "asset_keys", "asset_event_tags", "asset_check_executions"):
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")
                       if r[1] not in ("create_timestamp", "updated_timestamp")]
            out[table] = conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1, 2").fetchall()
    return out


def replayed(batches: list[list[Any]]) -> list[list[Any]]:
    """A real run's event batches (``captured``), and before and after them the batches no run
    makes: a first one with two assets new to the event log (their rows made in the order they
    came), two partitions in one, an evaluation stored twice (the second updates its check's row),
    an evaluation before its partition's materialization and one after, a runless evaluation, a
    planned materialization and a materialization of one asset either way round."""
    from dagster import AssetCheckEvaluation

    # (a materialization, the evaluation after it in its batch), whatever else the batch held
    pairs = [b[i:i + 2] for b in batches for i in range(len(b) - 1) if [e.dagster_event_type for e in b[i:i + 2]]
             == ["ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION"]]
    steps = sum(bool(spec(stages=["fuzzy"]).partitions(p)) for p in PROGRAMS)  # the captured crawl's
    assert len(pairs) >= 2 and len(batches) > steps
    mat, check = pairs[0]
    mats = [m for m, _ in pairs]
    other = next(m for m in mats if m.dagster_event.asset_key != mat.dagster_event.asset_key)
    again = next(m for m in mats if m.dagster_event.asset_key == mat.dagster_event.asset_key
                 and m.dagster_event.partition != mat.dagster_event.partition)
    twice = [mat, check, check._replace(timestamp=check.timestamp + 1)]
    around = [check._replace(timestamp=mat.timestamp - 1), mat, check]
    runless = pairs[1][1]._replace(run_id="")
    assert isinstance(runless.dagster_event.event_specific_data, AssetCheckEvaluation)
    (planned,) = [e for b in batches for e in b if e.dagster_event_type == "ASSET_MATERIALIZATION_PLANNED"
                  and e.dagster_event.asset_key == mat.dagster_event.asset_key
                  and e.dagster_event.partition == mat.dagster_event.partition]
    later = planned._replace(timestamp=mat.timestamp + 2)  # what each leaves in the asset's row differs
    return [[mat, other, again], *batches, pairs[0] + pairs[1], twice, around, [pairs[1][0], runless],
            [mat, later], [later, mat]]


def captured(storage: type, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Where ``storage`` (an event-log class) is given batches from now on: each batch, kept."""
    batches: list[list[Any]] = []
    original = storage.store_event_batch

    def keep(self: Any, events: Any) -> None:
        batches.append(list(events))
        original(self, events)

    monkeypatch.setattr(storage, "store_event_batch", keep)
    return batches


def test_a_batch_writes_the_rows_dagster_writes_event_by_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """``store_together`` (a batch's few statements, asset rows upserted) leaves every table as
    Dagster's ``store_event`` of each event in turn does (``store_each``, with Dagster's asset
    rows): the batches of a real crawl run replayed both ways into fresh event logs, and batches
    it did not make (``replayed``). A batch of a run's events is one insert, its ids known before
    they are serialized; where they came out otherwise (told one too low here), the batch is
    inserted again partition by partition, with the same rows."""
    from curation_dagster.ops.event_log import ConsolidatedSqliteEventLogStorage, PooledSqliteEventLogStorage

    batches = captured(PooledSqliteEventLogStorage, monkeypatch)
    with fast_tmp(tmp_path / "w") as work:
        run_crawl(work, work / "dagster", spec(stages=["fuzzy"]), quiet=True,
                  resource=CurationResource(workdir=str(work)))
    monkeypatch.undo()

    class Dagsters(PooledSqliteEventLogStorage):
        """Each event stored by Dagster's own code, asset rows and serialized events included."""

        _store_asset_event = ConsolidatedSqliteEventLogStorage._store_asset_event
        _event_to_row = ConsolidatedSqliteEventLogStorage._event_to_row

    class Mistold(PooledSqliteEventLogStorage):
        def _next_id(self, conn: Any) -> int:
            return super()._next_id(conn) - 1

    fast = PooledSqliteEventLogStorage(str(tmp_path / "fast"))
    mistold = Mistold(str(tmp_path / "mistold"))
    each = Dagsters(str(tmp_path / "each"))
    inserts: list[str] = []

    def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().startswith("INSERT INTO event_logs"):
            inserts.append(statement)

    for events in replayed(batches):
        sa.event.listen(fast.engine(), "before_cursor_execute", executed)
        try:
            fast.store_event_batch(events)
        finally:
            sa.event.remove(fast.engine(), "before_cursor_execute", executed)
        assert len(inserts) == 1 or not all(e.run_id for e in events), (len(events), len(inserts))
        inserts.clear()
        mistold.store_event_batch(events)
        with each._connect() as conn:
            each._held.conn = conn
            try:
                each.store_each(events)
            finally:
                each._held.conn = None
    want = _tables(Path(each.get_db_path()))
    assert len(want["asset_check_executions"]) > 0 and len(want["asset_event_tags"]) > 0
    for storage in (fast, mistold):
        got = _tables(Path(storage.get_db_path()))
        assert {t: len(rows) for t, rows in got.items()} == {t: len(rows) for t, rows in want.items()}
        for table in want:
            assert got[table] == want[table], (type(storage).__name__, table)
        storage.dispose()
    each.dispose()


def test_a_column_schema_is_serialized_once_and_each_event_as_dagster_serializes_it(tmp_path: Path) -> None:
    """Materializations whose column schemas ``values`` made from equal columns share one schema
    object, serialized once (from its second event on); each stored event is Dagster's
    serialization of it, byte for byte, also where the placeholder's text is in the event itself
    (then serialized the plain way)."""
    from dagster import deserialize_value, serialize_value

    from curation_dagster.ops import event_log
    from curation_dagster.run import values

    columns = [("doc_id", "string", "documents.doc_id"), ("text", "string", "documents.text")]
    schemas = [values._made("schema", (list(columns),)) for _ in range(3)]
    assert schemas[0] is schemas[1] is schemas[2]
    other = values._made("schema", ([*columns, ("n", "int", "documents.n")],))
    instance = DagsterInstance.from_config(str(ensure_instance_config(tmp_path / "dagster")))
    metadata = [{"dagster/column_schema": schemas[0], "rows": 1}, {"rows": 2, "dagster/column_schema": schemas[1]},
                {"dagster/column_schema": other},
                {"dagster/column_schema": schemas[2], "note": event_log._PLACEHOLDER},  # the plain way,
                {"note": event_log._PLACEHOLDER, "dagster/column_schema": schemas[2]}]  # either way round
    event_log._SCHEMAS.clear()
    for n, meta in enumerate(metadata):
        instance.report_runless_asset_event(AssetMaterialization(asset_key="raw_documents", partition=str(n),
                                                                 metadata=meta))
    # serialized once, at its second event; a schema seen once is only remembered
    assert {k: v[1] is not None for k, v in event_log._SCHEMAS.items()} == {id(schemas[0]): True, id(other): False}
    import sqlite3

    db = Path(instance.event_log_storage.get_db_path())  # type: ignore[attr-defined]
    with sqlite3.connect(db) as conn:
        stored = [r[0] for r in conn.execute("SELECT event FROM event_logs WHERE dagster_event_type = "
                                             "'ASSET_MATERIALIZATION' ORDER BY id")]
    assert len(stored) == len(metadata)
    for blob, meta in zip(stored, metadata, strict=True):
        event = deserialize_value(blob)
        assert serialize_value(event) == blob
        assert blob.count(event_log._PLACEHOLDER_JSON) == (1 if "note" in meta else 0)  # the note's own
        got = event.dagster_event.event_specific_data.materialization.metadata
        assert list(got) == list(meta)
        assert got["dagster/column_schema"].schema == meta["dagster/column_schema"]


def test_each_event_is_stored_as_dagster_serializes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event's stored text is Dagster's ``serialize_value`` of it, byte for byte, where the
    event log packs it itself (``event_log._packed``): materializations with metadata of every
    kind (text, markdown, JSON with nested, non-ASCII and non-finite values, numbers, booleans,
    null, paths, URLs, timestamps, table schemas and records, asset keys, runs), a check
    evaluation, and every event of a real crawl run. Where its text of an event type differs from
    Dagster's, that type is serialized by Dagster from then on."""
    import math

    import dagster as dg
    from dagster import deserialize_value, serialize_value

    from curation_dagster.ops import event_log

    crawl = spec(stages=["fuzzy"])
    with fast_tmp(tmp_path / "w") as work:
        run_crawl(work, work / "dagster", crawl, quiet=True, resource=CurationResource(workdir=str(work)))
        instance = DagsterInstance.from_config(str(ensure_instance_config(work / "dagster")))
        (run,) = instance.get_runs()
        events = list(instance.all_logs(run.run_id))
        schema = dg.TableSchema(columns=[dg.TableColumn("doc_id", "string", "ids", dg.TableColumnConstraints(
            nullable=False, unique=True, other=["hex"]))])
        metadata: dict[str, Any] = {
            "text": "naïve — ✓", "md": dg.MetadataValue.md("| a |\n|---|"), "n": 3, "big": 2**70, "x": 1.5,
            "nan": math.nan, "inf": -math.inf, "yes": True, "none": None,
            "json": dg.MetadataValue.json({"a": [1, {"b": None, "é": math.inf}], "z": "\ud83d\ude00"}),
            "path": dg.MetadataValue.path("/data/x"), "url": dg.MetadataValue.url("https://example.com/?q=1"),
            "when": dg.MetadataValue.timestamp(1_700_000_000.5), "schema": schema,
            "table": dg.MetadataValue.table([dg.TableRecord({"k": "v", "n": 1})], schema=dg.TableSchema(
                columns=[dg.TableColumn("k"), dg.TableColumn("n", "int")])),
            "asset": dg.MetadataValue.asset(AssetKey(["a", "b"])), "run": dg.MetadataValue.dagster_run("abc"),
            "dagster/row_count": 7, "artifact": dg.MetadataValue.python_artifact(math.sqrt),
            "notebook": dg.MetadataValue.notebook("/n.ipynb"), "null": dg.MetadataValue.null(),
            "job": dg.MetadataValue.job("j", "loc"), "pool": dg.MetadataValue.pool("p"),
            "lineage": dg.MetadataValue.column_lineage(dg.TableColumnLineage(
                {"a": [dg.TableColumnDep(asset_key=AssetKey("x"), column_name="b")]})),
            # an object's value (no public constructor), its field skipped where None
            "object": deserialize_value('{"__class__": "ObjectMetadataValue", "inst": "object"}'),
        }
        instance.report_runless_asset_event(AssetMaterialization(asset_key=["raw_documents"], partition="p",
                                                                 metadata=metadata, description="d"))
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(
            asset_key=AssetKey("raw_documents"), check_name="c", passed=False, metadata={"why": "x", "n": 2},
            severity=dg.AssetCheckSeverity.WARN, description="no"))
        stored = [e for e in instance.all_logs("") if e.dagster_event is not None]
        assert len(stored) == 2
        checked = 0
        for event in [*events, *stored]:
            assert event_log.PooledSqliteEventLogStorage._serialized(event) == serialize_value(event)
            checked += 1
        assert checked > 100 and event_log._SAME and all(event_log._SAME.values())
        db = Path(instance.event_log_storage.get_db_path())  # type: ignore[attr-defined]
        import sqlite3

        with sqlite3.connect(db) as conn:
            blobs = [r[0] for r in conn.execute("SELECT event FROM event_logs")]
        assert all(serialize_value(deserialize_value(b)) == b for b in blobs)
        # Another Dagster would pack otherwise: its text is not used, Dagster's is
        monkeypatch.setattr(event_log, "_packed", lambda value: {"other": 1})
        monkeypatch.setattr(event_log, "_SAME", {})
        for event in stored:
            assert event_log.PooledSqliteEventLogStorage._serialized(event) == serialize_value(event)
            assert event_log.PooledSqliteEventLogStorage._serialized(event) == serialize_value(event)
        assert set(event_log._SAME.values()) == {False}
