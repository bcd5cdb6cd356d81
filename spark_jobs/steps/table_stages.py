"""What the two kinds of tables of tables share (spark_jobs/steps/table_aggregate.py, an aggregate over
a table's rows; spark_jobs/steps/table_join.py, a join of two tables): a rows stage `<t>.rows` holding
the input table's rows by key, opened beside the table's own state in each task, rebuilt from
the input's history, restored, snapshotted and wiped with it."""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp

from catalog.definitions import TableDefinition, input_definition
from catalog.mapping import rows_spec
from catalog.runtime import Runtime, task_replica_roots, task_state_dir
from state import codec, faults
from state.table import StateTable
from spark_jobs.frames.table_frames import latest_rows
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.task_context import TaskContext
from spark_jobs.steps.schemas import schemas_for

log = logging.getLogger(__name__)

INDEX = "\x00fk"         # a join's rows stage also holds (INDEX, fk, a-key) entries; a's rows are (a-key,)
# A stream's rows are never changed or deleted, and are only ever found through b's key: the
# stage keeps each in its index entry, (ROWS_BY_FK, fk, position) -> row, one entry a record
# where (INDEX, ...) and (position,) were two (Nexmark q20: the stage's commit was a third of
# its task). A stream's stage written before holds the two; both are read (table_join.indexed).
ROWS_BY_FK = "\x00fr"


def retractions_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "retractions")


def batch_folder(root: str, batch_id: int) -> str:
    return f"{root}/b{batch_id:012d}"


def part_file(partition: int) -> str:
    return f"p{partition:05d}.parquet"


DELTA_SCHEMA = pa.schema([("_sp", pa.int32()), ("_key", pa.binary()), ("_delta", pa.binary())])


def open_stage(spec, ctx: TaskContext, partition: int):
    table = StateTable(spec, task_state_dir(ctx.state_dir), bootstrap=ctx.bootstrap, snapshot_uri=ctx.snapshot_uri,
                       create_topics=False, seed_dirs=task_replica_roots(ctx.replica_roots))
    hydrated = not table.has_local_state(partition)
    try:
        return table, table.open(partition), hydrated
    except BaseException:
        table.close()
        raise


def summary(partition: int, part, result, ms: dict, hydrated: bool, delta_keys: int = 0, **counts) -> pa.Table:
    """A stage task's report (PartitionSummary); `counts`: the stage's own."""
    meta = part.meta
    return PartitionSummary(
        partition=partition, noop=result.noop, keys_changed=result.keys_changed,
        changelog_offset=meta.changelog_offset, digest=format(meta.digest, "016x"), key_count=meta.key_count,
        applied_batch=meta.applied_batch, ms=ms, hydrated=hydrated, delta_keys=delta_keys,
        worker=os.environ.get(faults.WORKER_ENV) or socket.gethostname(), counts=counts).to_table()


@dataclass
class InputRead:
    """A batch's input records of a table of tables: each key's latest row in the batch with its
    state partition (`rows`: `_sp`, `_k0`, `_del`, `_v<i>`, and where the Arrow read made them,
    `_partition` and `_offset`, which `latest_per_key` in the merge task reads), counted, bad
    records dead-lettered (a tombstone is a delete, not an error)."""
    rows: object
    persisted: object            # the frame to unpersist when the stages are done
    reasons: dict
    read: int
    dead: int


def read_input(table_run, plan, clock, source: TableDefinition, blobs: bool = False) -> InputRead:
    """The read and dead-letter steps every table of tables shares (MicroBatchRunner's fault points
    after_read, after_dead_letters and after_bronze, which these tables keep none of): the Arrow
    read (frames/arrow_rows.py) where it covers the input, else Spark SQL's. STATETABLE_ENGINE=spark
    forces the latter, as it does for aggregates. `blobs`: a stream's rows from the Arrow read go
    as blobs (arrow_rows.RowsSpec.blobs; the merge tasks read them with arrow_rows.rows_of)."""
    from spark_jobs.frames import arrow_rows

    why = arrow_rows.unsupported(source)
    if why is None and os.environ.get("STATETABLE_ENGINE") != "spark":
        return _arrow_read(table_run, plan, clock, source, blobs and source.stream)
    log.debug("%s: Spark SQL reads %s (the Arrow read does not cover %s)", table_run.table.name, source.name, why)
    return _spark_read(table_run, plan, clock, source)


