"""A table of tables' input records in one Arrow pass (mapInArrow): parsed, classified and keyed by
the input table's rules, each with its state partition, where Spark SQL's `parse.classify` and
`table_frames.latest_rows` took a typed parse, a text parse of the rejects, a bracketed parse for
trailing values and a window over the keys (Nexmark q3: 3.6 s of a 7.5 s batch for 120,000
auctions, ten times the Arrow pass's cost per record).

The values are judged by the Arrow pass's own parser (arrow_pass.classify, held to Spark's rules
by the stream pass's parity tests). What only Spark defines, its `try_cast` of a Kafka key to the
primary key's type, stays with Spark: a record whose Kafka key is not plainly its key's text (a
key "12" for id 12 is; "012", " 12" or a JSON key is not) is marked `_undecided`, carries its key
and bytes, and Spark judges it as `parse.classify` would (key_mismatch; a tombstone's key or its
reason). So both passes, and verify's recomputation through Spark SQL, agree record by record.

Rows are not folded here: two records of one key may sit in two tasks (a key in two Kafka
partitions), and one of them may still be refused by Spark. The merge task keeps each key's
latest (`latest_per_key`), as latest_rows' window did.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import TableDefinition
from spark_jobs.frames import arrow_blobs
from spark_jobs.frames.arrow_keys import state_partitions
from spark_jobs.frames.arrow_pass import PassSpec, classify, dead_letters, shaped
from spark_jobs.frames.arrow_values import arrow_type
from spark_jobs.frames.formats import transcodes
from spark_jobs.frames.parse import MAX_VALUE_BYTES

_INT_KEYS = {"BIGINT": (-(1 << 63), (1 << 63) - 1), "LONG": (-(1 << 63), (1 << 63) - 1),
             "INT": (-(1 << 31), (1 << 31) - 1)}
_PLAIN_INT = re.compile(rb"(0|-?[1-9][0-9]{0,18})")
_SPARK_TYPE = {"LONG": "BIGINT", "DECIMAL": "DECIMAL(10,0)"}


def unsupported(source: TableDefinition) -> str | None:
    """Why the Arrow read cannot take `source`'s records (None: it can): the Spark-SQL read stays
    for formats read through a registry, scaled DECIMALs and keys of other types."""
    if transcodes(source):
        return f"format {source.format}"
    scaled = [name for name, dtype in source.schema if dtype.startswith("DECIMAL(")]
    if scaled:
        return f"DECIMAL(p,s) field {scaled[0]}"
    if not source.stream and dict(source.schema)[source.key_columns[0]] not in (*_INT_KEYS, "STRING"):
        return f"a {dict(source.schema)[source.key_columns[0]]} primary key"
    return None


def _stored_type(dtype: str) -> tuple[str, pa.DataType]:
    """A value's (Spark DDL, Arrow type) as the state keeps it (latest_rows' `stored`)."""
    if dtype == "TIMESTAMP":
        return "BIGINT", pa.int64()
    if dtype == "DATE":
        return "INT", pa.int32()
    return _SPARK_TYPE.get(dtype, dtype), arrow_type(dtype)


def output_columns(source: TableDefinition) -> list[tuple[str, str, pa.DataType]]:
    kinds = dict(source.schema)
    key_type = "STRING" if source.stream else kinds[source.key_columns[0]]
    cols = [("_kind", "STRING", pa.string()), ("_sp", "INT", pa.int32()),
            ("_k0", _SPARK_TYPE.get(key_type, key_type), arrow_type(key_type)), ("_del", "BOOLEAN", pa.bool_())]
    for i, name in enumerate(source.value_columns):
        cols.append((f"_v{i}", *(("STRING", pa.string()) if source.stream and name == source.key_columns[0]
                                 else _stored_type(kinds[name]))))
    return cols + [("_partition", "INT", pa.int32()), ("_offset", "BIGINT", pa.int64()),
                   ("_undecided", "BOOLEAN", pa.bool_()), ("_key", "BINARY", pa.binary()),
                   ("reason", "STRING", pa.string()), ("source_partition", "INT", pa.int32()),
                   ("source_offset", "BIGINT", pa.int64()), ("value", "BINARY", pa.binary()),
                   ("size", "INT", pa.int32()), ("stat", "STRING", pa.string()), ("stat_value", "BIGINT", pa.int64())]


def output_ddl(source: TableDefinition) -> str:
    return ", ".join(f"{name} {ddl}" for name, ddl, _ in output_columns(source))


@dataclass(frozen=True)
class WindowRule:
    """A windowed join's own judgment of a stream's accepted records (stream_join._judged): each
    needs its event time and window end, no later than the batch's clock allows, a window no
    longer than the join's longest, and (after the first batch) a time not before the watermark."""
    time_column: str
    until_column: str
    watermark_ms: int | None
    max_window_ms: int


