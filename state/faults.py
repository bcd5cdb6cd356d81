"""Named fault-injection points.

A process dies at a point when STATETABLE_FAULT names it (or when a test calls
`arm`). Dying is `os._exit`, not an exception: no finally block, flush or
atexit runs, exactly as with a kill -9 or a lost machine.
"""
from __future__ import annotations

import os

ENV = "STATETABLE_FAULT"
EXIT_CODE = 137

POINTS = {
    "commit.before_changelog": "changes computed, nothing published",
    "commit.mid_changelog": "half of the batch's changelog records sent, transaction open",
    "commit.after_changelog": "changelog transaction committed, RocksDB not yet written",
    "commit.after_state": "RocksDB batch written, before the caller hears of it",
    "snapshot.mid_upload": "some snapshot files copied, manifest not written",
    "restore.mid_replay": "part of the changelog replayed into a restored partition",
}

_armed: str | None = None


def validate(name: str | None) -> None:
    if name and name not in POINTS and not name.startswith(("batch.", "job.")):
        known = ", ".join(sorted(POINTS))
        raise ValueError(f"{ENV}={name!r} is not a fault point; use one of: {known}")


def arm(name: str | None) -> None:
    validate(name)
    global _armed
    _armed = name


def point(name: str) -> None:
    """Die here if this point is armed."""
    if name == _armed or name == os.environ.get(ENV):
        os._exit(EXIT_CODE)