def _log_read(table_run, plan, clock, source: TableDefinition, read_count: int) -> None:
    log.info("%s batch %d: read %d records of table %s in %.1fs (%.0f records/s)", table_run.table.name, plan.batch_id,
             read_count, source.name, clock.seconds["read"], read_count / max(clock.seconds["read"], 1e-6))


def _spark_read(table_run, plan, clock, source: TableDefinition) -> InputRead:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.frames import parse
    from spark_jobs.steps.offsets import OffsetRange, spark_reader

    from spark_jobs.steps import sinks

    rt = table_run.rt
    with clock.step("read"):
        raw = spark_reader(table_run.spark, rt.bootstrap, OffsetRange(plan.topic, plan.ranges), table_run.reader_group)
        classified = parse.classify(raw, source, _key_fields(source), now_ms=int(plan.created_at * 1000), rows=True,
                                    schemas=schemas_for(source)) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        reasons = {r["reason"]: r["count"] for r in classified.groupBy("reason").count().collect()}
    read_count = sum(reasons.values())
    if not source.stream:       # a table's tombstones are deletes, not errors; a stream's are dead letters
        reasons[None] = reasons.get(None, 0) + reasons.pop("null_value", 0)
    _log_read(table_run, plan, clock, source, read_count)
    with clock.step("dead_letters", "batch.after_dead_letters", "batch.after_bronze"):
        dead = parse.dead_letters(classified, plan.topic)
        dead = dead if source.stream else dead.where(F.col("reason") != "null_value")
        dead_count = sinks.write_dead_letters(table_run, dead, plan.batch_id, sum(n for r, n in reasons.items() if r))
    rows = table_run.frames.partitioned(latest_rows(classified, source))
    return InputRead(rows, classified, reasons, read_count, dead_count)


def _arrow_read(table_run, plan, clock, source: TableDefinition, blobs: bool = False) -> InputRead:
    """One Arrow pass over the records (arrow_rows.run); Spark judges only the records whose Kafka
    key is not plainly their key (arrow_rows.judged), and only when there are any."""
    from pyspark.sql import functions as F

    from spark_jobs.frames import arrow_rows, parse
    from spark_jobs.steps import sinks
    from spark_jobs.steps.offsets import OffsetRange

    spec = arrow_rows.RowsSpec(source, table_run.table.partitions, plan.batch_id, now_ms=int(plan.created_at * 1000),
                               blobs=blobs)
    with clock.step("read"):
        out, stats = arrow_rows_pass(table_run, OffsetRange(plan.topic, plan.ranges), spec)
        undecided = stats.get("undecided", 0)
        out_judged = arrow_rows.judged(out, source) if undecided else out
        reasons = arrow_rows.reasons_of(stats)
        if undecided:
            for r in out_judged.where((F.col("_kind") == "row") & F.col("reason").isNotNull()) \
                    .groupBy("reason").count().collect():
                reasons[r["reason"]] = reasons.get(r["reason"], 0) + r["count"]
                reasons[None] -= r["count"]
    read_count = stats.get("read", 0)
    _log_read(table_run, plan, clock, source, read_count)
    with clock.step("dead_letters", "batch.after_dead_letters", "batch.after_bronze"):
        dead_count = sinks.write_dead_letters(table_run, parse.pass_dead_letters(out_judged, plan.topic),
                                              plan.batch_id, sum(n for r, n in reasons.items() if r))
    rows = arrow_rows.rows_frame(out_judged, source, blobs=blobs)
    if undecided:               # a tombstone's key was Spark's to read: its partition too
        rows = table_run.frames.partitioned(rows.drop("_sp"))
    return InputRead(rows, out, reasons, read_count, dead_count)


