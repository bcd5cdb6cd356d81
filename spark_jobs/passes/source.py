"""A source table: the latest row per key of its topic; a null value deletes the key."""
from __future__ import annotations

from spark_jobs.frames import parse

from spark_jobs.steps import sql_step
from spark_jobs.steps.offsets import OffsetRange, spark_reader
from spark_jobs.passes.base import Pass
from spark_jobs.frames.table_frames import latest_rows
from spark_jobs.steps.schemas import schemas_for

__all__ = ["SourcePass"]


class SourcePass(Pass):
    name = "source"
    rows = True

    @property
    def engine(self) -> str:
        return "spark"              # the Arrow pass folds partials; it keeps no rows

    def run(self, table_run, plan, started: float, begun_at: float):
        return sql_step.run(table_run, plan, started, begun_at, self)

    def recompute(self, frames, last, spark, rt) -> tuple:
        """The topic from offset 0 to the last commit's ends, each key's latest record."""
        if last is None:
            return None, None
        table = self.table
        full = OffsetRange(table.topic, {p: (0, end) for p, (_, end) in last.ranges.items()})
        classified = parse.classify(spark_reader(spark, rt.bootstrap, full), table, table.key_columns, rows=True,
                                    schemas=schemas_for(table))
        return frames.partitioned(latest_rows(classified, frames.table)), None
