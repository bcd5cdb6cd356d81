"""One pass over a micro-batch's records, in Arrow: parse, classify, filter, window, pre-aggregate.

Spark hands each input partition to `run` (mapInArrow) as Arrow batches of Kafka records. Each
batch is parsed once by pyarrow's JSON reader, and everything the batch needs comes out of that
one pass: per-key partial aggregates (one row per key and window per Arrow batch), the dead
letters with their reasons, the batch's counts, and the bronze copy of the good events, written
as Parquet by the worker that already holds them (the driver commits those files to Delta).

Reading the records' JSON into typed columns is arrow_values' job (strict, block by block, a bad
record judged alone); the table's WHERE as a pyarrow expression is arrow_where's; the key helpers
every stage shares are arrow_keys'.

Everything here is plain pyarrow: it runs in Spark's Python workers, over Spark Connect too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.aggregates import OFFSET_BITS
from catalog.definitions import EVENT_MS, TableDefinition
from spark_jobs.frames import arrow_blobs
from spark_jobs.frames.arrow_fold import folded, foldable
from spark_jobs.frames.parse import MAX_VALUE_BYTES
from spark_jobs.errors import ArrowUnsupported
from spark_jobs.frames.arrow_values import INTEGERS, arrow_type, parse_values
from spark_jobs.frames.arrow_where import derived_columns, derived_types, where_expression
from spark_jobs.frames.arrow_keys import state_partitions
from spark_jobs.frames.formats import transcode, transcodes, writer_schema_ids

SPARK_TYPE = {"LONG": "BIGINT", "DECIMAL": "DECIMAL(10,0)"}


def _sum_type(dtype: str) -> str:
    """Integer sums are summed as DECIMAL(38,0): a SUM past 64 bits must reach the state (which
    refuses it with a reason) instead of wrapping around here."""
    return "DECIMAL(38,0)" if dtype in INTEGERS or dtype == "DECIMAL" else "DOUBLE"


@dataclass(frozen=True)
class PassSpec:
    table: TableDefinition
    batch_id: int
    now_ms: int | None            # the batch's clock (its plan's creation time)
    watermark_ms: int | None      # events whose every window closed before it are late
    bronze: str | None            # the bronze Delta table's folder (None: bronze off, or committed)
    # How a bronze file is written, whole or not at all: (rows, folder, name) -> bytes. Handed in
    # (delta_files.write_parquet_atomically) so the pass itself imports no storage.
    write_file: Callable[[pa.Table, str, str], int] | None = None
    max_value_bytes: int = MAX_VALUE_BYTES
    # A registry's schemas by id, for a table in Confluent's wire format (frames/formats/wire.py):
    # handed in (spark_jobs.steps.schemas) as write_file is.
    schemas: Callable | None = None

    @property
    def fields(self) -> dict[str, str]:
        return pass_fields(self.table)

    @property
    def key_fields(self) -> list[str]:
        return [k.split(".")[-1] for k in self.table.key_columns]


# ---------------------------------------------------------------------------------------- checks
def pass_fields(table: TableDefinition) -> dict[str, str]:
    """The columns the pass aggregates over: the stream's fields, its computed keys and aggregate
    arguments (`derived`), and the event time as epoch milliseconds where a TTL or a session
    keeps a MAX of it (TableDefinition.event_ms)."""
    return {**dict(table.schema), **(derived_types(table) if table.derived else {}),
            **({EVENT_MS: "BIGINT"} if table.event_ms else {})}


def check_supported(table: TableDefinition) -> None:
    """Raise ArrowUnsupported for what the Arrow pass cannot run yet of an aggregate over a stream
    (passes.aggregate asks, before the first batch)."""
    if table.joins:
        raise ArrowUnsupported("joins")
    fields = pass_fields(table)
    if table.derived:
        empty = pa.table({n: pa.array([], arrow_type(t)) for n, t in table.schema})
        try:
            _with_derived(empty, derived_columns(table))
        except Exception as exc:   # noqa: BLE001 - any pyarrow kernel or translation gap
            raise ArrowUnsupported(f"computed values ({exc})") from None
    scaled = [name for name, dtype in table.schema if dtype.startswith("DECIMAL(")]
    if scaled:
        raise ArrowUnsupported(f"DECIMAL(p,s) field {scaled[0]}")     # the pass reads bare DECIMALs only
    keys = [k.split(".")[-1] for k in table.key_columns]
    for name in keys + _aggregate_inputs(table):
        if name not in fields:
            raise ArrowUnsupported(f"column {name}")
        kind = fields[name].split("(")[0]
        # A key's state partition is hashed from its Python value in the pass, and a TIMESTAMP,
        # DATE or DECIMAL has no value both passes give alike. An aggregate's TIMESTAMP input is
        # folded as epoch milliseconds (_stored_inputs), the value the Spark-SQL pass keeps
        # (Nexmark's q18 keeps the last bid's dateTime). DATE and DECIMAL inputs stay with Spark.
        if kind in ("DATE", "DECIMAL") or (kind == "TIMESTAMP" and name in keys):
            raise ArrowUnsupported(f"{fields[name]} column {name} as a key or aggregate input")
    for agg in table.aggregates:
        score = fields.get(agg.args[0].split(".")[-1]) if agg.function == "topk" else None
        if score is not None and score not in INTEGERS and score not in ("DOUBLE", "FLOAT"):
            raise ArrowUnsupported(f"TOPK over a {score} score")        # the pass ranks numbers as doubles
    if table.where:
        empty = pa.table({n: pa.array([], arrow_type(t)) for n, t in table.schema})
        try:
            empty.filter(where_expression(table))
        except Exception as exc:   # noqa: BLE001 - any pyarrow kernel or translation gap
            raise ArrowUnsupported(f"WHERE {table.where} ({exc})") from None


def output_columns(table: TableDefinition) -> list[tuple[str, str, pa.DataType]]:
    """The pass's output rows, as (name, Spark DDL type, Arrow type): partials, dead letters and
    counts, told apart by `_kind`. Built here, without a Spark session, for both sides."""
    fields = pass_fields(table)
    cols = [("_kind", "STRING", pa.string()), ("_sp", "INT", pa.int32())]
    for i, name in enumerate(k.split(".")[-1] for k in table.key_columns):
        cols.append((f"_k{i}", SPARK_TYPE.get(fields[name], fields[name]), arrow_type(fields[name])))
    if table.window is not None:
        cols.append((f"_k{len(table.key_columns)}", "BIGINT", pa.int64()))
    for i, agg in enumerate(table.aggregates):
        cols.append((f"_a{i}", *_partial_type(agg, fields)))
    cols += [("reason", "STRING", pa.string()), ("source_partition", "INT", pa.int32()),
             ("source_offset", "BIGINT", pa.int64()), ("value", "BINARY", pa.binary()), ("size", "INT", pa.int32()),
             ("stat", "STRING", pa.string()), ("stat_value", "BIGINT", pa.int64()), ("file", "STRING", pa.string())]
    return cols


def output_ddl(table: TableDefinition) -> str:
    return ", ".join(f"{name} {ddl}" for name, ddl, _ in output_columns(table))


def output_schema(table: TableDefinition) -> pa.Schema:
    return pa.schema([(name, dtype) for name, _, dtype in output_columns(table)])


# What an aggregate's input is folded as, where the state's codec has no type of its own for it:
# a TIMESTAMP as epoch milliseconds (table_frames.state_columns, Spark's unix_millis).
_STORED = {"TIMESTAMP": "BIGINT"}


def _aggregate_inputs(table: TableDefinition) -> list[str]:
    """The fields the aggregates read, each once, in order."""
    return list(dict.fromkeys(a.split(".")[-1] for g in table.aggregates for a in g.args))


def _stored_inputs(events: pa.Table, table: TableDefinition, fields: dict[str, str]) -> pa.Table:
    """The events with each TIMESTAMP aggregate input as epoch milliseconds, floored as Spark's
    unix_millis floors (a time before 1970 included); keys and the WHERE saw the times as they are."""
    for name in _aggregate_inputs(table):
        if fields.get(name) == "TIMESTAMP":
            column = pc.floor_temporal(events.column(name), unit="millisecond")
            events = events.set_column(events.schema.get_field_index(name), name,
                                       column.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()))
    return events


def _sum_partial(dtype: str) -> tuple[str, pa.DataType]:
    return ("DECIMAL(38,0)", pa.decimal128(38, 0)) if _sum_type(dtype) != "DOUBLE" else ("DOUBLE", pa.float64())


def _partial_type(agg, fields: dict[str, str]) -> tuple[str, pa.DataType]:
    raw = [_STORED.get(fields[a.split(".")[-1]], fields[a.split(".")[-1]]) for a in agg.args]
    ddl = [SPARK_TYPE.get(t, t) for t in raw]
    arrow = [arrow_type(t) for t in raw]
    if agg.function == "count":
        return "BIGINT", pa.int64()
    if agg.function == "sum":
        return _sum_partial(raw[0])
    if agg.function in ("min", "max"):
        return ddl[0], arrow[0]
    if agg.function == "avg":
        s_ddl, s_type = _sum_partial(raw[0])
        return f"STRUCT<s: {s_ddl}, n: BIGINT>", pa.struct([("s", s_type), ("n", pa.int64())])
    if agg.function == "count_distinct":
        return f"ARRAY<{ddl[0]}>", pa.list_(arrow[0])
    if agg.function in ("latest_by_offset", "latest_keeping_nulls"):
        return f"STRUCT<o: BIGINT, v: {ddl[0]}>", pa.struct([("o", pa.int64()), ("v", arrow[0])])
    typed = ", ".join(f"c{j}: {t}" for j, t in enumerate(ddl[1:]))
    entry = pa.struct([("score", pa.float64()), ("o", pa.int64()),
                       ("typed", pa.struct([(f"c{j}", t) for j, t in enumerate(arrow[1:])]))])
    return f"ARRAY<STRUCT<score: DOUBLE, o: BIGINT, typed: STRUCT<{typed}>>>", pa.list_(entry)


# ------------------------------------------------------------------------------------- the pass
def classify(batch: pa.RecordBatch, spec: PassSpec, key_fields: list[str] | None = None):
    """(good events with source columns, dead letter table, counts by reason) of one Arrow batch.
    `key_fields`: the fields a record must carry (missing_key), if not the stream's key fields (a
    table's input rows: frames/arrow_rows.py)."""
    table = spec.table
    values = batch.column("value")
    n = len(values)
    size = pc.binary_length(values)
    is_null = pc.is_null(values)
    too_large = pc.fill_null(pc.greater(size, spec.max_value_bytes), False)
    unread = None
    if transcodes(table):                       # Avro and the like, as JSON (frames/formats.py)
        values, reasons = transcode(values, table, spec.schemas)
        unread = pc.and_(pc.is_valid(reasons), pc.invert(too_large))
        too_large = pc.or_(too_large, unread)   # left out of the parse like an oversize record
    if not pc.any(too_large).as_py() and not pc.any(is_null).as_py():   # the common case
        idx = pa.array(np.arange(n, dtype=np.int64))
        parsed, parsed_pos, bad = parse_values(values, table.schema)
    else:
        idx = pc.indices_nonzero(pc.invert(pc.or_(too_large, is_null))).cast(pa.int64())
        parsed, parsed_pos, bad = parse_values(pc.take(values, idx), table.schema)
    good_index = pc.take(idx, parsed_pos)
    dead_index = [int(idx[i].as_py()) for i, _ in bad]
    dead_reason = [r for _, r in bad]
    for i in pc.indices_nonzero(too_large).to_pylist():
        dead_index.append(i)
        dead_reason.append("too_large" if unread is None or not unread[i].as_py() else reasons[i].as_py())
    for i in pc.indices_nonzero(is_null).to_pylist():
        dead_index.append(i)
        dead_reason.append("null_value")

    # Rules on parsed rows, in the order parse.classify applies them.
    rule = pa.nulls(parsed.num_rows, pa.string())
    checks = [("missing_key", _any_null(parsed, table.stream_key_fields if key_fields is None else key_fields))]
    if table.timed:
        event = parsed.column(table.event_time)
        checks.append(("missing_event_time", pc.is_null(event)))
        if spec.now_ms is not None:
            limit = pa.scalar((spec.now_ms + table.event_time_skew_ms) * 1000, pa.int64())
            checks.append(("future_event_time", pc.fill_null(pc.greater(event.cast(pa.int64()), limit), False)))
    for name, mask in checks:
        rule = pc.if_else(pc.and_(pc.is_null(rule), mask), pa.scalar(name), rule)
    rejected = pc.is_valid(rule)
    if pc.any(rejected).as_py():
        positions = pc.indices_nonzero(rejected)
        dead_index += pc.take(good_index, positions).to_pylist()
        dead_reason += pc.take(rule, positions).to_pylist()
        keep = pc.invert(rejected)
        parsed, good_index = parsed.filter(keep), good_index.filter(keep)

    events = parsed.append_column("source_partition", pc.take(batch.column("partition"), good_index)) \
        .append_column("source_offset", pc.take(batch.column("offset"), good_index)) \
        .append_column("source_timestamp", pc.take(batch.column("timestamp"), good_index))
    return events, dead_letters(batch, pa.array(dead_index, pa.int64()), dead_reason, spec), n


