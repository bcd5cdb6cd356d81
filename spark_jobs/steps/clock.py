"""The step clock: `with clock.step("read"):` is a batch step's whole ceremony, once. It names the
step's Spark jobs (the Spark UI and event log say which step a stage served), times it from the
end of the step before (the first from the batch's start, so the steps add up to the pass), and
when the step ends, reaches its fault point (state.faults; `batch.after_<step>` unless named),
where the exactly-once tests crash a batch. A step that raises is neither timed nor passed."""
from __future__ import annotations

import time
from contextlib import contextmanager

from state import faults

__all__ = ["StepClock"]


class StepClock:
    def __init__(self, table_run, batch_id: int, started: float) -> None:
        self.table_run, self.batch_id, self.mark = table_run, batch_id, started
        self.seconds: dict[str, float] = {}       # step name -> seconds, in the order the steps ran

    @contextmanager
    def step(self, name: str, *fault_points: str):
        """`fault_points`: the points reached at the step's end, in order (default `batch.after_<name>`)."""
        self.table_run.describe(self.batch_id, name)
        yield
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.mark
        self.mark = now
        for point in fault_points or (f"batch.after_{name}",):
            faults.point(point)


class TaskLaps:
    """A merge task's own step profile: each call records the milliseconds since the last one
    under its step's name (`ms`, the PartitionSummary's), as StepClock does for a batch's steps."""

    def __init__(self) -> None:
        self.ms: dict[str, int] = {}
        self._last = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.ms[step] = round((now - self._last) * 1000)
        self._last = now
