"""An aggregate over a table's rows (`CREATE TABLE t AS SELECT g, COUNT(*) ... FROM some_table
GROUP BY g`): a changed row takes its old contribution out of its old group and adds its new one
to its new group; a deleted row (a tombstone) only takes out.

A batch runs two state stages under one batch id, as Kafka Streams' KTable.groupBy(...).aggregate
keeps the source table's store and a repartition topic:

1. rows: the input table's latest row per key in the batch (the source-table pass), merged per
   input key into `<t>.rows` (catalog.mapping.rows_spec). Each task reads the rows' old values,
   and writes the batch's retractions and additions, folded per group, to a Parquet file of the
   batch (`<t>_retractions/b<batch>/p<partition>.parquet`) *before* it commits: a re-run of a
   committed partition reads its file again, since its old values are gone.
2. groups: the files, shuffled by group partition, folded into the table's own state with a
   RetractingAggregator (state.aggregates); a group whose rows all left is deleted.

Both stages commit partition by partition with their changelog transactions, a re-run of a
committed partition is a no-op, and the batch log's commit entry makes the batch exist: the same
protocol as every table, applied twice.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import pyarrow as pa

from catalog.definitions import TableDefinition, input_definition
from catalog.mapping import compiled, rows_spec, state_spec
from catalog.runtime import Runtime, arrow_filesystem, spark_path
from state import codec, faults
from state.table import partition_of
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.clock import StepClock
from spark_jobs.errors import GroupTooLarge
from spark_jobs.steps.table_stages import (DELTA_SCHEMA, part_file, batch_folder, input_history,
                                     open_stage, read_input, retractions_path, summary)
from spark_jobs.frames.arrow_rows import latest_per_key
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.task_context import TaskContext

log = logging.getLogger(__name__)


class RowStage:
    """An input row's contribution to its group: WHERE, the computed arguments and keys (as
    catalog.expressions evaluates them), then the group key and the aggregator's lifted values."""

    def __init__(self, table: TableDefinition, source: TableDefinition) -> None:
        self.table = table
        self.columns = list(source.value_columns)
        fields = set(self.columns)
        self.derived = [(name, compiled("compile_value", sql, fields)) for name, sql in table.derived.items()]
        self.where = compiled("compile_predicate", table.where, fields) if table.where else None
        self.keys = [k.split(".")[-1] for k in table.key_columns]
        self.args = [[a.split(".")[-1] for a in column.args] for column in table.aggregates]
        self.functions = [column.function for column in table.aggregates]
        self.aggregator = state_spec(table).aggregator

    def contribution(self, row: tuple, sign: int) -> tuple[tuple, tuple] | None:
        """(group key, partial) of `row` joining (+1) or leaving (-1) its group; None when WHERE drops it."""
        values = dict(zip(self.columns, row))
        for name, compute in self.derived:
            values[name] = compute(values)
        if self.where is not None and not self.where(values):
            return None
        lifted = []
        for function, args in zip(self.functions, self.args):
            if function == "topk":
                lifted.append((values[args[0]], tuple(values[a] for a in args[1:])))
            else:
                lifted.append(values[args[0]] if args else 1)      # COUNT(*) counts every row
        return tuple(values[k] for k in self.keys), self.aggregator.lift(tuple(lifted), sign)


