"""Tables over topics written in Avro (a writer schema from a file, `-- format: avro`), on the
real broker and Spark, on both passes: typed by name into the table's columns, and every record
the format cannot read dead-lettered with its reason. Each table is checked against pandas over
the records decoded back with fastavro, not the product's own reading."""
from __future__ import annotations

import io
import json
import uuid

import fastavro
import pandas as pd
import pytest
from confluent_kafka import Producer

from spark_jobs import jobs
from state.kafka_admin import ensure_topic
from tests.table_env import dead_letter_reasons, isolated_runtime, read_topic

ENGINES = pytest.mark.parametrize("engine", ["arrow", "spark"])
WRITER = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "channel", "type": ["null", "string"], "default": None},       # no column reads it
]}


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _avro(record: dict, schema=WRITER) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _produce(rt, topic: str, values: list, keys: list | None = None) -> None:
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=None if keys is None else keys[i], partition=0)
    assert producer.flush(30) == 0


@ENGINES
def test_an_aggregate_over_an_avro_topic_equals_pandas_and_dead_letters_what_it_cannot_read(env, spark, monkeypatch,
                                                                                           engine):
    rt, suffix = env
    monkeypatch.setenv("STATETABLE_ENGINE", engine)
    topic = f"payments-avro-{uuid.uuid4().hex[:6]}{suffix}"
    (rt.tables_dir / "payment.avsc").write_text(json.dumps(WRITER))
    (rt.tables_dir / "avro_spend.sql").write_text(
        f"-- topic: {topic}\n-- schema: customer STRING, amount BIGINT, at TIMESTAMP\n-- partitions: 2\n"
        "-- format: avro\n-- value_schema: payment.avsc\n"
        "CREATE TABLE avro_spend AS SELECT customer, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS top "
        "FROM payments GROUP BY customer\n")
    ensure_topic(rt.bootstrap, topic, 1)
    values = [_avro({"customer": f"c{i % 4}", "amount": i * 7, "at": 1795683600000 + i * 1000,
                     "channel": None if i % 2 else "web"}) for i in range(60)]
    values[5] = values[5][:-2]                                      # truncated
    values[17] = values[17] + b"\x01"                               # a byte after the datum
    values[33] = json.dumps({"customer": "c1", "amount": 1}).encode()   # JSON on the Avro topic
    values[41] = None                                               # a null value
    _produce(rt, topic, values)
    commits = jobs.run("avro_spend", until_caught_up=True, spark=spark, rt=rt)
    assert commits and sum(c.counts["read"] for c in commits) == 60

    dead = dead_letter_reasons(rt, "avro_spend")
    assert dead == {5: "malformed_avro", 17: "malformed_avro", 33: "malformed_avro", 41: "null_value"}
    decoded = [fastavro.schemaless_reader(io.BytesIO(m.value()), fastavro.parse_schema(WRITER), None)
               for m in read_topic(rt.bootstrap, topic) if m.offset() not in dead]
    frame = pd.DataFrame(decoded)
    expected = frame.groupby("customer").agg(n=("amount", "size"), total=("amount", "sum"), top=("amount", "max"))
    from catalog.mapping import row_of
    from catalog.registry import load_table

    table = load_table("avro_spend", rt)[0]
    rows = {k[0]: row_of(table, k, v) for k, v in jobs.state_rows("avro_spend", rt).items()}
    assert {k: (r["n"], r["total"], r["top"]) for k, r in rows.items()} == {
        k: (int(e["n"]), int(e["total"]), int(e["top"])) for k, e in expected.iterrows()}


PERSON = {"type": "record", "name": "Person", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "born", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None}]}


def test_a_source_table_over_an_avro_topic_upserts_and_deletes_by_key(env, spark):
    """Rows by their key: the newest record of each key, a tombstone deletes, and an unreadable
    record is a dead letter that leaves the row as it was."""
    import datetime as dt

    rt, suffix = env
    topic = f"people-avro-{uuid.uuid4().hex[:6]}{suffix}"
    (rt.tables_dir / "person.avsc").write_text(json.dumps(PERSON))
    (rt.tables_dir / "people.sql").write_text(
        "-- partitions: 2\n-- format: avro\n-- value_schema: person.avsc\n"
        f"CREATE TABLE people (id BIGINT PRIMARY KEY, name STRING, born DATE) WITH (topic='{topic}');\n")
    ensure_topic(rt.bootstrap, topic, 1)
    records = [({"id": 1, "name": "ann", "born": dt.date(1990, 5, 1)}), ({"id": 2, "name": "bob", "born": None}),
               ({"id": 3, "name": "cy", "born": dt.date(2001, 1, 31)}), ({"id": 1, "name": "ann b", "born": None})]
    values = [_avro(r, PERSON) for r in records] + [None, _avro({"id": 3, "name": "x", "born": None}, PERSON)[:-1]]
    keys = [str(r["id"]).encode() for r in records] + [b"2", b"3"]
    _produce(rt, topic, values, keys)
    assert jobs.run("people", until_caught_up=True, spark=spark, rt=rt)

    assert dead_letter_reasons(rt, "people") == {5: "malformed_avro"}
    kept = [fastavro.schemaless_reader(io.BytesIO(m.value()), fastavro.parse_schema(PERSON), None)
            for m in read_topic(rt.bootstrap, topic) if m.value() is not None and m.offset() != 5]
    latest = pd.DataFrame(kept).drop_duplicates("id", keep="last").set_index("id")
    deleted = {2}
    epoch = dt.date(1970, 1, 1)
    expected = {(int(i),): (r["name"], None if r["born"] is None or pd.isna(r["born"]) else (r["born"] - epoch).days)
                for i, r in latest.iterrows() if i not in deleted}
    state = jobs.state_rows("people", rt)
    assert {k: (v[1], v[2]) for k, v in state.items()} == expected
