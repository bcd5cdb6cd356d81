"""catalog.registry.due_snapshots with phases: tables that start together snapshot in different
batches, a partition is never more than `snapshot_every` batches behind, and `snapshot_phase: N`
pins the old every-Nth batches."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from catalog import registry
from catalog.definitions import DefinitionError, parse
from catalog.runtime import Runtime

SQL = "-- topic: s\n-- schema: k STRING\n{header}CREATE TABLE {name} AS SELECT k, COUNT(*) AS n FROM s GROUP BY k"


def _table(tmp_path, name: str, header: str = ""):
    path = tmp_path / f"{name}.sql"
    path.write_text(SQL.format(name=name, header=header))
    return parse(path)


def _snapshot_batches(table, tmp_path, batches: range, skip: set[int] = frozenset()) -> dict[int, list[int]]:
    """Each partition's snapshot batches over a run of batches, from due_snapshots with a store
    that records what was taken (the store's listing is newest first, as SnapshotStore.list)."""
    taken: dict[int, list[int]] = {p: [] for p in range(table.partitions)}

    class Store:
        def __init__(self, uri):
            pass

        def list(self, name, p):
            return [SimpleNamespace(batch_id=b) for b in reversed(taken[p])]

    rt = dataclasses.replace(Runtime.from_env(), data_dir=tmp_path)
    import state.snapshots

    original = state.snapshots.SnapshotStore
    state.snapshots.SnapshotStore = Store
    try:
        for b in batches:
            if b in skip:           # a run of several batches checks only its last
                continue
            for p in registry.due_snapshots(table, rt, b):
                taken[p].append(b)
    finally:
        state.snapshots.SnapshotStore = original
    return taken


def test_tables_started_together_snapshot_in_different_batches(tmp_path):
    names = [f"payments_{i:03d}" for i in range(100)]
    phases = [registry.snapshot_phase(_table(tmp_path, n)) for n in names]
    per_batch = [phases.count(b) for b in range(10)]
    assert sum(per_batch) == 100 and max(per_batch) <= 20, per_batch      # not all 100 in one batch
    table = _table(tmp_path, names[0])
    phase = registry.snapshot_phase(table)
    taken = _snapshot_batches(table, tmp_path, range(40))
    expected = [0] + [b for b in range(1, 40) if b % 10 == phase]
    assert all(batches == expected for batches in taken.values()), (phase, taken)


def test_a_run_that_skips_its_phase_is_never_more_than_snapshot_every_behind(tmp_path):
    table = _table(tmp_path, "payments_000")
    phase = registry.snapshot_phase(table)
    skip = {b for b in range(1, 60) if b % 10 == phase or b % 3}       # the phase's batches never checked
    checked = [b for b in range(60) if b not in skip]
    longest_unchecked = max(later - earlier for earlier, later in zip(checked, checked[1:]))
    taken = _snapshot_batches(table, tmp_path, range(60), skip)[0]
    assert taken[0] == 0 and len(taken) >= 4
    # due at the first check `snapshot_every` or more behind: at most one unchecked stretch later
    assert all(10 <= later - earlier < 10 + longest_unchecked for earlier, later in zip(taken, taken[1:])), taken


def test_a_pinned_phase_snapshots_every_nth_batch_and_a_bad_one_is_refused(tmp_path):
    table = _table(tmp_path, "payments_001", "-- snapshot_every: 5\n-- snapshot_phase: 0\n")
    assert _snapshot_batches(table, tmp_path, range(16))[0] == [0, 5, 10, 15]
    assert "snapshot_phase" not in str(table.meaning())
    with pytest.raises(DefinitionError, match=r"snapshot_phase=5 must be from 0 to 4"):
        _table(tmp_path, "payments_002", "-- snapshot_every: 5\n-- snapshot_phase: 5\n")
