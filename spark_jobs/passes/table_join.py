"""A join of two tables, keyed by the left one's key: a change on either side re-joins the rows
it touches (spark_jobs/table_join.py has the stages)."""
from __future__ import annotations

from spark_jobs import mirror, table_join, table_stages
from spark_jobs.passes.base import Pass
from spark_jobs.table_frames import TableFrames

__all__ = ["TableJoinPass"]


class TableJoinPass(Pass):
    name = "join of tables"
    rows = True
    pins_since = True
    rows_stage = True

    def run(self, table_run, plan, started: float, begun_at: float):
        return table_join.run(table_run, plan, started)

    def recompute(self, frames, last, spark, rt) -> tuple:
        return (None if last is None else table_join.recomputed_rows(frames, last)), None

    def rebuild_stages(self, spark, tables: dict, rt, last, batch_id: int) -> None:
        table_stages.rebuild_rows(TableFrames(spark, self.table, tables, rt), last, batch_id, join_index=True)

    def moved_without_records(self, rt, last) -> bool:
        return mirror.joined_tables_moved(rt, self.table, last)