@dataclass(frozen=True)
class RowsSpec:
    source: TableDefinition       # the input table (a stream's records are rows keyed by position)
    partitions: int               # the reading table's state partitions (its `_sp`)
    batch_id: int
    now_ms: int | None
    max_value_bytes: int = MAX_VALUE_BYTES
    # A windowed join's side: the join key, which every record must carry and which picks its
    # state partition, and the rule of its event times.
    join_key: str | None = None
    window: WindowRule | None = None
    # The value columns the reader uses (None: all); the others come out NULL, as the windowed
    # join's _side_rows stores them, so a bid's url and extra never cross into the JVM (q4).
    keep: frozenset | None = None
    # A windowed join's side, handed on as its merge tasks take it (SideExchange): its accepted
    # rows leave as one Arrow IPC blob a state partition and Arrow batch, not as rows.
    exchange: "SideExchange | None" = None
    # A stream's rows for a join of tables, handed on whole as blobs (arrow_blobs: `_k0`, `_del`,
    # `_v<i>`; a stream's rows are one a position, so its merge tasks need no positions).
    blobs: bool = False


@dataclass(frozen=True)
class SideExchange:
    """Which side of a windowed join the rows are (`a` or `b`) and the fields that make its join
    key, event time and window end. The merge tasks need the rows whole and only there, so they
    cross Spark as a few blobs (its cache and shuffle copy bytes), not as 1.84M rows of 23 columns
    converted field by field into the JVM and back (Nexmark q4's bids: the read 8.4 s where the
    aggregate pass reads them in 4.2 s)."""
    side: str
    key: str
    time_column: str
    until_column: str
    used: frozenset = frozenset()       # the fields a joined row or the WHERE reads; the others NULL


BLOB = arrow_blobs.BLOB      # an output row of an exchanged side: `_sp` and its rows' IPC stream in `value`


def side_table(rows: pa.Table, source: TableDefinition, exchange: SideExchange) -> pa.Table:
    """A windowed join's side rows in the columns stream_join._side_rows gives them by Spark:
    `_k0` the join key, `_k1` the position, `_side`, `_t` and `_u` in ms, `_a` or `_b` the fields
    (those not `used` NULL: a record waits with what its rows will read, as Spark's rows do)."""
    index = {c: i for i, c in enumerate(source.value_columns)}
    names = source.value_columns[1:]

    def field(c: str) -> pa.Array:
        column = rows.column(f"_v{index[c]}").combine_chunks()
        return column if c in exchange.used else pa.nulls(len(column), column.type)

    fields = pa.StructArray.from_arrays([field(c) for c in names], names=names)
    return pa.table({"_k0": rows.column(f"_v{index[exchange.key]}"), "_k1": rows.column("_k0"),
                     "_side": pa.repeat(exchange.side, rows.num_rows).cast(pa.string()),
                     "_t": rows.column(f"_v{index[exchange.time_column]}").cast(pa.int64()),
                     "_u": rows.column(f"_v{index[exchange.until_column]}").cast(pa.int64()),
                     f"_{exchange.side}": fields})


