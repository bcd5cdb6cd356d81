"""Where a batch's records go besides the state: dead letters (the Kafka topic and the Delta
table, one writer for both) and bronze (the events the batch applied, the history verify and
rebuild recompute from). Every write is idempotent per batch (dead letters keyed by source
coordinates, Delta appends with txnAppId/txnVersion), so a batch re-run from its plan writes
nothing twice."""
from __future__ import annotations

import logging

from catalog.batch_log import BatchPlan
from catalog.definitions import TableDefinition
from spark_jobs.delta import delta_files
from spark_jobs.frames import parse
from spark_jobs.steps.table_run import TableRun
from state import kafka_config

__all__ = ["write_dead_letters", "late_dead_letters", "dead_letter_refused", "write_bronze", "bronze_target", "commit_bronze"]

log = logging.getLogger("statetable.microbatch")


def _deliver(run: TableRun, dead, batch_id: int, app: str) -> None:
    """`dead` (parse.dead_letter_records) to the dead-letter topic by Spark's Kafka sink (append:
    the V2 sink takes no other mode) and to the table's Delta dead-letter table, once per batch
    and `app` (txnAppId/txnVersion)."""
    from pyspark.sql import functions as F

    (dead.select("key", "value", "headers").write.format("kafka").mode("append")
     .options(**kafka_config.spark_options(run.rt.bootstrap)).option("topic", run.dead_letter_topic).save())
    rows = dead.select("reason", "source_partition", "source_offset",
                       F.col("value").cast("string").alias("value"), F.lit(batch_id).alias("batch_id"))
    _append_files(rows, run.rt.delta_path(run.table.name, "dlq"), f"{run.table.name}.{app}", batch_id,
                  f"{app}-b{batch_id:012d}")


