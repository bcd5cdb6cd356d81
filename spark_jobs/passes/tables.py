"""What the two kinds of tables of tables share: a stages module runs their batches and
recomputes them, and a rows stage of their input table comes first, in a batch as in a rebuild."""
from __future__ import annotations

from spark_jobs.steps import table_stages
from spark_jobs.passes.base import Pass
from spark_jobs.steps.inputs import frames_of

__all__ = ["TablesPass"]


class TablesPass(Pass):
    rows_stage = True
    stages = None               # the kind's module: run(table_run, plan, started), recomputed(frames, rt, last)
    join_index = False          # its rows stage also indexes the joined table's keys (a join of tables)

    def run(self, table_run, plan, started: float, begun_at: float):
        return self.stages.run(table_run, plan, started)

    def recompute(self, frames, last, spark, rt) -> tuple:
        return (None if last is None else self.stages.recomputed(frames, rt, last)), None

    def rebuild_stages(self, spark, tables: dict, rt, last, batch_id: int) -> None:
        table_stages.rebuild_rows(frames_of(spark, self.table, tables, rt), rt, last, batch_id, join_index=self.join_index)
