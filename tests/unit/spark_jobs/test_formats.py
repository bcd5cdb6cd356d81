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


# ----------------------------------------------------------- Confluent's wire format, schemas by id
V1 = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "customer", "type": "string"}, {"name": "amount", "type": "int"},
    {"name": "note", "type": "string", "default": ""}]}
V2 = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [      # amount int -> long,
    {"name": "customer", "type": "string"}, {"name": "amount", "type": "long"},  # note removed,
    {"name": "channel", "type": "string", "default": "web"}]}                    # channel added
V3 = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [      # amount now a string
    {"name": "customer", "type": "string"}, {"name": "amount", "type": "string"}]}


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def _registry_table(tmp_path, fmt: str):
    path = tmp_path / "spend.sql"
    path.write_text(f"-- topic: payments\n-- schema: customer STRING, amount BIGINT, note STRING\n-- format: {fmt}\n"
                    "CREATE TABLE spend AS SELECT customer, SUM(amount) AS total FROM payments GROUP BY customer;\n")
    return parse(path)


def _classify(table, values, schemas):
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array(values, pa.binary()), "partition": pa.array([0] * len(values), pa.int32()),
        "offset": pa.array(range(len(values)), pa.int64()),
        "timestamp": pa.array([0] * len(values), pa.timestamp("us"))})
    spec = arrow_pass.PassSpec(table, 0, now_ms=None, watermark_ms=None, bronze=None, schemas=schemas)
    events, dead, _ = arrow_pass.classify(batch, spec)
    return (events.select(["customer", "amount", "note"]).to_pylist(),
            dict(zip(dead.column("source_offset").to_pylist(), dead.column("reason").to_pylist())))


def test_avro_writer_schemas_that_evolve_are_resolved_by_name_and_an_incompatible_one_is_dead_lettered(tmp_path):
    from spark_jobs.frames.formats.wire import Registered

    registered = {1: Registered("AVRO", json.dumps(V1)), 2: Registered("AVRO", json.dumps(V2)),
                  3: Registered("AVRO", json.dumps(V3)), 4: Registered("JSON", "{}")}
    asked = []
    schemas = lambda i: asked.append(i) or registered.get(i)       # noqa: E731
    table = _registry_table(tmp_path, "avro-confluent")
    values = [
        _framed(1, _avro({"customer": "ann", "amount": 5, "note": "hi"}, V1)),
        _framed(2, _avro({"customer": "ann", "amount": 2**40, "channel": "app"}, V2)),   # a long beyond int
        _framed(3, _avro({"customer": "bob", "amount": "7"}, V3)),
        _framed(9, _avro({"customer": "bob", "amount": 1, "note": ""}, V1)),             # an id nobody knows
        _avro({"customer": "bob", "amount": 1, "note": ""}, V1),                         # no frame
        _framed(1, _avro({"customer": "bob", "amount": 1, "note": ""}, V1)[:-2]),        # truncated
        _framed(4, b'{"customer": "bob"}'),                                              # a JSON Schema's id
        _framed(1, _avro({"customer": "cy", "amount": -3, "note": ""}, V1)),
    ]
    rows, dead = _classify(table, values, schemas)
    assert rows == [{"customer": "ann", "amount": 5, "note": "hi"},
                    {"customer": "ann", "amount": 2**40, "note": None},       # removed field: null
                    {"customer": "cy", "amount": -3, "note": ""}]
    assert dead == {2: "schema_incompatible", 3: "unknown_schema_id", 4: "not_wire_format", 5: "malformed_avro",
                    6: "schema_incompatible"}
    assert sorted(set(asked)) == [1, 2, 3, 4, 9] and len(asked) == 5, "each id is looked up once per batch"


