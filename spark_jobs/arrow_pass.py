"""One pass over a micro-batch's records, in Arrow: parse, classify, filter, window, pre-aggregate.

Spark hands each input partition to `run` (mapInArrow) as Arrow batches of Kafka records. Each
batch is parsed once by pyarrow's JSON reader, and everything the batch needs comes out of that
one pass: per-key partial aggregates (one row per key and window per Arrow batch), the dead
letters with their reasons, the batch's counts, and the bronze copy of the good events, written
as Parquet by the worker that already holds them (the driver commits those files to Delta).

pyarrow's reader is strict and all-or-nothing: one record it cannot type fails the block. A block
that fails is split in halves until the bad records stand alone, and a lone record is judged by
`_judge`, which holds the rules (the module docstring of parse.py lists the reasons). So clean
input costs one vectorised parse, and a bad record costs a few small re-parses, never a wedge.

Everything here is plain pyarrow: it runs in Spark's Python workers, over Spark Connect too.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import sys
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import codec
from state.aggregates import OFFSET_BITS
from state.table import partition_of
from catalog.definitions import EVENT_MS, TableDefinition
from catalog.expressions import java_double
from spark_jobs.parse import (DATE_TEXT, LONE_SURROGATE, MAX_DATE_DAYS, MAX_EPOCH_MS, MAX_VALUE_BYTES, MIN_DATE_DAYS,
                              MIN_EPOCH_MS)
from spark_jobs.errors import ArrowUnsupported

INT_RANGES = {"INT": (-2 ** 31, 2 ** 31 - 1), "BIGINT": (-2 ** 63, 2 ** 63 - 1), "LONG": (-2 ** 63, 2 ** 63 - 1)}
INTEGERS = set(INT_RANGES)
SPARK_TYPE = {"LONG": "BIGINT", "DECIMAL": "DECIMAL(10,0)"}
DIGITS = r"^-?[0-9]{1,18}$"
INT_TEXT = re.compile(r"-?[0-9]+\Z")                 # ASCII digits only: int() takes any script's
EPOCH_TEXT = re.compile(r"-?[0-9]{1,18}\Z")
FLOAT_MAX = 3.4028234663852886e38
SPLIT_BELOW = 8           # blocks this small are judged record by record
# Spark's reader (Jackson's StreamReadConstraints) refuses JSON nested deeper than 1,000, counting
# the record's own object as 1, and the Spark-SQL pass reads each record once more inside [ ]
# (parse.classify: one JSON value per record), one level deeper: so 999 there. pyarrow's reader
# takes any depth and json.loads stops at Python's recursion limit. A record past it is
# malformed_json on both passes, alone or in a block.
MAX_JSON_DEPTH = 999
# json.loads recurses once per level: a record at MAX_JSON_DEPTH must parse alone wherever the
# call stands (a Spark worker's stack is already deep), as it does in a block.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * MAX_JSON_DEPTH))


def arrow_type(dtype: str) -> pa.DataType:
    if dtype.startswith("DECIMAL("):
        precision, scale = (int(n) for n in dtype[len("DECIMAL("):-1].split(","))
        return pa.decimal128(precision, scale)
    return {"STRING": pa.string(), "BIGINT": pa.int64(), "LONG": pa.int64(), "INT": pa.int32(),
            "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "BOOLEAN": pa.bool_(),
            "TIMESTAMP": pa.timestamp("us", tz="UTC"), "DATE": pa.date32(),
            "DECIMAL": pa.decimal128(10, 0)}[dtype]


def _reader_type(dtype: str) -> pa.DataType:
    """What the JSON reader is asked for: wide types, narrowed (and range-checked) afterwards."""
    return {"INT": pa.int64(), "FLOAT": pa.float64(), "TIMESTAMP": pa.string(), "DATE": pa.string(),
            "DECIMAL": pa.float64()}.get(dtype) or arrow_type(dtype)


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
    max_value_bytes: int = MAX_VALUE_BYTES

    @property
    def fields(self) -> dict[str, str]:
        return pass_fields(self.table)

    @property
    def key_fields(self) -> list[str]:
        return [k.split(".")[-1] for k in self.table.key_columns]


# ---------------------------------------------------------------------------------------- checks
def pass_fields(table: TableDefinition) -> dict[str, str]:
    """The columns the pass aggregates over: the stream's fields, and the event time as epoch
    milliseconds where a TTL or a session keeps a MAX of it (TableDefinition.event_ms)."""
    return {**dict(table.schema), **({EVENT_MS: "BIGINT"} if table.event_ms else {})}


def check_supported(table: TableDefinition) -> None:
    """Raise ArrowUnsupported for what the Arrow pass cannot run yet of an aggregate over a stream
    (passes.aggregate asks, before the first batch)."""
    if table.joins:
        raise ArrowUnsupported("joins")
    fields = pass_fields(table)
    scaled = [name for name, dtype in table.schema if dtype.startswith("DECIMAL(")]
    if scaled:
        raise ArrowUnsupported(f"DECIMAL(p,s) field {scaled[0]}")     # the pass reads bare DECIMALs only
    used = [k.split(".")[-1] for k in table.key_columns] + [a.split(".")[-1] for g in table.aggregates for a in g.args]
    for name in used:
        if name not in fields:
            raise ArrowUnsupported(f"column {name}")
        if fields[name].split("(")[0] in ("TIMESTAMP", "DATE", "DECIMAL"):
            # Their Python values differ between Spark rows and Arrow (zone-aware datetimes,
            # decimals): state written by one pass must key and fold alike under the other.
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


def _sum_partial(dtype: str) -> tuple[str, pa.DataType]:
    return ("DECIMAL(38,0)", pa.decimal128(38, 0)) if _sum_type(dtype) != "DOUBLE" else ("DOUBLE", pa.float64())


def _partial_type(agg, fields: dict[str, str]) -> tuple[str, pa.DataType]:
    raw = [fields[a.split(".")[-1]] for a in agg.args]
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


# ----------------------------------------------------------------------------------------- WHERE
def where_expression(table: TableDefinition):
    """The table's WHERE (Spark SQL, parsed by sqlglot) as a pyarrow expression. A row passes only
    when it is true; `Table.filter` drops nulls, which is SQL's rule."""
    import sqlglot
    from sqlglot import exp

    fields = dict(table.schema)

    def literal_for(node, other_type):
        value = convert(node)
        if other_type in ("TIMESTAMP", "DATE") and isinstance(value, str):
            parsed = _timestamp_ms(value) if other_type == "TIMESTAMP" else _date(value)
            if parsed is None:
                raise ArrowUnsupported(f"literal {node.sql()} is not a {other_type}")
            return pa.scalar(parsed * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")) \
                if other_type == "TIMESTAMP" else pa.scalar(parsed, pa.date32())
        return value

    def column_type(node):
        return fields.get(node.name) if isinstance(node, exp.Column) else None

    binary = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal",
              exp.LT: "less", exp.LTE: "less_equal", exp.Add: "add_checked", exp.Sub: "subtract_checked",
              exp.Mul: "multiply_checked"}

    def convert(node):
        if isinstance(node, exp.Paren):
            return convert(node.this)
        if isinstance(node, exp.Column):
            if node.name not in fields:
                raise ArrowUnsupported(f"column {node.sql()}")
            return pc.field(node.name)
        if isinstance(node, exp.Boolean):
            return pc.scalar(bool(node.this))
        if isinstance(node, exp.Null):
            return pc.scalar(None)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.this
            text = node.this
            return int(text) if text.lstrip("-").isdigit() else float(text)
        if isinstance(node, exp.Neg):
            return pc.negate_checked(convert(node.this))
        if isinstance(node, exp.Not):
            return ~convert(node.this)
        if isinstance(node, exp.And):
            return convert(node.left) & convert(node.right)
        if isinstance(node, exp.Or):
            return convert(node.left) | convert(node.right)
        if type(node) in binary:
            left, right = node.left, node.right
            lv = literal_for(left, column_type(right)) if not isinstance(left, exp.Column) else convert(left)
            rv = literal_for(right, column_type(left)) if not isinstance(right, exp.Column) else convert(right)
            return pc.Expression._call(binary[type(node)], [_expr(lv), _expr(rv)])
        if isinstance(node, exp.Div):
            return pc.Expression._call("divide", [pc.Expression._call("cast", [_expr(convert(node.left))],
                                                                      pc.CastOptions(pa.float64())),
                                                  _expr(convert(node.right))])
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return pc.field(node.this.name).is_null() if isinstance(node.this, exp.Column) \
                else _expr(convert(node.this)).is_null()
        if isinstance(node, exp.In) and not node.args.get("query"):
            values = [literal_for(v, column_type(node.this)) for v in node.expressions]
            return _expr(convert(node.this)).isin(values)
        if isinstance(node, exp.Between):
            target = node.this
            low = literal_for(node.args["low"], column_type(target))
            high = literal_for(node.args["high"], column_type(target))
            return (_expr(convert(target)) >= _expr(low)) & (_expr(convert(target)) <= _expr(high))
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise ArrowUnsupported(f"LIKE {pattern.sql()}")
            # sqlglot keeps NOT LIKE as Like(negate=True) rather than Not(Like): honour it.
            matched = pc.Expression._call("match_like", [_expr(convert(node.this))],
                                          pc.MatchSubstringOptions(pattern.this,
                                                                   ignore_case=isinstance(node, exp.ILike)))
            return ~matched if node.args.get("negate") else matched
        raise ArrowUnsupported(f"{node.key.upper()} in WHERE")

    return convert(sqlglot.parse_one(table.where, dialect="spark"))


