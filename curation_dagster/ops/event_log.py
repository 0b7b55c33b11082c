"""The embedded default's event log: Dagster's consolidated SQLite storage, on pooled connections.

``ConsolidatedSqliteEventLogStorage`` (one database for every run) builds a new SQLAlchemy engine
and opens and closes a SQLite connection for every statement it runs, and the database is in WAL
mode, so the close of the last connection checkpoints the log into the database and syncs both
to disk: ~12 ms per stored event on this project's CI machine, ~5 events per partition of a crawl
(its materialization and check evaluations). This storage keeps one engine per process with its
connections pooled (a connection per thread at a time, as SQLite wants), and opens each with
``synchronous=NORMAL``, SQLite's recommended setting for WAL: a commit is atomic and survives the
process being killed; only the last commits before an OS crash or power loss can be lost, and
``curate run`` records those partitions again (their outputs are in the data root). 1.3 ms per
event. A forked child builds its own engine, never its parent's connections. The UI's live run
logs wake on the write-ahead log as well as the database (``watch``). Each stored event is one
transaction (``store_event``): Dagster's writes its row, its asset's row and its check's row in a
transaction each; a batch of events (``store_event_batch``, ``EventBatches.batch``) is one.

Named by its private module path, ``dagster._core.storage.event_log``: Dagster exports no public
name for the base class; dagster is pinned (pyproject.toml), and
tests/curation_dagster/defs/test_dagster_tools.py fails if it moves or stops loading. The other
private names, ``AssetCheckEvaluationTargetMaterializationData`` (``_target``, the one place a
check evaluation's target is built) and the event log's tables (``store_together`` writes the
rows Dagster's ``store_event`` writes), have no public export either; test_checks.py reads the
check state they feed, and test_event_batches.py compares the rows with Dagster's own. So do the
names of Dagster's serialization that ``_packed`` walks with (its whitelist, its object and
metadata field serializers); test_event_batches.py compares its text with ``serialize_value``'s on
a real run's events and on metadata of every kind, and a process checks the first event of each
type (``_dumps``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from dagster import TableSchemaMetadataValue, TextMetadataValue, serialize_value
from dagster._core.definitions.metadata import MetadataFieldSerializer
from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage
from dagster_shared.serdes.serdes import _WHITELIST_MAP, EMPTY_VALUES_TO_SKIP, ObjectSerializer, pack_value
from watchdog.events import PatternMatchingEventHandler

BUSY_TIMEOUT_S = 30  # as Dagster's SQLite storages wait on a locked database


def target_of(record: Any) -> Any:
    """What a check evaluation names of the materialization it judged (an ``EventLogRecord`` of
    it): Dagster's check state counts an evaluation only for the materialization it targets."""
    return _target(record.storage_id, record.run_id, record.timestamp)


def latest_target(records: Any, asset_key: Any, partition: str | None) -> Any:
    """``target_of`` the partition's latest materialization in ``records`` (an instance or an
    event-log storage: both fetch materializations), or None where it has none."""
    from dagster import AssetRecordsFilter

    found = records.fetch_materializations(AssetRecordsFilter(
        asset_key=asset_key, asset_partitions=[partition] if partition else None), limit=1).records
    return target_of(found[0]) if found else None


def _target(storage_id: int, run_id: str, timestamp: float) -> Any:
    """A check evaluation's target: the materialization of that storage id, run and time."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    return AssetCheckEvaluationTargetMaterializationData(storage_id=storage_id, run_id=run_id, timestamp=timestamp)


def _untargeted(event: Any) -> Any:
    """The check evaluation of ``event`` where it is a run's with no target, else None."""
    dagster_event = event.dagster_event
    if dagster_event is None or dagster_event.event_type_value != _EVALUATION or not event.run_id:
        return None
    evaluation = dagster_event.event_specific_data
    return evaluation if evaluation.target_materialization_data is None else None


_MATERIALIZATION, _EVALUATION = "ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION"

# The events of a partition (its materialization, its check evaluations) and a step's planned
# materializations: what ``curation_dagster.run.recorder.together`` batches.
_BATCHED = frozenset({_MATERIALIZATION, _EVALUATION, "ASSET_MATERIALIZATION_PLANNED"})