def test_a_declared_reader_schema_gives_removed_fields_their_default(tmp_path):
    from spark_jobs.frames.formats.wire import Registered

    (tmp_path / "reader.avsc").write_text(json.dumps(V1))
    path = tmp_path / "spend.sql"
    path.write_text("-- topic: payments\n-- schema: customer STRING, amount BIGINT, note STRING\n"
                    "-- format: avro-confluent\n-- value_schema: reader.avsc\n"
                    "CREATE TABLE spend AS SELECT customer, SUM(amount) AS total FROM payments GROUP BY customer;\n")
    table = parse(path)
    registered = {2: Registered("AVRO", json.dumps(V2))}
    rows, dead = _classify(table, [_framed(2, _avro({"customer": "ann", "amount": 4, "channel": "x"}, V2))],
                           registered.get)
    # The reader (V1) reads amount as int: Avro does not narrow long to int, so the record is refused.
    assert rows == [] and dead == {0: "schema_incompatible"}
    rows, dead = _classify(table, [_framed(1, _avro({"customer": "ann", "amount": 4, "note": "n"}, V1))],
                           {1: Registered("AVRO", json.dumps(V1))}.get)
    assert rows == [{"customer": "ann", "amount": 4, "note": "n"}] and dead == {}
    v1_without_note = {**V1, "fields": V1["fields"][:2]}
    rows, _ = _classify(table, [_framed(5, _avro({"customer": "bo", "amount": 1}, v1_without_note))],
                        {5: Registered("AVRO", json.dumps(v1_without_note))}.get)
    assert rows == [{"customer": "bo", "amount": 1, "note": ""}], "the reader's default fills a removed field"


def test_json_schema_ids_are_judged_once_against_the_columns(tmp_path):
    from spark_jobs.frames.formats.wire import Registered

    def schema(amount_type):
        return Registered("JSON", json.dumps({"type": "object", "properties": {
            "customer": {"type": "string"}, "amount": {"type": amount_type}, "extra": {"type": "object"}}}))

    registered = {1: schema("integer"), 2: schema(["integer", "null"]), 3: schema("string"),
                  4: Registered("AVRO", json.dumps(V1))}
    table = _registry_table(tmp_path, "json-confluent")
    values = [_framed(1, b'{"customer": "ann", "amount": 3, "extra": {}}'),
              _framed(2, b'{"customer": "ann", "amount": null}'),
              _framed(3, b'{"customer": "bob", "amount": "3"}'),
              _framed(4, b'{"customer": "bob", "amount": 3}'),
              _framed(7, b'{"customer": "bob", "amount": 3}'),
              b'{"customer": "bob", "amount": 3}',
              _framed(1, b'{"customer": "bob", "amount": 3')]
    rows, dead = _classify(table, values, registered.get)
    assert rows == [{"customer": "ann", "amount": 3, "note": None}, {"customer": "ann", "amount": None, "note": None}]
    assert dead == {2: "schema_incompatible", 3: "schema_incompatible", 4: "unknown_schema_id",
                    5: "not_wire_format", 6: "malformed_json"}


def test_registry_settings_ride_in_the_client_config_and_never_reach_librdkafka(tmp_path, monkeypatch):
    from state.kafka_config import CONFIG_ENV, REGISTRY_URL_ENV, client_config, registry_config

    conf = tmp_path / "client.properties"
    conf.write_text("security.protocol=PLAINTEXT\nschema.registry.url=https://sr.example:8081\n"
                    "schema.registry.basic.auth.user.info=team:s3cret\n")
    conf.chmod(0o600)
    monkeypatch.setenv(CONFIG_ENV, str(conf))
    assert client_config("b:9092") == {"security.protocol": "PLAINTEXT", "bootstrap.servers": "b:9092"}
    assert registry_config("http://local") == {"url": "https://sr.example:8081", "basic.auth.user.info": "team:s3cret"}
    monkeypatch.delenv(CONFIG_ENV)
    assert registry_config("http://local") == {"url": "http://local"}
    monkeypatch.setenv(REGISTRY_URL_ENV, "http://other:1")
    assert registry_config("http://local") == {"url": "http://other:1"}