def _expr(value):
    return value if isinstance(value, pc.Expression) else pc.scalar(value)


# ---------------------------------------------------------------------------------- judging rules
def _timestamp_us(text: str) -> int | None:
    """Epoch microseconds of a TIMESTAMP field's ISO-8601 text (no offset meaning UTC), or None.
    Exact for every instant, before 1970 too: the block reader keeps microseconds, so must this."""
    try:
        stamp = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    try:
        return (stamp - _EPOCH) // dt.timedelta(microseconds=1)
    except OverflowError:
        return None


def _timestamp_ms(text: str) -> int | None:
    """Epoch milliseconds (floored) of ISO-8601 text, or None: WHERE's literals."""
    us = _timestamp_us(text)
    return None if us is None else us // 1000


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


_DATE_TEXT = re.compile(DATE_TEXT)             # the Spark pass's rlike pattern, read alike here


def _date(text: str) -> int | None:
    """parse._date's rule: fromisoformat alone also takes "20240101" and "2024-W01-1"."""
    if not _DATE_TEXT.match(text):
        return None
    try:
        return (dt.date.fromisoformat(text.strip(" \t\n\r")) - dt.date(1970, 1, 1)).days
    except ValueError:
        return None


class _Number(str):
    """A JSON number as its text: each field's type decides what it is (a STRING field keeps the
    text as written, as Spark's reader does; a huge integer is judged, never overflowed)."""


