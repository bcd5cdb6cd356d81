"""Fuzzing the registry formats: generated Avro and Protobuf writer schemas (fields added,
removed, promoted, renumbered and changed past what a column holds) and records of them, framed
with their ids, with hostile bytes among them (truncated, with bytes after, random payloads,
unknown ids, no framing).

Four properties, each seeded (a failure prints its seed and the command that replays it):
- a record's verdict and value are the same alone as in its block;
- a writer schema's records are `schema_incompatible` exactly when the test's own table (Avro's
  promotions; which Protobuf field types each column holds) says a field cannot be read into its
  column (independent of fastavro's resolution and of the product's Protobuf table);
- the Arrow pass and the Spark SQL pass give every record the same verdict and the same row;
- Avro read a block at a time in one native pass (formats/avro_block.py) equals fastavro record
  by record, and the native pass did read the blocks it may.

Found by it: a damaged Protobuf framing whose message index decoded negative raised IndexError in
the pass (a batch that fails every run), and an index of -1 would have picked the .proto's last
message; a negative index now names no message (`malformed_protobuf`).
"""
from __future__ import annotations

import datetime as dt
import io
import json
import math
import os
import random

import fastavro
import pyarrow as pa
import pytest

from catalog.definitions import parse
from spark_jobs.frames import arrow_pass
from spark_jobs.frames.formats.wire import Registered
from tests.fuzz import records as fuzz_records

SEED = int(os.environ.get("STATETABLE_FUZZ_SEED", "4511"))
COLUMNS = fuzz_records.SCHEMA          # k STRING, v BIGINT, x DOUBLE, t TIMESTAMP, flag BOOLEAN, d DATE
# Per column, writer types and whether Avro's resolution reads them into the column's reader type
# (the spec's promotions: int -> long -> float -> double, bytes <-> string); the test's own table.
WRITER_TYPES = {
    "k": [("string", True), ("bytes", True), ("int", False), ({"type": "enum", "name": "E", "symbols": ["A", "B"]},
                                                              False)],
    "v": [("long", True), ("int", True), ("double", False), ("string", False), ("boolean", False)],
    "x": [("double", True), ("float", True), ("long", True), ("int", True), ("string", False)],
    "t": [({"type": "long", "logicalType": "timestamp-millis"}, True), ("long", True), ("string", True),
          ({"type": "long", "logicalType": "timestamp-micros"}, True), ("int", True), ("boolean", False)],
    "flag": [("boolean", True), ("int", False), ("string", False)],
    "d": [({"type": "int", "logicalType": "date"}, True), ("string", True), ("int", True), ("double", False)],
}


def _replay(test: str, seed: int) -> str:
    return f"seed {seed}; replay: STATETABLE_FUZZ_SEED={seed} .venv/bin/python -m pytest tests/test_fuzz_formats.py -k {test}"


def _writer(rng: random.Random) -> tuple[dict, set]:
    """A writer schema and the fields it has that cannot be read into their columns."""
    fields, unreadable = [], set()
    breaking = rng.choice([name for name, _ in COLUMNS]) if rng.random() < 0.35 else None
    for name, _ in COLUMNS:
        if name != "k" and name != breaking and rng.random() < 0.2:
            continue                                            # a removed field: null
        kind, ok = rng.choice([t for t in WRITER_TYPES[name] if t[1] == (name != breaking)])
        if rng.random() < 0.3:
            kind = ["null", kind]                               # nullable: the union resolves the same way
        fields.append({"name": name, "type": kind})
        if not ok:
            unreadable.add(name)
    if rng.random() < 0.5:
        fields.append({"name": "extra", "type": rng.choice(["string", "long", {"type": "array", "items": "int"}])})
    rng.shuffle(fields)
    return {"type": "record", "name": "Event", "namespace": "fuzz", "fields": fields}, unreadable


