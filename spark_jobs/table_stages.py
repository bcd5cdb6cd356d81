"""What the two kinds of tables of tables share (spark_jobs/table_aggregate.py, an aggregate over
a table's rows; spark_jobs/table_join.py, a join of two tables): a rows stage `<t>.rows` holding
the input table's rows by key, opened beside the table's own state in each task, rebuilt from
the input's history, restored, snapshotted and wiped with it."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass

import pyarrow as pa

from catalog.definitions import TableDefinition, input_definition
from catalog.mapping import rows_spec
from catalog.runtime import Runtime, task_replica_roots, task_state_dir
from state import codec, faults
from state.table import StateTable

log = logging.getLogger(__name__)

INDEX = "\x00fk"         # a join's rows stage also holds (INDEX, fk, a-key) entries; a's rows are (a-key,)


@dataclass(frozen=True)
class StageContext:
    table: TableDefinition
    source: TableDefinition
    batch_id: int
    state_dir: str
    bootstrap: str
    snapshot_uri: str
    namespace: str
    retractions: str                # this batch's folder of retraction files
    changelog: str | None = None    # the groups' changelog topic (see registry.spec_of)
    replica_roots: tuple = ()


def retractions_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "retractions")


def batch_folder(root: str, batch_id: int) -> str:
    return f"{root}/b{batch_id:012d}"


def part_file(partition: int) -> str:
    return f"p{partition:05d}.parquet"


DELTA_SCHEMA = pa.schema([("_sp", pa.int32()), ("_key", pa.binary()), ("_delta", pa.binary())])


def open_stage(spec, ctx: StageContext, partition: int):
    table = StateTable(spec, task_state_dir(ctx.state_dir), bootstrap=ctx.bootstrap, snapshot_uri=ctx.snapshot_uri,
                       create_topics=False, seed_dirs=task_replica_roots(ctx.replica_roots))
    hydrated = not table.has_local_state(partition)
    try:
        return table, table.open(partition), hydrated
    except BaseException:
        table.close()
        raise


def summary(partition: int, part, result, ms: dict, hydrated: bool, **extra) -> pa.Table:
    meta = part.meta
    summary = {"partition": partition, "noop": result.noop, "keys_changed": result.keys_changed,
               "changelog_offset": meta.changelog_offset, "digest": format(meta.digest, "016x"),
               "key_count": meta.key_count, "applied_batch": meta.applied_batch, "purged": 0, "expired": 0,
               "rejected": [], "ms": ms, "hydrated": hydrated,
               "worker": os.environ.get(faults.WORKER_ENV) or socket.gethostname(), **extra}
    return pa.table({"summary": [json.dumps(summary, default=str)]})


@dataclass
class InputRead:
    """A batch's input records of a table of tables: classified by the input table's schema, counted,
    bad ones dead-lettered (a tombstone is a delete, not an error)."""
    classified: object           # a persisted DataFrame; unpersist when the stages are done
    reasons: dict
    read: int
    dead: int
    steps: dict


def read_input(table_run, plan, started: float, source: TableDefinition) -> InputRead:
    """The read and dead-letter steps every table of tables shares (MicroBatchRunner's fault points
    after_read, after_dead_letters and after_bronze, which these tables keep none of)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs import parse
    from spark_jobs.offsets import OffsetRange, spark_reader

    from spark_jobs import sinks

    table, rt = table_run.table, table_run.rt
    table_run.describe(plan.batch_id, "read")
    raw = spark_reader(table_run.spark, rt.bootstrap, OffsetRange(plan.topic, plan.ranges), table_run.reader_group)
    classified = parse.classify(raw, source, source.key_columns, now_ms=int(plan.created_at * 1000), rows=True) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    reasons = {r["reason"]: r["count"] for r in classified.groupBy("reason").count().collect()}
    read_count = sum(reasons.values())
    reasons[None] = reasons.get(None, 0) + reasons.pop("null_value", 0)      # tombstones are deletes, not errors
    steps = {"read": time.monotonic() - started}
    faults.point("batch.after_read")
    log.info("%s batch %d: read %d records of table %s in %.1fs (%.0f records/s)", table.name, plan.batch_id,
             read_count, source.name, steps["read"], read_count / max(steps["read"], 1e-6))
    table_run.describe(plan.batch_id, "dead_letters")
    dead = parse.dead_letters(classified, plan.topic).where(F.col("reason") != "null_value")
    dead_count = sinks.write_dead_letters(table_run, dead, plan.batch_id, sum(n for r, n in reasons.items() if r))
    steps["dead_letters"] = time.monotonic() - started - sum(steps.values())
    faults.point("batch.after_dead_letters")
    faults.point("batch.after_bronze")
    return InputRead(classified, reasons, read_count, dead_count, steps)


