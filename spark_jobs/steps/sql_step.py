"""One batch through the Spark-SQL pass (from_json, joins, groupBy): source tables, stream-table
joins, and what the Arrow pass does not cover (arrow_pass.check_supported). Same signature and
result as arrow_step.run: read → dead letters → bronze → merge, each followed by its fault point."""
from __future__ import annotations

import logging

from catalog.batch_log import BatchPlan
from spark_jobs.steps import merge_step
from spark_jobs.frames import parse
from spark_jobs.steps import sinks
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.offsets import OffsetRange, spark_reader
from spark_jobs.steps.table_run import TableRun
from spark_jobs.steps.clock import StepClock
from spark_jobs.steps.schemas import schemas_for
from spark_jobs.frames.formats import SCHEMA_ID

__all__ = ["run"]

log = logging.getLogger("statetable.microbatch")


def run(table_run: TableRun, plan: BatchPlan, started: float, begun_at: float, table_pass) -> BatchStep:
    """`table_pass`: the table's Pass (spark_jobs.passes): whether its records are rows or events."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    table, frames = table_run.table, table_run.frames.for_batch(plan.watermark_ms)
    clock = StepClock(table_run, plan.batch_id, started)
    with clock.step("read"):
        classified, events, late, late_count, watermark, reasons, schema_ids = _read(table_run, plan, frames,
                                                                                     table_pass)
    read_count = sum(reasons.values())
    log.info("%s batch %d: read %d records in %.1fs (%.0f records/s)", table.name, plan.batch_id,
             read_count, clock.seconds["read"], read_count / max(clock.seconds["read"], 1e-6))

    with clock.step("dead_letters"):
        dead = parse.dead_letters(classified, plan.topic)
        if table.window is not None and late_count:
            dead = dead.unionByName(sinks.late_dead_letters(table, late, plan.topic))
        if table_pass.rows:
            dead = dead.where(F.col("reason") != "null_value")   # tombstones delete, they are not errors
        tombstones = reasons.get("null_value", 0) if table_pass.rows else 0
        dead_count = sinks.write_dead_letters(table_run, dead, plan.batch_id,
                                              sum(n for r, n in reasons.items() if r) - tombstones + late_count)

    unenriched = events
    if table.joins:
        events = frames.enrich(events, plan.joins).persist(StorageLevel.MEMORY_AND_DISK)   # bronze keeps it
    persisted = tuple(frame for frame in (classified, unenriched, events, late) if frame is not None)
    with clock.step("bronze"):
        if table.bronze:
            sinks.write_bronze(table_run, events, plan.batch_id)

    with clock.step("aggregate_merge", "batch.after_merge"):
        join_counts: dict = {}
        events = events.withColumn("batch_id", F.lit(plan.batch_id).cast("bigint"))    # as bronze has it
        partials = frames.batch_partials(events, classified, join_counts, rows=table_pass.rows)
        summaries = merge_step.merge(table_run, partials.withColumn("_kind", F.lit("partial")), plan.batch_id,
                                     watermark, plan.watermark_ms, begun_at)
        refused = {tuple(k): reason for s in summaries.values() for k, reason in s.rejected}
        refused_counts = sinks.dead_letter_refused(table_run, events, classified, refused, plan) \
            if refused and not table_pass.rows else {}
    return BatchStep(reasons=reasons, read=read_count, late=late_count, dead=dead_count, refused=refused,
                     refused_counts=refused_counts, summaries=summaries,
                     delta_keys=sum(s.delta_keys for s in summaries.values()), watermark=watermark,
                     steps=clock.seconds, extra={**join_counts, **schema_ids}, release=persisted)


def _read(table_run: TableRun, plan: BatchPlan, frames, table_pass):
    """The batch's records classified, its good events (late ones apart, for a windowed table),
    the watermark they move, and the count per reason."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    table = table_run.table
    raw = spark_reader(table_run.spark, table_run.rt.bootstrap, OffsetRange(plan.topic, plan.ranges),
                       table_run.reader_group)
    key_fields = table.key_columns if table_pass.rows else table.stream_key_fields
    # The plan's creation time is the batch's clock: a re-run judges future event times alike.
    classified = parse.classify(raw, table, key_fields, now_ms=int(plan.created_at * 1000), rows=table_pass.rows,
                                schemas=schemas_for(table)) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    events = parse.good_events(classified, table)
    late, late_count, batch_max = None, 0, None
    watermark = plan.watermark_ms
    if table.window is not None:
        events, late, batch_max = frames.split_late(events, plan.watermark_ms)
        events = events.persist(StorageLevel.MEMORY_AND_DISK)
        late = late.persist(StorageLevel.MEMORY_AND_DISK)
        late_count = late.count()
    elif table.timed:
        batch_max = events.agg(F.max(F.unix_millis(F.col(table.event_time)))).first()[0]
    if batch_max is not None:
        watermark = max(watermark or batch_max, batch_max)
    by = ["reason", SCHEMA_ID] if SCHEMA_ID in classified.columns else ["reason"]
    reasons, schema_ids = {}, {}
    for r in classified.groupBy(*by).count().collect():
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + r["count"]
        if len(by) > 1 and r[SCHEMA_ID] is not None:
            schema_ids[f"schema_{r[SCHEMA_ID]}"] = schema_ids.get(f"schema_{r[SCHEMA_ID]}", 0) + r["count"]
    return classified, events, late, late_count, watermark, reasons, schema_ids