# A materialization's column schema, serialized once per schema object. Dagster serializes an
# event in Python, object by object: its ``_event_to_row`` of a raw_documents materialization
# (a 7-column schema) took 0.89 ms, this one 0.61 ms, and every partition of a step shares its
# schema (``curation_dagster.run.values`` makes one ``TableSchema`` per distinct column list;
# 1,408 materializations at 200 sources). From a schema's second event on, the event is
# serialized with a text placeholder in its column schema's place, then the schema's own
# serialization put where the placeholder's is: Dagster's serialization is ``json.dumps`` (sorted
# keys, no indent) of the packed event, which writes a nested value as it writes it alone, so the
# result is Dagster's own, byte for byte (test_event_batches.py compares them on a real run's
# events). A schema seen once (a Pipes step's, made from JSON for each event) costs nothing more
# than a memo entry. Keyed by the schema's id, with the schema held so that its id stays its own;
# its serialization None until its second event.
_SCHEMA_KEY = "dagster/column_schema"
_PLACEHOLDER = "\x00the column schema, serialized once\x00"
_PLACEHOLDER_JSON = serialize_value(TextMetadataValue(_PLACEHOLDER))
_SCHEMAS: dict[int, tuple[Any, str | None]] = {}
_SCHEMAS_HELD = 256


def _column_schema(event: Any) -> Any:
    """The ``TableSchemaMetadataValue`` of a materialization ``event``, else None."""
    dagster_event = event.dagster_event
    if dagster_event is None or dagster_event.event_type_value != _MATERIALIZATION:
        return None
    value = dagster_event.event_specific_data.materialization.metadata.get(_SCHEMA_KEY)
    return value if type(value) is TableSchemaMetadataValue else None


def _serialized_schema(value: Any) -> str | None:
    """``serialize_value(value)`` of a ``TableSchemaMetadataValue``, made once per ``TableSchema``
    at its second event; None at its first."""
    held = _SCHEMAS.get(id(value.schema))
    if held is None or held[0] is not value.schema:
        if len(_SCHEMAS) >= _SCHEMAS_HELD:
            _SCHEMAS.clear()
        _SCHEMAS[id(value.schema)] = (value.schema, None)
        return None
    if held[1] is None:
        held = _SCHEMAS[id(value.schema)] = (value.schema, serialize_value(value))
    return held[1]


# Dagster's serialization of an event, made faster. ``serialize_value`` packs an event object by
# object through a generic walk that builds a descent path (for its error messages) at every node
# and drives the JSON encoder through lazy wrappers' generators: 0.25-0.45 ms a materialization
# (17 metadata entries), 0.12-0.2 ms a check evaluation, about a fifth of what recording a
# partition costs ``curate run``'s process at 200 sources. ``_packed`` walks the same objects with
# Dagster's own serializers (their storage names, field serializers, skipped fields and old
# fields; a metadata dict as the list of entries ``MetadataFieldSerializer`` makes) into plain
# dicts and lists, and hands anything else (an enum, a set, an object whose serializer packs in
# its own way) to Dagster's ``pack_value``; the JSON is Dagster's ``json.dumps`` with sorted
# keys. The 4,085 events of a 200-source crawl came out byte for byte Dagster's, in 0.36 s against
# 0.65 s (best of seven passes). The first event of each type in a process is serialized both ways and compared: where
# they differ (another Dagster), that type is serialized by Dagster from then on.
_OBJECTS: dict[type, Any] = {}  # a type's serializer, where ``_packed`` packs it; False: Dagster does
_SAME: dict[str | None, bool] = {}  # by event type: whether ``_packed`` gave Dagster's text


def _serializer(kind: type) -> Any:
    """The whitelisted serializer of ``kind`` where it packs its fields the common way (its class's
    own, ``pack_items`` and ``before_pack`` not overridden), else False."""
    serializer = _WHITELIST_MAP.object_serializers.get(kind.__name__)
    if serializer is None or serializer.klass is not kind or \
            type(serializer).pack_items is not ObjectSerializer.pack_items or \
            type(serializer).before_pack is not ObjectSerializer.before_pack:
        return False
    return serializer


