"""Whether the stack keeps up with its tables' schedules.

A run that took longer, from reaching the batch service to its end, than its table's schedule
interval ends after the table's next run was due: on a stack whose tables are all due at once,
that is a wave longer than its interval, and the tables fall further behind every wave. The
batch service records each run here (one small file, the last hour's runs over their interval
and the counts); the State tables page shows the warning and /metrics exports it, so the
signal reaches a user before the lag does.
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

from catalog.runtime import Runtime

WINDOW_S = 3600.0
FILE = "capacity.json"


@functools.lru_cache(maxsize=1024)
def interval_seconds(cron: str | None) -> float | None:
    """Seconds between two consecutive fires of a 5-field cron (None: no schedule). For a cron
    whose gaps differ (`0 9,17 * * *`), the shortest of a day's gaps: the tightest deadline.
    Cached: the batch service asks after every run, and 50 croniter steps were a tenth of its
    Python time at 100 tables."""
    if not cron:
        return None
    from croniter import croniter

    fires = croniter(cron, datetime(2026, 1, 5, tzinfo=timezone.utc))
    times = [fires.get_next(float) for _ in range(50)]
    return min(b - a for a, b in zip(times, times[1:]))


def path(rt: Runtime) -> Path:
    return rt.data_dir / "batch_service" / FILE


class CapacityLog:
    """The batch service's record of its runs, written after each (atomically; bounded to the
    last hour's runs)."""

    def __init__(self, rt: Runtime, slots: int) -> None:
        self.file = path(rt)
        self.slots = slots
        self.runs: deque = deque()
        self.guard = threading.Lock()

    def record(self, table: str, arrived: float, ended: float, queued_s: float, interval_s: float | None) -> None:
        with self.guard:
            self.runs.append({"table": table, "ended_at": round(ended, 3), "took_s": round(ended - arrived, 2),
                              "queued_s": round(queued_s, 2), "interval_s": interval_s})
            while self.runs and self.runs[0]["ended_at"] < ended - WINDOW_S:
                self.runs.popleft()
            over = [r for r in self.runs if r["interval_s"] and r["took_s"] > r["interval_s"]]
            state = {"updated_at": round(ended, 3), "slots": self.slots, "window_s": WINDOW_S,
                     "runs": len(self.runs), "over_interval": over[-20:], "over_interval_count": len(over),
                     "longest_queue_s": max(r["queued_s"] for r in self.runs)}
            self.file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.file.with_name(f".{self.file.name}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.file)


def read(rt: Runtime) -> dict | None:
    try:
        return json.loads(path(rt).read_text())
    except (OSError, ValueError):
        return None


def warning(state: dict | None, now: float | None = None) -> str | None:
    """The over-capacity warning, while a run over its interval ended within the last hour."""
    now = time.time() if now is None else now
    recent = [r for r in (state or {}).get("over_interval", []) if r["ended_at"] >= now - WINDOW_S]
    if not recent:
        return None
    worst = max(recent, key=lambda r: r["took_s"] / r["interval_s"])
    count = sum(1 for r in state["over_interval"] if r["ended_at"] >= now - WINDOW_S)
    return (f"over capacity: {count} run(s) in the last hour took longer than their table's schedule interval "
            f"(slowest: {worst['table']}, {worst['took_s']:.0f}s of a {worst['interval_s']:.0f}s interval, "
            f"{worst['queued_s']:.0f}s of it queued for one of {state['slots']} batch slots); the tables fall "
            f"behind each interval. Add cores (STATETABLE_BATCH_SLOTS follows them), spread or lengthen "
            f"schedules, or move tables to another stack")
