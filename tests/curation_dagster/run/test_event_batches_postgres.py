"""The deployment's event log (``curation_dagster.ops.pg_storage.PooledPostgresStorage``) on a real
PostgreSQL server: a crawl step stores a partition's materialization and check evaluations in one
transaction, and each evaluation targets the materialization it judged, so Dagster's check state
(the UI's partition check statuses, the automation's ``check_failed``) counts it. The crawl job run
in this process on the tiny corpus, against a throwaway cluster started as ``curate deploy`` starts
its own; skipped where no PostgreSQL server is installed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops.deploy import PG_PASSWORD_ENV, PG_USER, DeployError, Deployment, RunAs, postgres_bindir
from curation_dagster.run.in_process import RunFailed, run_crawl
from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS
from tests.curation_dagster.defs.test_checks import _check_state
from tests.support.tiny_corpus import CRAWL, spec

PASSWORD = "throwaway"


@pytest.fixture
def postgres_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int]]:
    """A Dagster home whose ``dagster.yaml`` is the deployment's (PooledPostgresStorage) on a fresh
    PostgreSQL cluster, and the server's port; the server stopped at the end, even on failure."""
    pytest.importorskip("dagster_postgres")
    try:
        postgres_bindir()
        RunAs.for_postgres()
    except DeployError as exc:
        pytest.skip(str(exc))
    # A folder the PostgreSQL user can enter (pytest's tmp folders are private to root), on a
    # tmpfs where there is one (as tiny_corpus.fast_tmp's): the cluster's files are throwaway.
    shm = Path("/dev/shm")
    roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 512 << 20
    folder = Path(tempfile.mkdtemp(prefix="curate-pg-", dir=shm if roomy else None))
    folder.chmod(0o711)
    dep = Deployment(folder, "unused", log=lambda _: None)
    try:
        (dep.base / "logs").mkdir(parents=True)
        port = dep.start_postgres(PASSWORD)
        dep.write_config(pg_port=port, grpc_port=0)  # dagster.yaml; the workspace is not used
        monkeypatch.setenv(PG_PASSWORD_ENV, PASSWORD)
        yield dep.base / "dagster", port
    finally:
        dep.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _event_rows(port: int) -> list[tuple[int, str, str, str | None, str | None]]:
    """The event log's rows as PostgreSQL holds them: (id, the transaction that inserted it
    (``xmin``), event type, asset, partition), by id."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, password=PASSWORD, dbname=PG_USER)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, xmin::text, dagster_event_type, asset_key, partition FROM event_logs"
                        " WHERE dagster_event_type IS NOT NULL ORDER BY id")
            return [(i, x, e, json.loads(a)[0] if a else None, p) for i, x, e, a, p in cur.fetchall()]
    finally:
        conn.close()


def _evaluations(port: int) -> dict[int, tuple[str, str | None, int | None]]:
    """Each run's check evaluation by its event's id: its asset, its partition and the id of the
    materialization it targets (what the check state joins on; the event's own row names neither
    asset nor partition)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, password=PASSWORD, dbname=PG_USER)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT evaluation_event_storage_id, asset_key, partition, materialization_event_storage_id"
                        " FROM asset_check_executions WHERE evaluation_event_storage_id IS NOT NULL")
            return {e: (json.loads(a)[0], p, m) for e, a, p, m in cur.fetchall()}
    finally:
        conn.close()