def _loads(value: bytes):
    """JSON with numbers as their text. NaN and Infinity (not JSON, but Spark's reader takes them)
    are numbers too, so a numeric field holding one is wrong_type on both passes."""
    return json.loads(value, parse_int=_Number, parse_float=_Number, parse_constant=_Number)


class _Raw(str):
    """Text `_compact` writes as it is (brackets, commas, a key and its colon)."""


def _number_text(item: "_Number") -> str:
    """A number as Spark's reader (Jackson) writes it into text: an integer as written, any other
    number as the DOUBLE it reads (1e2 is 100.0), NaN and infinities quoted."""
    if INT_TEXT.match(item):
        return str(item)
    number = float(item)
    return java_double(number) if math.isfinite(number) else json.dumps(java_double(number))


def _compact(item) -> str:
    """A JSON value as Spark's reader gives it to a STRING field: compact JSON text. Without
    recursion: a value nested as deep as the JSON parser allows must not raise here."""
    parts, stack = [], [item]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            parts.append(item)
        elif isinstance(item, _Number):
            parts.append(_number_text(item))
        elif isinstance(item, (dict, list)):
            pieces = [_Raw("{" if isinstance(item, dict) else "[")]
            for n, entry in enumerate(item.items() if isinstance(item, dict) else item):
                if n:
                    pieces.append(_Raw(","))
                if isinstance(item, dict):
                    pieces.append(_Raw(json.dumps(entry[0], ensure_ascii=False) + ":"))
                    entry = entry[1]
                pieces.append(entry)
            pieces.append(_Raw("}" if isinstance(item, dict) else "]"))
            stack.extend(reversed(pieces))
        else:
            parts.append(json.dumps(item, ensure_ascii=False))
    return "".join(parts)


def _finite(text: str, limit: float | None = None) -> float:
    number = float(text)
    if not math.isfinite(number) or (limit is not None and abs(number) > limit):
        raise ValueError("not a finite number of the type")
    return number