def dead_letters(batch: pa.RecordBatch, index, reasons: list[str], spec: PassSpec) -> pa.Table:
    """Dead-letter rows for the batch's records at `index`. Oversize values are kept as their
    first KiB; the size column keeps the real size."""
    values = pc.take(batch.column("value"), index)
    lengths = pc.binary_length(values)
    oversize = pc.fill_null(pc.greater(lengths, spec.max_value_bytes), False)
    return pa.table({
        "reason": pa.array(reasons, pa.string()),
        "source_partition": pc.take(batch.column("partition"), index).cast(pa.int32()),
        "source_offset": pc.take(batch.column("offset"), index),
        "value": pc.if_else(oversize, pc.binary_slice(values, 0, 1024), values),
        "size": lengths.cast(pa.int32()),
    })


def _with_derived(events: pa.Table, derived: list) -> pa.Table:
    """The events with each computed key and aggregate argument as a column of its type."""
    import pyarrow.acero as acero

    names = events.column_names
    project = acero.ProjectNodeOptions([pc.field(n) for n in names] +
                                       [pc.Expression._call("cast", [expr], pc.CastOptions(dtype))
                                        for _, expr, dtype in derived],
                                       names + [name for name, _, _ in derived])
    return acero.Declaration.from_sequence([acero.Declaration("table_source", acero.TableSourceNodeOptions(events)),
                                            acero.Declaration("project", project)]).to_table(use_threads=False)


