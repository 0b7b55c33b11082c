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
event. A forked child builds its own engine, never its parent's connections.

Named by its private module path, ``dagster._core.storage.event_log``: Dagster exports no public
name for the base class; dagster is pinned (pyproject.toml), and
tests/curation_dagster/test_dagster_tools.py fails if it moves or stops loading.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage

BUSY_TIMEOUT_S = 30  # as Dagster's SQLite storages wait on a locked database


class PooledSqliteEventLogStorage(ConsolidatedSqliteEventLogStorage):
    """``ConsolidatedSqliteEventLogStorage`` on one engine per process with pooled connections."""

    _engine: sa.engine.Engine | None = None
    _engine_pid: int | None = None

    def engine(self) -> sa.engine.Engine:
        if self._engine is None or self._engine_pid != os.getpid():
            if self._engine is not None:  # a forked child: leave the parent's connections alone
                self._engine.dispose(close=False)
            engine = sa.create_engine(
                self._conn_string, pool_size=1, max_overflow=16, pool_pre_ping=False,
                connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
            )
            sa.event.listen(engine, "connect", _on_connect)
            self._engine, self._engine_pid = engine, os.getpid()
        return self._engine

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        with self.engine().connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        if self._engine is not None and self._engine_pid == os.getpid():
            self._engine.dispose()
            self._engine = None
        super().dispose()


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")