def _convert(value, dtype: str):
    """A JSON value (numbers as _Number text) as the field's type; raises ValueError when it is
    not one (wrong_type). The same rules as the block reader's (parse_values)."""
    if dtype == "STRING":
        return value if isinstance(value, str) and not isinstance(value, _Number) else _compact(value)
    if dtype in INTEGERS:
        if isinstance(value, _Number) and INT_TEXT.match(value):
            low, high = INT_RANGES[dtype]
            number = int(value)
            if low <= number <= high:
                return number
    elif dtype in ("DOUBLE", "FLOAT"):
        if isinstance(value, _Number):
            return _finite(value, None if dtype == "DOUBLE" else FLOAT_MAX)
    elif dtype == "BOOLEAN":
        if type(value) is bool:
            return value
    elif dtype == "TIMESTAMP":
        if isinstance(value, _Number) and INT_TEXT.match(value) or isinstance(value, str) and EPOCH_TEXT.match(value):
            ms = int(value)
            if MIN_EPOCH_MS <= ms <= MAX_EPOCH_MS:
                return ms * 1000
        elif isinstance(value, str) and not isinstance(value, _Number):
            us = _timestamp_us(value)
            if us is not None and MIN_EPOCH_MS * 1000 <= us <= MAX_EPOCH_MS * 1000 + 999:
                return us
    elif dtype == "DATE":
        days = _date(value) if isinstance(value, str) and not isinstance(value, _Number) else None
        if days is not None:
            return days
    elif dtype == "DECIMAL":
        if isinstance(value, _Number):
            number = decimal.Decimal(value)
            if abs(number) < 10 ** 10:      # as Spark's DECIMAL(10,0): half up, then 10 digits at most
                number = number.quantize(decimal.Decimal(1), rounding=decimal.ROUND_HALF_UP)
                if abs(number) < 10 ** 10:
                    return number
    raise ValueError(dtype)


def _judge(value: bytes, schema: list[tuple[str, str]]):
    """(reason, None) or (None, {field: value}) for one record the block parse could not take."""
    try:
        obj = _loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "malformed_json", None
    if not isinstance(obj, dict):
        return "malformed_json", None
    row = {}
    for name, dtype in schema:
        item = obj.get(name)
        if item is None:
            row[name] = None
            continue
        try:
            row[name] = _convert(item, dtype)
        except (ValueError, ArithmeticError):
            return "wrong_type", None
    return None, row


# ----------------------------------------------------------------------------------------- parse
def _typed(table: pa.Table, schema: list[tuple[str, str]]) -> pa.Table:
    """The reader's wide columns narrowed to the declared types; raises where a value does not fit."""
    columns = {}
    for name, dtype in schema:
        col = table.column(name)
        if dtype in ("DOUBLE", "FLOAT"):
            finite = pc.is_finite(col)
            if not pc.all(pc.or_kleene(finite, pc.is_null(col))).as_py():
                raise ValueError("non-finite")
            col = col.cast(arrow_type(dtype)) if dtype == "DOUBLE" else pc.cast(col, pa.float32())
            if dtype == "FLOAT" and not pc.all(pc.or_kleene(pc.is_finite(col), pc.is_null(col))).as_py():
                raise ValueError("float range")
        elif dtype == "INT":
            col = pc.cast(col, pa.int32())          # raises on overflow
        elif dtype == "TIMESTAMP":
            col = _timestamps(col)
        elif dtype == "DATE":
            col = pc.cast(col, pa.date32())
            _in_range(pc.cast(col, pa.int32()), 1, MIN_DATE_DAYS, MAX_DATE_DAYS)
        elif dtype == "DECIMAL":
            raise ValueError("decimals are judged one by one")
        columns[name] = col
    return pa.table(columns)


def _timestamps(col):
    """TIMESTAMP text: all digits means epoch milliseconds, else ISO-8601 (no offset: UTC).
    Raises where a value is outside MIN_EPOCH_MS..MAX_EPOCH_MS, so its block is split and the
    record judged alone (wrong_type), never wrapped."""
    if col.null_count == len(col):
        return pa.nulls(len(col), pa.timestamp("us", tz="UTC"))
    if pa.types.is_integer(col.type):
        millis = col
    else:
        digits = pc.match_substring_regex(col, DIGITS)
        if pc.all(pc.or_kleene(digits, pc.is_null(col))).as_py():
            millis = pc.cast(col, pa.int64())
        elif pc.any(digits).as_py():
            raise ValueError("mixed timestamp forms")
        else:
            try:
                micros = pc.cast(col, pa.timestamp("us", tz="UTC"))
            except pa.ArrowInvalid:
                micros = pc.cast(pc.cast(col, pa.timestamp("us")), pa.timestamp("us", tz="UTC"))
            _in_range(pc.cast(micros, pa.int64()), 1000)
            return micros
    _in_range(millis, 1)
    return pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC"))


def _in_range(values, per_ms: int, lowest: int = MIN_EPOCH_MS, highest: int = MAX_EPOCH_MS) -> None:
    low, high = pc.min(values).as_py(), pc.max(values).as_py()
    if low is not None and (low < lowest * per_ms or high > (highest + 1) * per_ms - 1):
        raise ValueError("a time outside years 1-9999")