BENIGN = {"string": lambda rng, name: ("2026-11-01T10:00:00Z" if name == "t" else "2024-02-03" if name == "d"
                                      else rng.choice(fuzz_records.KEYS[:4])),
          "long": lambda rng, name: rng.randint(0, 1_800_000_000_000) if name == "t" else rng.randint(-1000, 1000),
          "int": lambda rng, name: rng.randint(0, 30_000) if name in ("d", "t") else rng.randint(-1000, 1000),
          "double": lambda rng, name: rng.uniform(-1e3, 1e3), "float": lambda rng, name: 0.5,
          "boolean": lambda rng, name: rng.random() < 0.5, "bytes": lambda rng, name: b"abc"}


def _value(rng: random.Random, kind, name: str):
    base = kind[1] if isinstance(kind, list) else kind
    if isinstance(kind, list) and rng.random() < 0.2:
        return None
    if rng.random() < 0.85 and (isinstance(base, str) and base in BENIGN
                                or isinstance(base, dict) and base.get("logicalType")):
        if isinstance(base, dict):
            return rng.randint(0, 30_000) if base["logicalType"] == "date" else rng.randint(0, 1_800_000_000_000)
        return BENIGN[base](rng, name)
    if isinstance(base, dict):
        if base["type"] == "enum":
            return rng.choice(base["symbols"])
        if base["type"] == "array":
            return [rng.randint(-5, 5) for _ in range(rng.randint(0, 3))]
        if base.get("logicalType") == "date":
            return rng.randint(-800_000, 2_900_000)             # past DATE's range too
        return rng.choice([0, 1_795_683_660_250, rng.randint(-2 ** 62, 2 ** 62)])
    return {
        "string": lambda: rng.choice(fuzz_records.KEYS + ["2026-11-01T10:00:00Z", "1700000000000", "2024-02-30"]),
        "bytes": lambda: bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))),
        "int": lambda: rng.choice([0, -1, 2 ** 31 - 1, -2 ** 31, rng.randint(-1000, 1000)]),
        "long": lambda: rng.choice([0, 2 ** 63 - 1, -2 ** 63, rng.randint(-2 ** 40, 2 ** 40)]),
        "double": lambda: rng.choice([0.5, -0.0, 1.7e308, 5e-324, math.nan, math.inf, rng.uniform(-1e6, 1e6)]),
        "float": lambda: rng.choice([0.25, -3.5, rng.uniform(-1e3, 1e3)]),
        "boolean": lambda: rng.random() < 0.5,
    }[base]()


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
        return True
    except UnicodeDecodeError:
        return False


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def generated(seed: int, count: int) -> tuple[dict[int, Registered], list[bytes], dict[int, bool]]:
    """(the registry, the values, offset -> whether Avro's rules refuse it) for `count` records over
    4 writer schemas; a damaged record's expectation is left out (its bytes may still read)."""
    rng = random.Random(seed)
    registry, unreadable, parsed = {}, {}, {}
    for schema_id in range(1, 5):
        schema, refused = _writer(rng)
        registry[schema_id] = Registered("AVRO", json.dumps(schema))
        unreadable[schema_id], parsed[schema_id] = refused, (schema, fastavro.parse_schema(schema))
    values, expected = [], {}
    for offset in range(count):
        schema_id = rng.randint(1, 4)
        schema, writer = parsed[schema_id]
        out = io.BytesIO()
        record = {f["name"]: _value(rng, f["type"], f["name"]) for f in schema["fields"]}
        fastavro.schemaless_writer(out, writer, record)
        payload = out.getvalue()
        roll = rng.random()
        if 0.11 <= roll <= 0.95:
            # A union resolves by the branch a value was written in: a null resolves whatever the
            # other branch is. Bytes promote to a string only when they are UTF-8.
            expected[offset] = any(record[name] is not None for name in unreadable[schema_id]) or (
                isinstance(record.get("k"), bytes) and not _utf8(record["k"]))
        if roll < 0.05:
            payload = payload[:rng.randint(0, max(0, len(payload) - 1))]         # truncated
        elif roll < 0.08:
            payload += bytes([rng.randrange(256)])                              # a byte after the datum
        elif roll < 0.11:
            payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))   # random bytes
        if roll > 0.97:
            values.append(payload)                                              # no framing
        elif roll > 0.95:
            values.append(_framed(rng.choice([0, 77, 2 ** 31]), payload))       # an id nobody registered
        else:
            values.append(_framed(schema_id, payload))
    return registry, values, expected