def test_on_postgres_a_partitions_events_are_one_transaction_and_its_evaluations_count(
    postgres_home: tuple[Path, int], tmp_path: Path
) -> None:
    """A crawl stopped by a blocking check (over_deletion, bound 0.2 on heuristic): in PostgreSQL
    each stored partition is one transaction holding its materialization and every check
    evaluation of it, on consecutive ids; each evaluation targets that materialization, so the
    check state shows the blocked partitions FAILED and the other SUCCEEDED."""
    home, port = postgres_home
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "curate.yaml").write_text(yaml.safe_dump(
        {"checks": {"over_deletion": {"per_stage": {"heuristic": 0.2}, "min_documents": 0}}}))
    with pytest.raises(RunFailed, match="check over_deletion failed"):
        run_crawl(workdir, home, spec(stages=("heuristic", "exact")), quiet=True,
                  resource=CurationResource(workdir=str(workdir), workers=1))
    assert _check_state(home) == {"FAILED": [f"{CRAWL}|forum", f"{CRAWL}|news"], "SUCCEEDED": [f"{CRAWL}|wiki"]}

    rows, evaluations = _event_rows(port), _evaluations(port)
    by_transaction: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for id_, xmin, kind, _, _ in rows:
        by_transaction[xmin].append((id_, kind))
    materialized = {(a, p): i for i, _, kind, a, p in rows if kind == "ASSET_MATERIALIZATION"}
    assert {("filtered_documents", f"{CRAWL}|{s}") for s in ("forum", "news", "wiki")} <= set(materialized)
    stored_with: dict[int, int] = {}  # a check evaluation's id: the materialization's in its transaction
    for events in by_transaction.values():
        if not any(kind == "ASSET_MATERIALIZATION" for _, kind in events):
            continue
        # One partition's materialization, then every check evaluation of it, on consecutive ids.
        (mat_id, kind), *checks = events
        assert kind == "ASSET_MATERIALIZATION" and all(k == "ASSET_CHECK_EVALUATION" for _, k in checks), events
        assert [i for i, _ in events] == list(range(mat_id, mat_id + len(events))), events
        program, partition = next((a, p) for i, _, _, a, p in rows if i == mat_id)
        assert program is not None and partition is not None
        assert {evaluations[i][:2] for i, _ in checks} == {(program, partition)}, events
        assert len(checks) == sum(k.applies(PROGRAMS[program]) for k in CHECK_KINDS), events
        stored_with.update((i, mat_id) for i, _ in checks)
    # Every evaluation stored with its partition's materialization, and targeting it.
    assert set(stored_with) == set(evaluations) == {i for i, _, kind, _, _ in rows if kind == "ASSET_CHECK_EVALUATION"}
    assert {i: m for i, (_, _, m) in evaluations.items()} == stored_with



def _pg_tables(port: int, database: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the event log's tables that a batch writes, but the times the database set and
    the asset rows' ids (an upsert takes a sequence number even where it updates: Dagster's, one
    per event, takes more)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, password=PASSWORD, dbname=database)
    out = {}
    try:
        with conn.cursor() as cur:
            for table in ("event_logs", "asset_keys", "asset_event_tags", "asset_check_executions"):
                cur.execute(f"SELECT * FROM {table}")
                names = [d[0] for d in cur.description]
                keep = [i for i, n in enumerate(names) if n not in ("create_timestamp", "updated_timestamp")
                        and not (table == "asset_keys" and n == "id")]
                out[table] = sorted((tuple(r[i] for i in keep) for r in cur.fetchall()), key=repr)
    finally:
        conn.close()
    return out


def test_on_postgres_a_batch_writes_the_rows_dagster_postgres_writes_event_by_event(
    postgres_home: tuple[Path, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployment's event log stores a batch in a few statements (``store_together``) with the
    rows dagster-postgres's ``store_event`` writes event by event (``store_each``): a real crawl's
    batches on two warm workers, replayed both ways into fresh databases with the batches no run
    makes (``test_event_batches.replayed``)."""
    import psycopg2

    from curation_dagster.ops.pg_storage import _EventLogStorage
    from tests.curation_dagster.run.test_event_batches import captured, replayed

    home, port = postgres_home
    batches = captured(_EventLogStorage, monkeypatch)
    workdir = tmp_path / "w"
    workdir.mkdir()
    run_crawl(workdir, home, spec(stages=("fuzzy",)), quiet=True, resource=CurationResource(workdir=str(workdir)))
    monkeypatch.undo()
    admin = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, password=PASSWORD, dbname=PG_USER)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE fast")
        cur.execute("CREATE DATABASE each_event")
    admin.close()
    fast, each = (_EventLogStorage(f"postgresql+psycopg2://{PG_USER}:{PASSWORD}@127.0.0.1:{port}/{db}")
                  for db in ("fast", "each_event"))
    try:
        for events in replayed(batches):
            fast.store_event_batch(events)
            with each._writing, each._held_or_new() as conn:
                conn.exec_driver_sql("BEGIN")
                each._held.conn = conn
                try:
                    each.store_each(events)
                    conn.exec_driver_sql("COMMIT")
                finally:
                    each._held.conn = None
    finally:
        fast.dispose()
        each.dispose()
    got, want = _pg_tables(port, "fast"), _pg_tables(port, "each_event")
    assert len(want["asset_check_executions"]) > 0 and len(want["asset_event_tags"]) > 0
    for table in want:
        assert got[table] == want[table], table