# Measured on 200k records of 25 bytes: 256 KiB blocks parse in 65 ms, one 5 MB block in 94 ms.
# No reader threads: Spark runs one Python worker per core already.
READ_BLOCK_BYTES = 1 << 18


def _lines(values: pa.Array) -> pa.Buffer:
    """The values as one newline-delimited buffer for the JSON reader: each value with a newline
    appended, element-wise, so the new array's data buffer is the text (6 ms per 200k records,
    where a binary_join over a list of them took 126 ms)."""
    lines = pc.binary_join_element_wise(values, pa.scalar(b"\n", values.type), pa.scalar(b"", values.type))
    width = 8 if pa.types.is_large_binary(lines.type) or pa.types.is_large_string(lines.type) else 4
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64 if width == 8 else np.int32,
                            count=len(lines) + 1, offset=lines.offset * width)
    return lines.buffers()[2][int(offsets[0]):int(offsets[-1])]


def _read_block(values: pa.Array, schema: list[tuple[str, str]]) -> pa.Table:
    """A block of JSON objects as typed columns. TIMESTAMP fields are read as text, or, when the
    block's are JSON numbers (epoch milliseconds), as integers."""
    import pyarrow.json as pj

    if not len(values):
        return pa.table({n: pa.array([], arrow_type(t)) for n, t in schema})
    text = _lines(values)
    variants = [pa.schema([(n, _reader_type(t)) for n, t in schema])]
    if any(t == "TIMESTAMP" for _, t in schema):
        variants.append(pa.schema([(n, pa.int64() if t == "TIMESTAMP" else _reader_type(t)) for n, t in schema]))
    for attempt, reader_schema in enumerate(variants):
        try:
            parsed = pj.read_json(pa.BufferReader(text),
                                  read_options=pj.ReadOptions(block_size=READ_BLOCK_BYTES, use_threads=False),
                                  parse_options=pj.ParseOptions(explicit_schema=reader_schema,
                                                                unexpected_field_behavior="ignore"))
            break
        except pa.ArrowInvalid:
            if attempt == len(variants) - 1:
                raise
    if parsed.num_rows != len(values):
        raise ValueError("a value held more than one JSON object")
    return _typed(parsed.combine_chunks(), schema)


