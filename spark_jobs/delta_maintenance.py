"""The Delta tables a table keeps, kept small: bronze, the mirror and the dead letters gain files
every batch (or every fold), and nothing else ever rewrites or deletes them. Every
`maintain_every` batches the batch job compacts each (OPTIMIZE: the small files since the last
compaction become a few large ones), deletes bronze older than `bronze_retention` (but never a
batch after the last verified checkpoint, which the next verify starts from), and vacuums
(VACUUM: files the tables dropped more than `delta_retention` ago leave the disk). The mirror's
change table is not compacted: its files leave it by name at each fold (spark_jobs.mirror).

What a table's disk then holds is bounded by time, not by age: about `delta_retention` of
dropped files, plus the live data (all of bronze without a retention)."""
from __future__ import annotations

import logging
import time

from catalog.batch_log import BatchCommit, BatchLog
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime, spark_path
from spark_jobs import delta_files, mirror
from spark_jobs.verify_chain import BRONZE_FROM, bronze_from_batch

__all__ = ["maintain", "maintain_if_due"]

log = logging.getLogger("statetable.maintenance")



def maintain_if_due(spark, rt: Runtime, table: TableDefinition, commit: BatchCommit) -> dict | None:
    if commit.batch_id == 0 or commit.batch_id % table.maintain_every:
        return None
    return maintain(spark, rt, table)


def _tables(rt: Runtime, table: TableDefinition) -> dict[str, str]:
    paths = {"mirror": mirror.mirror_path(rt, table.name), "dlq": rt.delta_path(table.name, "dlq")}
    if table.bronze:
        paths["bronze"] = rt.delta_path(table.name, "bronze")
    return {name: path for name, path in paths.items() if delta_files.exists(path)}


def _trim_bronze(spark, rt: Runtime, table: TableDefinition, path: str) -> int | None:
    """Delete bronze rows of batches committed before `bronze_retention` and covered by a verified
    checkpoint (spark_jobs.verify_chain: the next verify needs every batch after it); returns
    bronze's new first batch (None: nothing was both old enough and verified)."""
    from catalog.registry import spec_of
    from spark_jobs.verify_chain import latest

    checkpoint = latest(rt, table, spec_of(table, rt).fingerprint, any_age=True)
    if checkpoint is None:
        log.info("%s: bronze_retention waits for a verified checkpoint: without one, verify needs all of bronze",
                 table.name)
        return None
    cutoff = time.time() - table.bronze_retention_ms / 1000
    first = checkpoint["batch_id"] + 1
    for commit in BatchLog(rt.batch_dir(table.name)).commits():
        if commit.committed_at >= cutoff:
            first = min(first, commit.batch_id)
            break
    if first <= (bronze_from_batch(rt, table.name) or 0):
        return None
    where = spark_path(path)
    spark.sql(f"DELETE FROM delta.`{where}` WHERE batch_id < {first}")
    spark.sql(f"ALTER TABLE delta.`{where}` SET TBLPROPERTIES ('{BRONZE_FROM}' = '{first}')")
    return first


def maintain(spark, rt: Runtime, table: TableDefinition) -> dict:
    """OPTIMIZE, the bronze retention and VACUUM of the table's Delta tables; what was done, by table."""
    hours = table.delta_retention_ms / 3_600_000
    report: dict[str, dict] = {}
    for name, path in _tables(rt, table).items():
        started, done = time.monotonic(), {}
        if name == "bronze" and table.bronze_retention_ms is not None:
            done["bronze_from_batch"] = _trim_bronze(spark, rt, table, path)
        where = spark_path(path)
        # OPTIMIZE reports what it compacted: no listing of the table's files before and after.
        metrics = spark.sql(f"OPTIMIZE delta.`{where}`").collect()[0]["metrics"]
        # Delta refuses a retention under 7 days unless told that no reader needs the files that long:
        # the definition's delta_retention is that statement (at least 1 h, see catalog.definitions).
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(hours >= 168).lower())
        spark.sql(f"VACUUM delta.`{where}` RETAIN {hours:g} HOURS")
        done.update(files_compacted=metrics["numFilesRemoved"], files_written=metrics["numFilesAdded"],
                    seconds=round(time.monotonic() - started, 2))
        report[name] = done
    log.info("%s: Delta maintenance (OPTIMIZE, VACUUM retaining %g h%s): %s", table.name, hours,
             "" if table.bronze_retention_ms is None else f", bronze for {table.bronze_retention_ms / 86_400_000:g} d",
             report)
    return report
