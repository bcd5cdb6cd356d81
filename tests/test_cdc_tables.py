"""A database table's change events as Debezium writes them (the shapes its PostgreSQL connector
3.6.1 wrote in the spike of issue #68: op r/c/u/d, before/after, a tombstone after each delete, a
primary-key change as a delete and an insert, with and without JsonConverter's embedded schemas)
into a source table (`-- format: debezium-json`), and an aggregate over it: revenue per customer.

The reference is the test's own model of the database (a dict of rows it changed), as
`SELECT customer_id, COUNT(*), SUM(amount) ... GROUP BY customer_id` on the source database would
answer. After each of three rounds of inserts, updates, deletes and key changes both tables equal
it; then the last events are sent again, as a connector restarted from its last committed offset
re-sends them, and nothing changes."""
from __future__ import annotations

import json
import random

import pytest

from catalog.mapping import row_of
from spark_jobs import jobs
from tests.table_env import dead_letter_reasons, isolated_runtime, new_table

ORDERS = ("-- format: debezium-json\n-- partitions: 2\n"
          "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT, amount DOUBLE, placed_at TIMESTAMP) "
          "WITH (topic='{topic}');")
REVENUE = ("-- partitions: 2\nCREATE TABLE revenue AS SELECT customer_id, COUNT(*) AS orders, SUM(amount) AS total "
           "FROM orders GROUP BY customer_id;")
SCHEMA_AFTER = {"type": "struct", "optional": True, "field": "after", "name": "shop.public.orders.Value", "fields": [
    {"type": "int32", "optional": False, "field": "id"}, {"type": "int32", "optional": True, "field": "customer_id"},
    {"type": "double", "optional": True, "field": "amount"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1,
     "field": "placed_at"}]}


class Database:
    """The test's model of the source table, and the events Debezium would write for its changes."""

    def __init__(self, schemas: bool) -> None:
        self.rows: dict[int, dict] = {}
        self.events: list[tuple[bytes, bytes | None]] = []
        self.schemas = schemas

    def _key(self, row_id: int) -> bytes:
        key = {"id": row_id}
        if self.schemas:
            key = {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                   "payload": key}
        return json.dumps(key).encode()

    def _wire(self, row: dict | None) -> dict | None:
        if row is None or not self.schemas:
            return row
        return {**row, "placed_at": row["placed_at"] * 1000}          # MicroTimestamp

    def _event(self, op: str, before: dict | None, after: dict | None, row_id: int) -> None:
        payload = {"before": self._wire(before), "after": self._wire(after), "op": op, "ts_ms": 1796222226731,
                   "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "shop", "db": "shop",
                              "schema": "public", "table": "orders", "snapshot": "false"}}
        value = {"schema": {"type": "struct", "fields": [SCHEMA_AFTER, {**SCHEMA_AFTER, "field": "before"}]},
                 "payload": payload} if self.schemas else payload
        self.events.append((self._key(row_id), json.dumps(value).encode()))

    def upsert(self, row: dict, snapshot: bool = False) -> None:
        before = self.rows.get(row["id"])
        self.rows[row["id"]] = row
        self._event("r" if snapshot else "u" if before else "c", before, row, row["id"])

    def delete(self, row_id: int) -> None:
        before = self.rows.pop(row_id)
        self._event("d", before, None, row_id)
        self.events.append((self._key(row_id), None))              # the tombstone that follows a delete

    def change_key(self, row_id: int, new_id: int) -> None:
        row = {**self.rows[row_id], "id": new_id}
        self.delete(row_id)
        self.upsert(row)

    def revenue(self) -> dict:
        out: dict[int, dict] = {}
        for row in self.rows.values():
            group = out.setdefault(row["customer_id"], {"customer_id": row["customer_id"], "orders": 0, "total": 0.0})
            group["orders"] += 1
            group["total"] += row["amount"]
        return out


def _round(db: Database, rng: random.Random, first: bool) -> None:
    if first:
        for row_id in range(1, 41):
            db.upsert({"id": row_id, "customer_id": rng.randint(1, 6), "amount": round(rng.uniform(1, 100), 2),
                       "placed_at": 1_795_683_660_000 + row_id * 1000}, snapshot=True)
        return
    for _ in range(25):
        roll, ids = rng.random(), sorted(db.rows)
        if roll < 0.35 or not ids:
            row_id = max(db.rows, default=0) + rng.randint(1, 3)
            db.upsert({"id": row_id, "customer_id": rng.randint(1, 6), "amount": round(rng.uniform(1, 100), 2),
                       "placed_at": 1_795_683_700_000 + row_id})
        elif roll < 0.7:
            row = dict(db.rows[rng.choice(ids)])
            row.update(rng.choice([{"amount": round(rng.uniform(1, 100), 2)}, {"customer_id": rng.randint(1, 6)}]))
            db.upsert(row)
        elif roll < 0.88:
            db.delete(rng.choice(ids))
        else:
            db.change_key(rng.choice(ids), max(db.rows) + 100)