def _blobs(rows: pa.Table, spec: "RowsSpec"):
    """One output row a state partition: its side rows as an Arrow IPC stream."""
    return arrow_blobs.handed_on(side_table(rows, spec.source, spec.exchange), rows.column("_sp"))


def _row_blobs(rows: pa.Table, schema: pa.Schema):
    """One output row a state partition: a stream's rows (`_k0`, `_del`, `_v<i>` in the read's
    types) as an Arrow IPC stream (RowsSpec.blobs); a merge task reads them with
    arrow_blobs.rows_of."""
    fields = [f for f in schema if f.name in ("_k0", "_del") or (f.name[:2] == "_v" and f.name[2:].isdigit())]
    return arrow_blobs.handed_on(pa.table({f.name: rows.column(f.name).cast(f.type) for f in fields}), rows.column("_sp"))


def exchanged(partials: pa.Table) -> pa.Table:
    """The side rows a merge task was given, blobs (`_blob`) opened and rows by Spark as they are."""
    if "_blob" not in partials.column_names:
        return partials
    blobs = partials.column("_blob")
    is_blob = pc.is_valid(blobs)
    tables = arrow_blobs.opened(blobs.filter(is_blob).to_pylist())
    rows = partials.filter(pc.invert(is_blob))
    if rows.num_rows:
        tables.append(rows.select([c for c in rows.column_names if c in ("_k0", "_k1", "_side", "_t", "_u", "_a", "_b")]))
    return pa.concat_tables(tables, promote_options="default") if tables else partials.slice(0, 0)


def run(spec: RowsSpec, batches):
    """mapInArrow body: row, dead-letter and stat rows (output_columns)."""
    schema = pa.schema([(name, dtype) for name, _, dtype in output_columns(spec.source)])
    pass_spec = PassSpec(spec.source, spec.batch_id, spec.now_ms, None, None, max_value_bytes=spec.max_value_bytes)
    counts: dict[str, int] = {}
    for batch in batches:
        if not batch.num_rows:
            continue
        for kind, table in _records(batch, spec, pass_spec):
            if kind == "stat":
                for name, n in table.items():
                    _add_stat(counts, name, n)
            elif table.num_rows and kind == "row" and spec.exchange is not None:
                for blob in _blobs(table, spec):
                    yield shaped(blob, schema)
            elif table.num_rows and kind == "row" and spec.blobs:
                for blob in _row_blobs(table, schema):
                    yield shaped(blob, schema)
            elif table.num_rows:
                yield shaped(table.append_column("_kind", pa.array([kind] * table.num_rows, pa.string())), schema)
    if counts:
        yield shaped(pa.table({"_kind": ["stat"] * len(counts), "stat": list(counts),
                                "stat_value": pa.array(list(counts.values()), pa.int64())}), schema)


def _records(batch: pa.RecordBatch, spec: RowsSpec, pass_spec: PassSpec):
    source = spec.source
    key_fields = [spec.join_key] if spec.join_key else [] if source.stream else source.key_columns
    events, dead, read = classify(batch, pass_spec, key_fields=key_fields)
    stats = {"read": read}
    if not source.stream:       # a table's tombstones are deletes, or dead letters by their key
        tombstones = pc.equal(dead.column("reason"), "null_value")
        if pc.any(tombstones).as_py():
            yield from _tombstones(batch, dead.filter(tombstones), spec, stats)
            dead = dead.filter(pc.invert(tombstones))
    for reason in dead.column("reason").to_pylist():
        stats[f"dead_{reason}"] = stats.get(f"dead_{reason}", 0) + 1
    yield "dead", dead
    if events.num_rows:
        rows = _rows(batch, events, spec, stats)
        if spec.window is not None:
            rows, late = _judge_times(batch, rows, spec, pass_spec, stats)
            yield "dead", late
        yield "row", rows
    yield "stat", stats


