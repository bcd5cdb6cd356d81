"""The CDC pipeline as `stack up --cdc` runs it: the example `shop` database on the stack's
PostgreSQL, changed with `psql` as its users would, captured by Debezium's PostgreSQL connector
in a real Kafka Connect worker (added with `statetable cdc add`), read by the shipped example
tables (examples/shop/tables: two CDC tables, revenue per customer over the orders, and each
order joined with its customer).

The reference is the database itself: after the connector caught up, every table equals the
`SELECT ... GROUP BY` (and JOIN) the database answers, after the snapshot, after each of three
rounds of inserts, updates, deletes and primary-key changes, after the Connect worker was
SIGKILLed mid-stream and started again (it re-sends what came after its last committed offset:
the test checks it did), and after a lost local store was restored from snapshots and
changelogs, which verify then recomputes from the topics' history and finds exact."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from catalog.mapping import row_of
from catalog.runtime import Runtime
from deploy import cdc, postgres_server
from ops import failures
from spark_jobs import jobs
from spark_jobs.recompute.verify import verify
from tests.table_env import dead_letter_reasons, read_topic

TABLES = ("shop_customers", "shop_orders", "shop_revenue", "shop_order_details")


@pytest.fixture(scope="module")
def pipeline(kafka, stack_settings_):
    """PostgreSQL with the example database and a Kafka Connect worker, stopped by pid after."""
    had_postgres = postgres_server.process(stack_settings_).is_running()
    cdc.start(stack_settings_)
    try:
        cdc.wait_healthy(stack_settings_)
        yield stack_settings_
    finally:
        cdc.stop(stack_settings_)
        if not had_postgres:
            postgres_server.stop(stack_settings_)


def _cli(settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "statetable"), *args], capture_output=True, text=True,
                          env={**os.environ, **settings.as_env()}, timeout=300)


def _psql(settings, script: str) -> None:
    """Changes as a user makes them: psql on the shop database, as the stack's user."""
    done = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", settings.host,
                           "-p", str(settings.postgres_port), "-U", postgres_server.USER, "-d", "shop"],
                          input=script, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **postgres_server.client_env(settings)})
    assert done.returncode == 0, done.stderr


def _query(settings, sql: str) -> list[tuple]:
    with postgres_server.connect(settings, "shop") as conn:
        return conn.execute(sql).fetchall()


def _round(rng: random.Random, number: int, order_ids: list[int]) -> str:
    """Inserts, updates (amount, status, customer), deletes and primary-key changes, some in
    one transaction together, some alone."""
    lines, ids, next_id = [], list(order_ids), max(order_ids) + 1
    for _ in range(30):
        roll = rng.random()
        if roll < 0.35 or len(ids) < 5:
            lines.append(f"INSERT INTO orders (id, customer_id, amount, status, placed_at) VALUES ({next_id}, "
                         f"{rng.randint(1, 5)}, {rng.randint(100, 99999) / 100}, 'placed', "
                         f"'2026-12-0{number + 1} 10:{rng.randint(0, 59):02d}:00');")
            ids.append(next_id)
            next_id += 1
        elif roll < 0.7:
            change = rng.choice([f"amount = {rng.randint(100, 99999) / 100}", "status = 'paid'",
                                 f"customer_id = {rng.randint(1, 5)}"])
            lines.append(f"UPDATE orders SET {change} WHERE id = {rng.choice(ids)};")
        elif roll < 0.88:
            gone = rng.choice(ids)
            ids.remove(gone)
            lines.append(f"DELETE FROM orders WHERE id = {gone};")
        else:
            old = rng.choice(ids)
            ids.remove(old)
            ids.append(next_id + 500)
            lines.append(f"UPDATE orders SET id = {next_id + 500} WHERE id = {old};")
            next_id += 501
    lines.insert(10, "BEGIN;")
    lines.insert(20, "COMMIT;")
    lines.append(f"UPDATE customers SET name = 'Grace {number}' WHERE id = 2;")
    return "\n".join(lines)