def test_a_registry_that_does_not_answer_stops_the_batch_in_one_line_naming_it_and_the_fix(monkeypatch):
    from catalog.messages import one_line
    from spark_jobs.errors import RegistryUnreachable
    from spark_jobs.steps import schemas
    from state.kafka_config import CONFIG_ENV, REGISTRY_URL_ENV

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv(REGISTRY_URL_ENV, "http://127.0.0.1:9")          # nothing listens on discard
    schemas._client.cache_clear()
    try:
        with pytest.raises(RegistryUnreachable) as raised:
            schemas.RegistrySchemas()(7)
    finally:
        schemas._client.cache_clear()
    message = one_line(raised.value)
    assert message.startswith("the schema registry at http://127.0.0.1:9 did not answer (") and \
        "statetable stack up --registry" in message and "schema.registry.url" in message
    # Raised in a Spark task, it reaches the user as the same sentence, not Spark's first line.
    wrapped = RuntimeError("An exception was thrown from the Python worker. Please see the stack trace below.\n"
                           "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                           f"spark_jobs.errors.RegistryUnreachable: {message}\n")
    assert one_line(wrapped) == message


PROTO_V1 = ('syntax = "proto3";\npackage shop;\nimport "google/protobuf/timestamp.proto";\n'
            'message Payment {\n  string customer = 1;\n  int32 amount = 2;\n  optional string note = 3;\n'
            '  google.protobuf.Timestamp at = 4;\n  message Inner { string x = 1; }\n}\n'
            'message Refund {\n  string customer = 1;\n  int64 amount = 2;\n}\n')
PROTO_V3 = 'syntax = "proto3";\npackage shop;\nmessage Payment {\n  string customer = 1;\n  string amount = 2;\n}\n'


def _proto_message(text: str, name: str, **fields) -> bytes:
    """The payload as the test builds it: protoc and protobuf, not the product's reader."""
    from spark_jobs.frames.formats.protobuf import compile_proto
    from google.protobuf.message_factory import GetMessageClass

    message = GetMessageClass(compile_proto(text).message_types_by_name[name])()
    for key, value in fields.items():
        if key == "at":
            message.at.FromMilliseconds(value)
        else:
            setattr(message, key, value)
    return message.SerializeToString()


def test_protobuf_messages_are_read_by_their_schema_id_and_message_index(tmp_path):
    from spark_jobs.frames.formats.wire import Registered

    path = tmp_path / "spend.sql"
    path.write_text("-- topic: payments\n-- schema: customer STRING, amount BIGINT, note STRING, at TIMESTAMP\n"
                    "-- format: protobuf-confluent\n"
                    "CREATE TABLE spend AS SELECT customer, SUM(amount) AS total FROM payments GROUP BY customer;\n")
    table = parse(path)
    registered = {1: Registered("PROTOBUF", PROTO_V1), 3: Registered("PROTOBUF", PROTO_V3),
                  4: Registered("PROTOBUF", "syntax = nonsense"), 5: Registered("AVRO", json.dumps(V1))}
    values = [
        _framed(1, b"\x00" + _proto_message(PROTO_V1, "Payment", customer="ann", amount=5, note="hi",
                                            at=1795683660250)),
        _framed(1, b"\x02\x02" + _proto_message(PROTO_V1, "Refund", customer="bob", amount=2**40)),  # index [1]
        _framed(1, b"\x00" + _proto_message(PROTO_V1, "Payment", customer="cy")),    # unset: 0, null, null
        _framed(3, b"\x00" + _proto_message(PROTO_V3, "Payment", customer="dee", amount="7")),
        _framed(4, b"\x00"), _framed(5, b"\x00"), _framed(9, b"\x00"),
        _framed(1, b"\x00\xff\xff"),                                                 # not a Payment
        _framed(1, b"\x02\x10"),                                                     # index [8]: no such message
        b"\x08\x01",
    ]
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array(values, pa.binary()), "partition": pa.array([0] * len(values), pa.int32()),
        "offset": pa.array(range(len(values)), pa.int64()),
        "timestamp": pa.array([0] * len(values), pa.timestamp("us"))})
    spec = arrow_pass.PassSpec(table, 0, now_ms=None, watermark_ms=None, bronze=None, schemas=registered.get)
    events, dead, _ = arrow_pass.classify(batch, spec)
    rows = events.select(["customer", "amount", "note", "at"]).to_pylist()
    assert [(r["customer"], r["amount"], r["note"]) for r in rows] == [("ann", 5, "hi"), ("bob", 2**40, None),
                                                                      ("cy", 0, None)]
    assert str(rows[0]["at"]).startswith("2026-11-26 09:01:00.250") and rows[2]["at"] is None
    assert dict(zip(dead.column("source_offset").to_pylist(), dead.column("reason").to_pylist())) == {
        3: "schema_incompatible", 4: "schema_incompatible", 5: "schema_incompatible", 6: "unknown_schema_id",
        7: "malformed_protobuf", 8: "malformed_protobuf", 9: "not_wire_format"}


