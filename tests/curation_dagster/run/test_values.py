"""A pool worker's metadata values (``curation_dagster.run.values``): plain data there, the
Dagster values where they are unpickled, equal to those made at once."""

from __future__ import annotations

import pickle

import dagster as dg
import pytest

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


def test_a_value_dagster_refuses_is_a_text_saying_why_here_and_where_unpickled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A table Dagster refuses (rows of other fields, a cell that is a list) costs one metadata
    entry, never an exception: where a worker's ``Later`` is unpickled, the pool's result thread,
    one would break the pool. The same where the value is made at once."""
    for rows in ([{"doc_id": "a", "score": 1}, {"doc_id": "b"}], [{"doc_id": ["a"]}]):
        now = values.table(rows, COLUMNS)
        monkeypatch.setattr(values, "_DEFERRED", True)
        later = pickle.loads(pickle.dumps(values.table(rows, COLUMNS)))
        monkeypatch.setattr(values, "_DEFERRED", False)
        assert now == later and isinstance(now, dg.TextMetadataValue), now
        assert now.text.startswith("metadata value could not be made: CheckError")
    assert isinstance(values.table([{"doc_id": None}], COLUMNS), dg.TableMetadataValue)  # None: a cell Dagster takes
