"""The Delta mirror of a table's state, off the hot path: an append-only changes table, folded
into a compacted copy every `mirror_every` batches.

- `<table>_mirror_changes`: the merge tasks write each batch's changed rows (key, row as the API
  shows it, batch_id, deleted), one Parquet file per state partition, into this table's folder.
  After the batch commits, the driver adds them in one Delta transaction (app id
  `<table>.mirror_changes`, version = the batch): no Spark job, no row through the driver.
- `<table>_mirror`: every `mirror_every` batches one MERGE folds the changes in (app id
  `<table>.mirror`, so a re-run folds nothing twice), then the folded files leave the changes
  table (a file-level remove, nothing rewritten).

What a reader sees: `<table>_mirror` alone is the state as of its last fold, at most
`mirror_every - 1` batches old. `frame()` (or VIEW_SQL in any Delta reader) is the mirror
overlaid with the newer changes, newest per key, deletes dropped: the state as of the last
committed batch, so after a run's last batch it equals the state. A fold cut short by a crash
leaves changes that are already in the mirror; the overlay gives them the same answer.
"""
from __future__ import annotations

import logging
import time

from state import faults
from spark_jobs import delta_files
from spark_jobs.definitions import TableDefinition
from spark_jobs.runtime import Runtime

log = logging.getLogger("statetable.mirror")

VIEW_SQL = """-- the state as of the last committed batch: the mirror overlaid with newer changes
SELECT key, row, batch_id FROM (
  SELECT *, row_number() OVER (PARTITION BY key ORDER BY batch_id DESC) AS rn FROM (
    SELECT key, row, batch_id, false AS deleted FROM delta.`{mirror}`
    UNION ALL SELECT key, row, batch_id, deleted FROM delta.`{changes}`))
WHERE rn = 1 AND NOT deleted"""


def mirror_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "mirror")


def changes_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "mirror_changes")


def change_file(batch_id: int, partition: int) -> str:
    """One name per (batch, state partition): a retried or re-run merge task replaces its file."""
    return f"b{batch_id:012d}-p{partition:05d}.parquet"


CHANGE_DDL = "key STRING, row STRING, batch_id BIGINT, deleted BOOLEAN"


def change_schema():
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("row", pa.string()), ("batch_id", pa.int64()), ("deleted", pa.bool_())])


def write_changes(folder: str, table: TableDefinition, batch_id: int, partition: int, keys: list, values: list,
                  aggregator=None) -> None:
    """A partition's changed rows of a batch (value None: the key is gone), written atomically under
    their fixed name; `aggregator` as for compile.row_of."""
    import json

    import pyarrow as pa

    from spark_jobs.arrow_pass import write_parquet_atomically
    from spark_jobs.compile import row_of

    rows = pa.table({
        "key": [json.dumps(list(k), default=str) for k in keys],
        "row": [json.dumps(row_of(table, k, v, aggregator), default=str) for k, v in zip(keys, values)],
        "batch_id": [batch_id] * len(keys), "deleted": [v is None for v in values]}, schema=change_schema())
    write_parquet_atomically(rows, folder, change_file(batch_id, partition))


def commit_changes(rt: Runtime, table: str, batch_id: int) -> None:
    """Add a committed batch's change files to the changes table (idempotent per batch)."""
    import pyarrow.parquet as pq

    path = changes_path(rt, table)
    names = delta_files.listed(path, change_file(batch_id, 0)[:13])
    if not names:
        return
    files = [delta_files.DataFile(name, size, pq.read_metadata(f"{path}/{name}").num_rows)
             for name, size in names]
    delta_files.commit_files(path, files, change_schema(), f"{table}.mirror_changes", batch_id)


