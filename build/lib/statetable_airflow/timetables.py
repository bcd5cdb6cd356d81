"""Timetables of the statetable DAGs."""
from __future__ import annotations

import re
import zlib

from airflow.timetables.interval import CronDataIntervalTimetable

_EVERY_N_MINUTES = re.compile(r"^\*/(\d+)(\s.*)$")


def spread(cron: str | None, table: str) -> str | None:
    """`*/N ...` moved to a minute of its own within every N: `k-59/N ...`, k a stable hash of the
    table's name modulo N.

    Every table's `*/5` fired in the same second, so twenty tables queued twenty runs at once
    for executor slots while the other four minutes stayed idle. Each table still runs every N
    minutes, on the same minute every time; other crons are kept as written.
    """
    match = _EVERY_N_MINUTES.match(cron or "")
    if not match:
        return cron
    n = int(match.group(1))
    if n < 2 or 60 % n:
        return cron
    offset = zlib.crc32(table.encode()) % n
    return f"{offset}-59/{n}{match.group(2)}" if offset else cron


class BackfillOnlyTimetable(CronDataIntervalTimetable):
    """Day-long (or any cron) data intervals for backfills, and no scheduled runs.

    A rebuild is something one asks for: `airflow backfill create` over a date
    range, or a manual run. The intervals exist so that a backfill date means
    "the windows of that day"; the scheduler itself never starts a rebuild
    (it asks without catchup, backfills ask with it).
    """

    @property
    def summary(self) -> str:
        return f"backfill only ({self._expression})"

    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        if not restriction.catchup:
            return None
        return super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                        restriction=restriction)