def _any_null(table: pa.Table, names: list[str]):
    mask = pa.array(np.zeros(table.num_rows, dtype=bool))
    for name in names:
        mask = pc.or_(mask, pc.is_null(table.column(name)))
    return mask


def _split_late(events: pa.Table, spec: PassSpec):
    """(on-time events, late events): an event is late when every window it falls in has closed
    (its last window's end plus grace is at or before the batch's starting watermark)."""
    window = spec.table.window
    if window is None or spec.watermark_ms is None or not events.num_rows:
        return events, events.slice(0, 0)
    ts = _millis(events.column(spec.table.event_time))
    if window.session:
        late = pc.less(pc.add(ts, window.grace_ms), spec.watermark_ms)
        return events.filter(pc.invert(late)), events.filter(late)
    last_start = pc.subtract(ts, _pmod(ts, window.advance))
    late = pc.less_equal(pc.add(last_start, window.size_ms + window.grace_ms), spec.watermark_ms)
    return events.filter(pc.invert(late)), events.filter(late)


def _millis(col):
    return pc.divide(col.cast(pa.int64()), 1000) if col.type != pa.int64() else col


def _pmod(ts, divisor: int):
    rem = pc.subtract(ts, pc.multiply(pc.divide(ts, divisor), divisor))
    return pc.if_else(pc.less(rem, 0), pc.add(rem, divisor), rem)