def fold_if_due(spark, rt: Runtime, table: TableDefinition, batch_id: int) -> None:
    """After every `mirror_every`-th batch (batch ids N-1, 2N-1, ...): MERGE the changes up to
    `batch_id` into the mirror, then remove their files from the changes table."""
    if (batch_id + 1) % table.mirror_every:
        return
    path, changes = mirror_path(rt, table.name), changes_path(rt, table.name)
    if delta_files.committed_version(changes, f"{table.name}.mirror_changes") is None:
        return
    from pyspark.sql import Window, functions as F

    started = time.monotonic()
    target = delta_files.load(path)
    folded = None if target is None else target.transaction_version(f"{table.name}.mirror")
    if folded is None or folded < batch_id:
        latest = Window.partitionBy("key").orderBy(F.desc("batch_id"))
        source = (spark.read.format("delta").load(changes).where(F.col("batch_id") <= batch_id)
                  .withColumn("_rn", F.row_number().over(latest)).where("_rn = 1").drop("_rn"))
        if target is None:        # created by delta-rs: no Spark job for an empty table
            delta_files.commit_files(path, [], change_schema(), f"{table.name}.mirror", -1)
        spark.conf.set("spark.databricks.delta.write.txnAppId", f"{table.name}.mirror")
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            upsert(spark, path, source)
        finally:
            spark.conf.unset("spark.databricks.delta.write.txnAppId")
            spark.conf.unset("spark.databricks.delta.write.txnVersion")
    faults.point("mirror.after_merge")
    removed = delta_files.remove_files(changes, lambda name: int(name[1:13]) <= batch_id)
    log.info("%s: mirror folded the changes of batches up to %d (%d files) in %.2fs", table.name, batch_id,
             removed, time.monotonic() - started)


def upsert(spark, path: str, source) -> None:
    """MERGE change rows (newest per key) into the mirror at `path`: a delete removes the key."""
    from delta.tables import DeltaTable

    (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.key = s.key")
     .whenMatchedDelete(condition="s.deleted")
     .whenMatchedUpdateAll(condition="NOT s.deleted")
     .whenNotMatchedInsertAll(condition="NOT s.deleted")
     .execute())


def committed_rows(rt: Runtime, table: str, attempts: int = 5):
    """(batch, rows): the table's rows (`key`, `row` JSON) as of `batch`, the newest batch whose
    changes are committed (None: none yet), read by delta-rs on the driver, no Spark job.

    The mirror is loaded before the changes: a fold that lands in between moves rows out of the
    changes that the loaded mirror lacks, so the mirror's version is checked again afterwards and
    the read repeated (as when a fold deletes a changes file while it is read)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pa.table({"key": pa.array([], pa.string()), "row": pa.array([], pa.string()),
                      "batch_id": pa.array([], pa.int64()), "deleted": pa.array([], pa.bool_())})
    columns = ["key", "row", "batch_id", "deleted"]
    for attempt in range(attempts):
        try:
            folded = delta_files.load(mirror_path(rt, table))
            changes = delta_files.load(changes_path(rt, table))
            batch = changes.transaction_version(f"{table}.mirror_changes") if changes is not None else None
            parts = [empty]
            if folded is not None:
                rows = folded.to_pyarrow_table(columns=columns[:3])
                parts.append(rows.append_column("deleted", pa.array([False] * rows.num_rows, pa.bool_())))
            if changes is not None:
                parts.append(changes.to_pyarrow_table(columns=columns))
            both = pa.concat_tables([p.cast(empty.schema) for p in parts])
            again = delta_files.load(mirror_path(rt, table))
            if (again.version() if again is not None else None) == (folded.version() if folded is not None else None):
                break
        except (OSError, ValueError) as exc:      # a changes file deleted by a fold while read
            if attempt == attempts - 1:
                raise
            log.info("%s: mirror changed while read (%s); reading again", table, exc)
    else:
        raise RuntimeError(f"{table}: the mirror folded {attempts} times while its state was read")
    newest = both.sort_by([("batch_id", "descending")]).group_by("key", use_threads=False).aggregate(
        [("row", "first"), ("deleted", "first")])
    live = newest.filter(pc.invert(newest.column("deleted_first")))
    return batch, pa.table({"key": live.column("key"), "row": live.column("row_first")})


def frame(spark, rt: Runtime, table: str):
    """The mirror as of the last committed batch (VIEW_SQL as a DataFrame)."""
    from pyspark.sql import Window, functions as F

    def load(path):
        if delta_files.exists(path):
            return spark.read.format("delta").load(path).select("key", "row", "batch_id", "deleted")
        return spark.createDataFrame([], CHANGE_DDL)

    both = load(mirror_path(rt, table)).withColumn("deleted", F.lit(False)) \
        .unionByName(load(changes_path(rt, table)))
    latest = Window.partitionBy("key").orderBy(F.desc("batch_id"))
    return (both.withColumn("_rn", F.row_number().over(latest))
            .where("_rn = 1 AND NOT deleted").drop("_rn", "deleted"))
