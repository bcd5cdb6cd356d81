"""The Delta tables a table keeps, kept small: bronze, the mirror and the dead letters gain files
every batch (or every fold), and nothing else ever rewrites or deletes them. Every
`maintain_every` batches the batch job compacts each (OPTIMIZE: the small files since the last
compaction become a few large ones), deletes bronze older than `bronze_retention`, and vacuums
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

__all__ = ["BRONZE_FROM", "bronze_from_batch", "maintain", "maintain_if_due"]

log = logging.getLogger("statetable.maintenance")

BRONZE_FROM = "statetable.bronze.fromBatch"     # table property: bronze's first batch after a retention delete


def maintain_if_due(spark, rt: Runtime, table: TableDefinition, commit: BatchCommit) -> dict | None:
    if commit.batch_id == 0 or commit.batch_id % table.maintain_every:
        return None
    return maintain(spark, rt, table)


def bronze_from_batch(rt: Runtime, table: str) -> int | None:
    """The first batch bronze still holds when a retention delete trimmed it, else None."""
    found = delta_files.load(rt.delta_path(table, "bronze"))
    value = None if found is None else found.metadata().configuration.get(BRONZE_FROM)
    return None if value is None else int(value)


def _tables(rt: Runtime, table: TableDefinition) -> dict[str, str]:
    paths = {"mirror": mirror.mirror_path(rt, table.name), "dlq": rt.delta_path(table.name, "dlq")}
    if table.bronze:
        paths["bronze"] = rt.delta_path(table.name, "bronze")
    return {name: path for name, path in paths.items() if delta_files.exists(path)}


def _trim_bronze(spark, rt: Runtime, table: TableDefinition, path: str) -> int | None:
    """Delete bronze rows of batches committed before `bronze_retention`; returns bronze's new
    first batch (None: nothing was old enough)."""
    cutoff = time.time() - table.bronze_retention_ms / 1000
    first = None
    for commit in BatchLog(rt.batch_dir(table.name)).commits():
        if commit.committed_at >= cutoff:
            first = commit.batch_id
            break
    if first is None or first <= (bronze_from_batch(rt, table.name) or 0):
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
        started, before = time.monotonic(), len(delta_files.load(path).file_uris())
        done: dict = {}
        if name == "bronze" and table.bronze_retention_ms is not None:
            done["bronze_from_batch"] = _trim_bronze(spark, rt, table, path)
        where = spark_path(path)
        spark.sql(f"OPTIMIZE delta.`{where}`")
        # Delta refuses a retention under 7 days unless told that no reader needs the files that long:
        # the definition's delta_retention is that statement (at least 1 h, see catalog.definitions).
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(hours >= 168).lower())
        spark.sql(f"VACUUM delta.`{where}` RETAIN {hours:g} HOURS")
        done.update(files_before=before, files_after=len(delta_files.load(path).file_uris()),
                    seconds=round(time.monotonic() - started, 2))
        report[name] = done
    log.info("%s: Delta maintenance (OPTIMIZE, VACUUM retaining %g h%s): %s", table.name, hours,
             "" if table.bronze_retention_ms is None else f", bronze for {table.bronze_retention_ms / 86_400_000:g} d",
             report)
    return report