def _caught_up(settings, marker: str, timeout: float = 120.0) -> None:
    """Until the connector wrote the round's last change (a customer renamed to `marker`, committed
    after every other change of the round), and the orders topic then stopped growing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = {json.loads(m.value())["after"]["name"] for m in read_topic(settings.kafka_bootstrap,
                                                                             "shop.public.customers")
                 if m.value() and json.loads(m.value()).get("after")}
        if marker in names:
            before = len(read_topic(settings.kafka_bootstrap, "shop.public.orders"))
            time.sleep(1.0)
            if len(read_topic(settings.kafka_bootstrap, "shop.public.orders")) == before:
                return
        time.sleep(0.5)
    raise AssertionError(f"the connector did not write {marker!r} in {timeout:.0f}s; see {cdc.process(settings).log_file}")


def _rows(rt, table: str) -> dict:
    loaded = jobs.load_table(table, rt)[0]
    return {k[0]: row_of(loaded, k, v) for k, v in jobs.state_rows(table, rt).items()}


def _assert_equals_database(settings, rt, when: str) -> None:
    orders = {r[0]: (r[1], r[2], r[3], r[4]) for r in _query(
        settings, "SELECT id, customer_id, amount::float8, status, "
                  "(extract(epoch FROM placed_at) * 1000)::bigint FROM orders")}
    got = {k: (r["customer_id"], r["amount"], r["status"], r["placed_at"]) for k, r in _rows(rt, "shop_orders").items()}
    assert got == orders, when
    customers = {r[0]: (r[1], r[2]) for r in _query(settings, "SELECT id, name, country FROM customers")}
    assert {k: (r["name"], r["country"]) for k, r in _rows(rt, "shop_customers").items()} == customers, when
    revenue = {r[0]: (r[1], r[2]) for r in _query(
        settings, "SELECT customer_id, COUNT(*), SUM(amount)::float8 FROM orders GROUP BY customer_id")}
    got = _rows(rt, "shop_revenue")
    assert set(got) == set(revenue), when
    for customer, (count, total) in revenue.items():
        assert (got[customer]["orders"], got[customer]["revenue"]) == (count, pytest.approx(total)), (when, customer)
    joined = {r[0]: (r[1], r[2], r[3], r[4]) for r in _query(
        settings, "SELECT o.id, o.customer_id, o.amount::float8, c.name, c.country FROM orders o "
                  "LEFT JOIN customers c ON c.id = o.customer_id")}
    got = {k: (r["customer_id"], r["amount"], r["name"], r["country"])
           for k, r in _rows(rt, "shop_order_details").items()}
    assert got == joined, when


def _run_all(rt, spark) -> None:
    for table in TABLES:
        jobs.run(table, until_caught_up=True, spark=spark, rt=rt)


def test_a_database_through_debezium_equals_its_tables_after_rounds_a_killed_worker_and_a_restore(
        pipeline, spark, tmp_path):
    settings = pipeline
    added = _cli(settings, "cdc", "add", "shop", "public.customers", "public.orders")
    assert added.returncode == 0, added.stderr
    assert "connector shop: RUNNING" in added.stdout, added.stdout
    assert _cli(settings, "cdc", "list").stdout.split() == ["shop"]
    status = _cli(settings, "stack", "status").stdout
    assert f"kafka-connect {settings.cdc_url} up (connectors: shop)" in status, status
    # The connector's config as Connect's REST API shows it to anyone: no password in it.
    shown = json.loads(subprocess.run(["curl", "-s", f"{settings.cdc_url}/connectors/shop/config"],
                                      capture_output=True, text=True).stdout)
    assert shown["database.password"].startswith("${file:") and \
        postgres_server.cdc_password(settings) not in json.dumps(shown)

    tables = tmp_path / "tables"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "shop" / "tables", tables)
    rt = Runtime(bootstrap=settings.kafka_bootstrap, data_dir=tmp_path / "data",
                 snapshot_uri=str(tmp_path / "data" / "snapshots"), tables_dir=tables,
                 namespace=f"ns{uuid.uuid4().hex[:8]}.")
    rng = random.Random(68)

    _psql(settings, "UPDATE customers SET name = 'Grace snapshot' WHERE id = 2;")
    _caught_up(settings, "Grace snapshot")
    _run_all(rt, spark)
    _assert_equals_database(settings, rt, "after the snapshot")

    for number in range(1, 4):
        ids = [r[0] for r in _query(settings, "SELECT id FROM orders")]
        _psql(settings, _round(rng, number, ids))
        _caught_up(settings, f"Grace {number}")
        _run_all(rt, spark)
        _assert_equals_database(settings, rt, f"after round {number}")

    # SIGKILL the worker while changes stream in; start it again; it sends again what came after
    # its last committed offset.
    def stream():
        _psql(settings, "\n".join(f"UPDATE orders SET amount = amount + 1 WHERE id = (SELECT min(id) FROM orders "
                                  f"WHERE id % 7 = {i % 7}); SELECT pg_sleep(0.03);" for i in range(200)))

    writer = threading.Thread(target=stream)
    writer.start()
    time.sleep(3.0)
    assert cdc.kill(settings)
    time.sleep(1.0)
    cdc.start(settings)
    cdc.wait_healthy(settings)
    cdc.wait_running(settings, "shop")
    writer.join(timeout=120)
    assert not writer.is_alive()
    _psql(settings, "UPDATE customers SET name = 'Grace restarted' WHERE id = 2;")
    _caught_up(settings, "Grace restarted")
    events = [(m.key(), json.loads(m.value())["source"]["lsn"], json.loads(m.value())["op"])
              for m in read_topic(settings.kafka_bootstrap, "shop.public.orders") if m.value()]
    resent = sum(n - 1 for n in Counter(events).values() if n > 1)
    assert resent > 0, "the killed worker sent nothing again: the drill proved nothing about duplicates"
    _run_all(rt, spark)
    _assert_equals_database(settings, rt, f"after the worker was killed and {resent} events came again")

    # A lost local store: restored from snapshots and changelogs, then verified against the
    # topics' history.
    for table in ("shop_orders", "shop_revenue"):
        failures.inject(table, "wipe_local_store", rt)
        jobs.restore(table, rt=rt)
    _assert_equals_database(settings, rt, "after the wipe-and-restore")
    for table in ("shop_orders", "shop_revenue"):
        result = verify(table, spark=spark, rt=rt)
        assert result.ok, (table, result.summary())
    assert not dead_letter_reasons(rt, "shop_orders") and not dead_letter_reasons(rt, "shop_customers")

    # Removing the connector leaves no replication slot holding the write-ahead log.
    removed = _cli(settings, "cdc", "remove", "shop")
    assert removed.returncode == 0, removed.stderr
    assert _query(settings, "SELECT slot_name FROM pg_replication_slots") == []
    assert _query(settings, "SELECT pubname FROM pg_publication") == []