def merge_rows(ctx: TaskContext, group) -> pa.Table:
    """Stage 1, one task per partition of the input's keys: see the module's docstring."""
    import pyarrow.compute as pc

    from spark_jobs.frames.arrow_keys import encoded_keys
    from spark_jobs.delta.delta_files import write_parquet_atomically
    from spark_jobs.steps.merge_task import partial_values

    started = time.monotonic()
    partition = group.column("_sp")[0].as_py()
    partials = latest_per_key(group.filter(pc.equal(group.column("_kind"), "partial")), unique=ctx.source.stream)
    spec = rows_spec(ctx.table, ctx.namespace)
    table, part, hydrated = open_stage(spec, ctx, partition)
    try:
        keys, rows = encoded_keys(partials), partial_values(ctx.source, partials)
        tx = part.begin(ctx.batch_id)
        deltas: dict[bytes, tuple] = {}
        if part.meta.applied_batch < ctx.batch_id:
            stage = RowStage(ctx.table, ctx.source)
            merge = stage.aggregator.merge
            decode = codec.decode_value
            for key, old, new in zip(keys, part.get_raw_many(keys), rows):
                old = None if old is None else decode(old)
                if old == new:
                    continue
                for row, sign in ((old, -1), (new, 1)):
                    moved = None if row is None else stage.contribution(row, sign)
                    if moved is not None:
                        group_key = codec.encode_key(moved[0])
                        deltas[group_key] = merge(deltas.get(group_key), moved[1])
                if new is None:
                    tx.delete_encoded(key)
                else:
                    tx.put_encoded(key, new)
            route, encode = ctx.table.partitions, codec.encode_value
            write_parquet_atomically(pa.table({
                "_sp": pa.array([partition_of(k, route) for k in deltas], pa.int32()),
                "_key": pa.array(list(deltas), pa.binary()),
                "_delta": pa.array([encode(d) for d in deltas.values()], pa.binary())}, schema=DELTA_SCHEMA),
                ctx.retractions, part_file(partition))
        result = tx.commit()
        if partition == 0:
            faults.point("rows.after_commit")
        ms = {"rows": round((time.monotonic() - started) * 1000)}
        return summary(partition, part, result, ms, hydrated, delta_keys=len(keys), groups_touched=len(deltas))
    finally:
        table.close()


def merge_groups(ctx: TaskContext, mirror_dir: str | None, group) -> pa.Table:
    """Stage 2, one task per group partition: the batch's folded retractions and additions into
    the table's state, its change topic and its mirror changes."""
    import pyarrow.compute as pc

    from spark_jobs.steps.merge_task import unbatched_rows, outputs_of
    from spark_jobs.delta.mirror import write_change_rows

    started = time.monotonic()
    partition = group.column("_sp")[0].as_py()
    deltas = group.filter(pc.equal(group.column("_kind"), "partial"))
    spec = state_spec(ctx.table, ctx.namespace)
    spec = replace(spec, changelog=ctx.changelog or spec.changelog)
    aggregator = spec.aggregator
    decode = codec.decode_value
    folded: dict[bytes, tuple] = {}
    for key, delta in zip(deltas.column("_key").to_pylist(), deltas.column("_delta").to_pylist()):
        folded[key] = aggregator.merge(folded.get(key), decode(delta))
    table, part, hydrated = open_stage(spec, ctx, partition)
    try:
        keys = list(folded)
        tx = part.begin(ctx.batch_id)
        for key, old in zip(keys, part.get_raw_many(keys)):
            new = aggregator.merge_or_delete(None if old is None else decode(old), folded[key])
            if new is None:
                tx.delete_encoded(key)
            else:
                tx.put_encoded(key, new)

        result = tx.commit(outputs_of(ctx.table, aggregator))
        if result.rejected:
            raise GroupTooLarge(
                f"table {ctx.table.name!r} batch {ctx.batch_id}: {len(result.rejected)} groups would outgrow one state "
                f"value ({sorted({r for _, r in result.rejected})}), e.g. {codec.decode_key(result.rejected[0][0])}: "
                f"MIN, MAX, COUNT(DISTINCT) and TOPK over a table keep each group's distinct values; group by "
                f"something finer or drop those aggregates")
        if partition == 0:
            faults.point("batch.mid_merge")
        if mirror_dir is not None:
            # A re-run of a committed partition writes the rows its keys have now (its first run
            # may have died before this file).
            changed = result.changes if not result.noop else dict(zip(keys, part.get_raw_many(keys)))
            write_change_rows(mirror_dir, ctx.batch_id, partition, unbatched_rows(ctx.table, aggregator, {}, changed or {}))
        ms = {"groups": round((time.monotonic() - started) * 1000)}
        return summary(partition, part, result, ms, hydrated, delta_keys=len(keys))
    finally:
        table.close()