# Per column, Protobuf field types and whether the column holds them (the test's own table: integers
# widen into BIGINT, DOUBLE and the time columns; a string is text, a timestamp's or a date's
# spelling; google.protobuf.Timestamp is a TIMESTAMP; nothing else crosses kinds).
PROTO_TYPES = {
    "k": [("string", True), ("bytes", False), ("int64", False)],
    "v": [("int64", True), ("int32", True), ("sint64", True), ("uint32", True), ("fixed64", True),
          ("double", False), ("string", False), ("bool", False)],
    "x": [("double", True), ("float", True), ("int64", True), ("int32", True), ("string", False)],
    "t": [("int64", True), ("string", True), ("google.protobuf.Timestamp", True), ("bool", False)],
    "flag": [("bool", True), ("int32", False), ("string", False)],
    "d": [("string", True), ("int32", True), ("double", False)],
}


def _proto_writer(rng: random.Random) -> tuple[str, list[tuple[str, str]], set]:
    """A .proto (one message, fields in any order and numbering, some optional), its fields, and
    the fields the columns cannot hold."""
    breaking = rng.choice([name for name, _ in COLUMNS]) if rng.random() < 0.35 else None
    fields, unreadable = [], set()
    for name, _ in COLUMNS:
        if name != "k" and name != breaking and rng.random() < 0.2:
            continue
        kind, ok = rng.choice([t for t in PROTO_TYPES[name] if t[1] == (name != breaking)])
        fields.append((name, kind))
        if not ok:
            unreadable.add(name)
    if rng.random() < 0.5:
        fields.append(("extra", rng.choice(["string", "int64", "bytes"])))
    rng.shuffle(fields)
    numbers = rng.sample(range(1, 60), len(fields))
    lines = [f"  {'optional ' if rng.random() < 0.3 and not kind.startswith('google') else ''}{kind} {name} = {number};"
             for (name, kind), number in zip(fields, numbers)]
    uses_timestamp = any(kind.startswith("google") for _, kind in fields)
    text = 'syntax = "proto3";\npackage fuzz;\n' + ('import "google/protobuf/timestamp.proto";\n' if uses_timestamp
                                                     else "") + f"message Event {{\n{chr(10).join(lines)}\n}}\n"
    return text, fields, unreadable


def _proto_class(text: str):
    """The message class, compiled by protoc (grpcio-tools) here, independently of the product."""
    import tempfile
    from pathlib import Path

    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "event.proto").write_text(text)
        assert protoc.main(["protoc", f"-I{folder}", f"-I{include}", "--include_imports",
                            f"--descriptor_set_out={folder}/out", f"{folder}/event.proto"]) == 0
        files = descriptor_pb2.FileDescriptorSet.FromString((Path(folder) / "out").read_bytes()).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("fuzz.Event"))


