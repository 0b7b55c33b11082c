"""The instance storage of ``curate deploy`` (its ``dagster.yaml`` names it): dagster-postgres's,
with its run and event-log connections held open and the tables it has found remembered.

Profiled with py-spy on a 200-source deployed crawl (1,408 partitions), a run worker's main thread
spent most of its time on two things per recorded event (a materialization, a check evaluation):

- connecting: dagster-postgres opens a connection per query (SQLAlchemy's ``NullPool``) everywhere
  but in dagster-webserver, which holds one (``optimize_for_webserver``); each connection forks a
  PostgreSQL backend and runs the SCRAM handshake on both sides (75% of the thread);
- asking PostgreSQL's catalog whether a table exists (``has_table``: the asset-event tags table
  for every materialization, the check executions table for every check evaluation), a third of
  the time left once connections were held. A table, once there, stays: a found one is
  remembered (a missing one is asked again, so a migration is seen).

Then, per recorded partition, a commit per statement (the engine autocommits: an event's row, its
NOTIFY, its asset's row, its check's row), each a WAL flush: a batch of events
(``curation_dagster.ops.event_log.EventBatches``: a partition's materialization and check
evaluations, a step's planned materializations) is stored in one transaction.

Imported only by the deployment's Dagster processes: dagster-postgres is the ``deploy`` extra's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager, suppress
from typing import Any

import sqlalchemy as sa
from dagster import EventLogEntry
from dagster_postgres import (
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)
from dagster_postgres.event_log.event_log import CHANNEL_NAME
from sqlalchemy.engine import Connection

from curation_dagster.ops.event_log import EventBatches


class _EventLogStorage(EventBatches, PostgresEventLogStorage):
    """dagster-postgres's event log, its tables remembered once found, a batch of events stored in
    one transaction (``EventBatches``)."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, token_provider: Any = None) -> None:
        self._found: set[str] = set()
        self._held = threading.local()  # this thread's connection while it stores a batch
        self._batches = threading.local()
        # This process's writes one at a time, so that its events commit in the order of their
        # ids: a run's live log (the UI's, SqlPollingEventWatcher) reads on from the last id it
        # saw, and would never see a batch's events committed after a later id of another thread.
        # (Dagster's log handler serializes its writes the same way; a batch is stored outside it.)
        self._writing = threading.RLock()
        super().__init__(postgres_url, should_autocreate_tables, token_provider=token_provider)

    def has_table(self, table_name: str) -> bool:
        if table_name in self._found:
            return True
        found = super().has_table(table_name)
        if found:
            self._found.add(table_name)
        return found

    def store_event(self, event: EventLogEntry) -> None:
        if not self._held_back(event):
            with self._writing:
                super().store_event(event)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """The events in one transaction, each stored as ``store_event`` stores it: one commit,
        where each event is otherwise 3-4 (the engine autocommits each statement: the event's row,
        its NOTIFY, its asset's row and tags, its check's row), each a WAL flush. (dagster-postgres
        batches only materializations or only observations, and commits those in two.)"""
        if getattr(self._held, "conn", None) is not None:  # a batch while storing one
            for event in events:
                super().store_event(event)
            return
        # BEGIN and COMMIT sent as statements on the autocommit connection: switching it out of
        # autocommit (``execution_options(isolation_level=...)``, as dagster-postgres's
        # index_transaction does) and back costs two more round trips, 8% of a batch (py-spy).
        # The first statement autobegins SQLAlchemy's transaction, so Dagster's index_transaction
        # inside runs in this one.
        with self._writing, super()._connect() as conn:
            conn.exec_driver_sql("BEGIN")
            self._held.conn = conn
            try:
                self.store_together(conn, events)
                conn.exec_driver_sql("COMMIT")
            except BaseException:
                with suppress(Exception):  # a broken connection: the error is the first one
                    conn.exec_driver_sql("ROLLBACK")
                raise
            finally:
                self._held.conn = None

    def store_event_now(self, event: EventLogEntry) -> None:
        """Dagster's own, in the batch's transaction (``EventBatches.store_each``)."""
        super().store_event(event)

    def _notify(self, conn: Connection, run_id: str, last_id: int) -> None:
        """The NOTIFY dagster-postgres sends for each stored event (kept for listeners of earlier
        versions, which read on from their cursor when woken), once for the batch's last."""
        conn.execute(sa.text(f"NOTIFY {CHANNEL_NAME}, :notify_id"), {"notify_id": f"{run_id}_{last_id}"})

    @contextmanager
    def _held_or_new(self) -> Iterator[Connection]:
        held = getattr(self._held, "conn", None)
        if held is not None:
            yield held
            return
        with super()._connect() as conn:
            yield conn

    def _connect(self) -> ContextManager[Connection]:
        """The batch's connection, in its transaction, while this thread stores one."""
        return self._held_or_new()


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` whose run and event-log storages each keep one connection open
    (more threads at once open their own, as before), without a statement timeout, recycled
    hourly; its event log remembers the tables it found."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, inst_data: Any = None,
                 token_provider: Any = None) -> None:
        # DagsterPostgresStorage's __init__ with our event log in place of its own, which it would
        # build first (an engine, the database's tables listed) only for it to be dropped.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        self._run_storage = PostgresRunStorage(postgres_url, should_autocreate_tables, token_provider=token_provider)
        self._event_log_storage = _EventLogStorage(postgres_url, should_autocreate_tables, token_provider)
        self._schedule_storage = PostgresScheduleStorage(postgres_url, should_autocreate_tables,
                                                         token_provider=token_provider)
        super(DagsterPostgresStorage, self).__init__()  # what DagsterPostgresStorage's ends with
        for storage in (self.run_storage, self.event_log_storage):
            storage.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=20)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> PooledPostgresStorage:  # type: ignore[override]
        from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

        return cls(postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   inst_data=inst_data, token_provider=get_token_provider_from_config(config_value))
