"""The Delta tables a table keeps, kept small: bronze, the mirror and the dead letters gain files
every batch (or every fold), and nothing else ever rewrites or deletes them. Every
`maintain_every` batches the batch job compacts each (OPTIMIZE: the small files since the last
compaction become a few large ones), deletes bronze older than `bronze_retention` (but never a
batch after the last verified checkpoint, which the next verify starts from), and vacuums
(VACUUM: files the tables dropped more than `delta_retention` ago leave the disk). The mirror's
change table is not compacted: its files leave it by name at each fold (spark_jobs.delta.mirror).

What a table's disk then holds is bounded by time, not by age: about `delta_retention` of
dropped files, plus the live data (all of bronze without a retention).

Who does it: delta-rs on the driver while the files it would read (the small files a compaction
rewrites, and the files a bronze trim may rewrite) are at most
`STATETABLE_MAINTENANCE_DRIVER_BYTES` (default 256 MiB), Spark SQL above that. What a run reads
grows with what changed since the last one (those are the small files), so most runs are the
driver's: one of 288 files of 2,000 rows took 0.5 s there against 21 s of wall and 41 JVM CPU s
in Spark SQL, leaving the same rows (bench/delta_maintenance.py, which times these two functions).
Where delta-rs fails (a writer feature it lacks, a conflicting commit), Spark SQL takes over,
named in the log."""
from __future__ import annotations

import logging
import math
import os
import time

from catalog.batch_log import BatchCommit, BatchLog
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime, spark_path
from spark_jobs.delta import delta_files, mirror
from spark_jobs.delta.verify_chain import BRONZE_FROM, bronze_from_batch

__all__ = ["in_spark", "maintain", "maintain_if_due", "on_driver"]

log = logging.getLogger("statetable.maintenance")

DRIVER_BYTES = int(os.environ.get("STATETABLE_MAINTENANCE_DRIVER_BYTES", str(256 << 20)))
SMALL_FILE_BYTES = 100 << 20      # the compaction's target size: files below it are rewritten


def maintain_if_due(spark, rt: Runtime, table: TableDefinition, commit: BatchCommit) -> dict | None:
    if commit.batch_id == 0 or commit.batch_id % table.maintain_every:
        return None
    return maintain(spark, rt, table)


def _tables(rt: Runtime, table: TableDefinition) -> dict[str, str]:
    """The table's Delta tables, by name; one that was never written has no log and is skipped."""
    paths = {"mirror": mirror.mirror_path(rt, table.name), "dlq": rt.delta_path(table.name, "dlq")}
    if table.bronze:
        paths["bronze"] = rt.delta_path(table.name, "bronze")
    return paths


def _trim_from(rt: Runtime, table: TableDefinition) -> int | None:
    """Bronze's new first batch: batches committed before `bronze_retention` and covered by a
    verified checkpoint (spark_jobs.delta.verify_chain: the next verify needs every batch after it) may
    go. None: nothing was both old enough and verified."""
    from catalog.registry import spec_of
    from spark_jobs.delta.verify_chain import latest

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
    return None if first <= (bronze_from_batch(rt, table.name) or 0) else first


def _bytes_to_read(target, trim_from: int | None) -> int:
    """What a run reads, from the log's add actions (nothing is read to decide): the small files a
    compaction rewrites, and the larger ones a trim may rewrite (their first batch is before it).
    The add actions are the live files: about bronze's bytes / SMALL_FILE_BYTES once compacted, plus
    the `maintain_every` batches' files since."""
    import pyarrow as pa

    actions = pa.table(target.get_add_actions(flatten=True)).to_pydict()
    firsts = actions.get("min.batch_id") or [None] * len(actions["size_bytes"])
    return sum(size for size, first in zip(actions["size_bytes"], firsts)
               if size < SMALL_FILE_BYTES or (trim_from is not None and (first is None or first < trim_from)))


def on_driver(target, trim_from: int | None, hours: float) -> dict:
    """The trim, compaction and vacuum by delta-rs on the driver, on the loaded DeltaTable `target`."""
    if trim_from is not None:
        target.delete(f"batch_id < {trim_from}")
        target.alter.set_table_properties({BRONZE_FROM: str(trim_from)}, raise_if_not_exists=False)
    metrics = target.optimize.compact(target_size=SMALL_FILE_BYTES)
    # `full`: also the files no commit names (a crashed batch's workers wrote them), as Spark's VACUUM.
    target.vacuum(retention_hours=math.ceil(hours), dry_run=False, enforce_retention_duration=hours >= 168, full=True)
    return {"files_compacted": metrics["numFilesRemoved"], "files_written": metrics["numFilesAdded"]}


def in_spark(spark, path: str, trim_from: int | None, hours: float) -> dict:
    """The same steps in Spark SQL: a run over the driver's bound, or a table delta-rs cannot write."""
    where = spark_path(path)
    if trim_from is not None:
        spark.sql(f"DELETE FROM delta.`{where}` WHERE batch_id < {trim_from}")
        spark.sql(f"ALTER TABLE delta.`{where}` SET TBLPROPERTIES ('{BRONZE_FROM}' = '{trim_from}')")
    # OPTIMIZE reports what it compacted: no listing of the table's files before and after.
    metrics = spark.sql(f"OPTIMIZE delta.`{where}`").collect()[0]["metrics"]
    # Delta refuses a retention under 7 days unless told that no reader needs the files that long:
    # the definition's delta_retention is that statement (at least 1 h, see catalog.definitions).
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(hours >= 168).lower())
    spark.sql(f"VACUUM delta.`{where}` RETAIN {hours:g} HOURS")
    return {"files_compacted": metrics["numFilesRemoved"], "files_written": metrics["numFilesAdded"]}


def maintain(spark, rt: Runtime, table: TableDefinition) -> dict:
    """The bronze retention, OPTIMIZE and VACUUM of the table's Delta tables; what was done, by table."""
    from deltalake.exceptions import DeltaError

    hours = table.delta_retention_ms / 3_600_000
    report: dict[str, dict] = {}
    for name, path in _tables(rt, table).items():
        target = delta_files.load(path)          # loaded once: the bound and delta-rs' steps read it
        if target is None:
            continue
        started, done = time.monotonic(), {}
        trim_from = None
        if name == "bronze" and table.bronze_retention_ms is not None:
            trim_from = done["bronze_from_batch"] = _trim_from(rt, table)
        reads = _bytes_to_read(target, trim_from)
        engine = "delta-rs" if reads <= DRIVER_BYTES else "spark"
        if engine == "delta-rs":
            try:
                done.update(on_driver(target, trim_from, hours))
            except DeltaError as exc:
                # Each step is its own commit and none repeats harmfully, so Spark SQL takes over
                # wherever delta-rs stopped; a table delta-rs cannot write is not stopped by it.
                log.warning("%s: %s: delta-rs could not maintain it (%s); Spark SQL does", table.name, name, exc)
                engine = "spark"
        if engine == "spark":
            done.update(in_spark(spark, path, trim_from, hours))
        done.update(engine=engine, bytes_read_at_most=reads, seconds=round(time.monotonic() - started, 2))
        report[name] = done
    log.info("%s: Delta maintenance (OPTIMIZE, VACUUM retaining %g h%s): %s", table.name, hours,
             "" if table.bronze_retention_ms is None else f", bronze for {table.bronze_retention_ms / 86_400_000:g} d",
             report)
    return report