def _proto_value(rng: random.Random, kind: str, name: str):
    if rng.random() < 0.85:                 # mostly values the column reads, so rows get through
        if kind == "string":
            return "2026-11-01T10:00:00Z" if name == "t" else "2024-02-03" if name == "d" else \
                rng.choice(fuzz_records.KEYS[:4])
        if kind in ("int32", "int64", "sint64", "uint32", "fixed64"):
            return rng.randint(0, 30_000) if name in ("d", "t") else rng.randint(0, 1000)
        if kind in ("double", "float"):
            return rng.choice([0.5, 2.25, -3.0])
    if kind == "google.protobuf.Timestamp":
        return rng.choice([0, 1_795_683_660_250, rng.randint(-62_135_596_800_000, 253_402_300_799_000)])
    return {"string": lambda: rng.choice(fuzz_records.KEYS + ["2026-11-01T10:00:00Z", "2024-02-03", "2024-02-30"]),
            "bytes": lambda: bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))),
            "int32": lambda: rng.choice([0, -1, 2 ** 31 - 1, -2 ** 31, rng.randint(0, 30_000)]),
            "uint32": lambda: rng.choice([0, 2 ** 32 - 1, rng.randint(0, 30_000)]),
            "int64": lambda: rng.choice([0, 2 ** 63 - 1, -2 ** 63, rng.randint(0, 1_800_000_000_000)]),
            "sint64": lambda: rng.choice([0, -2 ** 63, rng.randint(-2 ** 40, 2 ** 40)]),
            "fixed64": lambda: rng.choice([0, 2 ** 64 - 1, rng.randint(0, 2 ** 40)]),
            "double": lambda: rng.choice([0.5, -0.0, 1.7e308, math.nan, math.inf, rng.uniform(-1e6, 1e6)]),
            "float": lambda: rng.choice([0.25, -3.5, 1e30]),
            "bool": lambda: rng.random() < 0.5}[kind]()


def generated_protobuf(seed: int, count: int) -> tuple[dict[int, Registered], list[bytes], dict[int, bool]]:
    """As `generated`, for Protobuf: (the registry, the values, offset -> whether the columns refuse
    the record's writer schema); a damaged record's expectation is left out (Protobuf parses many
    truncations and extensions as a shorter or longer message)."""
    rng = random.Random(seed)
    registry, classes, writers = {}, {}, {}
    for schema_id in range(1, 5):
        text, fields, unreadable = _proto_writer(rng)
        registry[schema_id] = Registered("PROTOBUF", text)
        classes[schema_id], writers[schema_id] = _proto_class(text), (fields, unreadable)
    values, expected = [], {}
    for offset in range(count):
        schema_id = rng.randint(1, 4)
        fields, unreadable = writers[schema_id]
        message = classes[schema_id]()
        for name, kind in fields:
            if rng.random() < 0.15:
                continue                                    # unset: its default, or null with presence
            value = _proto_value(rng, kind, name)
            if kind == "google.protobuf.Timestamp":
                getattr(message, name).FromMilliseconds(value)
            else:
                setattr(message, name, value)
        payload = b"\x00" + message.SerializeToString()      # message index: the first message
        roll = rng.random()
        if 0.11 <= roll <= 0.95:
            expected[offset] = bool(unreadable)
        if roll < 0.05:
            payload = payload[:rng.randint(0, max(0, len(payload) - 1))]
        elif roll < 0.08:
            payload += bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        elif roll < 0.11:
            payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        if roll > 0.97:
            values.append(payload[1:])
        elif roll > 0.95:
            values.append(_framed(rng.choice([0, 77, 2 ** 31]), payload))
        else:
            values.append(_framed(schema_id, payload))
    return registry, values, expected


def _table(tmp_path, fmt: str = "avro-confluent"):
    path = tmp_path / "fuzz.sql"
    path.write_text(f"-- topic: fuzz\n-- schema: {', '.join(f'{n} {t}' for n, t in COLUMNS)}\n"
                    f"-- format: {fmt}\n"
                    "CREATE TABLE fuzz AS SELECT k, COUNT(*) AS n, SUM(v) AS s FROM events GROUP BY k;\n")
    return parse(path)


def _batch(values: list[bytes], first: int = 0) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": pa.array([None] * n, pa.binary()), "value": pa.array(values, pa.binary()),
        "topic": pa.array(["fuzz"] * n), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(first, first + n), pa.int64()),
        "timestamp": pa.array([0] * n, pa.timestamp("us")), "timestampType": pa.array([0] * n, pa.int32())})