def _rows(batch: pa.RecordBatch, events: pa.Table, spec: RowsSpec, stats: dict) -> pa.Table:
    """The good records as rows: `_k0`, `_v<i>` as the state keeps them, their position, and, where
    the Kafka key is not plainly the row's key, `_undecided` with the key and bytes for Spark."""
    source = spec.source
    n = events.num_rows
    kinds = dict(source.schema)
    if source.stream:
        position = pc.binary_join_element_wise(events.column("source_partition").cast(pa.string()),
                                               events.column("source_offset").cast(pa.string()), ":")
        key = position
    else:
        key = events.column(source.key_columns[0])
    out = {"_k0": key, "_del": pa.array([False] * n, pa.bool_())}
    for i, name in enumerate(source.value_columns):
        if source.stream and name == source.key_columns[0]:
            out[f"_v{i}"] = position
        elif spec.keep is not None and name not in spec.keep:
            out[f"_v{i}"] = pa.nulls(n, _stored_type(kinds[name])[1])
        elif kinds[name] == "TIMESTAMP":
            out[f"_v{i}"] = pc.floor_temporal(events.column(name), unit="millisecond") \
                .cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
        elif kinds[name] == "DATE":
            out[f"_v{i}"] = events.column(name).cast(pa.int32())
        else:
            out[f"_v{i}"] = events.column(name)
    out["_partition"] = events.column("source_partition").cast(pa.int32())
    out["_offset"] = events.column("source_offset")
    rows = pa.table(out)
    if source.stream:
        route = rows.select(["_k0"]) if spec.join_key is None else \
            pa.table({"_k0": out[f"_v{source.value_columns.index(spec.join_key)}"]})
        return rows.append_column("_sp", state_partitions(route, spec.partitions))
    # Spark's rule: a Kafka key that is present must try_cast to the row's key. Its plain text
    # (what str() of the key gives) always does; anything else Spark judges.
    index = pc.index_in(events.column("source_offset"), value_set=batch.column("offset"))
    kafka_keys = pc.take(batch.column("key"), index) if "key" in batch.schema.names else pa.nulls(n, pa.binary())
    if source.key_format != "plain":
        plain = pc.is_null(kafka_keys)
    else:
        text = key.cast(pa.string()).cast(pa.binary())
        plain = pc.or_(pc.is_null(kafka_keys), pc.fill_null(pc.equal(kafka_keys.cast(pa.binary()), text), False))
    undecided = pc.invert(plain)
    rows = rows.append_column("_undecided", undecided)
    if pc.any(undecided).as_py():
        stats["undecided"] = stats.get("undecided", 0) + pc.sum(undecided.cast(pa.int64())).as_py()
        values = pc.take(batch.column("value"), index)
        rows = rows.append_column("_key", pc.if_else(undecided, kafka_keys.cast(pa.binary()), None)) \
            .append_column("value", pc.if_else(undecided, values, None)) \
            .append_column("size", pc.if_else(undecided, pc.binary_length(values).cast(pa.int32()), None)) \
            .append_column("source_partition", rows.column("_partition")) \
            .append_column("source_offset", rows.column("_offset"))
    return rows.append_column("_sp", state_partitions(rows.select(["_k0"]), spec.partitions))