def _packed(value: Any) -> Any:
    """Dagster's ``pack_value(value)``: JSON-ready dicts, lists and scalars (see above)."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is list:
        return [_packed(v) for v in value]
    if kind is dict:
        return {k: _packed(v) for k, v in value.items()}
    serializer = _OBJECTS.get(kind)
    if serializer is None:
        serializer = _OBJECTS[kind] = _serializer(kind)
    if serializer is False:
        return pack_value(value)
    out: dict[str, Any] = {"__class__": serializer.get_storage_name()}
    names, custom = serializer.storage_field_names, serializer.field_serializers
    for key, inner in serializer.object_as_mapping(value).items():
        field = custom.get(key)
        entries = type(field) is MetadataFieldSerializer  # its list of entries, their values packed here
        if entries:
            inner = [{"__class__": "EventMetadataEntry", "label": label, "entry_data": _packed(v), "description": None}
                     for label, v in inner.items()]
        elif field is not None:
            inner = field.pack(inner, whitelist_map=_WHITELIST_MAP, descent_path=key)
        if (key in serializer.skip_when_empty_fields and inner in EMPTY_VALUES_TO_SKIP) or \
                (key in serializer.skip_when_none_fields and inner is None):
            continue
        out[names.get(key, key)] = inner if entries else _packed(inner)
    for key, default in serializer.old_fields.items():
        out[key] = default
    return out


def _dumps(event: Any) -> str:
    """``serialize_value(event)``, byte for byte, mostly by ``_packed`` (see above)."""
    kind = event.dagster_event.event_type_value if event.dagster_event is not None else None
    same = _SAME.get(kind)
    if same is False:
        return serialize_value(event)
    if same is None:  # the type's first event: both ways, Dagster's kept
        dagster = serialize_value(event)
        try:
            _SAME[kind] = json.dumps(_packed(event), sort_keys=True) == dagster
        except Exception:  # what Dagster serialized and this walk could not
            _SAME[kind] = False
        return dagster
    return json.dumps(_packed(event), sort_keys=True)


def _with_placeholder(event: Any) -> Any:
    """A materialization ``event`` with its column schema replaced by ``_PLACEHOLDER``."""
    dagster_event = event.dagster_event
    data = dagster_event.event_specific_data
    materialization = data.materialization
    metadata = {**materialization.metadata, _SCHEMA_KEY: TextMetadataValue(_PLACEHOLDER)}
    return event._replace(dagster_event=dagster_event._replace(
        event_specific_data=data._replace(materialization=materialization._replace(metadata=metadata))))


class EventBatches:
    """Events stored together: within ``batch()``, what this thread stores is held, and at its
    end handed to ``store_event_batch`` (one transaction: one commit) at once; a batch left by an
    exception is dropped whole. Held, not a transaction left open between the events: Dagster
    stores a step's events one at a time under its log handler's lock, and another thread of
    the run (a launching thread logging a line) may be waiting on the database under that lock."""

    _batches: threading.local

    def store_event_batch(self, events: Sequence[Any]) -> None:
        raise NotImplementedError

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The events this thread stores meanwhile, stored as one batch at the end (a partition's
        materialization and check evaluations, a step's planned materializations:
        ``curation_dagster.run.recorder.together``). Nested: the outer one's."""
        if getattr(self._batches, "events", None) is not None:
            yield
            return
        events: list[Any] = []
        self._batches.events = events
        try:
            yield
        finally:
            self._batches.events = None
        if events:
            self.store_event_batch(events)

    def targeted(self, event: Any, found: dict[tuple[Any, str | None], Any]) -> Any:
        """``event``, or, where it is a run's check evaluation with no target, that evaluation
        targeting its partition's latest materialization when the same run stored it (the
        batch's own, stored before it in this transaction: its storage id is known only now).
        The check state the UI's partition statuses and the automation's ``check_failed`` read
        counts an evaluation only for the materialization it names. ``found``: the targets known,
        by (asset key, partition): the batch's own materializations (``store_together``), else
        one lookup per partition (a partition's evaluations follow its materialization)."""
        from dagster_shared.record import replace

        evaluation = _untargeted(event)
        if evaluation is None:
            return event
        at = (evaluation.asset_key, evaluation.partition)
        if at not in found:
            found[at] = latest_target(self, evaluation.asset_key, evaluation.partition)
        target = found[at]
        if target is None or target.run_id != event.run_id:
            return event
        dagster_event = event.dagster_event
        return event._replace(dagster_event=dagster_event._replace(
            event_specific_data=replace(evaluation, target_materialization_data=target)))

    def store_together(self, conn: Any, events: Sequence[Any]) -> None:
        """Store ``events`` on ``conn`` (in the caller's transaction) as Dagster's ``store_event``
        stores them one after another, with the same rows in every table, in a few statements.
        Profiled (py-spy, ``curate run`` of 200 sources, 1,408 partitions), recording took half of
        the run process's CPU, most of it Dagster's work per event: each event serialized two or
        three times (its row, its asset's row, its check's row), a statement built and compiled
        for each write, a failed insert before each asset row's update, and a lookup of each
        partition's materialization for its evaluations' target. Here each event is serialized
        once for its row and its check's row; the events' rows are one insert (``RETURNING``
        their ids), then their tags, each asset's row once (its last materialization and last
        planned materialization, in their order: Dagster's each overwrites what the earlier ones
        wrote; dagster-postgres's own batch writes the last event alone), and the checks' rows
        one select and an insert or update each. An evaluation with no target targets the batch's
        materialization of its partition, whose id the insert returned (on SQLite, the id it was
        numbered before: ``_insert_numbered``). A batch with any other event (or a runless one)
        is stored event by event, as Dagster's."""
        if not events:
            return
        if not all(event.run_id and event.dagster_event is not None
                   and event.dagster_event.event_type_value in _BATCHED for event in events):
            self.store_each(events)
            return
        targets: dict[tuple[Any, str | None], Any] = {}
        materialized = {(e.dagster_event.asset_key, e.dagster_event.partition) for e in events
                        if e.dagster_event.event_type_value == _MATERIALIZATION}
        judged = any((evaluation.asset_key, evaluation.partition) in materialized
                     for evaluation in map(_untargeted, events) if evaluation is not None)
        stored = self._insert_numbered(conn, events, targets) if judged and conn.dialect.name == "sqlite" else None
        if stored is None:
            stored = self._insert_in_turn(conn, events, targets)
        assets = [(event, event_id) for event, event_id, _ in stored if event.dagster_event.asset_key
                  and event.dagster_event.event_type_value != _EVALUATION]
        if assets:
            self._store_asset_event_tags(conn, [e for e, _ in assets], [i for _, i in assets])
            first: dict[Any, int] = {}  # each asset's first event: its row is made in that order
            last: dict[tuple[Any, str], tuple[int, Any, int]] = {}
            for n, (event, event_id) in enumerate(assets):
                first.setdefault(event.dagster_event.asset_key, n)
                last[(event.dagster_event.asset_key, event.dagster_event.event_type_value)] = (n, event, event_id)
            self._batches.serialized = {event_id: row for _, event_id, row in stored}
            try:
                for _, event, event_id in sorted(last.values(),
                                                 key=lambda x: (first[x[1].dagster_event.asset_key], x[0])):
                    self._store_asset_event(conn, event, event_id)
            finally:
                self._batches.serialized = None
        checks = [(e, i, row) for e, i, row in stored if e.dagster_event.event_type_value == _EVALUATION]
        if checks:
            self._store_check_rows(conn, checks)
        self._notify(conn, stored[-1][0].run_id, stored[-1][1])

    def _insert_numbered(self, conn: Any, events: Sequence[Any], targets: dict[tuple[Any, str | None], Any]
                         ) -> list[tuple[Any, int, str]] | None:
        """The events' rows on SQLite in one insert, their ids known before they are serialized:
        an evaluation names its partition's materialization in this batch by the id it will
        have (elsewhere a partition's evaluations wait for the insert of its materialization: an
        insert a partition, a fifth of storing a batch of twenty). A write that writes nothing
        takes the database's write lock, held to the commit: no other writer inserts meanwhile,
        and SQLite numbers new rows from one past the largest id. None, with nothing left
        written, where the ids came out otherwise (the caller inserts partition by partition)."""
        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as Events

        start = self._next_id(conn)
        numbered: dict[tuple[Any, str | None], Any] = dict(targets)
        prepared: list[Any] = []
        for n, event in enumerate(events, start=start):
            prepared.append(self.targeted(event, numbered))
            if event.dagster_event.event_type_value == _MATERIALIZATION:
                numbered[(event.dagster_event.asset_key, event.dagster_event.partition)] = _target(
                    n, event.run_id, event.timestamp)
        stored = self._insert_events(conn, prepared, targets)
        ids = [event_id for _, event_id, _ in stored]
        if ids == list(range(start, start + len(events))):
            return stored
        conn.execute(Events.delete().where(Events.c.id.in_(ids)))
        targets.clear()
        return None

    def _insert_in_turn(self, conn: Any, events: Sequence[Any], targets: dict[tuple[Any, str | None], Any]
                        ) -> list[tuple[Any, int, str]]:
        """The events' rows in as few inserts as their targets allow: an evaluation of a
        partition whose materialization waits in the current insert starts the next one (its
        target's id is known only once that insert has run)."""
        stored: list[tuple[Any, int, str]] = []  # event, its id, its serialized form
        segment: list[Any] = []
        waiting: set[tuple[Any, str | None]] = set()  # the segment's materializations
        for event in events:
            evaluation = _untargeted(event)
            if evaluation is not None and (evaluation.asset_key, evaluation.partition) in waiting:
                stored += self._insert_events(conn, segment, targets)
                segment, waiting = [], set()
            segment.append(self.targeted(event, targets))
            if event.dagster_event.event_type_value == _MATERIALIZATION:
                waiting.add((event.dagster_event.asset_key, event.dagster_event.partition))
        return stored + self._insert_events(conn, segment, targets)

    def _next_id(self, conn: Any) -> int:
        """The id SQLite gives the next event row, the write lock taken (``_insert_numbered``)."""
        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as Events

        conn.execute(Events.update().where(sa.false()).values(run_id=Events.c.run_id))
        return int(conn.execute(sa.select(sa.func.max(Events.c.id))).scalar() or 0) + 1

    def _insert_events(self, conn: Any, events: list[Any], targets: dict[tuple[Any, str | None], Any]
                       ) -> list[tuple[Any, int, str]]:
        """The events' rows, one insert; each event with its id and serialized form. A
        materialization becomes the target of its partition's later evaluations (``targets``)."""
        if not events:
            return []
        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as Events

        rows = [self._event_to_row(event) for event in events]
        if conn.dialect.name == "sqlite":
            # One statement; SQLite numbers a statement's rows in order under the transaction's
            # write lock, so the ids sorted are the rows'. (SQLAlchemy would send a statement per
            # row to return them in order: SQLite has no ordering it can rely on.)
            ids = sorted(row[0] for row in conn.execute(Events.insert().returning(Events.c.id), rows))
        else:
            ids = [row[0] for row in conn.execute(
                Events.insert().returning(Events.c.id, sort_by_parameter_order=True), rows)]
        for event, event_id in zip(events, ids, strict=True):
            if event.dagster_event.event_type_value == _MATERIALIZATION:
                targets[(event.dagster_event.asset_key, event.dagster_event.partition)] = _target(
                    event_id, event.run_id, event.timestamp)
        return [(event, event_id, row["event"]) for event, event_id, row in zip(events, ids, rows, strict=True)]

    def _get_asset_entry_values(self, event: Any, event_id: int, has_asset_key_index_cols: bool) -> dict[str, Any]:
        """Dagster's values of an asset's row for ``event``; a materialization's record (its event
        and its id, ``EventLogRecord``) made from the event as its row holds it, when the batch
        stored it, not serialized again (a tenth of storing a partition). Dagster serializes with
        sorted keys, so the record's text is its event's text in place."""
        serialized = getattr(self._batches, "serialized", None) or {}
        dagster_event = event.dagster_event
        if event_id not in serialized or not dagster_event.is_step_materialization:
            return super()._get_asset_entry_values(event, event_id, has_asset_key_index_cols)  # type: ignore[misc, no-any-return]
        from dagster._time import datetime_from_timestamp

        values: dict[str, Any] = {
            "last_materialization": (f'{{"__class__": "EventLogRecord", "event_log_entry": {serialized[event_id]}, '
                                     f'"storage_id": {int(event_id)}}}'),
            "last_run_id": event.run_id,
        }
        if has_asset_key_index_cols:
            values["last_materialization_timestamp"] = datetime_from_timestamp(event.timestamp)
        return values

    def _store_check_rows(self, conn: Any, checks: list[tuple[Any, int, str]]) -> None:
        """The check executions' rows of run evaluations (event, id, serialized), as Dagster's
        ``_update_asset_check_evaluation`` writes each: the run's row of that check and partition
        (a planned one) updated, else a new one."""
        from dagster import DagsterInvariantViolationError
        from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable as Checks

        def at(event: Any) -> tuple[str, str, str, str | None]:
            evaluation = event.dagster_event.event_specific_data
            return (evaluation.asset_key.to_string(), evaluation.check_name, event.run_id, evaluation.partition)

        keys = {at(event) for event, _, _ in checks}
        existing: dict[tuple[str, str, str, str | None], int] = {}
        for run_id in {key[2] for key in keys}:
            ours = [key for key in keys if key[2] == run_id]
            # The batch's partitions only: a crawl run holds a row per check and partition, so
            # without them each batch read back every row its step had written so far (a fifth of
            # storing a batch at 200 sources, growing with the sources).
            named = {key[3] for key in ours} - {None}
            within: sa.ColumnElement[bool] = Checks.c.partition.in_(named)
            if any(key[3] is None for key in ours):
                within = sa.or_(Checks.c.partition.is_(None), within) if named else Checks.c.partition.is_(None)
            query = sa.select(Checks.c.asset_key, Checks.c.check_name, Checks.c.run_id, Checks.c.partition).where(
                Checks.c.run_id == run_id, Checks.c.asset_key.in_({key[0] for key in ours}),
                Checks.c.check_name.in_({key[1] for key in ours}), within)
            for row in conn.execute(query):
                key = (row[0], row[1], row[2], row[3])
                existing[key] = existing.get(key, 0) + 1
        inserts: list[dict[str, Any]] = []
        updates: list[tuple[tuple[str, str, str, str | None], dict[str, Any]]] = []
        for event, event_id, serialized in checks:
            evaluation = event.dagster_event.event_specific_data
            key = at(event)
            if existing.get(key, 0) > 1:
                raise DagsterInvariantViolationError(
                    f"Updated {existing[key]} rows for asset check evaluation {evaluation.asset_check_key} "
                    "as a result of duplicate AssetCheckPlanned events.")
            target = evaluation.target_materialization_data
            values = {
                "execution_status": "SUCCEEDED" if evaluation.passed else "FAILED",
                "evaluation_event": serialized,
                "evaluation_event_timestamp": self._event_insert_timestamp(event),
                "evaluation_event_storage_id": event_id,
                "materialization_event_storage_id": target.storage_id if target else None,
                "partition": evaluation.partition,
            }
            if key in existing:
                updates.append((key, values))
            else:
                inserts.append({**values, "asset_key": key[0], "check_name": key[1], "run_id": key[2]})
                existing[key] = 1  # a later evaluation of it in this batch updates this row
        if inserts:
            conn.execute(Checks.insert(), inserts)
        for (asset_key, check_name, run_id, partition), values in updates:  # a null partition: its own comparison
            conn.execute(Checks.update().where(
                Checks.c.asset_key == asset_key, Checks.c.check_name == check_name, Checks.c.run_id == run_id,
                Checks.c.partition.is_(None) if partition is None else Checks.c.partition == partition,
            ).values(**values))

    def store_each(self, events: Sequence[Any]) -> None:
        """The events one by one, each as Dagster's ``store_event`` stores it (in the current
        batch's transaction), a run's evaluation with no target targeting its partition's
        materialization (``targeted``): what ``store_together`` matches, in fewer statements."""
        found: dict[tuple[Any, str | None], Any] = {}
        for event in events:
            self.store_event_now(self.targeted(event, found))
            dagster_event = event.dagster_event
            if event.run_id and dagster_event is not None and dagster_event.event_type_value == _MATERIALIZATION:
                found.pop((dagster_event.asset_key, dagster_event.partition), None)  # the latest now

    def _notify(self, conn: Any, run_id: str, last_id: int) -> None:
        """After a batch is stored: what the storage tells listeners (nothing, here)."""

    def store_event_now(self, event: Any) -> None:
        """Dagster's ``store_event`` of the storage, inside the current batch's transaction."""
        raise NotImplementedError

    def _event_to_row(self, event: Any) -> dict[str, Any]:
        """Dagster's row of ``event`` (``SqlEventLogStorage._event_to_row``: the same columns, filled
        the same way), its serialized form the same bytes, made faster (``_dumps``) and with a
        materialization's column schema serialized once for all the events that share it
        (``_serialized_schema``)."""
        dagster_event = event.dagster_event
        return {
            "run_id": event.run_id,
            "event": self._serialized(event),
            "dagster_event_type": dagster_event.event_type_value if dagster_event is not None else None,
            "timestamp": self._event_insert_timestamp(event),
            "step_key": dagster_event.step_key if dagster_event is not None else event.step_key,
            "asset_key": dagster_event.asset_key.to_string() if dagster_event is not None and
            dagster_event.asset_key else None,
            "partition": dagster_event.partition if dagster_event is not None and dagster_event.partition else None,
        }

    @staticmethod
    def _serialized(event: Any) -> str:
        """``serialize_value(event)``, byte for byte (``_event_to_row``)."""
        value = _column_schema(event)
        schema = None if value is None else _serialized_schema(value)
        if schema is not None:
            head, _, tail = _dumps(_with_placeholder(event)).partition(_PLACEHOLDER_JSON)
            if _PLACEHOLDER_JSON not in tail:  # else the placeholder's text is in the event itself
                return head + schema + tail
        return _dumps(event)

    if TYPE_CHECKING:  # Dagster's SqlEventLogStorage's, which the storages this mixes into have
        def _store_asset_event_tags(self, conn: Any, events: Sequence[Any], event_ids: Sequence[int]) -> None: ...

        def _store_asset_event(self, conn: Any, event: Any, event_id: int) -> None: ...

        def _event_insert_timestamp(self, event: Any) -> Any: ...

    def _held_back(self, event: Any) -> bool:
        """Whether ``event`` joined this thread's open batch (else it is to be stored now). Only
        the events a batch is for: a batch is open across the step's ``yield``, and an event
        Dagster stores meanwhile for itself (a step's failure, its run's end) is never held,
        whatever becomes of the batch."""
        events = getattr(self._batches, "events", None)
        if events is None:
            return False
        if event.dagster_event is None or event.dagster_event.event_type_value not in _BATCHED:
            return False
        events.append(event)
        return True


