"""Topics in Confluent's wire format (Avro, JSON Schema, Protobuf), through a real schema registry
(Apicurio, as `stack up --registry` runs it), written by confluent-kafka's own serializers as a
team's producers write them, with writer schemas that evolve mid-topic: v1, v2 (a field added, a
field removed, int -> long), then an incompatible v3. On both passes the table equals pandas over the v1 and v2 records
decoded back independently (fastavro / json / protoc's classes over the bytes, the writer schema chosen by the
test, not by the product), and every v3 record is a dead letter `schema_incompatible`."""
from __future__ import annotations

import io
import json
import uuid

import fastavro
import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from catalog.mapping import row_of
from catalog.registry import load_table
from spark_jobs import jobs
from state.kafka_admin import ensure_topic
from tests.table_env import dead_letter_reasons, isolated_runtime, read_topic

ENGINES = pytest.mark.parametrize("engine", ["arrow", "spark"])


def _record(name, fields):
    return {"type": "record", "name": "Payment", "namespace": "shop", "fields": fields}


AVRO = {
    1: _record("v1", [{"name": "customer", "type": "string"}, {"name": "amount", "type": "int"},
                      {"name": "note", "type": ["null", "string"], "default": None}]),
    2: _record("v2", [{"name": "customer", "type": "string"}, {"name": "amount", "type": "long"},
                      {"name": "channel", "type": "string", "default": "web"}]),
    3: _record("v3", [{"name": "customer", "type": "string"}, {"name": "amount", "type": "string"}]),
}
JSON_SCHEMAS = {
    1: {"type": "object", "properties": {"customer": {"type": "string"}, "amount": {"type": "integer"},
                                         "note": {"type": ["string", "null"]}}},
    2: {"type": "object", "properties": {"customer": {"type": "string"}, "amount": {"type": ["integer", "null"]},
                                         "channel": {"type": "string"}}},
    3: {"type": "object", "properties": {"customer": {"type": "string"}, "amount": {"type": "string"}}},
}


PROTOS = {
    1: 'syntax = "proto3";\npackage shop;\nmessage Payment {\n  string customer = 1;\n  int32 amount = 2;\n'
       '  optional string note = 3;\n}\n',
    2: 'syntax = "proto3";\npackage shop;\nmessage Payment {\n  string customer = 1;\n  int64 amount = 2;\n'
       '  string channel = 4;\n}\n',
    3: 'syntax = "proto3";\npackage shop;\nmessage Payment {\n  string customer = 1;\n  string amount = 2;\n}\n',
}


def _proto_class(version: int):
    """The test's message class for a version, compiled by protoc (grpcio-tools) as a team's build would."""
    import tempfile
    from pathlib import Path

    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "payment.proto").write_text(PROTOS[version])
        assert protoc.main(["protoc", f"-I{folder}", f"--descriptor_set_out={folder}/out",
                            f"{folder}/payment.proto"]) == 0
        file = descriptor_pb2.FileDescriptorSet.FromString((Path(folder) / "out").read_bytes()).file[0]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return GetMessageClass(pool.FindFileByName(file.name).message_types_by_name["Payment"])


def _events(version: int, n: int, offset: int) -> list[dict]:
    out = []
    for i in range(offset, offset + n):
        event = {"customer": f"c{i % 3}", "amount": i * 11 if version != 3 else str(i)}
        if version == 1:
            event["note"] = None if i % 2 else f"n{i}"
        if version == 2:
            event["amount"] = 2**33 + i           # beyond v1's int
            event["channel"] = "app"
        out.append(event)
    return out


def _table_sql(topic: str, fmt: str) -> str:
    return (f"-- topic: {topic}\n-- schema: customer STRING, amount BIGINT, note STRING\n-- partitions: 2\n"
            f"-- format: {fmt}\n"
            "CREATE TABLE evolving AS SELECT customer, COUNT(*) AS n, SUM(amount) AS total, COUNT(note) AS notes "
            "FROM payments GROUP BY customer\n")


# Subjects named <topic>-value, as teams' producers name them. (confluent-kafka 2.16's default first
# asks the registry for "associations", an API Apicurio 3.3.3 does not serve: one such request hung.)
SUBJECTS = {"subject.name.strategy.type": "TOPIC"}


def _serializer(fmt: str, client: SchemaRegistryClient, version: int):
    if fmt == "protobuf-confluent":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        message = _proto_class(version)
        serialize = ProtobufSerializer(message, client, {"use.deprecated.format": False, **SUBJECTS})
        return lambda event, ctx: serialize(message(**{k: v for k, v in event.items() if v is not None}), ctx)
    if fmt == "avro-confluent":
        from confluent_kafka.schema_registry.avro import AvroSerializer
        return AvroSerializer(client, json.dumps(AVRO[version]), conf=SUBJECTS)
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    return JSONSerializer(json.dumps(JSON_SCHEMAS[version]), client, conf=SUBJECTS)