def _arrow_verdicts(table, values, registry, first: int = 0) -> dict[int, object]:
    spec = arrow_pass.PassSpec(table, 0, now_ms=None, watermark_ms=None, bronze=None, schemas=registry.get)
    events, dead, _ = arrow_pass.classify(_batch(values, first), spec)
    out = {o: ("dead", r) for o, r in zip(dead.column("source_offset").to_pylist(), dead.column("reason").to_pylist())}
    names = [n for n, _ in COLUMNS]
    for row in events.select([*names, "source_offset"]).to_pylist():
        if row["t"] is not None:           # as Spark collects it: naive, in the session's UTC
            row["t"] = row["t"].astimezone(dt.timezone.utc).replace(tzinfo=None)
        out[row.pop("source_offset")] = ("good", row)
    return out


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "dead":
        return a[1] == b[1]
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a[1].values(), b[1].values())) and a[1].keys() == b[1].keys()


GENERATORS = {"avro-confluent": generated, "protobuf-confluent": generated_protobuf}
FORMATS = pytest.mark.parametrize("fmt", list(GENERATORS), ids=["avro", "protobuf"])


@FORMATS
def test_generated_records_get_the_same_verdict_alone_as_in_their_block_and_as_their_schema_says(tmp_path, fmt):
    table = _table(tmp_path, fmt)
    for seed in range(SEED, SEED + 8):
        registry, values, refused = GENERATORS[fmt](seed, 120)
        block = _arrow_verdicts(table, values, registry)
        assert set(block) == set(range(len(values))), _replay("alone", seed)
        for offset, value in enumerate(values):
            alone = _arrow_verdicts(table, [value], registry, offset)[offset]
            assert _same(alone, block[offset]), (offset, value[:40], alone, block[offset], _replay("alone", seed))
            if offset in refused:
                assert (block[offset] == ("dead", "schema_incompatible")) == refused[offset], (
                    offset, block[offset], registry[int.from_bytes(value[1:5], "big")], _replay("alone", seed))


@FORMATS
@pytest.mark.timeout(600)
def test_generated_records_get_the_same_verdicts_and_rows_on_both_passes(spark, tmp_path, fmt):
    from pyspark.sql import functions as F

    from spark_jobs.frames import parse as spark_parse

    table = _table(tmp_path, fmt)
    registry, values, _ = GENERATORS[fmt](SEED, int(os.environ.get("STATETABLE_FUZZ_RECORDS", "600")))
    arrow = _arrow_verdicts(table, values, registry)
    raw = spark.createDataFrame(_batch(values).to_pandas()).select(
        "key", "value", "topic", "partition", "offset", F.col("timestamp").cast("timestamp"), "timestampType")
    classified = spark_parse.classify(raw, table, ["k"], schemas=registry.get)
    spark_verdicts = {r["_offset"]: ("dead", r["reason"]) for r in classified.where("reason IS NOT NULL")
                      .select("_offset", "reason").collect()}
    for r in spark_parse.good_events(classified, table).collect():
        row = r.asDict()
        offset = row.pop("source_offset")
        row.pop("source_partition"), row.pop("source_timestamp")
        spark_verdicts[offset] = ("good", row)
    assert set(spark_verdicts) == set(arrow), _replay("both_passes", SEED)
    differ = {o: (arrow[o], spark_verdicts[o]) for o in arrow if not _same(arrow[o], spark_verdicts[o])}
    assert differ == {}, (dict(list(differ.items())[:5]), _replay("both_passes", SEED))


def _one_by_one(table, values, registry):
    from spark_jobs.frames.formats import _one_by_one as per_record, format_for

    return per_record(format_for(table, registry.get), values)