def _judge_times(batch: pa.RecordBatch, rows: pa.Table, spec: RowsSpec, pass_spec: PassSpec, stats: dict):
    """(accepted rows, dead letters): stream_join._judged's reasons in its order, and each Kafka
    partition's newest accepted event time as `newest_<partition>` (a maximum, not a sum)."""
    rule, columns = spec.window, spec.source.value_columns
    t = rows.column(f"_v{columns.index(rule.time_column)}").cast(pa.int64())
    until = rows.column(f"_v{columns.index(rule.until_column)}").cast(pa.int64())
    checks = [("missing_event_time", pc.or_(pc.is_null(t), pc.is_null(until))),
              ("future_event_time", pc.greater(t, spec.now_ms + spec.source.event_time_skew_ms)),
              ("window_too_long", pc.greater(pc.subtract(until, t), rule.max_window_ms))]
    if rule.watermark_ms is not None:
        checks.append(("late", pc.less(t, rule.watermark_ms)))
    reason = pa.nulls(rows.num_rows, pa.string())
    for name, mask in checks:
        reason = pc.if_else(pc.and_(pc.is_null(reason), pc.fill_null(mask, False)), pa.scalar(name), reason)
    rejected = pc.is_valid(reason)
    accepted = rows.filter(pc.invert(rejected))
    kept_t = t.filter(pc.invert(rejected))
    if accepted.num_rows:
        for partition in pc.unique(accepted.column("_partition")).to_pylist():
            newest = pc.max(kept_t.filter(pc.equal(accepted.column("_partition"), partition))).as_py()
            _add_stat(stats, f"newest_{partition}", newest)
    if not pc.any(rejected).as_py():
        return accepted, rows.slice(0, 0).select([])
    reasons = reason.filter(rejected).to_pylist()
    for name in reasons:
        _add_stat(stats, f"dead_{name}", 1)
    index = pc.index_in(rows.column("_offset").filter(rejected), value_set=batch.column("offset"))
    return accepted, dead_letters(batch, index, reasons, pass_spec)


def _tombstones(batch: pa.RecordBatch, nulls: pa.Table, spec: RowsSpec, stats: dict):
    """A table's null values: a delete of the key its Kafka key names, when that is plainly the
    key's text; a dead letter when there is no Kafka key; otherwise Spark judges (undecided)."""
    source = spec.source
    pk_type = dict(source.schema)[source.key_columns[0]]
    index = pc.index_in(nulls.column("source_offset"), value_set=batch.column("offset"))
    keys = (pc.take(batch.column("key"), index) if "key" in batch.schema.names
            else pa.nulls(nulls.num_rows, pa.binary())).cast(pa.binary()).to_pylist()
    deleted, dead, undecided = [], [], []
    for i, key in enumerate(keys):
        if key is None:
            dead.append(i)
            continue
        value = _plain_key(key, pk_type) if source.key_format == "plain" else None
        (undecided if value is None else deleted).append((i, value))
    if dead:
        stats["dead_tombstone_without_key"] = stats.get("dead_tombstone_without_key", 0) + len(dead)
        picked = nulls.take(pa.array(dead, pa.int64()))
        yield "dead", picked.set_column(picked.schema.get_field_index("reason"), "reason",
                                        pa.array(["tombstone_without_key"] * len(dead), pa.string()))
    key_type = arrow_type(pk_type)
    for group, flag in ((deleted, False), (undecided, True)):
        if not group:
            continue
        at = pa.array([i for i, _ in group], pa.int64())
        rows = pa.table({"_k0": pa.array([v for _, v in group], key_type), "_del": pa.array([True] * len(group)),
                         "_partition": pc.take(nulls.column("source_partition"), at),
                         "_offset": pc.take(nulls.column("source_offset"), at)})
        if flag:
            stats["undecided"] = stats.get("undecided", 0) + len(group)
            yield "row", rows.append_column("_undecided", pa.array([True] * len(group))) \
                .append_column("_key", pa.array([keys[i] for i, _ in group], pa.binary())) \
                .append_column("source_partition", rows.column("_partition")) \
                .append_column("source_offset", rows.column("_offset"))
        else:
            yield "row", rows.append_column("_undecided", pa.array([False] * len(group))) \
                .append_column("_sp", state_partitions(rows.select(["_k0"]), spec.partitions))