# Debezium's events as Confluent's AvroConverter registers them: the Envelope with the row record in
# before/after (declared once, named the second time), Connect's type names on the fields.
AVRO_ROW = {"type": "record", "name": "Value", "fields": [
    {"name": "id", "type": "int"}, {"name": "customer_id", "type": ["null", "int"], "default": None},
    {"name": "amount", "type": ["null", "double"], "default": None},
    {"name": "placed_at", "type": ["null", {"type": "long", "connect.version": 1,
                                            "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None}]}
AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.orders", "fields": [
    {"name": "before", "type": ["null", AVRO_ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": n, "type": "string"} for n in
                                           ("version", "connector", "name", "db", "schema", "table", "snapshot")]}},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
AVRO_KEY = {"type": "record", "name": "Key", "namespace": "shop.public.orders", "fields": [{"name": "id", "type": "int"}]}


def _avro_wire(registry: str, topic: str):
    """(key, value) JSON events -> the same events as AvroConverter writes them, through the registry."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry, "timeout": 30})
    conf = {"subject.name.strategy.type": "TOPIC"}
    keys, values = AvroSerializer(client, json.dumps(AVRO_KEY), conf=conf), \
        AvroSerializer(client, json.dumps(AVRO_ENVELOPE), conf=conf)

    def wire(key: bytes, value: bytes | None) -> tuple[bytes, bytes | None]:
        event = json.loads(value) if value is not None else None
        if event is not None:
            for side in ("before", "after"):
                if event.get(side):
                    event[side] = {**event[side], "placed_at": event[side]["placed_at"] * 1000}   # MicroTimestamp
        return (keys(json.loads(key), SerializationContext(topic, MessageField.KEY)),
                None if event is None else values(event, SerializationContext(topic, MessageField.VALUE)))
    return wire


@pytest.mark.parametrize("schemas", [False, True, "avro"], ids=["plain", "embedded-schemas", "avro"])
def test_a_cdc_table_and_an_aggregate_over_it_equal_the_database_after_each_round_and_after_resent_events(
        kafka, spark, tmp_path, request, schemas):
    rt, suffix = isolated_runtime(kafka, tmp_path)
    topic = f"shop.public.orders{suffix}"
    declared = ORDERS.format(topic=topic)
    wire = None
    if schemas == "avro":
        declared = declared.replace("debezium-json", "debezium-avro-confluent")
        wire = _avro_wire(request.getfixturevalue("registry"), topic)
    producer = new_table(rt, "orders", declared, topic)
    (rt.tables_dir / "revenue.sql").write_text(REVENUE)
    db, rng, sent = Database(schemas is True), random.Random(68), 0

    def send(events):
        for key, value in events:
            partition = json.loads(key).get("payload", json.loads(key))["id"] % 2
            if wire is not None:
                key, value = wire(key, value)
            producer.produce(topic, value, key=key, partition=partition)
        assert producer.flush(30) == 0

    def check(when: str):
        jobs.run("orders", until_caught_up=True, spark=spark, rt=rt)
        jobs.run("revenue", until_caught_up=True, spark=spark, rt=rt)
        orders = jobs.load_table("orders", rt)[0]
        rows = {k[0]: row_of(orders, k, v) for k, v in jobs.state_rows("orders", rt).items()}
        assert {k: (r["customer_id"], r["amount"], r["placed_at"]) for k, r in rows.items()} == \
            {k: (r["customer_id"], r["amount"], r["placed_at"]) for k, r in db.rows.items()}, when
        revenue = jobs.load_table("revenue", rt)[0]
        got = {k[0]: row_of(revenue, k, v) for k, v in jobs.state_rows("revenue", rt).items()}
        expected = db.revenue()
        assert set(got) == set(expected), when
        for group, row in expected.items():
            assert got[group]["orders"] == row["orders"] and got[group]["total"] == pytest.approx(row["total"]), \
                (when, group)

    for number in range(3):
        _round(db, rng, first=number == 0)
        send(db.events[sent:])
        sent = len(db.events)
        check(f"after round {number + 1}")
    send(db.events[-30:])                 # a connector restarted from its last committed offset
    check("after the last 30 events came again")
    if wire is None:
        send([(db._key(9999), b'{"op": "t", "before": null, "after": null}'), (db._key(9998), b"[1, 2]")])
        check("a truncate and a stray value change nothing")
        dead = set(dead_letter_reasons(rt, "orders").values())
        assert dead == {"truncate_not_applied", "not_a_change_event"}, dead
        return
    # In Avro: a truncate, a damaged value, a key that is not in the wire format, a key whose schema
    # id the registry does not know.
    truncate = wire(db._key(9999), json.dumps({"before": None, "after": None, "op": "t", "ts_ms": 1,
                                               "source": db.events[0] and json.loads(db.events[0][1])["source"]}))
    good_key, good_value = wire(db._key(1), db.events[0][1])
    producer.produce(topic, truncate[1], key=truncate[0], partition=1)
    producer.produce(topic, good_value[:-3], key=good_key, partition=1)
    producer.produce(topic, good_value, key=b'{"id": 1}', partition=1)
    producer.produce(topic, good_value, key=b"\x00\x00\x00\x7f\x7f\x02", partition=1)
    producer.produce(topic, None, key=b"\x00\x00\x00\x7f\x7f\x02", partition=1)
    assert producer.flush(30) == 0
    check("a truncate, a damaged value and unreadable keys change nothing")
    dead = sorted(dead_letter_reasons(rt, "orders").values())
    assert dead == sorted(["truncate_not_applied", "malformed_avro", "key_not_wire_format", "key_unknown_schema_id",
                           "key_unknown_schema_id"]), dead
