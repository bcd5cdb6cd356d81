"""A join of two tables, keyed by the left one's key: a change on either side re-joins the rows
it touches (spark_jobs/steps/table_join.py has the stages)."""
from __future__ import annotations

from spark_jobs.delta import mirror

from spark_jobs.steps import table_join
from spark_jobs.passes.tables import TablesPass

__all__ = ["TableJoinPass"]


class TableJoinPass(TablesPass):
    name = "join of tables"
    stages = table_join
    rows = True
    pins_since = True
    join_index = True

    def moved_without_records(self, rt, last) -> bool:
        return mirror.joined_tables_moved(rt, self.table, last)