def test_records_that_shift_into_each_other_in_one_native_block_go_record_by_record():
    """Two damaged values whose bytes, back to back, are two good records: {v: 1}{v: 2} as
    b"\\x02\\x04" and b"". A block reader alone reads both as good; the size check sends the block
    to the per-record path, which calls both malformed."""
    from spark_jobs.frames.formats import avro_block

    schema = {"type": "record", "name": "E", "fields": [{"name": "v", "type": "long"}]}
    plan = avro_block.plan(schema, None)
    good = avro_block.decode(pa.array([b"\x02", b"\x04"], pa.binary()), plan)
    assert [json.loads(v) for v in good.to_pylist()] == [{"v": 1}, {"v": 2}]
    assert avro_block.decode(pa.array([b"\x02\x04", b""], pa.binary()), plan) is None
    assert avro_block.plan({**schema, "fields": [{"name": "v", "type": {"type": "long", "logicalType":
                                                                          "timestamp-millis"}}]}, None) is None


def test_debezium_avro_tables_read_registry_keys_and_a_key_format_outside_the_list_fails_in_one_line(tmp_path):
    from catalog.definitions import reads_registry

    path = tmp_path / "orders.sql"
    path.write_text("-- format: debezium-avro-confluent\n"
                    "CREATE TABLE orders (id BIGINT PRIMARY KEY, amount DOUBLE) WITH (topic='shop.public.orders');\n")
    table = parse(path)
    assert (table.format, table.key_format, reads_registry(table)) == ("debezium-avro-confluent", "avro-confluent", True)
    path.write_text("-- key_format: protobuf-confluent\n"
                    "CREATE TABLE orders (id BIGINT PRIMARY KEY, amount DOUBLE) WITH (topic='orders');\n")
    table = parse(path)
    assert (table.format, table.key_format, reads_registry(table)) == ("json", "protobuf-confluent", True)
    path.write_text("-- key_format: xml\nCREATE TABLE orders (id BIGINT PRIMARY KEY) WITH (topic='orders');\n")
    with pytest.raises(DefinitionError) as refused:
        parse(path)
    assert "key_format='xml'" in str(refused.value) and "avro-confluent" in str(refused.value) and \
        "\n" not in str(refused.value)


def test_a_debezium_avro_envelope_upserts_after_deletes_on_d_and_reads_connect_time_types():
    from spark_jobs.frames.formats import DELETE
    from spark_jobs.frames.formats.debezium import DebeziumAvro
    from spark_jobs.frames.formats.wire import Registered

    row = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "at", "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}]},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]}]}
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", row]}, {"name": "after", "type": ["null", "Value"]},
        {"name": "op", "type": "string"}]}
    reader = DebeziumAvro(None, {7: Registered("AVRO", json.dumps(envelope))}.get)

    def framed(event):
        return b"\x00" + (7).to_bytes(4, "big") + _avro(event, envelope)

    upsert = reader.decode(framed({"before": None, "after": {"id": 1, "at": 1_795_683_660_123_456, "day": 1},
                                   "op": "c"}))
    assert upsert == (b'{"id":1,"at":1795683660123,"day":"1970-01-02"}', None)
    assert reader.decode(framed({"before": {"id": 1, "at": None, "day": None}, "after": None, "op": "d"})) == \
        (None, DELETE)
    assert reader.decode(framed({"before": None, "after": None, "op": "c"})) == (None, "not_a_change_event")
    assert reader.decode(framed({"before": None, "after": None, "op": "t"})) == (None, "truncate_not_applied")
    assert reader.decode(framed({"before": None, "after": None, "op": "c"})[:-2]) == (None, "malformed_avro")
    assert reader.decode(b"\x00\x00\x00\x00\x08" + b"x") == (None, "unknown_schema_id")
