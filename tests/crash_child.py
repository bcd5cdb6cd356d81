"""Subprocess for the crash tests: does the work, dies at the armed fault point."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from state import faults  # noqa: E402
from state.table import StateTable  # noqa: E402
from tests.state_workload import PARTITIONS, apply_batch, spec  # noqa: E402


def main(root: str, name: str, bootstrap: str, action: str, point: str) -> None:
    table = StateTable(spec(name), Path(root) / "state", bootstrap=bootstrap, snapshot_uri=str(Path(root) / "snapshots"))
    if action == "setup":
        for batch_id in range(3):
            apply_batch(table, batch_id)
            if batch_id == 1:
                for p in range(PARTITIONS):
                    table.snapshot(p)
        table.close()
        return
    faults.arm(point)
    if action == "commit":
        apply_batch(table, 3)
    elif action == "snapshot":
        apply_batch(table, 3)
        table.snapshot(0)
    elif action == "restore":
        table.wipe_local(0)
        table.restore(0)
    raise SystemExit(f"fault point {point} was never reached")


if __name__ == "__main__":
    main(*sys.argv[1:])