def parse_values(values: pa.Array | pa.ChunkedArray, schema: list[tuple[str, str]]):
    """(typed table of the records that parsed, their indices, [(index, reason)] of the rest).

    One rule for a record whether it comes alone or among others: the Unicode check first
    (invalid_unicode), then values that look like one JSON object on one line are read in
    blocks, and anything else is judged alone (`_judge`), never inside a block, where the JSON
    reader would read `null` as a row of nulls or give an extra object to an empty neighbour.

    `values` may come chunked (a column read from several files or batches): the JSON reader
    wants one contiguous buffer, so the chunks are joined once here."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary() if pa.types.is_string(values.type) else pa.large_binary())
    good, good_index, bad = [], [], []
    bad += [(i, "invalid_unicode") for i in unicode_rejects(values)]
    rejected = {i for i, _ in bad}
    bad += [(i, "malformed_json") for i in nesting_rejects(values) if i not in rejected]
    usable = pc.is_valid(values)
    if bad:
        judged = np.ones(len(values), dtype=bool)
        judged[[i for i, _ in bad]] = False
        usable = pc.and_(usable, pa.array(judged))
    simple = pc.and_(usable, looks_like_object(values))
    block_index = pc.indices_nonzero(simple).cast(pa.int64())
    alone_index = pc.indices_nonzero(pc.and_(usable, pc.invert(simple))).cast(pa.int64())
    in_order = len(block_index) == len(values)
    blocks = values if in_order else pc.take(values, block_index)

    def judge(indices: list[int], raws: list) -> None:
        rows, index = [], []
        for i, raw in zip(indices, raws):
            reason, row = _judge(raw, schema)
            if reason:
                bad.append((i, reason))
            else:
                rows.append(row)
                index.append(i)
        if rows:
            good.append(_from_rows(rows, schema))
            good_index.append(pa.array(index, pa.int64()))

    def visit(lo: int, hi: int) -> None:
        if hi <= lo:
            return
        chunk = blocks.slice(lo, hi - lo)
        if hi - lo >= SPLIT_BELOW:
            try:
                good.append(_read_block(chunk, schema))
                good_index.append(pa.array(np.arange(lo, hi, dtype=np.int64)) if in_order
                                  else block_index.slice(lo, hi - lo))
                return
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
                mid = (lo + hi) // 2
                visit(lo, mid)
                visit(mid, hi)
                return
        judge(list(range(lo, hi)) if in_order else block_index.slice(lo, hi - lo).to_pylist(), chunk.to_pylist())

    visit(0, len(blocks))
    if len(alone_index):
        judge(alone_index.to_pylist(), pc.take(values, alone_index).to_pylist())
    if good:
        return pa.concat_tables(good), pa.concat_arrays(good_index), bad
    return _from_rows([], schema), pa.array([], pa.int64()), bad


_LONE_SURROGATE = re.compile(LONE_SURROGATE.encode())


def unicode_rejects(values: pa.Array) -> list[int]:
    """Indices of values that are not valid UTF-8, or that escape a lone surrogate: text no
    UTF-8 column or state key can hold. Vectorised checks first; Python only for suspects."""
    suspects = set()
    try:
        values.cast(pa.string() if not pa.types.is_large_binary(values.type) else pa.large_string())
    except pa.ArrowInvalid:
        for i, raw in enumerate(values.to_pylist()):
            if raw is not None:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    suspects.add(i)
    escapes = pc.fill_null(pc.match_substring_regex(values, r"\\u[dD][89a-fA-F]"), False)
    for i in pc.indices_nonzero(escapes).to_pylist():
        if _LONE_SURROGATE.search(values[i].as_py()):
            suspects.add(i)
    return sorted(suspects)


_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)


def nesting_rejects(values: pa.Array) -> list[int]:
    """Indices of values nested deeper than MAX_JSON_DEPTH (brackets inside strings do not
    count). Only values with that many opening brackets at all are scanned."""
    opening = pc.add(pc.count_substring(values, "["), pc.count_substring(values, "{"))
    suspects = pc.indices_nonzero(pc.fill_null(pc.greater(opening, MAX_JSON_DEPTH), False)).to_pylist()
    out = []
    for i in suspects:
        text = np.frombuffer(_JSON_STRING.sub(b"", values[i].as_py()), dtype=np.uint8)
        steps = np.isin(text, (ord("["), ord("{"))).astype(np.int32) - np.isin(text, (ord("]"), ord("}")))
        if len(steps) and np.cumsum(steps).max() > MAX_JSON_DEPTH:
            out.append(i)
    return out


def looks_like_object(values: pa.Array):
    """True where a value is `{...}` on one line: what the block reader may take."""
    first = pc.binary_slice(values, 0, 1)
    last = pc.binary_slice(values, -1)
    brace = pc.and_(pc.equal(first, pa.scalar(b"{", pa.binary())), pc.equal(last, pa.scalar(b"}", pa.binary())))
    return pc.fill_null(pc.and_(brace, pc.invert(pc.match_substring(values, "\n"))), False)


def _from_rows(rows: list[dict], schema: list[tuple[str, str]]) -> pa.Table:
    columns = {}
    for name, dtype in schema:
        items = [r[name] for r in rows]
        if dtype == "TIMESTAMP":
            columns[name] = pa.array(items, pa.int64()).cast(pa.timestamp("us", tz="UTC"))   # _convert: us
        elif dtype == "DATE":
            columns[name] = pa.array(items, pa.int32()).cast(pa.date32())
        else:
            columns[name] = pa.array(items, arrow_type(dtype))
    return pa.table(columns)


# ------------------------------------------------------------------------------------- the pass
def classify(batch: pa.RecordBatch, spec: PassSpec):
    """(good events with source columns, dead letter table, counts by reason) of one Arrow batch."""
    table = spec.table
    values = batch.column("value")
    n = len(values)
    size = pc.binary_length(values)
    is_null = pc.is_null(values)
    too_large = pc.fill_null(pc.greater(size, spec.max_value_bytes), False)
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
        dead_reason.append("too_large")
    for i in pc.indices_nonzero(is_null).to_pylist():
        dead_index.append(i)
        dead_reason.append("null_value")

    # Rules on parsed rows, in the order parse.classify applies them.
    rule = pa.nulls(parsed.num_rows, pa.string())
    checks = [("missing_key", _any_null(parsed, spec.key_fields))]
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
    return events, _dead_letters(batch, pa.array(dead_index, pa.int64()), dead_reason, spec), n


def _dead_letters(batch: pa.RecordBatch, index, reasons: list[str], spec: PassSpec) -> pa.Table:
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

    events = events.append_column("_one", _constant(1, pa.int8(), events.num_rows)) \
        .append_column("_order", pc.add(events.column("source_offset"), spec.batch_id << OFFSET_BITS))
    fields = spec.fields
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


FOLDABLE = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "avg": "sum"}   # partial -> how partials fold
FOLD_ROWS = 1 << 19     # partial rows a pass task holds before it folds them (and, if still this many, hands them on)


def foldable(table: TableDefinition) -> bool:
    """Whether partials of one key fold into one in Arrow: a table of plain aggregates (a table
    of rows has none)."""
    return bool(table.aggregates) and all(a.function in FOLDABLE for a in table.aggregates)


def combine_partials(partials: pa.Table, table: TableDefinition) -> pa.Table:
    """Partials of one key from several Arrow batches or tasks, folded into one row per key, so the
    shuffle and the state see one row per key, not one per Arrow batch. Other tables' partials
    (top-n, latest, distinct counts, sources) are returned as they are."""
    if not foldable(table) or not partials.num_rows:
        return partials
    keys = key_columns(partials)
    flat, aggs = {k: partials.column(k) for k in keys}, []
    for i, agg in enumerate(table.aggregates):
        col, how = partials.column(f"_a{i}"), FOLDABLE[agg.function]
        if agg.function == "avg":
            flat[f"_a{i}s"], flat[f"_a{i}n"] = pc.struct_field(col, "s"), pc.struct_field(col, "n")
            aggs += [(f"_a{i}s", "sum"), (f"_a{i}n", "sum")]
        else:
            flat[f"_a{i}"] = col        # a SUM of only nulls stays null (min_count=1)
            aggs.append((f"_a{i}", how, pc.ScalarAggregateOptions(min_count=1)))
    grouped = pa.table(flat).group_by(keys, use_threads=False).aggregate(aggs)
    out = {k: grouped.column(k) for k in keys}
    for i, agg in enumerate(table.aggregates):
        if agg.function == "avg":
            out[f"_a{i}"] = pa.StructArray.from_arrays(
                [grouped.column(f"_a{i}s_sum").combine_chunks(), grouped.column(f"_a{i}n_sum").combine_chunks()],
                names=["s", "n"])
        else:
            out[f"_a{i}"] = grouped.column(f"_a{i}_{FOLDABLE[agg.function]}")
    return pa.table(out)


def key_columns(partials: pa.Table) -> list[str]:
    """The key columns of partials, in order (_k0, _k1, ...; the window start last)."""
    return sorted((c for c in partials.column_names if c[:2] == "_k" and c[2:].isdigit()), key=lambda c: int(c[2:]))


_STR_TAG = codec.encode_key(("",))[:1]      # the codec's tags, taken from the codec itself
_INT_TAG = codec.encode_key((0,))[:1]
_NO_SEPARATOR = pa.scalar(b"")


def _encoded_column(column) -> pa.Array | None:
    """One key column in the codec's bytes, or None when it needs the per-row codec (nulls, or a
    type other than string and integer)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        return None
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        body = pc.replace_substring(column.cast(pa.binary()), b"\x00", b"\x00\xff")
        return pc.binary_join_element_wise(pa.scalar(_STR_TAG), body, pa.scalar(b"\x00"), _NO_SEPARATOR)
    if pa.types.is_integer(kind) and kind != pa.uint64():
        biased = (column.cast(pa.int64()).to_numpy().view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
        fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(column), [None, pa.py_buffer(biased.tobytes())])
        return pc.binary_join_element_wise(pa.scalar(_INT_TAG), fixed.cast(pa.binary()), _NO_SEPARATOR)
    return None


