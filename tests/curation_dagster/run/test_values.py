"""A pool worker's metadata values (``curation_dagster.run.values``): plain data there, the
Dagster values where they are unpickled, equal to those made at once."""

from __future__ import annotations

import pickle

import dagster as dg
import pytest
from dagster_shared.check import CheckError

from curation_dagster.run import values

COLUMNS = [("doc_id", "string", "documents.doc_id"), ("score", "float", "documents.score")]
ROWS = [{"doc_id": "a", "score": 0.5}, {"doc_id": "b", "score": ""}]


def made() -> list[object]:
    return [values.md("| a | b |"), values.schema(COLUMNS), values.table(ROWS, COLUMNS)]


def test_deferred_values_become_the_values_made_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    now = made()
    assert isinstance(now[0], dg.MarkdownMetadataValue) and isinstance(now[1], dg.TableSchema)
    assert isinstance(now[2], dg.TableMetadataValue)
    monkeypatch.setattr(values, "_DEFERRED", True)  # as ``values.defer()`` in a pool worker
    later = made()
    assert all(isinstance(v, values.Later) for v in later)
    assert [pickle.loads(pickle.dumps(v)) for v in later] == now
    assert now[1].columns[0] == dg.TableColumn("doc_id", "string", "documents.doc_id")
    assert now[2].records[1] == dg.TableRecord({"doc_id": "b", "score": ""})


def test_a_value_dagster_would_refuse_fails_where_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused in the worker (its partition fails), not where the pool unpickles it (which would
    break the pool): a table cell that is a list, as Dagster's TableRecord refuses it."""
    bad = [{"doc_id": ["a"]}]
    with pytest.raises(CheckError):
        values.table(bad, COLUMNS)
    monkeypatch.setattr(values, "_DEFERRED", True)
    assert isinstance(values.table([{"doc_id": None}], COLUMNS), values.Later)  # None is a cell Dagster takes
    with pytest.raises(TypeError, match="not a Dagster table"):
        values.table(bad, COLUMNS)
    with pytest.raises(TypeError, match="not a Dagster md"):
        values.md(None)  # type: ignore[arg-type]


def test_rows_of_other_fields_fail_where_made_and_never_where_unpickled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows with other fields: Dagster refuses the table; a worker refuses it as it is made. One
    that got past that check (a later Dagster's rule) unpickles as a text saying why, not an
    exception in the pool's result thread."""
    rows = [{"doc_id": "a", "score": 1}, {"doc_id": "b"}]
    with pytest.raises(CheckError):
        values.table(rows, COLUMNS)
    monkeypatch.setattr(values, "_DEFERRED", True)
    with pytest.raises(TypeError, match="not a Dagster table"):
        values.table(rows, COLUMNS)
    slipped = values.Later("table", (COLUMNS, rows))
    text = pickle.loads(pickle.dumps(slipped))
    assert isinstance(text, dg.TextMetadataValue) and text.text.startswith("metadata value could not be made: ")
