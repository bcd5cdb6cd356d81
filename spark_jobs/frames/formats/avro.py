"""Avro values: from a schema file (`avro`), or framed with a registry's schema id (`avro-confluent`).

Values come out in the forms the JSON reader types: timestamp-millis/micros/nanos as epoch
milliseconds (floored), date as YYYY-MM-DD (days past year 9999 stay a number: wrong_type), bytes as base64 (as Kafka Connect's JsonConverter writes
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import TableDefinition
import spark_jobs.frames.formats.avro_block as avro_block
from spark_jobs.frames.formats.wire import HEADER, RegistryFormat, Refused, Schemas, framed

READ_ERRORS = (EOFError, ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError, OverflowError, MemoryError)
# A column's type as the reader schema asks for it: what Avro promotes into it, nullable.
_READER_TYPES = {"STRING": ["null", "string"], "BIGINT": ["null", "long"], "LONG": ["null", "long"],
                 "INT": ["null", "int"], "DOUBLE": ["null", "double"], "DECIMAL": ["null", "double"],
                 "FLOAT": ["null", "float"], "BOOLEAN": ["null", "boolean"],
                 "TIMESTAMP": ["null", "long", "string"], "DATE": ["null", "int", "string"]}


# Logical types read as the numbers they are written as, and converted here (see _logical): fastavro
# turns them into datetime objects, which cannot hold every value a long can (year 10000 raised
# OverflowError, a well-formed record taken for a malformed one).
_SCALES = {"timestamp-millis": 1, "local-timestamp-millis": 1, "timestamp-micros": 1000,
           "local-timestamp-micros": 1000, "timestamp-nanos": 1_000_000, "local-timestamp-nanos": 1_000_000}
_ORDINAL_1970 = dt.date(1970, 1, 1).toordinal()


def _strip(schema):
    """`schema` without the logical types this module converts itself."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if isinstance(schema, dict):
        out = {k: _strip(v) if k in ("fields", "items", "values", "type") else v for k, v in schema.items()
               if not (k == "logicalType" and (v in _SCALES or v in ("date", "time-millis", "time-micros")))}
        return out
    return schema


def _logical(schema: dict) -> dict[str, str]:
    """A record schema's top-level fields of a logical type this module converts: name -> type."""
    out = {}
    for field in schema.get("fields", []):
        for branch in field["type"] if isinstance(field["type"], list) else [field["type"]]:
            if isinstance(branch, dict) and (branch.get("logicalType") in _SCALES or branch.get("logicalType") == "date"):
                out[field["name"]] = branch["logicalType"]
    return out


def _convert(record: dict, logical: dict[str, str]) -> dict:
    """Epoch milliseconds for timestamps, YYYY-MM-DD for dates in range (days past it stay a number,
    which a DATE column refuses as wrong_type, as a JSON producer's would be)."""
    for name, kind in logical.items():
        value = record.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if kind == "date":
            record[name] = iso_day(value)
        else:
            record[name] = value // _SCALES[kind]
    return record


def iso_day(days: int) -> str | int:
    """Days since 1970 as YYYY-MM-DD; a day past what a date holds stays a number, which a DATE
    column refuses as wrong_type (as a JSON producer's number would be)."""
    if 1 <= days + _ORDINAL_1970 <= dt.date.max.toordinal():
        return dt.date.fromordinal(days + _ORDINAL_1970).isoformat()
    return days


@lru_cache(maxsize=64)
def parsed(text: str):
    """(the schema as fastavro reads it, logical types stripped; its converted fields)."""
    import fastavro

    schema = json.loads(text)
    return fastavro.parse_schema(_strip(schema)), _logical(schema)


def plain(value):
    """A decoded Avro value in the forms the JSON reader types (see the module docstring); times and
    dates never reach here as objects (_strip reads them as numbers, _convert turns them)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return float(value) if value.is_finite() else str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    return value


def _datum(raw: bytes, writer, reader=None) -> tuple[bytes | None, str | None]:
    """One datum of `writer` (resolved to `reader`) as canonical JSON bytes, or its reason;
    `writer` and `reader` as `parsed` gives them."""
    import fastavro
    from fastavro._read_common import SchemaResolutionError

    stream = io.BytesIO(raw)
    try:
        record = fastavro.schemaless_reader(stream, writer[0], None if reader is None else reader[0])
    except (SchemaResolutionError, *READ_ERRORS):
        if reader is None:
            return None, "malformed_avro"
        # A record its writer reads but the reader cannot (a type that does not resolve; bytes
        # promoted to a string that are not UTF-8) is incompatible; a damaged one is malformed,
        # whichever of the two the reading met first.
        return None, "schema_incompatible" if _datum(raw, writer)[1] is None else "malformed_avro"
    if stream.tell() != len(raw) or not isinstance(record, dict):
        return None, "malformed_avro"
    record = _convert(record, writer[1])
    return json.dumps(plain(record), ensure_ascii=False, separators=(",", ":")).encode(), None


class FileAvro:
    """`-- format: avro`: unframed Avro, every record written with the one `-- value_schema:`."""

    def __init__(self, table: TableDefinition, schemas: Schemas | None = None) -> None:
        self.schema = parsed(table.value_schema)
        self.block = avro_block.plan(json.loads(table.value_schema), None)

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        return _datum(raw, self.schema)

    def decode_many(self, values: pa.BinaryArray) -> list[tuple[np.ndarray, pa.Array]]:
        """[(record indexes, their JSON)] for what one native pass read (avro_block)."""
        if self.block is None:
            return []
        present = np.nonzero(pc.is_valid(values).to_numpy(zero_copy_only=False))[0]
        decoded = avro_block.decode(values.take(present), self.block)
        return [] if decoded is None else [(present, decoded)]


class RegistryAvro(RegistryFormat):
    """`-- format: avro-confluent`: each record's writer schema from the registry by its id."""

    schema_type = "AVRO"

    def prepare(self, text: str):
        """(writer, reader) as `parsed` gives them."""
        try:
            writer_json = json.loads(text)
            writer = parsed(text)
        except Exception:                     # noqa: BLE001 - a registered schema fastavro cannot parse
            return Refused("schema_incompatible")
        if not isinstance(writer_json, dict) or writer_json.get("type") != "record":
            return Refused("schema_incompatible")
        reader_json = reader_schema(self.table, writer_json)
        return writer, parsed(json.dumps(reader_json, sort_keys=True)), avro_block.plan(writer_json, reader_json)

    def read(self, payload: bytes, prepared) -> tuple[bytes | None, str | None]:
        return _datum(payload, prepared[0], prepared[1])

    def decode_many(self, values: pa.BinaryArray) -> list[tuple[np.ndarray, pa.Array]]:
        """[(record indexes, their JSON)] for each writer schema id whose records one native pass
        read (avro_block); the rest go record by record."""
        in_wire = framed(values)
        headers = pc.binary_slice(values, 0, HEADER)
        parts = []
        for header in pc.unique(pc.filter(headers, in_wire)).to_pylist():
            prepared = self.lookup(int.from_bytes(header[1:HEADER], "big"))
            if isinstance(prepared, Refused) or prepared[2] is None:
                continue
            mask = pc.and_(in_wire, pc.fill_null(pc.equal(headers, pa.scalar(header, pa.binary())), False))
            indexes = np.nonzero(mask.to_numpy(zero_copy_only=False))[0]
            payloads = pc.binary_slice(values.take(indexes), HEADER, 2 ** 31 - 1)
            decoded = avro_block.decode(payloads, prepared[2])
            if decoded is not None:
                parts.append((indexes, decoded))
        return parts


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