def encoded_keys(partials: pa.Table) -> list[bytes]:
    """`codec.encode_key` of every row's key. String and integer key columns are encoded column by
    column in Arrow: a merge task of a million-key batch encodes each key twice, and one Python
    encode per key cost seconds. Other key types take the codec row by row; the bytes are the same."""
    if not partials.num_rows:
        return []
    names = key_columns(partials)
    parts = [_encoded_column(partials.column(c)) for c in names]
    if any(part is None for part in parts):
        return [codec.encode_key(key) for key in zip(*[partials.column(c).to_pylist() for c in names])]
    return pc.binary_join_element_wise(*parts, _NO_SEPARATOR).to_pylist()


def state_partitions(partials: pa.Table, partitions: int, width: int | None = None) -> pa.Array:
    """Each partial's state partition: crc32 of its encoded key, or of its first `width` key parts
    (the state library's rule, TableSpec.route)."""
    if width:
        partials = partials.select(key_columns(partials)[:width])
    return pa.array([partition_of(key, partitions) for key in encoded_keys(partials)], pa.int32())


def with_state_partition(partitions: int, batches, width: int | None = None):
    """mapInArrow body for the Spark-SQL pass's partials: each row with its state partition `_sp`."""
    for batch in batches:
        table = pa.Table.from_batches([batch])
        yield from table.append_column("_sp", state_partitions(table, partitions, width)).to_batches()


