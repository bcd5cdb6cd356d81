"""One batch through the Arrow pass (arrow_pass.run, in mapInArrow): parse, classify, filter,
window and pre-aggregate per input partition, bronze Parquet written by the workers; the partials
go by state partition to one merge task each. Nothing re-reads the batch. Same signature and
result as sql_step.run."""
from __future__ import annotations

import logging

from catalog.batch_log import BatchPlan
from spark_jobs.steps import merge_step
from spark_jobs.frames import parse
from spark_jobs.delta import delta_files, delta_frames
from spark_jobs.steps import sinks
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.offsets import OffsetRange, spark_reader
from spark_jobs.steps.table_run import TableRun
from spark_jobs.steps.clock import StepClock
from spark_jobs.steps.schemas import schemas_for

__all__ = ["run"]

log = logging.getLogger("statetable.microbatch")


def run(table_run: TableRun, plan: BatchPlan, started: float, begun_at: float) -> BatchStep:
    """In the session whose Arrow batches fit this table's records (session.arrow_session):
    every job of the pass's step runs there."""
    from spark_jobs.engine import arrow_batches
    from spark_jobs.engine import session

    records, why = arrow_batches.records_for(table_run.log.last_commit(), table_run.rt.bootstrap, plan.topic,
                                             plan.ranges, resumed=plan.resumed)
    log.info("%s batch %d: Arrow batches of %s", table_run.table.name, plan.batch_id, why)
    return _pass(table_run.in_session(session.arrow_session(table_run.spark, records)), plan, started, begun_at,
                 records)


def _pass(table_run: TableRun, plan: BatchPlan, started: float, begun_at: float, records: int | None) -> BatchStep:
    from pyspark.sql import functions as F

    from spark_jobs.frames import arrow_blobs, arrow_pass

    table = table_run.table
    bronze = sinks.bronze_target(table_run, plan.batch_id)
    spec = arrow_pass.PassSpec(table, plan.batch_id, now_ms=int(plan.created_at * 1000),
                               watermark_ms=plan.watermark_ms, bronze=bronze,
                               write_file=delta_files.write_parquet_atomically, schemas=schemas_for(table))
    clock = StepClock(table_run, plan.batch_id, started)
    with clock.step("read"):
        out, stats, files, applied = _read(table_run, plan, spec, records)
    read_count, late_count = stats.get("read", 0), stats.get("late", 0)
    reasons = {name[5:]: n for name, n in stats.items() if name.startswith("dead_")}
    reasons[None] = read_count - sum(reasons.values())
    watermark = plan.watermark_ms
    if "max_event_ms" in stats:
        watermark = max(watermark or stats["max_event_ms"], stats["max_event_ms"])
    log.info("%s batch %d: read and parsed %d records in %.1fs (%.0f records/s)", table.name, plan.batch_id,
             read_count, clock.seconds["read"], read_count / max(clock.seconds["read"], 1e-6))

    with clock.step("dead_letters"):
        dead_count = sinks.write_dead_letters(table_run, parse.pass_dead_letters(out, plan.topic), plan.batch_id,
                                              sum(n for r, n in reasons.items() if r) + late_count)

    with clock.step("bronze"):
        if bronze is not None:
            sinks.commit_bronze(table_run, files, plan.batch_id)

    with clock.step("aggregate_merge", "batch.after_merge"):
        partials = out.where(F.col("_kind") == arrow_blobs.BLOB).select("_kind", "_sp", F.col("value").alias("_blob"))
        summaries = merge_step.merge(table_run, partials, plan.batch_id, watermark, plan.watermark_ms, begun_at)
        out.unpersist()
        refused = {tuple(k): reason for s in summaries.values() for k, reason in s.rejected}
        refused_counts = sinks.dead_letter_refused(table_run, *_refusal_inputs(table_run, plan), refused, plan) \
            if refused else {}
    return BatchStep(reasons=reasons, read=read_count, late=late_count, dead=dead_count, refused=refused,
                     refused_counts=refused_counts, summaries=summaries,
                     delta_keys=sum(s.delta_keys for s in summaries.values()), watermark=watermark,
                     steps=clock.seconds,
                     extra={**{k: v for k, v in stats.items() if k in ("filtered", "read_bytes") or k.startswith("schema_")},
                            "arrow_records": records or 0, "arrow_records_applied": applied or 0})


def _read(table_run: TableRun, plan: BatchPlan, spec, records: int | None):
    """The pass over the batch's records, run once and kept: its rows (partials, dead letters),
    the statistics its tasks report, and the bronze files they wrote."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.engine import arrow_batches
    from spark_jobs.engine.session import is_connect, struct
    from spark_jobs.frames import arrow_pass

    table, spark = table_run.table, table_run.spark
    raw = spark_reader(spark, table_run.rt.bootstrap, OffsetRange(plan.topic, plan.ranges), table_run.reader_group) \
        .select("partition", "offset", "timestamp", "value")     # what the pass reads (arrow_batches: with
    # Spark's per-row byte check off, the positions add little to the JVM-to-Python transfer)
    out = raw.mapInArrow(lambda batches: arrow_pass.run(spec, batches), struct(spark, arrow_pass.output_ddl(table))) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    stats: dict[str, int] = {}
    files: dict[str, dict[str, int]] = {}
    # A Connect batch runs in its cap's own session (arrow_session); a local one is sized here.
    with arrow_batches.sized(spark, None if is_connect(spark) else records):
        applied = arrow_batches.applied(spark)
        stat_rows = out.where(F.col("_kind").isin("stat", "file")) \
            .select("_kind", "file", "stat", "stat_value").collect()
    for row in stat_rows:
        name, value = row["stat"], row["stat_value"]
        if row["_kind"] == "file":          # a retried task reports its file again: same name
            files.setdefault(row["file"], {})[name] = value
        else:
            stats[name] = max(stats.get(name, value), value) if name == "max_event_ms" \
                else stats.get(name, 0) + value
    return out, stats, files, applied


def _refusal_inputs(table_run: TableRun, plan: BatchPlan):
    """(events, raw records) of a batch whose keys the state refused: bronze holds the batch's
    events (without bronze, Spark SQL parses the batch again), and the refused ones' bytes are
    read again (only on this rare path)."""
    from pyspark.sql import functions as F

    table, spark = table_run.table, table_run.spark
    records = spark_reader(spark, table_run.rt.bootstrap, OffsetRange(plan.topic, plan.ranges), table_run.reader_group)
    if table.bronze:
        events = delta_frames.read(spark, table_run.rt.delta_path(table.name, "bronze")) \
            .where(F.col("batch_id") == plan.batch_id)
    else:
        classified = parse.classify(records, table, table.stream_key_fields, now_ms=int(plan.created_at * 1000),
                                    schemas=schemas_for(table))
        events = parse.good_events(classified, table)
        if table.window is not None:
            events = table_run.frames.split_late(events, plan.watermark_ms)[0]
    raw = records.select(F.col("partition").alias("_partition"), F.col("offset").alias("_offset"),
                         F.col("value").alias("_value"), F.length("value").alias("_size"))
    return events, raw
