"""An aggregate over a table's rows: a changed row retracts its old contribution and adds its
new one (spark_jobs/table_aggregate.py has the stages)."""
from __future__ import annotations

from spark_jobs import table_aggregate, table_stages
from spark_jobs.passes.base import Pass
from spark_jobs.table_frames import TableFrames

__all__ = ["TableAggregatePass"]


class TableAggregatePass(Pass):
    name = "aggregate over a table"
    rows_stage = True

    def run(self, table_run, plan, started: float, begun_at: float):
        return table_aggregate.run(table_run, plan, started)

    def recompute(self, frames, last, spark, rt) -> tuple:
        return (None if last is None else table_aggregate.recomputed_groups(frames, last)), None

    def rebuild_stages(self, spark, tables: dict, rt, last, batch_id: int) -> None:
        table_stages.rebuild_rows(TableFrames(spark, self.table, tables, rt), last, batch_id)

    def after_commit(self, rt, batch_id: int) -> None:
        table_aggregate.drop_retractions(rt, self.table.name, batch_id)
