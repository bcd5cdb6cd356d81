"""A pass's work over one batch, step by step, and what every step shares.

  clock            `with clock.step("read"):` names, times and fault-points a step, once
  table_run        what every step of one table's batches shares (session, definition, spec, log)
  inputs           what a table's frames read from storage (pinned joins, the mirror, watermarks)
  offsets          exact Kafka offset ranges, handed to Spark's reader verbatim (the read step)
  arrow_step       a stream through the Arrow pass (mapInArrow): read, dead letters, bronze, merge
  sql_step         a stream through Spark SQL (from_json, joins, groupBy), the same steps
  table_stages     what the tables of tables share: the read of their input table, the rows stage
  table_aggregate  an aggregate over a table's rows: rows stage, then groups stage
  table_join       a join of two tables: rows stage, then the join stage
  sinks            where records go besides the state: dead letters (topic, Delta) and bronze
  merge_step       the merge from the driver: partials grouped by state partition, one task each
  merge_task       the task beside a state partition that merges one batch's deltas
  batch_step       what a pass hands the commit: counts, partials' summaries per partition
"""
