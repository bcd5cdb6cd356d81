"""Avro values read by the Arrow pass as the JSON path reads its own: typed by name into the
table's columns, with a dead letter and its reason for what cannot be read. (The Spark SQL
pass reads the same transcoded JSON; tests/test_formats.py runs both on a stack.)"""
from __future__ import annotations

import io
import json

import fastavro
import pyarrow as pa
import pytest

from catalog.definitions import DefinitionError, parse
from spark_jobs.frames import arrow_pass

WRITER = {"type": "record", "name": "Payment", "fields": [
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}


def _table(tmp_path, schema=WRITER, header="-- format: avro\n-- value_schema: payment.avsc\n"):
    (tmp_path / "payment.avsc").write_text(json.dumps(schema))
    path = tmp_path / "paid.sql"
    path.write_text(f"-- topic: payments\n-- schema: customer STRING, amount DOUBLE, at TIMESTAMP, day DATE, "
                    f"missing BIGINT\n{header}"
                    "CREATE TABLE paid AS SELECT customer, SUM(amount) AS total, MAX(at) AS last, MIN(day) AS first, "
                    "COUNT(missing) AS n FROM payments GROUP BY customer;\n")
    return parse(path)


def _avro(record: dict, schema=WRITER) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_an_avro_table_declares_its_writer_schema_or_fails_in_one_line(tmp_path):
    table = _table(tmp_path)
    assert table.format == "avro" and json.loads(table.value_schema)["name"] == "Payment"
    assert table.meaning()["format"] == "avro"
    with pytest.raises(DefinitionError, match=r"paid\.sql:\d+:1: table 'paid': format avro needs its writer schema"):
        _table(tmp_path, header="-- format: avro\n")
    with pytest.raises(DefinitionError, match=r"format='xml' is not one of json, avro"):
        _table(tmp_path, header="-- format: xml\n")
    with pytest.raises(DefinitionError, match=r"value_schema payment.avsc is not an Avro schema"):
        _table(tmp_path, schema={"type": "record", "name": "P", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(DefinitionError, match="must be an Avro record"):
        _table(tmp_path, schema={"type": "string"})


def test_avro_records_are_typed_by_name_and_the_unreadable_are_dead_letters(tmp_path):
    table = _table(tmp_path)
    good = {"customer": "ann", "amount": 12.5, "at": 1795683660250, "day": 20418, "note": None}
    values = [
        _avro(good),
        _avro({**good, "customer": "bob", "amount": float("nan")}),       # NaN: wrong_type, as in JSON
        _avro(good)[:-3],                                                 # truncated
        _avro(good) + b"\x00",                                            # a byte after the datum
        None,                                                             # a null value
        b"{\"customer\": \"ann\"}",                                       # JSON on an Avro topic
    ]
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array(values, pa.binary()), "partition": pa.array([0] * 6, pa.int32()),
        "offset": pa.array(range(6), pa.int64()), "timestamp": pa.array([0] * 6, pa.timestamp("us"))})
    spec = arrow_pass.PassSpec(table, 0, now_ms=None, watermark_ms=None, bronze=None)
    events, dead, read = arrow_pass.classify(batch, spec)
    assert read == 6
    rows = events.select(["customer", "amount", "at", "day", "missing"]).to_pylist()
    assert len(rows) == 1 and rows[0]["customer"] == "ann" and rows[0]["amount"] == 12.5 and rows[0]["missing"] is None
    assert str(rows[0]["at"]) .startswith("2026-11-26 09:01:00.250") and str(rows[0]["day"]) == "2025-11-26"
    assert dict(zip(dead.column("source_offset").to_pylist(), dead.column("reason").to_pylist())) == {
        1: "wrong_type", 2: "malformed_avro", 3: "malformed_avro", 4: "null_value", 5: "malformed_avro"}
    assert dead.filter(pa.compute.equal(dead.column("source_offset"), 2)).column("value")[0].as_py() == values[2]


def test_mirror_rows_read_back_a_date_kept_as_days(tmp_path):
    """A source table keeps a DATE as days since 1970 and its mirror writes that number: a join
    reading the mirror gets the date back (it raised MirrorCorrupt, or the row had been refused)."""
    import datetime as dt

    from spark_jobs.frames.table_frames import typed_rows

    path = tmp_path / "people.sql"
    path.write_text("CREATE TABLE people (id BIGINT PRIMARY KEY, born DATE, seen TIMESTAMP) WITH (topic='p');")
    rows = pa.table({"row": [json.dumps({"id": 1, "born": 11353, "seen": 1795683660000}),
                             json.dumps({"id": 2, "born": None, "seen": None})]})
    typed = typed_rows(parse(path), rows)
    assert typed.column("born").to_pylist() == [dt.date(2001, 1, 31), None]
    assert typed.schema.field("born").type == pa.date32() and typed.column("id").to_pylist() == [1, 2]
