"""An aggregate over a stream: partials of its events folded into each key's aggregates."""
from __future__ import annotations

from catalog.batch_log import BatchCommit, BatchLog
from catalog.definitions import TableDefinition
from catalog.errors import UserError
from spark_jobs.steps import arrow_step, sql_step
from spark_jobs.errors import ArrowUnsupported, HistoryTrimmed
from spark_jobs.passes.base import Pass

__all__ = ["AggregatePass", "last_purge_watermark"]


class AggregatePass(Pass):
    name = "aggregate"

    @property
    def engine(self) -> str:
        """"arrow" (one Arrow pass) where it covers the definition, else "spark"; STATETABLE_ENGINE
        forces one (the benchmark's before-and-after profile)."""
        import logging
        import os

        from spark_jobs.frames import arrow_pass

        forced = os.environ.get("STATETABLE_ENGINE")
        if forced == "spark":
            return "spark"
        try:
            arrow_pass.check_supported(self.table)
        except ArrowUnsupported as exc:
            if forced == "arrow":
                raise
            logging.getLogger("statetable.microbatch").debug(
                "%s: the Spark-SQL pass runs it (the Arrow pass does not cover %s)", self.table.name, exc)
            return "spark"
        return "arrow"

    def run(self, table_run, plan, started: float, begun_at: float):
        if self.engine == "arrow":
            return arrow_step.run(table_run, plan, started, begun_at)
        return sql_step.run(table_run, plan, started, begun_at, self)

    def chains_verify(self) -> bool:
        table = self.table
        return bool(table.bronze) and table.window is None and table.ttl_ms is None

    def recompute(self, frames, last, spark, rt) -> tuple:
        """From bronze: WHERE, the refused keys and (with a TTL) the expiries as the batches applied them."""
        table = self.table
        if not table.bronze:
            raise UserError(f"table {table.name!r} keeps no bronze (`-- bronze: off` in {table.path}), and verify and "
                            f"rebuild recompute it from bronze; set `-- bronze: on` to have them (from then on)")
        from spark_jobs.delta import delta_files, delta_frames

        path = rt.delta_path(table.name, "bronze")
        found = delta_files.load(path)
        if found is None:
            return None, None
        from spark_jobs.delta.verify_chain import bronze_from_batch

        trimmed = bronze_from_batch(rt, table.name)
        if trimmed:
            raise HistoryTrimmed(f"table {table.name!r}: bronze holds batches from {trimmed} on (`-- bronze_retention` "
                                 f"in {table.path} deleted the older ones), and a full verify or a rebuild recomputes "
                                 f"the table from all of its history; set `-- bronze_retention: forever` to keep "
                                 f"history from now on")
        bronze = delta_frames.read(spark, path, found)
        commits = BatchLog(rt.batch_dir(table.name)).commits()
        refused = [(c.batch_id, tuple(key)) for c in commits for key, _ in (c.refused or [])]
        selected = frames.selected(frames.joined(bronze))
        if table.ttl_ms is not None:
            selected = _last_lives(spark, table, selected, commits)
        partials = frames.partials(selected, exclude=refused)
        return frames.partitioned(partials), last_purge_watermark(table, commits)


def _last_lives(spark, table: TableDefinition, events, commits: list[BatchCommit]):
    """A TTL table's events that its state still holds: each key's events after the last batch
    that expired it (see state.windows.expire_idle), as the batches decided.

    A batch P expires a key when the key's newest event time up to P is at or before P's
    watermark minus the TTL. Between two batches with events for the key its newest time stands
    still and the watermark only grows, so the last batch before the key's next events decides
    for the whole stretch. And the newest time over all of a key's events may stand for its
    current life's: an earlier life's newest was at or below an earlier watermark minus the TTL,
    so it is below every later one and never decides. No loop over batches is needed."""
    from pyspark.sql import Window, functions as F

    from catalog.definitions import EVENT_MS
    from spark_jobs.frames.table_frames import column

    if not commits:
        return events
    marks, high = [], None
    for commit in commits:           # the watermark after each batch (it never goes back)
        if commit.watermark_ms is not None:
            high = commit.watermark_ms if high is None else max(high, commit.watermark_ms)
        if high is not None:
            marks.append((commit.batch_id, high))
    if not marks:
        return events
    keys = [column(table, k) for k in table.key_columns]
    by_batch = events.groupBy(*keys, "batch_id").agg(F.max(column(table, EVENT_MS)).alias("_newest_in"))
    order = Window.partitionBy(*keys).orderBy("batch_id")
    by_batch = (by_batch
                .withColumn("_newest", F.max("_newest_in").over(order.rowsBetween(Window.unboundedPreceding, 0)))
                .withColumn("_until", F.coalesce(F.lead("batch_id").over(order) - 1, F.lit(commits[-1].batch_id))))
    watermarks = spark.createDataFrame(marks, "_until BIGINT, _watermark BIGINT")
    cuts = (by_batch.join(F.broadcast(watermarks), "_until")
            .where(F.col("_newest") <= F.col("_watermark") - F.lit(table.ttl_ms))
            .groupBy(*keys).agg(F.max("_until").alias("_cut")))
    return (events.join(cuts, keys, "left").where(F.col("_cut").isNull() | (F.col("batch_id") > F.col("_cut")))
            .drop("_cut"))


def last_purge_watermark(table: TableDefinition, commits: list[BatchCommit]) -> int | None:
    """The watermark of the newest purge of expired windows: the state no longer holds them,
    so a recomputation from bronze must not either."""
    if table.window is None:
        return None
    for commit in reversed(commits):
        mark = commit.counts.get("purge_watermark_ms")
        if mark is None and commit.watermark_ms is not None and commit.counts.get("purged_windows") \
                and commit.batch_id % table.snapshot_every == 0:
            mark = commit.watermark_ms        # a batch logged before purge_watermark_ms was recorded
        if mark is not None:
            return mark
    return None