def run(spec: PassSpec, batches):
    """mapInArrow body: yields partial, dead-letter and count rows (see `output_ddl`)."""
    schema = output_schema(spec.table)
    where = where_expression(spec.table) if spec.table.where else None
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
        events, late = _split_late(events, spec)
        if late.num_rows:
            lookup = pc.index_in(late.column("source_offset"), value_set=batch.column("offset"))
            dead = pa.concat_tables([dead, _dead_letters(batch, lookup, ["late"] * late.num_rows, spec)])
            counts["late"] = counts.get("late", 0) + late.num_rows
        if spec.table.timed and events.num_rows:
            newest = pc.max(_millis(events.column(spec.table.event_time))).as_py()
            max_event = newest if max_event is None else max(max_event, newest)
        if spec.bronze is not None and events.num_rows:
            yield _shaped(_write_bronze(events, spec, batch), schema)
        selected = events
        if where is not None:
            selected = events.filter(where)
            counts["filtered"] = counts.get("filtered", 0) + events.num_rows - selected.num_rows
        if spec.table.event_ms and selected.num_rows:
            selected = selected.append_column(EVENT_MS, _millis(selected.column(spec.table.event_time)))
        if spec.table.window is not None and selected.num_rows:
            selected = _windowed(selected, spec)
        if dead.num_rows:
            yield _shaped(dead.append_column("_kind", pa.array(["dead"] * dead.num_rows)), schema)
        if selected.num_rows:
            partials = preaggregate(selected, spec)
            if not fold:
                yield _tagged_partials(partials, spec, schema)
                continue
            held.append(partials)
            held_rows += partials.num_rows
            if held_rows >= FOLD_ROWS:
                folded = _folded(held, spec.table)
                held, held_rows = [folded], folded.num_rows
                if held_rows >= FOLD_ROWS // 2:     # mostly distinct keys: folding again gains little
                    yield _tagged_partials(folded, spec, schema)
                    held, held_rows = [], 0
    if held:
        yield _tagged_partials(_folded(held, spec.table), spec, schema)
    if max_event is not None:
        counts["max_event_ms"] = max_event
    if counts:
        yield _shaped(pa.table({"_kind": ["stat"] * len(counts), "stat": list(counts),
                                "stat_value": pa.array(list(counts.values()), pa.int64())}), schema)


def _folded(held: list[pa.Table], table: TableDefinition) -> pa.Table:
    return held[0] if len(held) == 1 else combine_partials(pa.concat_tables(held, promote_options="permissive"), table)


def _tagged_partials(partials: pa.Table, spec: PassSpec, schema: pa.Schema) -> pa.RecordBatch:
    partials = partials.append_column("_sp", state_partitions(partials, spec.table.partitions,
                                                              spec.table.routing_width)) \
        .append_column("_kind", pa.array(["partial"] * partials.num_rows))
    return _shaped(partials, schema)


def _shaped(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
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
    size = write_parquet_atomically(rows.cast(bronze_schema(spec.table)), spec.bronze, name)
    return pa.table({"_kind": ["file", "file"], "file": [name, name], "stat": ["bytes", "rows"],
                     "stat_value": pa.array([size, rows.num_rows], pa.int64())})


def bronze_file_prefix(batch_id: int) -> str:
    return f"part-b{batch_id:012d}"


def bronze_schema(table: TableDefinition) -> pa.Schema:
    """Bronze's columns as Arrow types: the same as Spark's bronze (parse.bronze_ddl)."""
    return pa.schema([(name, arrow_type(dtype)) for name, dtype in table.schema] + [
        ("source_partition", pa.int32()), ("source_offset", pa.int64()),
        ("source_timestamp", pa.timestamp("us", tz="UTC")), ("batch_id", pa.int64())])


def write_parquet_atomically(table: pa.Table, folder: str, name: str) -> int:
    """Write to a temporary file, then move it to `name`: a reader never sees half a file, and a
    retried task replaces its file instead of adding a second copy."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from catalog.runtime import arrow_filesystem

    fs, root = arrow_filesystem(folder)
    fs.create_dir(root, recursive=True)
    temporary = f"{root}/.tmp-{uuid.uuid4().hex}"
    pq.write_table(table, temporary, filesystem=fs, compression="snappy")
    size = fs.get_file_info(temporary).size
    fs.move(temporary, f"{root}/{name}")
    return size


def _constant(value, dtype: pa.DataType, n: int) -> pa.Array:
    return pa.array(np.full(n, value), dtype)