def _plain_key(key: bytes, pk_type: str):
    """The key a Kafka key names when it is plainly its text (Spark's try_cast agrees), else None."""
    if pk_type == "STRING":
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    low, high = _INT_KEYS[pk_type]
    if _PLAIN_INT.fullmatch(key) and low <= int(key) <= high:
        return int(key)
    return None


def judged(out, source: TableDefinition):
    """The pass's output with Spark's judgment of the undecided rows, as parse.classify and
    latest_rows give it: `reason` (key_mismatch, a tombstone's), and a tombstone's `_k0`."""
    from pyspark.sql import functions as F

    from spark_jobs.frames.parse import kafka_key_text

    if source.stream:
        return out
    pk_type = dict(source.schema)[source.key_columns[0]]
    kafka_key = kafka_key_text(source)
    undecided = (F.col("_kind") == "row") & F.coalesce(F.col("_undecided"), F.lit(False))
    reason = (F.when(F.col("_del"), F.when(kafka_key.isNull(), F.lit("tombstone_without_key"))
                     .when(kafka_key.try_cast(pk_type).isNull(), F.lit("bad_tombstone_key")))
              .when(kafka_key.isNotNull() & ~F.coalesce(kafka_key.try_cast(pk_type) == F.col("_k0"), F.lit(False)),
                    F.lit("key_mismatch")))
    return out.withColumn("reason", F.when(undecided, reason).otherwise(F.col("reason"))) \
        .withColumn("_k0", F.when(undecided & F.col("_del"), kafka_key.try_cast(pk_type)).otherwise(F.col("_k0")))


def collected_stats(out) -> dict[str, int]:
    """The pass's statistics over all its tasks (counts summed, newest times the greatest)."""
    from pyspark.sql import functions as F

    stats: dict[str, int] = {}
    for row in out.where(F.col("_kind") == "stat").select("stat", "stat_value").collect():
        _add_stat(stats, row["stat"], row["stat_value"])
    return stats


def _add_stat(stats: dict[str, int], name: str, n: int) -> None:
    """Counts add up; a partition's newest event time (`newest_<p>`) is the greatest seen."""
    stats[name] = n if name not in stats else max(stats[name], n) if name.startswith("newest_") else stats[name] + n


def reasons_of(stats: dict[str, int]) -> dict:
    """Records by reason (None: accepted), from the pass's statistics."""
    reasons = {name[5:]: n for name, n in stats.items() if name.startswith("dead_")}
    reasons[None] = stats.get("read", 0) - sum(reasons.values())
    return reasons


def rows_frame(out, source: TableDefinition, positions: bool = True, blobs: bool = False):
    """The accepted rows, as latest_rows shapes them, with `_sp` (and, for latest_per_key, their
    positions); `blobs`: the blobs of a read that made them (RowsSpec.blobs), `_sp` and `_blob`."""
    from pyspark.sql import functions as F

    if blobs:
        return out.where(F.col("_kind") == BLOB).select("_sp", F.col("value").alias("_blob"))
    return out.where((F.col("_kind") == "row") & F.col("reason").isNull()).select(
        "_k0", "_del", *[f"_v{i}" for i in range(len(source.value_columns))],
        *(["_partition", "_offset"] if positions else []), "_sp")


def latest_per_key(rows: pa.Table, unique: bool = False) -> pa.Table:
    """Each key's latest row (the last record by Kafka partition, then offset, as latest_rows'
    window picks it), where the Arrow read left rows with their positions; `unique`: a stream's
    rows, one per position already."""
    positions = [c for c in ("_offset", "_partition") if c in rows.column_names]
    if not positions or unique or rows.num_rows < 2:
        return rows.drop_columns(positions)
    order = pc.sort_indices(rows, [("_k0", "ascending"), ("_partition", "descending"), ("_offset", "descending")])
    rows = rows.take(order)
    keys = rows.column("_k0").combine_chunks()
    first = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
    keep = pa.concat_arrays([pa.array([True]), pc.fill_null(first, True)])
    return rows.filter(keep).drop_columns(positions)
