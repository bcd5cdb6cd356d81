"""A topic's values in the format they were written in, as the JSON both passes already type.

A table declares `-- format:`; JSON is read as it is. Any other format is transcoded here,
record by record, into one canonical JSON object, and from there the one JSON reader of each pass
(arrow_values for the Arrow pass, parse.classify for Spark SQL) types it. So both passes, and a
verify or a rebuild reading history, apply the same typing rules and give the same dead letters:
a record a format cannot read is a dead letter with that format's reason, before any JSON rule.

  malformed_avro   the bytes are not one datum of the writer schema (truncated, trailing bytes,
                   an impossible length or union index, text that is not UTF-8)

Avro is read by name: a record's field goes to the column of its name, a column the record
lacks is null (as an absent JSON field is), a field no column names is ignored. Its logical
types come out as the JSON reader's forms: timestamp-millis/micros as epoch milliseconds, date
as YYYY-MM-DD; a NaN or infinite double as a string (which a DOUBLE column dead-letters as
wrong_type, as JSON's rule is).

Pure pyarrow and fastavro: it runs in Spark's Python workers, over Spark Connect too.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import math
from functools import lru_cache

import pyarrow as pa

from catalog.definitions import TableDefinition

JSON_COLUMN = "_json"              # parse.classify's name for the transcoded value
REASON_COLUMN = "_format_reason"   # and for a record the format could not read
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@lru_cache(maxsize=32)
def _avro_schema(text: str):
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def _plain(value):
    """A decoded Avro value in the forms the JSON reader types (see the module docstring)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dt.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        delta = stamp - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value) if value.is_finite() else str(value)
    if isinstance(value, (bytes, bytearray)):          # as Kafka Connect's JsonConverter writes bytes
        return base64.b64encode(value).decode()
    if isinstance(value, dt.time):
        return value.isoformat()
    return value


def _avro_record(raw: bytes, schema) -> bytes | None:
    """One datum of `schema` as canonical JSON bytes; None if `raw` is not exactly one."""
    import fastavro

    stream = io.BytesIO(raw)
    try:
        record = fastavro.schemaless_reader(stream, schema, None)
    except (EOFError, ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError, OverflowError,
            MemoryError):
        return None
    if stream.tell() != len(raw) or not isinstance(record, dict):
        return None
    return json.dumps(_plain(record), ensure_ascii=False, separators=(",", ":")).encode()


def transcodes(table: TableDefinition) -> bool:
    return table.format != "json"


def transcode(values: pa.Array, table: TableDefinition) -> tuple[pa.Array, pa.Array]:
    """(the values as JSON bytes, each record's dead-letter reason): a null value stays null with
    no reason (a tombstone, or null_value: the passes judge it), a record the format cannot read
    is null with its reason."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    schema = _avro_schema(table.value_schema)
    out, reasons = [], []
    for raw in values.to_pylist():
        if raw is None:
            out.append(None)
            reasons.append(None)
            continue
        record = _avro_record(raw, schema)
        out.append(record)
        reasons.append(None if record is not None else "malformed_avro")
    return pa.array(out, pa.binary()), pa.array(reasons, pa.string())


def transcode_batches(table: TableDefinition):
    """For Spark's mapInArrow over a Kafka source frame: each batch with `_json` and
    `_format_reason` beside its columns (parse.classify reads them)."""
    def run(batches):
        for batch in batches:
            json_values, reasons = transcode(batch.column("value"), table)
            yield pa.RecordBatch.from_arrays(list(batch.columns) + [json_values, reasons],
                                             names=list(batch.schema.names) + [JSON_COLUMN, REASON_COLUMN])
    return run
