"""Timetables of the statetable DAGs."""
from __future__ import annotations

from airflow.timetables.interval import CronDataIntervalTimetable


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
