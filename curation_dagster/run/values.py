"""Dagster metadata values made from plain data, here or where Dagster is loaded.

A warm pool's worker describes each partition it runs (``curation_dagster.run.partition``):
its column schema, the ledger's tables, a failed check's examples are Dagster metadata values.
The worker imports no Dagster (its fork server then starts 0.5 s sooner, ``run.worker_imports``):
after ``defer()`` each value is a ``Later``, plain data that becomes the Dagster value where it
is unpickled, in the process that records it. Elsewhere (the recording process, an asset step)
the value is made at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

_DEFERRED = False


def defer() -> None:
    """From now on, this process makes ``Later`` values (a pool worker, which imports no Dagster)."""
    global _DEFERRED
    _DEFERRED = True


class Later:
    """A Dagster metadata value not made yet: ``kind`` and its plain arguments; pickled, it is
    made where it is unpickled (``_made``)."""

    __slots__ = ("args", "kind")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args

    def __reduce__(self) -> tuple[Any, tuple[str, tuple[Any, ...]]]:
        return _made, (self.kind, self.args)

    def __repr__(self) -> str:
        return f"Later({self.kind!r})"


Columns = Sequence[tuple[str, str, str]]  # (name, type, description) of each column


@functools.lru_cache(maxsize=256)
def _schema(columns: tuple[tuple[str, str, str], ...]) -> Any:
    """The ``TableSchema`` of ``columns``, one object for equal columns: every partition of a
    step shares its table's, and the event log serializes it once
    (``curation_dagster.ops.event_log.EventBatches``). Shared: never to be changed, its
    ``columns`` list included."""
    from dagster import TableColumn, TableSchema

    return TableSchema(columns=[TableColumn(name, type_, description) for name, type_, description in columns])


def _make(kind: str, args: tuple[Any, ...]) -> Any:
    from dagster import MetadataValue, TableRecord

    if kind == "md":
        return MetadataValue.md(args[0])
    schema = _schema(tuple((name, type_, description) for name, type_, description in args[0]))
    if kind == "schema":
        return schema
    assert kind == "table", kind
    return MetadataValue.table([TableRecord(r) for r in args[1]], schema)


def _made(kind: str, args: tuple[Any, ...]) -> Any:
    """``_make``, where a value Dagster refuses is a text saying why, here and where a ``Later`` is
    unpickled alike: there, in the pool's result thread, an exception would break the pool (every
    partition of the step failed), where it should cost one metadata entry."""
    try:
        return _make(kind, args)
    except Exception as exc:
        from dagster import MetadataValue

        return MetadataValue.text(f"metadata value could not be made: {type(exc).__name__}: {exc}")


def _value(kind: str, *args: Any) -> Any:
    return Later(kind, args) if _DEFERRED else _made(kind, args)


def md(text: str) -> Any:
    """``MetadataValue.md(text)``."""
    return _value("md", text)


def schema(columns: Columns) -> Any:
    """``TableSchema`` of ``columns`` (the ``dagster/column_schema`` of a partition's table)."""
    return _value("schema", list(columns))


def table(rows: Sequence[dict[str, Any]], columns: Columns) -> Any:
    """``MetadataValue.table`` of ``rows`` (each a ``TableRecord``) with ``columns``' schema."""
    return _value("table", list(columns), list(rows))
