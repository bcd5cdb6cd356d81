"""A StateTable is built without I/O (as Kafka Streams' store builders are); `ensure`, which
every opening step calls, makes the changelog topic and checks the folder's definition."""
from __future__ import annotations

import pytest

from state import changelog
from state.aggregates import Count, RowAggregator
from state.errors import DefinitionChanged
from state.table import StateTable, TableSpec


def _spec(partitions: int = 2) -> TableSpec:
    return TableSpec("lifecycle", partitions, RowAggregator({"n": Count()}))


def test_the_constructor_touches_no_folder_and_no_broker(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(changelog, "ensure_changelog", lambda *args: made.append(args))
    table = StateTable(_spec(), tmp_path / "state", bootstrap="127.0.0.1:9", snapshot_uri=str(tmp_path / "snaps"))
    assert made == [] and not (tmp_path / "state").exists() and not (tmp_path / "snaps").exists()
    assert table.ensure() is table and table.ensure() is table       # once, however often asked
    assert made == [("127.0.0.1:9", "lifecycle-changelog", 2)]
    assert (tmp_path / "state" / "lifecycle" / "table.json").exists()


def test_a_changed_definition_is_refused_when_the_table_opens_not_when_it_is_built(tmp_path):
    StateTable(_spec(2), tmp_path).ensure()
    other = StateTable(_spec(3), tmp_path)                         # building it is harmless
    with pytest.raises(DefinitionChanged, match="partitions"):
        other.open(0)
    with pytest.raises(DefinitionChanged):
        other.ensure()
