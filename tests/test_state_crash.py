"""Crash at every commit point: after reopening, each partition is exactly
"before the batch" or "after the batch", and re-applying gives "after" once."""
from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from state import faults
from state.table import StateTable
from tests.state_workload import PARTITIONS, apply_batch, contents, reference, spec

CHILD = str(Path(__file__).with_name("crash_child.py"))

# point -> (action of the child, what partition 0 must hold after reopening)
CASES = {
    "commit.before_changelog": ("commit", "before"),
    "commit.mid_changelog": ("commit", "before"),
    "commit.after_changelog": ("commit", "after"),
    "commit.after_state": ("commit", "after"),
    "snapshot.mid_upload": ("snapshot", "after"),
    "restore.mid_replay": ("restore", "before"),
}


def test_every_fault_point_is_covered():
    assert set(CASES) == set(faults.STATE_POINTS)


def _run_child(root, name, kafka, action, point=""):
    return subprocess.run([sys.executable, CHILD, str(root), name, kafka, action, point],
                          capture_output=True, text=True, timeout=300)


def _partition_state(table: StateTable, p: int) -> dict:
    return dict(table.open(p).items())


def _expected(batch: int, p: int, table: StateTable) -> dict:
    return {k: v for k, v in reference(batch).items() if table.partition_of(k) == p}


@pytest.mark.parametrize("point", sorted(CASES))
def test_crash_at_point_is_before_or_after_never_between(kafka, tmp_path, point):
    action, expect = CASES[point]
    name = f"crash-{uuid.uuid4().hex[:8]}"
    setup = _run_child(tmp_path, name, kafka, "setup")
    assert setup.returncode == 0, setup.stderr[-3000:]

    crashed = _run_child(tmp_path, name, kafka, action, point)
    assert crashed.returncode == faults.EXIT_CODE, f"child did not die at {point}: {crashed.stderr[-3000:]}"

    table = StateTable(spec(name), tmp_path / "state", bootstrap=kafka, snapshot_uri=str(tmp_path / "snapshots"))
    try:
        before, after = (_expected(2, 0, table), _expected(3, 0, table))
        if action == "restore":
            before = after = _expected(2, 0, table)
        state0 = _partition_state(table, 0)
        assert state0 == (before if expect == "before" else after)
        assert table.open(0).meta.applied_batch == (2 if expect == "before" else 3) or action == "restore"
        assert table.open(0).verify()[0]

        # Every partition is whole: batch 3 fully or not at all.
        for p in range(1, PARTITIONS):
            assert _partition_state(table, p) in (_expected(2, p, table), _expected(3, p, table))

        apply_batch(table, 3)                      # the rerun after the crash
        apply_batch(table, 3)                      # and once more: a no-op
        assert contents(table) == reference(3)

        table.wipe_local()                         # the changelog agrees with the state
        for p in range(PARTITIONS):
            table.restore(p)
        assert contents(table) == reference(3)
        if action == "snapshot":
            newest = table.snapshots.list(name, 0)[0]
            assert newest.batch_id == 1, "the interrupted snapshot must not count"
    finally:
        table.close()