def _decode(fmt: str, value: bytes, version: int) -> dict:
    """The test's own reading: the writer schema is the one the test wrote that version with."""
    assert value[0] == 0
    if fmt == "protobuf-confluent":
        assert value[5] == 0, "the first message of the .proto: index path [0]"
        message = _proto_class(version).FromString(value[6:])
        out = {"customer": message.customer, "amount": message.amount}
        if version == 1:
            out["note"] = message.note if message.HasField("note") else None
        return out
    if fmt == "json-confluent":
        return json.loads(value[5:])
    return fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(AVRO[version]), None)


@ENGINES
@pytest.mark.parametrize("fmt", ["avro-confluent", "json-confluent", "protobuf-confluent"])
def test_writer_schemas_that_evolve_mid_topic_reach_the_table_and_an_incompatible_one_is_dead_lettered(
        kafka, registry, spark, tmp_path, monkeypatch, engine, fmt):
    rt, suffix = isolated_runtime(kafka, tmp_path)
    monkeypatch.setenv("STATETABLE_ENGINE", engine)
    topic = f"payments-{fmt}-{uuid.uuid4().hex[:6]}{suffix}"
    ensure_topic(rt.bootstrap, topic, 2)
    (rt.tables_dir / "evolving.sql").write_text(_table_sql(topic, fmt))
    client = SchemaRegistryClient({"url": registry, "timeout": 30})
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    written = []                           # (partition, version) in produce order
    ids = {}                               # version -> the writer schema id its serializer framed
    plan = [(1, 0, 12), (2, 12, 12), (3, 24, 6), (1, 30, 6)]      # v1 again after v3: nothing wedged
    for batch, (version, start, n) in enumerate(plan):
        serialize = _serializer(fmt, client, version)
        for i, event in enumerate(_events(version, n, start)):
            partition = (start + i) % 2
            value = serialize(event, SerializationContext(topic, MessageField.VALUE))
            ids[version] = int.from_bytes(value[1:5], "big")
            producer.produce(topic, value, key=event["customer"].encode(), partition=partition)
            written.append((partition, version))
        assert producer.flush(30) == 0
        commits = jobs.run("evolving", until_caught_up=True, spark=spark, rt=rt)     # a batch per version
        assert commits, f"no batch for version {version}"
    producer.produce(topic, b"\x00\x00\x0f\x42\x40" + b"{}", partition=0)           # id 1000000: unknown
    producer.produce(topic, json.dumps({"customer": "c0", "amount": 1}).encode(), partition=1)   # unframed
    assert producer.flush(30) == 0
    jobs.run("evolving", until_caught_up=True, spark=spark, rt=rt)

    messages = read_topic(rt.bootstrap, topic)
    versions = {}
    counters = {0: 0, 1: 0}
    for partition, version in written:
        versions[(partition, counters[partition])] = version
        counters[partition] += 1
    dead = {(p, o): reason for (p, o), reason in dead_letter_reasons(rt, "evolving", by_partition=True).items()}
    expected_dead = {key: "schema_incompatible" for key, version in versions.items() if version == 3}
    expected_dead[(0, counters[0])] = "unknown_schema_id"
    expected_dead[(1, counters[1])] = "not_wire_format"
    assert dead == expected_dead

    decoded = [_decode(fmt, m.value(), versions[(m.partition(), m.offset())]) for m in messages
               if (m.partition(), m.offset()) in versions and versions[(m.partition(), m.offset())] != 3]
    frame = pd.DataFrame(decoded)
    if "note" not in frame:
        frame["note"] = None
    expected = frame.groupby("customer").agg(n=("amount", "size"), total=("amount", "sum"), notes=("note", "count"))
    table = load_table("evolving", rt)[0]
    rows = {k[0]: row_of(table, k, v) for k, v in jobs.state_rows("evolving", rt).items()}
    assert rows == {c: {"customer": c, "n": int(r.n), "total": int(r.total), "notes": int(r.notes)}
                    for c, r in expected.iterrows()}

    # The writer schemas the batches read, and the batch each first arrived in, as `tables` shows them.
    from ops import status

    info = status.table_status(table, rt)
    seen = {s["id"]: s for s in info["writer_schemas"]}
    assert set(seen) == {ids[1], ids[2], ids[3], 1_000_000}
    assert seen[ids[1]]["records"] == 18 and seen[ids[2]]["records"] == 12 and seen[ids[3]]["records"] == 6
    assert seen[ids[1]]["first_batch"] < seen[ids[2]]["first_batch"] < seen[ids[3]]["first_batch"] \
        < seen[ids[1]]["last_batch"], "v1 came back after v3, in a later batch"
    assert info["last_batch_writer_schema_ids"] == [1_000_000]

    # Recomputed from the topic's history, each record read with the schema it was written with,
    # the table is the same: the verify a restore drill runs holds across the schema versions.
    from spark_jobs.recompute.verify import verify

    verified = verify("evolving", spark=spark, rt=rt)
    assert verified.ok and verified.keys_compared == 3, verified.summary()
