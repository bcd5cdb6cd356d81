"""Many Avro records of one writer schema decoded in one native pass, instead of one fastavro
call per record (the per-record path cost 14.5 times the JSON reader; see docs/benchmarks/formats.md).

Avro's binary records are self-delimiting and an object container file's block is nothing but
records back to back, so a batch's payloads, framed as one block of a container whose header
names the writer schema, are a file polars' native reader decodes in one call. What makes that
safe is a check the block itself cannot give: a damaged record would shift every record after
it. So each decoded row's encoded size is computed back from its values (varints, string
lengths, union indexes) and must equal its Kafka value's length, row by row; one that does not,
a reader error or a panic, a non-finite double or a replaced character sends the whole block to
the per-record path, which gives each record its verdict. The fast path never decides a dead
letter; it only answers for blocks whose every record the per-record path would read the same.

It takes writer schemas of flat records whose fields are string, long, int, double or boolean,
each optionally in a union with null, and readers that resolve them by Avro's promotions
(int → long → double) or fill a missing field with a null default. Everything else (logical
types, bytes, floats, nested types, other defaults) stays on the per-record path.
"""
from __future__ import annotations

import io
import json
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_PRIMITIVES = ("string", "long", "int", "double", "boolean")
_PROMOTES = {"int": ("int", "long", "double"), "long": ("long", "double"), "double": ("double",),
             "string": ("string",), "boolean": ("boolean",)}
_SYNC = b"\x00" * 16
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


class Field(NamedTuple):
    name: str
    avro_type: str       # the writer's primitive
    nullable: bool


class Plan(NamedTuple):
    writer: tuple[Field, ...]
    out: tuple[tuple[str, str | None, str], ...]   # (column, writer field or None for null, type out)
    schema_json: bytes


def _branches(schema) -> tuple[list[str], bool] | None:
    """(the non-null primitive branches, whether null is one) of a field's type, or None."""
    types = schema if isinstance(schema, list) else [schema]
    names = [t["type"] if isinstance(t, dict) and set(t) <= {"type"} else t for t in types]
    if not all(isinstance(n, str) and (n == "null" or n in _PRIMITIVES) for n in names):
        return None
    return [n for n in names if n != "null"], "null" in names


def plan(writer: dict, reader: dict | None) -> Plan | None:
    """How to read `writer`'s records as `reader` (None: as written) in one pass, or None if the
    per-record path must."""
    if not isinstance(writer, dict) or writer.get("type") != "record" or not writer.get("fields"):
        return None
    fields = []
    for field in writer["fields"]:
        found = _branches(field.get("type"))
        if found is None or len(found[0]) != 1 or (found[1] and len(field["type"]) != 2):
            return None
        fields.append(Field(field["name"], found[0][0], found[1]))
    by_name = {f.name: f for f in fields}
    if reader is None:
        out = tuple((f.name, f.name, f.avro_type) for f in fields)
    else:
        out = []
        for field in reader.get("fields", []):
            found = _branches(field.get("type"))
            if found is None:
                return None
            branches, nullable = found
            source = by_name.get(field["name"])
            if source is None:
                if not (nullable and "default" in field and field["default"] is None):
                    return None
                out.append((field["name"], None, "null"))
                continue
            target = next((b for b in branches if b in _PROMOTES[source.avro_type]), None)
            if target is None or (source.nullable and not nullable) or \
                    (not isinstance(field["type"], list) and source.nullable):
                return None
            out.append((field["name"], source.name, target))
        out = tuple(out)
    return Plan(tuple(fields), out, json.dumps(writer).encode())


def _varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _container(schema_json: bytes, count: int, body: bytes) -> bytes:
    """An Avro object container: its header, then `body` (records back to back) as one block."""
    meta = (_varint(2) + _varint(11) + b"avro.schema" + _varint(len(schema_json)) + schema_json
            + _varint(10) + b"avro.codec" + _varint(4) + b"null" + _varint(0))
    return b"Obj\x01" + meta + _SYNC + _varint(count) + _varint(len(body)) + body + _SYNC


def _varint_sizes(unsigned: np.ndarray) -> np.ndarray:
    return 1 + (unsigned[:, None] >= _VARINT_STEPS[None, :]).sum(axis=1)


def _encoded_sizes(frame, fields: tuple[Field, ...]) -> np.ndarray:
    """Each row's Avro size, computed back from its decoded values."""
    import polars as pl

    sizes = np.zeros(frame.height, dtype=np.int64)
    for field in fields:
        column = frame.get_column(field.name)
        present = (~column.is_null()).to_numpy()
        if field.nullable:
            sizes += 1                                   # the union's branch index, 0 or 1
        if field.avro_type == "string":
            lengths = column.str.len_bytes().fill_null(0).cast(pl.UInt64).to_numpy()
            sizes += np.where(present, _varint_sizes(lengths) + lengths.astype(np.int64), 0)
        elif field.avro_type in ("long", "int"):
            values = column.fill_null(0).cast(pl.Int64).to_numpy()
            zigzag = ((values << 1) ^ (values >> 63)).view(np.uint64)
            sizes += np.where(present, _varint_sizes(zigzag), 0)
        elif field.avro_type == "double":
            sizes += np.where(present, 8, 0)
        else:
            sizes += np.where(present, 1, 0)
    return sizes


def _trustworthy(frame, fields: tuple[Field, ...]) -> bool:
    """Values the per-record path would write the same: finite doubles (it writes NaN as a
    string), strings without a replacement character (a reader may substitute one for bytes
    that are not UTF-8, which the per-record path refuses)."""
    for field in fields:
        column = frame.get_column(field.name)
        if field.avro_type == "double" and not column.drop_nulls().is_finite().all():
            return False
        if field.avro_type == "string" and column.str.contains("\ufffd", literal=True).fill_null(False).any():
            return False
    return frame.width == len(fields)


def decode(payloads: pa.BinaryArray, the_plan: Plan) -> pa.BinaryArray | None:
    """Each payload (no nulls) as the canonical JSON the per-record path writes, or None when the
    block must go record by record."""
    import polars as pl

    if len(payloads) == 0:
        return pa.array([], pa.binary())
    payloads = payloads.cast(pa.large_binary()) if payloads.type != pa.large_binary() else payloads
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int64)[payloads.offset:payloads.offset + len(payloads) + 1]
    lengths = np.diff(offsets)
    body = payloads.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_pybytes()
    try:
        frame = pl.read_avro(io.BytesIO(_container(the_plan.schema_json, len(payloads), body)))
    except BaseException as exc:           # noqa: BLE001 - a reader error or a Rust panic: record by record
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    if frame.height != len(payloads) or not _trustworthy(frame, the_plan.writer):
        return None
    if not np.array_equal(_encoded_sizes(frame, the_plan.writer), lengths):
        return None
    casts = {"long": pl.Int64, "int": pl.Int32, "double": pl.Float64, "string": pl.String, "boolean": pl.Boolean}
    columns = [pl.lit(None).alias(name) if source is None else pl.col(source).cast(casts[avro_type]).alias(name)
               for name, source, avro_type in the_plan.out]
    text = frame.select(columns).write_ndjson()
    lines = pc.list_flatten(pc.split_pattern(pa.array([text], pa.large_string()), "\n"))
    return lines.slice(0, len(payloads)).cast(pa.large_binary()).cast(pa.binary())
