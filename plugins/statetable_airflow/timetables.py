"""Timetables of the statetable DAGs."""
from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

from airflow.timetables.interval import CronDataIntervalTimetable
from airflow.timetables.trigger import CronTriggerTimetable

_EVERY_N_MINUTES = re.compile(r"^\*/(\d+)(\s.*)$")


def places(schedules: Mapping[str, str | None]) -> dict[str, int]:
    """Each table's place, in name order, among the tables with the same schedule: computed once
    per parse for all of them (a table's own count of its peers would grow with the square)."""
    by_cron: dict[str | None, list[str]] = {}
    for name in sorted(schedules):
        by_cron.setdefault(schedules[name], []).append(name)
    return {name: i for names in by_cron.values() for i, name in enumerate(names)}


def spread(cron: str | None, table: str, place: int | None = None) -> str | None:
    """`*/N ...` moved to a minute of its own within every N: `k-59/N ...`. k is the table's
    `place` among the tables with the same cron (`places`) modulo N; without one, a stable hash
    of its name modulo N.

    Every table's `*/N` fired in the same second, so twenty tables queued twenty runs at once
    while the other minutes stayed idle. A hash spread them, but unevenly: of 100 tables on
    `*/5`, 26 fell on one minute and 16 on another, and the busiest minute sets how long a
    wave takes. Counting places gives each minute N/100 of the tables, within one. Adding a
    table moves the tables after it in name order to the next minute, once; each still runs
    every N minutes. Other crons are kept as written.
    """
    match = _EVERY_N_MINUTES.match(cron or "")
    if not match:
        return cron
    n = int(match.group(1))
    if n < 2 or 60 % n:
        return cron
    offset = (place if place is not None else zlib.crc32(table.encode())) % n
    return f"{offset}-59/{n}{match.group(2)}" if offset else cron


def daily_minute(table: str) -> tuple[int, int]:
    """(hour, minute) of a table's daily drill: a stable hash of its name over the day's 1,440
    minutes, so a stack's drills never start together."""
    minute_of_day = zlib.crc32(f"drill:{table}".encode()) % 1440
    return divmod(minute_of_day, 60)


class NextTimeOnlyTimetable(CronTriggerTimetable):
    """A cron that never runs the interval that has already begun when the DAG first appears.

    Airflow's cron timetables without catchup start the latest past cron time at once: on a
    fresh stack every table's `@daily` restore drill started in the same minute, beside the
    engine's warm-up, before any table had a batch; on 2 cores the API server's calls timed out
    and `make run` failed. A drill waits for its first scheduled time instead (a drill can
    always be triggered by hand); after that, it runs as the cron says.
    """

    @property
    def summary(self) -> str:
        return f"{self._expression} (UTC)"

    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        if restriction.catchup or last_automated_data_interval is not None:
            return super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                            restriction=restriction)
        from airflow.timetables.trigger import coerce_datetime, utcnow
        from airflow.timetables.base import DagRunInfo

        start = self._get_next(coerce_datetime(utcnow()))
        if restriction.earliest is not None:
            start = max(start, self._align_to_next(restriction.earliest))
        if restriction.latest is not None and restriction.latest < start:
            return None
        return DagRunInfo.interval(coerce_datetime(start - self._interval), start)


def daily_drill(table: str) -> NextTimeOnlyTimetable:
    hour, minute = daily_minute(table)
    return NextTimeOnlyTimetable(f"{minute} {hour} * * *", timezone="UTC")


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