def _aggregated_columns(events: pa.Table, spec: PassSpec) -> list[str]:
    """The columns the windows and the partials read: a HOP repeats each event once per window,
    and copying the fields no aggregate reads (Nexmark's url and extra) was most of that."""
    table = spec.table
    wanted = {*spec.key_fields, table.event_time, "source_offset", EVENT_MS,
              *(a.split(".")[-1] for agg in table.aggregates for a in agg.args)}
    return [name for name in events.column_names if name in wanted]


def _windowed(events: pa.Table, spec: PassSpec) -> pa.Table:
    """Each event once per window it falls in, with the window start (ms) as `_wstart`; for a
    session window, each event once, with the start of its session among these events."""
    window = spec.table.window
    if window.session:
        return _sessioned(events, spec)
    ts = _millis(events.column(spec.table.event_time))
    last_start = pc.subtract(ts, _pmod(ts, window.advance))
    parts = []
    for j in range(-(-window.size_ms // window.advance)):
        start = pc.subtract(last_start, j * window.advance)
        # Kafka Streams starts no window before the epoch; an event before it keeps all of its own.
        inside = pc.and_(pc.greater(pc.add(start, window.size_ms), ts),
                         pc.or_(pc.greater_equal(start, 0), pc.less(ts, 0)))
        if spec.watermark_ms is not None:     # a window closed before the batch: not this event's any more
            inside = pc.and_(inside, pc.greater(pc.add(start, window.size_ms + window.grace_ms), spec.watermark_ms))
        parts.append(events.append_column("_wstart", start).filter(inside))
    return pa.concat_tables(parts)


def _sessioned(events: pa.Table, spec: PassSpec) -> pa.Table:
    """Sessions among this Arrow batch's events: by key and event time, a gap of more than the
    session gap starts a new one. The merge task joins them with the stored sessions and with
    other tasks' (state.windows.merge_sessions), so here they are partial."""
    keys = spec.key_fields
    ordered = events.take(pc.sort_indices(events, [(k, "ascending") for k in keys] + [(EVENT_MS, "ascending")]))
    ts = ordered.column(EVENT_MS).to_numpy()
    new = np.ones(len(ts), dtype=bool)
    new[1:] = ts[1:] - ts[:-1] > spec.table.window.size_ms       # the gap is inclusive
    for key in keys:
        values = np.asarray(ordered.column(key).to_numpy(zero_copy_only=False))
        new[1:] |= values[1:] != values[:-1]
    session = np.cumsum(new) - 1
    return ordered.append_column("_wstart", pa.array(ts[np.flatnonzero(new)][session], pa.int64()))


def preaggregate(events: pa.Table, spec: PassSpec) -> pa.Table:
    """One row per key (and window): the partial aggregate of this Arrow batch's events."""
    table = spec.table
    keys = list(spec.key_fields) + (["_wstart"] if table.window is not None else [])
    aggs, post = [], []

    def add(*aggregation) -> None:
        if not any(a[:2] == aggregation[:2] for a in aggs):    # one output column per (input, function)
            aggs.append(aggregation)

    fields = spec.fields
    events = _stored_inputs(events, table, fields) \
        .append_column("_one", _constant(1, pa.int8(), events.num_rows)) \
        .append_column("_order", pc.add(events.column("source_offset"), spec.batch_id << OFFSET_BITS))
    for i, agg in enumerate(table.aggregates):
        args = [a.split(".")[-1] for a in agg.args]
        if agg.function == "count":
            add(args[0] if args else "_one", "count", pc.CountOptions("only_valid"))
            post.append(("plain", i))
        elif agg.function in ("sum", "avg"):
            src = args[0]
            if fields[src] in INTEGERS or fields[src] == "DECIMAL":
                name = f"_dec_{src}"
                if name not in events.column_names:
                    events = events.append_column(name, events.column(src).cast(pa.decimal128(38, 0)))
                src = name
            add(src, "sum", pc.ScalarAggregateOptions(min_count=1))
            if agg.function == "avg":
                add(args[0], "count", pc.CountOptions("only_valid"))
            post.append((agg.function, i))
        elif agg.function in ("min", "max"):
            add(args[0], agg.function)
            post.append(("plain", i))
        elif agg.function == "count_distinct":
            add(args[0], "distinct", pc.CountOptions("only_valid"))
            post.append(("plain", i))
        elif agg.function == "latest_by_offset":   # nulls are skipped (state.aggregates.LatestByOffset)
            offset = f"_o_{args[0]}"
            if offset not in events.column_names:
                events = events.append_column(offset, pc.if_else(pc.is_valid(events.column(args[0])),
                                                                 events.column("_order"), None))
            add(offset, "max")
            add(args[0], "last", pc.ScalarAggregateOptions(skip_nulls=True))
            post.append(("latest", i))
        elif agg.function == "latest_keeping_nulls":    # the last event's value, NULL or not
            value, offset = f"_kn_{args[0]}", f"_ko_{args[0]}"
            if value not in events.column_names:
                events = events.append_column(value, events.column(args[0])).append_column(offset, events.column("_order"))
            add(offset, "max")
            add(value, "last", pc.ScalarAggregateOptions(skip_nulls=False))
            post.append(("latest_kept", i))
        else:
            post.append(("topk", i))
    if not aggs:
        add("_one", "count")
    grouped = events.group_by(keys, use_threads=False).aggregate(aggs)
    out = {f"_k{j}": grouped.column(k) for j, k in enumerate(keys)}
    for kind, i in post:
        agg = table.aggregates[i]
        args = [a.split(".")[-1] for a in agg.args]
        if kind == "plain":
            src = args[0] if args else "_one"
            fn = {"count": "count", "min": "min", "max": "max", "count_distinct": "distinct"}[agg.function]
            out[f"_a{i}"] = grouped.column(f"{src}_{fn}")
        elif kind in ("sum", "avg"):
            src = f"_dec_{args[0]}" if f"_dec_{args[0]}" in events.column_names else args[0]
            total = grouped.column(f"{src}_sum")
            if kind == "sum":
                out[f"_a{i}"] = total
            else:
                count = grouped.column(f"{args[0]}_count")
                zero = pa.scalar(0, total.type)
                out[f"_a{i}"] = pa.StructArray.from_arrays(
                    [pc.fill_null(total, zero).combine_chunks(), count.combine_chunks()], names=["s", "n"])
        elif kind in ("latest", "latest_kept"):
            offset, value = (f"_o_{args[0]}", args[0]) if kind == "latest" else (f"_ko_{args[0]}", f"_kn_{args[0]}")
            out[f"_a{i}"] = pa.StructArray.from_arrays(
                [grouped.column(f"{offset}_max").combine_chunks(), grouped.column(f"{value}_last").combine_chunks()],
                names=["o", "v"])
        else:
            out[f"_a{i}"] = _topk(events, grouped, keys, args, agg.n)
    return pa.table(out)


def _topk(events: pa.Table, grouped: pa.Table, keys: list[str], args: list[str], n: int) -> pa.Array:
    """Each group's best `n` entries (score desc, event order asc; null scores never rank), in the
    grouped table's order. Arrow has no per-group top-n, so the sorted rows are walked once."""
    score, rest = args[0], args[1:]
    ranked = events.filter(pc.is_valid(events.column(score))) \
        .sort_by([(score, "descending"), ("_order", "ascending")])
    best: dict[tuple, list] = {}
    columns = [ranked.column(k).to_pylist() for k in keys]
    scores = pc.cast(ranked.column(score), pa.float64()).to_pylist()
    offsets = ranked.column("_order").to_pylist()
    typed = [ranked.column(c).to_pylist() for c in rest]
    for row, key in enumerate(zip(*columns)):
        entries = best.setdefault(key, [])
        if len(entries) < n:
            entries.append({"score": scores[row], "o": offsets[row],
                            "typed": {f"c{j}": col[row] for j, col in enumerate(typed)}})
    order = zip(*[grouped.column(k).to_pylist() for k in keys])
    entry = pa.struct([("score", pa.float64()), ("o", pa.int64()),
                       ("typed", pa.struct([(f"c{j}", events.schema.field(c).type) for j, c in enumerate(rest)]))])
    return pa.array([best.get(key, []) for key in order], pa.list_(entry))


FOLD_ROWS = 1 << 19     # partial rows a pass task holds before it folds them (and, if still this many, hands them on)


def run(spec: PassSpec, batches):
    """mapInArrow body: yields partial, dead-letter and count rows (see `output_ddl`)."""
    schema = output_schema(spec.table)
    where = where_expression(spec.table) if spec.table.where else None
    derived = derived_columns(spec.table) if spec.table.derived else None
    counts: dict[str, int] = {}
    max_event = None
    fold, held, held_rows = foldable(spec.table), [], 0     # a task's partials, folded across its Arrow batches
    for batch in batches:
        if not batch.num_rows:
            continue
        events, dead, read = classify(batch, spec)
        counts["read"] = counts.get("read", 0) + read
        counts["read_bytes"] = counts.get("read_bytes", 0) + (pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0)
        for reason in dead.column("reason").to_pylist():
            counts[f"dead_{reason}"] = counts.get(f"dead_{reason}", 0) + 1
        for schema_id, n in writer_schema_ids(batch.column("value"), spec.table).items():
            counts[f"schema_{schema_id}"] = counts.get(f"schema_{schema_id}", 0) + n
        events, late = _split_late(events, spec)
        if late.num_rows:
            lookup = pc.index_in(late.column("source_offset"), value_set=batch.column("offset"))
            dead = pa.concat_tables([dead, dead_letters(batch, lookup, ["late"] * late.num_rows, spec)])
            counts["late"] = counts.get("late", 0) + late.num_rows
        if spec.table.timed and events.num_rows:
            newest = pc.max(_millis(events.column(spec.table.event_time))).as_py()
            max_event = newest if max_event is None else max(max_event, newest)
        if spec.bronze is not None and events.num_rows:
            yield shaped(_write_bronze(events, spec, batch), schema)
        selected = events
        if where is not None:
            selected = events.filter(where)
            counts["filtered"] = counts.get("filtered", 0) + events.num_rows - selected.num_rows
        if derived and selected.num_rows:
            selected = _with_derived(selected, derived)
        if spec.table.event_ms and selected.num_rows:
            selected = selected.append_column(EVENT_MS, _millis(selected.column(spec.table.event_time)))
        if spec.table.window is not None and selected.num_rows:
            selected = _windowed(selected.select(_aggregated_columns(selected, spec)), spec)
        if dead.num_rows:
            yield shaped(dead.append_column("_kind", pa.array(["dead"] * dead.num_rows)), schema)
        if selected.num_rows:
            partials = preaggregate(selected, spec)
            if not fold:
                yield from _tagged_partials(partials, spec, schema)
                continue
            held.append(partials)
            held_rows += partials.num_rows
            if held_rows >= FOLD_ROWS:
                once = folded(held, spec.table)
                held, held_rows = [once], once.num_rows
                if held_rows >= FOLD_ROWS // 2:     # mostly distinct keys: folding again gains little
                    yield from _tagged_partials(once, spec, schema)
                    held, held_rows = [], 0
    if held:
        yield from _tagged_partials(folded(held, spec.table), spec, schema)
    if max_event is not None:
        counts["max_event_ms"] = max_event
    if counts:
        yield shaped(pa.table({"_kind": ["stat"] * len(counts), "stat": list(counts),
                                "stat_value": pa.array(list(counts.values()), pa.int64())}), schema)


def _partial_fields(schema: pa.Schema) -> list[pa.Field]:
    """The key and aggregate columns of the pass's output (`_k0`.., `_a0`..)."""
    return [f for f in schema if f.name[:2] in ("_k", "_a") and f.name[2:].isdigit()]


def _tagged_partials(partials: pa.Table, spec: PassSpec, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The partials as blobs (arrow_blobs), one row a state partition: `_kind` "blob", `_sp`, and
    the partials' key and aggregate columns, in the pass's types, as an IPC stream in `value`."""
    partitions = state_partitions(partials, spec.table.partitions, spec.table.routing_width)
    typed = pa.table({f.name: partials.column(f.name).cast(f.type) for f in _partial_fields(schema)})
    for blob in arrow_blobs.handed_on(typed, partitions):
        yield shaped(blob, schema)


def partials_of(group: pa.Table, table: TableDefinition) -> pa.Table:
    """A merge task's partials of `table`: the Spark-SQL pass's rows, or this pass's blobs opened
    (arrow_blobs.rows_of; their `_k*`, `_a*` columns empty for a partition given none)."""
    return arrow_blobs.rows_of(group, lambda: pa.schema(_partial_fields(output_schema(table))))


def shaped(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            columns.append(col.cast(field.type) if col.type != field.type else col)
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema).combine_chunks().to_batches()[0] \
        if table.num_rows else pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _write_bronze(events: pa.Table, spec: PassSpec, batch: pa.RecordBatch) -> pa.Table:
    """The batch's good events as one Parquet file per Arrow batch in bronze's folder, named by the
    batch and its first source record: a retried task writes the same file again (atomically),
    never a second copy. Returns the file's rows for the driver, which commits it to Delta."""
    name = bronze_file_prefix(spec.batch_id) + \
        f"-p{batch.column('partition')[0].as_py():05d}-o{batch.column('offset')[0].as_py():020d}.parquet"
    rows = events.append_column("batch_id", _constant(spec.batch_id, pa.int64(), events.num_rows))
    size = spec.write_file(rows.cast(bronze_schema(spec.table)), spec.bronze, name)
    return pa.table({"_kind": ["file", "file"], "file": [name, name], "stat": ["bytes", "rows"],
                     "stat_value": pa.array([size, rows.num_rows], pa.int64())})


def bronze_file_prefix(batch_id: int) -> str:
    return f"part-b{batch_id:012d}"


def bronze_schema(table: TableDefinition) -> pa.Schema:
    """Bronze's columns as Arrow types: the same as Spark's bronze (parse.bronze_ddl)."""
    return pa.schema([(name, arrow_type(dtype)) for name, dtype in table.schema] + [
        ("source_partition", pa.int32()), ("source_offset", pa.int64()),
        ("source_timestamp", pa.timestamp("us", tz="UTC")), ("batch_id", pa.int64())])


def _constant(value, dtype: pa.DataType, n: int) -> pa.Array:
    return pa.array(np.full(n, value), dtype)