def run(table_run, plan, started: float) -> BatchStep:
    """One batch of an aggregate over a table (passes.table_aggregate): read the input table's
    records in the plan's ranges with Spark's Kafka source, dead-letter what its schema refuses,
    then the two stages."""
    from pyspark.sql import functions as F

    from spark_jobs.delta import mirror
    from spark_jobs.engine.partition_tasks import per_state_partition

    table, rt, spark = table_run.table, table_run.rt, table_run.spark
    source = input_definition(table, table_run.tables)
    clock = StepClock(table_run, plan.batch_id, started)
    read = read_input(table_run, plan, clock, source)

    root = retractions_path(rt, table.name)
    ctx = TaskContext.of(rt, table, plan.batch_id, source=source, retractions=batch_folder(root, plan.batch_id),
                         changelog=table_run.spec.changelog)
    with clock.step("rows"):
        rows = read.rows.withColumn("_kind", F.lit("partial"))
        row_summaries = PartitionSummary.all_of(per_state_partition(
            spark, rows, table.partitions, lambda group: merge_rows(ctx, group), f"{table.name} batch {plan.batch_id}: rows"))
        read.persisted.unpersist()

    with clock.step("groups", "batch.after_merge"):
        deltas = spark.read.schema("_sp INT, _key BINARY, _delta BINARY").parquet(spark_path(ctx.retractions)) \
            .withColumn("_kind", F.lit("partial"))
        mirror_dir = mirror.changes_path(rt, table.name)
        summaries = PartitionSummary.all_of(per_state_partition(
            spark, deltas, table.partitions, lambda group: merge_groups(ctx, mirror_dir, group),
            f"{table.name} batch {plan.batch_id}: groups"))
    steps = clock.seconds
    rows_changed = sum(s.keys_changed for s in row_summaries.values())
    log.info("%s batch %d: %d input rows changed, %d group changes (retractions and additions) merged into %d "
             "groups in %.1fs", table.name, plan.batch_id, rows_changed,
             sum(s.counts["groups_touched"] for s in row_summaries.values()),
             sum(s.keys_changed for s in summaries.values()), steps["rows"] + steps["groups"])
    return BatchStep(reasons=read.reasons, read=read.read, dead=read.dead, summaries=summaries,
                     delta_keys=sum(s.delta_keys for s in row_summaries.values()), steps=steps,
                     extra={"rows_changed": rows_changed})


def drop_retractions(rt: Runtime, table: str, through_batch: int) -> None:
    """Delete the retraction files of committed batches: only a re-run of an uncommitted batch reads them."""
    import pyarrow.fs as pafs

    fs, root = arrow_filesystem(retractions_path(rt, table))
    try:
        entries = fs.get_file_info(pafs.FileSelector(root))
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.base_name
        if entry.type == pafs.FileType.Directory and name.startswith("b") and name[1:].isdigit() \
                and int(name[1:]) <= through_batch:
            fs.delete_dir(entry.path)


def recomputed(frames, rt, last):
    """Every group's state from the input topic's whole history up to the last commit (verify,
    rebuild): each input key's last row, each row's contribution folded into its group. Rows with
    `_sp`, `_k*` and `_state` (the encoded state), as TableFrames.partitioned gives them."""
    from spark_jobs.steps.merge_task import partial_values

    spark, table = frames.spark, frames.table
    source = input_definition(table, frames.tables)
    latest = input_history(frames, rt.bootstrap, last, source).toArrow()
    stage = RowStage(table, source)
    groups: dict[tuple, tuple] = {}
    for row in partial_values(source, latest):
        moved = None if row is None else stage.contribution(row, 1)
        if moved is not None:
            groups[moved[0]] = stage.aggregator.merge(groups.get(moved[0]), moved[1])
    keys = list(groups)
    encoded = [codec.encode_key(k) for k in keys]
    columns = {f"_k{i}": [k[i] for k in keys] for i in range(len(table.key_columns))}
    frame = pa.table({**columns, "_state": pa.array([codec.encode_value(v) for v in groups.values()], pa.binary()),
                      "_sp": pa.array([partition_of(k, table.partitions) for k in encoded], pa.int32())})
    return spark.createDataFrame(frame) if frame.num_rows else None