def input_history(frames, last, source: TableDefinition):
    """The input table's latest row per key over its topic's whole history up to `last` (verify,
    rebuild): compaction keeps each key's last record, which is all this needs."""
    from spark_jobs import parse
    from spark_jobs.offsets import OffsetRange, spark_reader

    full = OffsetRange(frames.table.topic, {p: (0, end) for p, (_, end) in last.ranges.items()})
    classified = parse.classify(spark_reader(frames.spark, frames.rt.bootstrap, full), source, source.key_columns,
                                rows=True)
    return frames.source_partials(classified, source)


def rebuild_rows(frames, last, batch_id: int, join_index: bool = False) -> int:
    """A rebuild's rows stage (spark_jobs.batch._rebuild): every partition replaced by the input's
    last row per key over its whole history, committed as the rebuild's batch. Each task leaves an
    empty retraction file first, so a rebuild that dies here and is finished from its plan (an
    empty batch) merges nothing into the groups. `join_index`: a join of tables also indexes
    b's keys to a's rows. Returns the rows written."""
    from pyspark.sql import functions as F

    from spark_jobs.partition_tasks import per_state_partition

    spark, table, rt = frames.spark, frames.table, frames.rt
    source = input_definition(table, frames.tables)
    rows = frames.partitioned(input_history(frames, last, source)).withColumn("_kind", F.lit("partial"))
    ctx = StageContext(table, source, batch_id, str(rt.state_dir), rt.bootstrap, rt.snapshot_uri, rt.namespace,
                       batch_folder(retractions_path(rt, table.name), batch_id))
    summaries = per_state_partition(spark, rows, table.partitions, lambda group: _rebuild_rows(ctx, group, join_index),
                                    f"rebuild {table.name}: rows")
    return sum(s["key_count"] for s in summaries.values())


def _rebuild_rows(ctx: StageContext, group, join_index: bool) -> pa.Table:
    import pyarrow.compute as pc

    from spark_jobs.arrow_keys import encoded_keys, write_parquet_atomically
    from spark_jobs.merge_task import partial_values

    started = time.monotonic()
    partition = group.column("_sp")[0].as_py()
    partials = group.filter(pc.equal(group.column("_kind"), "partial"))
    table, part, hydrated = open_stage(rows_spec(ctx.table, ctx.namespace), ctx, partition)
    try:
        wanted = {k: v for k, v in zip(encoded_keys(partials), partial_values(ctx.source, partials)) if v is not None}
        if join_index:                       # and the index from b's keys to a's rows
            wanted.update(index_entries(ctx.table, ctx.source, wanted))
        tx = part.begin(ctx.batch_id)
        for key, _ in part.raw_items():
            if key not in wanted:
                tx.delete_encoded(key)
        for key, row in wanted.items():
            tx.put_encoded(key, row)
        write_parquet_atomically(DELTA_SCHEMA.empty_table(), ctx.retractions, part_file(partition))
        result = tx.commit()
        return summary(partition, part, result, {"rows": round((time.monotonic() - started) * 1000)}, hydrated)
    finally:
        table.close()


def index_entries(table: TableDefinition, source: TableDefinition, wanted: dict) -> dict:
    """The rows stage's index entries (encoded key -> ()) of a's rows `wanted` (encoded key -> row)."""
    fk = source.value_columns.index(table.joins[0].stream_column.split(".")[-1])
    return {codec.encode_key((INDEX, row[fk], codec.decode_key(key)[0])): () for key, row in wanted.items()
            if row[fk] is not None}
