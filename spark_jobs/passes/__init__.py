"""A table kind is a Pass: how its batches read and merge, what it recomputes from history, and
what follows its commits. `pass_for` is the one place in spark_jobs/ that asks which kind a table
is (tests/test_layout.py holds it); everything else asks the Pass, or is handed what it says.

  kind                      module            batch (run)                     recompute (verify, rebuild)
  source (latest value)     source            sql_step                        the topic from offset 0
  aggregate over a stream   aggregate         arrow_step, else sql_step       bronze
  aggregate over a table    table_aggregate   rows stage, then groups stage   the input table's rows
  join of two tables        table_join        rows stage, then join stage     both tables' rows
  windowed join of streams  stream_join       both streams, pairs, rows stage both streams, replayed batch by batch

A new kind is one module here with its Pass subclass, and its branch in `pass_for`.
"""
from __future__ import annotations

from catalog.definitions import TableDefinition
from spark_jobs.passes.aggregate import AggregatePass
from spark_jobs.passes.base import Pass
from spark_jobs.passes.source import SourcePass
from spark_jobs.passes.table_aggregate import TableAggregatePass
from spark_jobs.passes.stream_join import StreamJoinPass
from spark_jobs.passes.table_join import TableJoinPass

__all__ = ["Pass", "pass_for"]


def pass_for(table: TableDefinition) -> Pass:
    """The Pass of `table`'s kind."""
    if table.stream_join is not None:
        return StreamJoinPass(table)
    if table.over_table:
        return TableAggregatePass(table)
    if table.table_join:
        return TableJoinPass(table)
    if table.kind == "source":
        return SourcePass(table)
    return AggregatePass(table)
