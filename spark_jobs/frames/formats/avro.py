"""Avro values: from a schema file (`avro`), or framed with a registry's schema id (`avro-confluent`).

Values come out in the forms the JSON reader types: timestamp-millis/micros as epoch
milliseconds, date as YYYY-MM-DD, bytes as base64 (as Kafka Connect's JsonConverter writes
them), a NaN or infinite double as a string (which a DOUBLE column dead-letters as wrong_type,
as JSON's rule is).

With a registry, each writer schema is resolved against a reader schema by Avro's own rules
(fastavro's resolution): the table's `-- value_schema:` if it declares one, else one made from
its columns, every field nullable with default null. So an added field is ignored, a removed
one takes its default (null), int → long → float → double are promoted, and a field whose type
the reader cannot take (a string where a BIGINT column reads) makes the record
`schema_incompatible`. The reader is named as the writer is: Avro matches records by name, and a
team renaming its record type has not changed its fields.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import math
from functools import lru_cache

from catalog.definitions import TableDefinition
from spark_jobs.frames.formats.wire import Schemas, split

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_READ_ERRORS = (EOFError, ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError, OverflowError, MemoryError)
# A column's type as the reader schema asks for it: what Avro promotes into it, nullable.
_READER_TYPES = {"STRING": ["null", "string"], "BIGINT": ["null", "long"], "LONG": ["null", "long"],
                 "INT": ["null", "int"], "DOUBLE": ["null", "double"], "DECIMAL": ["null", "double"],
                 "FLOAT": ["null", "float"], "BOOLEAN": ["null", "boolean"],
                 "TIMESTAMP": ["null", "long", "string"], "DATE": ["null", "int", "string"]}


@lru_cache(maxsize=64)
def parsed(text: str):
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def plain(value):
    """A decoded Avro value in the forms the JSON reader types (see the module docstring)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
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
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.time):
        return value.isoformat()
    return value


def _datum(raw: bytes, writer, reader=None) -> tuple[bytes | None, str | None]:
    """One datum of `writer` (resolved to `reader`) as canonical JSON bytes, or its reason."""
    import fastavro
    from fastavro._read_common import SchemaResolutionError

    stream = io.BytesIO(raw)
    try:
        record = fastavro.schemaless_reader(stream, writer, reader)
    except SchemaResolutionError:
        return None, "schema_incompatible"
    except _READ_ERRORS:
        return None, "malformed_avro"
    if stream.tell() != len(raw) or not isinstance(record, dict):
        return None, "malformed_avro"
    return json.dumps(plain(record), ensure_ascii=False, separators=(",", ":")).encode(), None


class FileAvro:
    """`-- format: avro`: unframed Avro, every record written with the one `-- value_schema:`."""

    def __init__(self, table: TableDefinition, schemas: Schemas | None = None) -> None:
        self.schema = parsed(table.value_schema)

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        return _datum(raw, self.schema)


class RegistryAvro:
    """`-- format: avro-confluent`: each record's writer schema from the registry by its id."""

    def __init__(self, table: TableDefinition, schemas: Schemas) -> None:
        self.table, self.schemas = table, schemas
        self.readers: dict[int, tuple | None] = {}     # schema id -> (writer, reader), None: unusable

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        framed = split(raw)
        if framed is None:
            return None, "not_wire_format"
        schema_id, payload = framed
        if schema_id not in self.readers:
            self.readers[schema_id] = self._resolve(schema_id)
        pair = self.readers[schema_id]
        if pair is None:
            return None, "unknown_schema_id"
        if pair == "incompatible":
            return None, "schema_incompatible"
        return _datum(payload, *pair)

    def _resolve(self, schema_id: int):
        found = self.schemas(schema_id)
        if found is None:
            return None
        if found.schema_type != "AVRO":
            return "incompatible"             # a JSON Schema or Protobuf id on an Avro topic
        try:
            writer_json = json.loads(found.text)
            writer = parsed(found.text)
        except Exception:                     # noqa: BLE001 - a registered schema fastavro cannot parse
            return "incompatible"
        if not isinstance(writer_json, dict) or writer_json.get("type") != "record":
            return "incompatible"
        return writer, parsed(json.dumps(reader_schema(self.table, writer_json), sort_keys=True))


def reader_schema(table: TableDefinition, writer: dict) -> dict:
    """The table's reader schema, named as the writer record is (see the module docstring)."""
    if table.value_schema:
        reader = json.loads(table.value_schema)
    else:
        reader = {"type": "record", "fields": [
            {"name": name, "type": _READER_TYPES[dtype.split("(")[0]], "default": None}
            for name, dtype in table.schema]}
    reader["name"] = writer.get("name", "Record")
    if "namespace" in writer:
        reader["namespace"] = writer["namespace"]
    else:
        reader.pop("namespace", None)
    return reader