class PooledSqliteEventLogStorage(EventBatches, ConsolidatedSqliteEventLogStorage):
    """``ConsolidatedSqliteEventLogStorage`` on one engine per process with pooled connections."""

    _engine: sa.engine.Engine | None = None
    _engine_pid: int | None = None
    _engine_lock = threading.Lock()

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        self._tables: set[str] = set()  # tables seen (before the base class creates any)
        self._asset_key_columns: set[str] = set()  # columns of the asset keys table seen
        self._held = threading.local()  # this thread's connection while it stores events
        self._batches = threading.local()
        super().__init__(base_dir, inst_data)

    def store_event(self, event: Any) -> None:
        """Dagster's, with every write of the event in one transaction on one connection (its
        row, its asset's row and tags, its check's row): atomic, and one commit instead of 3-4,
        a third of what recording a small partition cost ``curate run``'s process."""
        if not self._held_back(event):
            self.store_event_batch([event])

    def store_event_batch(self, events: Sequence[Any]) -> None:
        """The events in one transaction: all stored, or none (Dagster's stores them one by one)."""
        if getattr(self._held, "conn", None) is not None:  # storing an event while storing one
            for event in events:
                super().store_event(event)
            return
        with self._connect() as conn:
            self._held.conn = conn
            try:
                self.store_together(conn, events)
            finally:
                self._held.conn = None

    def store_event_now(self, event: Any) -> None:
        """Dagster's own, in the batch's transaction (``EventBatches.store_each``)."""
        super().store_event(event)

    def _store_asset_event(self, conn: Any, event: Any, event_id: int) -> None:
        """Dagster's, as one upsert, as dagster-postgres writes it: Dagster's SQLite storage tries
        an insert first, which fails on every event of an asset it knows already (a raised and
        caught IntegrityError), then updates: a fifth of what storing a materialization cost."""
        from dagster._core.storage.event_log.schema import AssetKeyTable
        from sqlalchemy.dialects import sqlite

        if not (event.dagster_event and event.dagster_event.asset_key):
            return
        values = self._get_asset_entry_values(event, event_id, self._has_asset_key_index_cols_on_connection(conn))
        if not values:
            return
        conn.execute(sqlite.insert(AssetKeyTable).values(asset_key=event.dagster_event.asset_key.to_string(), **values)
                     .on_conflict_do_update(index_elements=[AssetKeyTable.c.asset_key], set_=values))

    def _has_asset_key_col_on_connection(self, conn: Any, column_name: str) -> bool:
        """Dagster's reads the table's columns for every stored materialization; a column once
        there stays (migrations only add them)."""
        if column_name in self._asset_key_columns:
            return True
        found = bool(super()._has_asset_key_col_on_connection(conn, column_name))
        if found:
            self._asset_key_columns.add(column_name)
        return found

    def engine(self) -> sa.engine.Engine:
        with self._engine_lock:
            if self._engine is None or self._engine_pid != os.getpid():
                if self._engine is not None:  # a forked child: leave the parent's connections alone
                    self._engine.dispose(close=False)
                # A few connections kept open (threads of the webserver), any number beyond them.
                engine = sa.create_engine(
                    self._conn_string, pool_size=4, max_overflow=-1,
                    connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
                )
                sa.event.listen(engine, "connect", _on_connect)
                self._engine, self._engine_pid = engine, os.getpid()
            return self._engine

    def has_table(self, table_name: str) -> bool:
        """Dagster's asks a new unpooled engine every time (per stored materialization with tags):
        the pooled one, and a table once there stays (migrations only add them)."""
        if table_name in self._tables:
            return True
        with self.engine().connect() as conn:
            found = bool(self.engine().dialect.has_table(conn, table_name))
        if found:
            self._tables.add(table_name)
        return found

    def watch(self, run_id: str | None, cursor: str | None, callback: Any) -> None:
        """As Dagster's, but woken by writes to the write-ahead log too: with connections kept
        open a commit changes only ``event_log.db-wal`` (the database file changes at a
        checkpoint, every ~1,000 pages), and the UI streams a run's logs from these callbacks."""
        if not self._obs:
            from watchdog.observers import Observer

            observer = Observer()
            observer.start()
            observer.schedule(_Watchdog(self), self._base_dir, recursive=True)
            self._obs = observer  # type: ignore[assignment]  # the base class declares it None
        self._watchers[run_id][callback] = cursor

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        held = getattr(self._held, "conn", None)
        if held is not None:  # inside store_event: its transaction
            yield held
            return
        with self.engine().connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        if self._engine is not None and self._engine_pid == os.getpid():
            self._engine.dispose()
            self._engine = None
        super().dispose()


def _new_lock() -> None:
    """A forked child's lock: the parent's may have been held by one of its threads."""
    PooledSqliteEventLogStorage._engine_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


class _Watchdog(PatternMatchingEventHandler):
    """Calls the storage's ``on_modified`` when its database or its write-ahead log changes."""

    def __init__(self, storage: PooledSqliteEventLogStorage) -> None:
        self._storage = storage
        db = storage.get_db_path()
        super().__init__(patterns=[db, db + "-wal"])

    def on_modified(self, event: Any) -> None:
        self._storage.on_modified()
