"""The instance storage of ``curate deploy`` (its ``dagster.yaml`` names it): dagster-postgres's,
with its run and event-log connections held open.

dagster-postgres opens a connection per query (SQLAlchemy's ``NullPool``) everywhere but in
dagster-webserver, which holds one (``optimize_for_webserver``). Each connection forks a PostgreSQL
backend and runs the SCRAM handshake on both sides, for every event a run worker records: a
materialization, a check evaluation, a log line. Profiled with py-spy on a 200-source deployed
crawl (1,408 partitions), connecting was 75% of the run worker's main thread (docs/operations.md).
Imported only by the deployment's Dagster processes: dagster-postgres is the ``deploy`` extra's.
"""

from __future__ import annotations

from typing import Any

from dagster._core.storage.config import pg_config
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` whose run and event-log storages each keep one connection open
    (more threads at once open their own, as before), without a statement timeout, recycled hourly."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, inst_data: Any = None,
                 token_provider: Any = None) -> None:
        super().__init__(postgres_url, should_autocreate_tables, inst_data, token_provider)
        for storage in (self.run_storage, self.event_log_storage):
            storage.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=20)

    @classmethod
    def config_type(cls) -> Any:
        return pg_config()

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> PooledPostgresStorage:  # type: ignore[override]
        return cls(postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   inst_data=inst_data, token_provider=get_token_provider_from_config(config_value))