def _simple_value(rng: random.Random, kind, hostile: bool = False):
    if isinstance(kind, list):
        if rng.random() < 0.2:
            return None
        kind = next(k for k in kind if k != "null")
    return {"string": lambda: rng.choice(fuzz_records.KEYS + ["", "ü€😀", "a\nb\"c"]),
            "int": lambda: rng.choice([0, -1, 2 ** 31 - 1, -2 ** 31, rng.randint(-1000, 1000)]),
            "long": lambda: rng.choice([0, 2 ** 63 - 1, -2 ** 63, 63, 64, -64, -65, rng.randint(-2 ** 40, 2 ** 40)]),
            "double": lambda: rng.choice([0.5, -0.0, 1.7e308, 5e-324, 1e20, rng.uniform(-1e6, 1e6)]
                                         + ([math.nan, math.inf] if hostile else [])),
            "boolean": lambda: rng.random() < 0.5}[kind]()


def test_avro_read_in_one_native_pass_equals_the_per_record_path_and_falls_back_on_any_damage(tmp_path):
    """avro_block's blocks against fastavro record by record: the same JSON (as values) and the same
    reasons for every record, clean or damaged, over schemas the fast path takes and ones it does not;
    and the fast path did read most clean records (a fast path that always fell back would pass the
    rest of this test)."""
    from spark_jobs.frames.formats import format_for, transcode

    table = _table(tmp_path)
    fast_read, clean = 0, 0
    for seed in range(SEED, SEED + 6):
        rng = random.Random(seed)
        registry, values = {}, []
        for schema_id in range(1, 5):
            fields = [{"name": "k", "type": rng.choice(["string", ["null", "string"]])},
                      {"name": "v", "type": rng.choice(["long", "int", ["null", "long"], ["int", "null"]])},
                      {"name": "x", "type": rng.choice(["double", "long", "int", ["null", "double"]])},
                      {"name": "flag", "type": rng.choice(["boolean", ["null", "boolean"]])}]
            if schema_id == 4:
                fields[1] = {"name": "v", "type": "string"}                  # incompatible: not read in a block
            if rng.random() < 0.5:
                fields.append({"name": "extra", "type": "string"})
            rng.shuffle(fields)
            schema = {"type": "record", "name": "Event", "fields": fields}
            registry[schema_id] = Registered("AVRO", json.dumps(schema))
            parsed = fastavro.parse_schema(schema)
            for _ in range(rng.randint(50, 150)):
                # NaN and infinity (written as strings by the per-record path) in one id's records only
                record = {f["name"]: _simple_value(rng, f["type"], hostile=schema_id == 2) for f in fields}
                out = io.BytesIO()
                fastavro.schemaless_writer(out, parsed, record)
                payload = out.getvalue()
                if schema_id == 3 and rng.random() < 0.05:                  # damage in one id's block only
                    payload = rng.choice([payload[:-1], payload + b"\x01", bytes(rng.randrange(256) for _ in range(7)),
                                          payload.replace(b"key", b"\xff\xfe\xfd", 1)])
                values.append(_framed(schema_id, payload))
        rng.shuffle(values)
        values.insert(3, None)
        values.insert(7, b"\x01not framed")
        array = pa.array(values, pa.binary())
        got_json, got_reasons = transcode(array, table, registry.get)
        want_json, want_reasons = _one_by_one(table, values, registry)
        assert got_reasons.to_pylist() == want_reasons.to_pylist(), _replay("native_pass", seed)
        for offset, (got, want) in enumerate(zip(got_json.to_pylist(), want_json.to_pylist())):
            assert (got is None) == (want is None), (offset, _replay("native_pass", seed))
            if got is not None:
                assert json.loads(got) == json.loads(want), (offset, got, want, _replay("native_pass", seed))
        fast_read += sum(len(indexes) for indexes, _ in format_for(table, registry.get).decode_many(array))
        clean += sum(1 for v in values if v and v[:5] == _framed(1, b""))
    assert fast_read >= clean > 0, (fast_read, clean)        # id 1's records: no damage, no NaN