def arrow_rows_pass(table_run, offsets, spec):
    """(the persisted output of arrow_rows.run over `offsets`' records, its statistics)."""
    from pyspark import StorageLevel

    from spark_jobs.engine.session import struct
    from spark_jobs.frames import arrow_rows
    from spark_jobs.steps.offsets import spark_reader

    spark = table_run.spark
    raw = spark_reader(spark, table_run.rt.bootstrap, offsets, table_run.reader_group) \
        .select("partition", "offset", "timestamp", "key", "value")
    out = raw.mapInArrow(lambda batches: arrow_rows.run(spec, batches), struct(spark, arrow_rows.output_ddl(spec.source))) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    return out, arrow_rows.collected_stats(out)


def _key_fields(source: TableDefinition) -> list[str]:
    """The fields a record must carry (missing_key otherwise): a stream's key is its position."""
    return [] if source.stream else source.key_columns


def input_history(frames, bootstrap: str, last, source: TableDefinition):
    """The input table's latest row per key over its topic's whole history up to `last` (verify,
    rebuild): compaction keeps each key's last record, which is all this needs."""
    from spark_jobs.frames import parse
    from spark_jobs.steps.offsets import OffsetRange, spark_reader

    full = OffsetRange(frames.table.topic, {p: (0, end) for p, (_, end) in last.ranges.items()})
    classified = parse.classify(spark_reader(frames.spark, bootstrap, full), source, _key_fields(source),
                                rows=True, schemas=schemas_for(source))
    return latest_rows(classified, source)


def rebuild_rows(frames, rt, last, batch_id: int, join_index: bool = False) -> int:
    """A rebuild's rows stage (spark_jobs.recompute.rebuild): every partition replaced by the input's
    last row per key over its whole history, committed as the rebuild's batch. Each task leaves an
    empty retraction file first, so a rebuild that dies here and is finished from its plan (an
    empty batch) merges nothing into the groups. `join_index`: a join of tables also indexes
    b's keys to a's rows. Returns the rows written."""
    from pyspark.sql import functions as F

    from spark_jobs.engine.partition_tasks import per_state_partition

    spark, table = frames.spark, frames.table
    source = input_definition(table, frames.tables)
    rows = frames.partitioned(input_history(frames, rt.bootstrap, last, source)).withColumn("_kind", F.lit("partial"))
    ctx = TaskContext.of(rt, table, batch_id, source=source, replica_roots=(),
                         retractions=batch_folder(retractions_path(rt, table.name), batch_id))
    reports = per_state_partition(spark, rows, table.partitions, lambda group: _rebuild_rows(ctx, group, join_index),
                                    f"rebuild {table.name}: rows")
    return sum(s.key_count for s in PartitionSummary.all_of(reports).values())


def _rebuild_rows(ctx: TaskContext, group, join_index: bool) -> pa.Table:
    import pyarrow.compute as pc

    from spark_jobs.frames.arrow_keys import encoded_keys
    from spark_jobs.delta.delta_files import write_parquet_atomically
    from spark_jobs.steps.merge_task import partial_values

    started = time.monotonic()
    partition = group.column("_sp")[0].as_py()
    partials = group.filter(pc.equal(group.column("_kind"), "partial"))
    table, part, hydrated = open_stage(rows_spec(ctx.table, ctx.namespace), ctx, partition)
    try:
        wanted = {k: v for k, v in zip(encoded_keys(partials), partial_values(ctx.source, partials)) if v is not None}
        kept = a_rows_kept(ctx.table, ctx.source) if join_index else None
        if kept is not None:                 # as merge_join keeps them
            wanted = {k: v for k, v in wanted.items() if kept(v)}
        if join_index:                       # and the index from b's keys to a's rows
            entries = index_entries(ctx.table, ctx.source, wanted)
            wanted = entries if ctx.source.stream else {**wanted, **entries}
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


def _a_only_conjuncts(table: TableDefinition) -> list:
    """The conjuncts of a join's WHERE that read a's columns (`alias.column`) and nothing else."""
    if not table.where:
        return []
    prefix = f"{table.stream_alias}."
    tree = sqlglot.parse_one(table.where, dialect="spark")
    return [c for c in (tree.flatten() if isinstance(tree, exp.And) else [tree])
            if (names := {col.name for col in c.find_all(exp.Column)}) and all(n.startswith(prefix) for n in names)]