def _append_files(rows, path: str, app_id: str, batch_id: int, prefix: str) -> None:
    """`rows` appended to the Delta table at `path` once per (app_id, batch_id), as bronze is
    written (`_write_files`, `_commit_files`). Spark's Delta writer cost a batch with dead
    letters ~3 s more than one without (its snapshot of the log, stats and commit) against ~2.3 s
    for the whole clean batch. A re-run of a committed batch adds nothing."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if (done := delta_files.committed_version(path, app_id)) is not None and done >= batch_id:
        return
    schema = pa.schema([f.with_nullable(True) for f in to_arrow_schema(rows.schema)])
    _commit_files(path, _write_files(rows, path, schema, prefix), schema, app_id, batch_id, prefix)


def _write_files(rows, path: str, schema, prefix: str) -> dict[str, dict[str, int]]:
    """Each Spark task writes its rows (in `schema`'s columns and types) as one Parquet file,
    `prefix`-s<task>.parquet, into the Delta table's folder at `path`; {file: {bytes, rows}}."""
    name = prefix + "-s{:05d}.parquet"

    def write(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_jobs.delta.delta_files import write_parquet_atomically

        batches = list(batches)
        table = pa.Table.from_batches(batches) if batches else None
        if table is None or not table.num_rows:
            return
        file = name.format(TaskContext.get().partitionId())     # a retried task replaces its file
        size = write_parquet_atomically(table.select(schema.names).cast(schema), path, file)
        yield pa.RecordBatch.from_pydict({"file": [file], "bytes": [size], "rows": [table.num_rows]})

    written = rows.mapInArrow(write, "file STRING, bytes BIGINT, rows BIGINT").collect()
    return {r["file"]: {"bytes": r["bytes"], "rows": r["rows"]} for r in written}


def _commit_files(path: str, files: dict[str, dict[str, int]], schema, app_id: str, batch_id: int,
                  prefix: str) -> None:
    """The workers' Parquet files of the batch, added to the table in one Delta transaction
    (app id and version: a re-run after a crash adds nothing twice). Only the files this run
    reported are committed; what an earlier attempt left with other names (cut at other
    boundaries) is removed afterwards, never read."""
    if files:
        delta_files.commit_files(path, [delta_files.DataFile(name, f["bytes"], f["rows"])
                                        for name, f in sorted(files.items())], schema, app_id, batch_id)
    for name, _ in delta_files.listed(path, prefix):
        if name not in files:
            delta_files.delete_file(path, name)


def write_dead_letters(run: TableRun, dead, batch_id: int, expected: int | None = None) -> int:
    """The pass's dead letters, delivered; how many. `expected`: the pass's own count of them
    (its reasons), when it has one: 0 runs no Spark job at all, as in most batches."""
    if expected == 0:
        return 0
    dead = dead.persist()
    try:
        count = dead.count()
        if count:
            _deliver(run, dead, batch_id, "dlq")
        return count
    finally:
        dead.unpersist()


def late_dead_letters(table: TableDefinition, late, topic: str):
    """A windowed table's late events (TableFrames.split_late) as dead-letter records, reason `late`."""
    from pyspark.sql import functions as F

    payload = F.to_json(F.struct(*[F.col(n) for n, _ in table.schema]))
    return parse.dead_letter_records(late, topic, payload, F.lit("late"), F.col("source_partition"),
                                     F.col("source_offset"), F.length(payload))


def dead_letter_refused(run: TableRun, events, classified, refused: dict[tuple, str], plan: BatchPlan) -> dict[str, int]:
    """The batch's events for keys the state refused (a SUM past 64 bits, a value past the
    changelog's record limit) go to the dead letters with that reason; the dead letters are
    keyed by source offset and the Delta append is per batch, so a re-run writes them again
    harmlessly. Counts by reason."""
    from pyspark.sql import functions as F

    coords = run.frames.refused_events(events, refused)
    raw = classified.select(F.col("_partition").alias("source_partition"), F.col("_offset").alias("source_offset"),
                            "_value", "_size")
    dead = parse.dead_letter_records(coords.join(raw, ["source_partition", "source_offset"]), plan.topic,
                                     F.col("_value"), F.col("reason"), F.col("source_partition"),
                                     F.col("source_offset"), F.col("_size")).persist()
    try:
        counts = {r["reason"]: r["count"] for r in dead.groupBy("reason").count().collect()}
        if counts:
            _deliver(run, dead, plan.batch_id, "dlq-refused")
    finally:
        dead.unpersist()
    log.warning("%s batch %d: %d keys refused by the state (%s); their %d events dead-lettered", run.table.name,
                plan.batch_id, len(refused), sorted(set(refused.values())), sum(counts.values()))
    return counts


def write_bronze(run: TableRun, events, batch_id: int) -> None:
    """The Spark-SQL pass's events, appended to bronze once per batch. Events with bronze's own
    columns (no join) are written as the Arrow pass writes them: each task its Parquet file in
    bronze's folder, the driver one delta-rs commit (`commit_bronze`). Spark's Delta writer cost
    a small batch ~2.8 of its ~6 s (its log, stats and commit). Enriched events (joins) keep
    Spark's writer, whose mergeSchema follows their columns."""
    from pyspark.sql import functions as F

    from spark_jobs.frames import arrow_pass

    try:
        schema = None if run.table.joins else arrow_pass.bronze_schema(run.table)
    except KeyError:                # a column type the Arrow side does not map
        schema = None
    if schema is None or sorted([*events.columns, "batch_id"]) != sorted(schema.names):
        (events.withColumn("batch_id", F.lit(batch_id)).write.format("delta").mode("append")
         .option("txnAppId", f"{run.table.name}.bronze").option("txnVersion", batch_id)
         .option("mergeSchema", "true")
         .save(run.rt.delta_path(run.table.name, "bronze")))
        return
    folder = bronze_target(run, batch_id)
    if folder is None:
        return
    rows = events.withColumn("batch_id", F.lit(batch_id).cast("long"))
    commit_bronze(run, _write_files(rows, folder, schema, arrow_pass.bronze_file_prefix(batch_id)), batch_id)


def bronze_target(run: TableRun, batch_id: int) -> str | None:
    """Where the Arrow pass writes bronze files: the bronze table's folder; None when the batch's
    bronze is already committed, or the table keeps none (`-- bronze: off`). Nothing is
    removed before the pass: on a shared Spark Connect session, a re-run of a batch whose
    client died can reuse that attempt's cached pass output, files and all, so its files must
    still be there (see `commit_bronze`)."""
    if not run.table.bronze:
        return None
    path = run.rt.delta_path(run.table.name, "bronze")
    done = delta_files.committed_version(path, f"{run.table.name}.bronze")
    if done is not None and done >= batch_id:
        return None
    return path


def commit_bronze(run: TableRun, files: dict[str, dict[str, int]], batch_id: int) -> None:
    """The batch's bronze files (the Arrow pass's or `write_bronze`'s), committed as
    `_commit_files` commits any table's."""
    from spark_jobs.frames import arrow_pass

    _commit_files(run.rt.delta_path(run.table.name, "bronze"), files, arrow_pass.bronze_schema(run.table),
                  f"{run.table.name}.bronze", batch_id, arrow_pass.bronze_file_prefix(batch_id))
