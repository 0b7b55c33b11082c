"""Dagster metadata values made from plain data, here or where Dagster is loaded.

A warm pool's worker describes each partition it runs (``curation_dagster.run.partition``):
its column schema, the ledger's tables, a failed check's examples are Dagster metadata values.
The worker imports no Dagster (its fork server then starts 0.5 s sooner, ``run.worker_imports``):
after ``defer()`` each value is a ``Later``, plain data that becomes the Dagster value where it
is unpickled, in the process that records it. Elsewhere (the recording process, an asset step)
the value is made at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_DEFERRED = False


def defer() -> None:
    """From now on, this process makes ``Later`` values (a pool worker, which imports no Dagster)."""
    global _DEFERRED
    _DEFERRED = True


class Later:
    """A Dagster metadata value not made yet: ``kind`` and its plain arguments; pickled, it is
    made where it is unpickled (``_unpickled``)."""

    __slots__ = ("args", "kind")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args

    def __reduce__(self) -> tuple[Any, tuple[str, tuple[Any, ...]]]:
        return _unpickled, (self.kind, self.args)

    def __repr__(self) -> str:
        return f"Later({self.kind!r})"


Columns = Sequence[tuple[str, str, str]]  # (name, type, description) of each column


def _make(kind: str, args: tuple[Any, ...]) -> Any:
    from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

    if kind == "md":
        return MetadataValue.md(args[0])
    schema = TableSchema(columns=[TableColumn(name, type_, description) for name, type_, description in args[0]])
    if kind == "schema":
        return schema
    assert kind == "table", kind
    return MetadataValue.table([TableRecord(r) for r in args[1]], schema)


def _unpickled(kind: str, args: tuple[Any, ...]) -> Any:
    """``_make``, where a ``Later`` is unpickled: in the pool's result thread, where an exception
    would break the pool, a value Dagster refuses (``_check`` missed it) is a text saying why."""
    try:
        return _make(kind, args)
    except Exception as exc:
        from dagster import MetadataValue

        return MetadataValue.text(f"metadata value could not be made: {type(exc).__name__}: {exc}")


def _value(kind: str, *args: Any) -> Any:
    if not _DEFERRED:
        return _make(kind, args)
    _check(kind, args)
    return Later(kind, args)


_CELL = (str, int, float, bool, type(None))  # what a TableRecord holds (dagster 1.13)


def _check(kind: str, args: tuple[Any, ...]) -> None:
    """What Dagster would refuse when making the value, refused here: a ``Later`` is made where it
    is unpickled, in the pool's result thread, where a failure breaks the pool instead of
    failing its partition."""
    if kind == "md":
        ok = isinstance(args[0], str)
    else:
        ok = all(len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], str) and isinstance(c[2], str | None)
                 for c in args[0])
        if kind == "table":  # and every row with the same fields
            ok = ok and all(isinstance(k, str) and isinstance(v, _CELL) for row in args[1] for k, v in row.items())
            ok = ok and all(row.keys() == args[1][0].keys() for row in args[1])
    if not ok:
        raise TypeError(f"not a Dagster {kind} metadata value: {args!r:.200}")


def md(text: str) -> Any:
    """``MetadataValue.md(text)``."""
    return _value("md", text)


def schema(columns: Columns) -> Any:
    """``TableSchema`` of ``columns`` (the ``dagster/column_schema`` of a partition's table)."""
    return _value("schema", [tuple(c) for c in columns])


def table(rows: Sequence[dict[str, Any]], columns: Columns) -> Any:
    """``MetadataValue.table`` of ``rows`` (each a ``TableRecord``) with ``columns``' schema."""
    return _value("table", [tuple(c) for c in columns], [dict(r) for r in rows])