def a_rows_kept(table: TableDefinition, source: TableDefinition):
    """The part of a join's WHERE that reads a's columns only, as a test of one a-row (None: no
    such part). An a-row that fails it joins to no row whatever b holds, so the rows stage need
    not keep it: a stream's such records are never stored, a table's row that comes to fail it
    leaves the stage as a deleted row would (Nexmark q3 keeps a fifth of its auctions)."""
    own = _a_only_conjuncts(table)
    if not own:
        return None
    from catalog.mapping import compiled

    prefix = f"{table.stream_alias}."
    names = {f"{prefix}{c}" for c in source.value_columns}
    test = compiled("compile_predicate", " AND ".join(f"({c.sql(dialect='spark')})" for c in own), names)
    picks = sorted({(col.name, source.value_columns.index(col.name[len(prefix):]))
                    for c in own for col in c.find_all(exp.Column)})
    return lambda row: test({name: row[i] for name, i in picks})


_NUMBERS = ("BIGINT", "LONG", "INT", "INTEGER", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")
# What Spark evaluates as catalog.expressions does, with no way to raise under ANSI SQL: plain
# comparisons of a column with a literal of its own kind, joined by AND, OR and NOT.
_PLAIN = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not, exp.Paren, exp.Is, exp.In,
          exp.Null, exp.Boolean, exp.Column, exp.Identifier, exp.Literal)


def a_rows_filter(table: TableDefinition, source: TableDefinition) -> str | None:
    """The plain conjuncts of a_rows_kept's part as Spark SQL over latest_rows' `_v<i>` columns,
    for a stream's records before they are shuffled to the merge tasks (q3: four in five of the
    auctions never leave the read). The merge still applies a_rows_kept, so this needs only
    never to drop a row that passes it; a conjunct it cannot say plainly is left to the merge."""
    prefix = f"{table.stream_alias}."
    kinds = dict(source.schema)
    index = {c: i for i, c in enumerate(source.value_columns)}

    def plain(node: exp.Expression) -> bool:
        if any(kinds.get(c.name[len(prefix):]) not in (*_NUMBERS, "STRING", "BOOLEAN")
               for c in node.find_all(exp.Column)):
            return False

        def same_kind(column, literals) -> bool:
            """A column of a number compared with number literals, of a string with strings."""
            kind = kinds[column.name[len(prefix):]] if isinstance(column, exp.Column) else None
            return kind in (*_NUMBERS, "STRING") and bool(literals) and all(
                isinstance(v, exp.Literal) and v.is_string == (kind == "STRING") for v in literals)

        for child in node.walk():
            if not isinstance(child, _PLAIN):
                return False
            if isinstance(child, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
                column, other = (child.left, child.right) if isinstance(child.left, exp.Column) \
                    else (child.right, child.left)
                if not same_kind(column, [other]):
                    return False
            elif isinstance(child, exp.In) and not same_kind(child.this, child.expressions) \
                    or isinstance(child, exp.Is) and not isinstance(child.expression, exp.Null):
                return False
        return True

    conjuncts = [c for c in _a_only_conjuncts(table) if plain(c)]
    if not conjuncts:
        return None
    renamed = [c.copy().transform(lambda n: exp.column(f"_v{index[n.name[len(prefix):]]}")
                                  if isinstance(n, exp.Column) else n) for c in conjuncts]
    return " AND ".join(f"({c.sql(dialect='spark')})" for c in renamed)


def index_entries(table: TableDefinition, source: TableDefinition, wanted: dict) -> dict:
    """The rows stage's index entries of a's rows `wanted` (encoded key -> row): encoded key -> (),
    or for a stream, whose rows the entries hold (ROWS_BY_FK), encoded key -> row."""
    fk = source.value_columns.index(table.joins[0].stream_column.split(".")[-1])
    prefix = ROWS_BY_FK if source.stream else INDEX
    return {codec.encode_key((prefix, row[fk], codec.decode_key(key)[0])): row if source.stream else ()
            for key, row in wanted.items() if row[fk] is not None}
