"""An aggregate over a table's rows: a changed row retracts its old contribution and adds its
new one (spark_jobs/steps/table_aggregate.py has the stages)."""
from __future__ import annotations

from spark_jobs.steps import table_aggregate
from spark_jobs.passes.tables import TablesPass

__all__ = ["TableAggregatePass"]


class TableAggregatePass(TablesPass):
    name = "aggregate over a table"
    stages = table_aggregate

    def after_commit(self, rt, batch_id: int) -> None:
        table_aggregate.drop_retractions(rt, self.table.name, batch_id)
