"""A windowed join of two streams (issue #69; Flink's interval join, ksqlDB's stream-stream JOIN
... WITHIN): `FROM orders o [LEFT|FULL OUTER] JOIN shipments s ON o.id = s.order_id AND s.ts
BETWEEN o.ts - INTERVAL ... AND o.ts + INTERVAL ...`, and Nexmark's form whose window ends at a
column of a (`b.dateTime BETWEEN a.dateTime AND a.expires`).

Checked against pandas over the records read back with confluent-kafka: every pair whose times
fall in the window, and for an outer side each record without one whose window has closed
(its time to leave is behind the newest event time less the grace). Run as a user runs it: both
streams produced in rounds, out of order within the grace, the join run in many small batches
after each round; records behind the watermark (late), without a join key or a time, and
malformed ones are dead letters, counted by reason, never rows. Then a lost disk and a restore,
and kills at every point of the join's steps."""
from __future__ import annotations

import json
import random
from contextlib import contextmanager

import pandas as pd
import pytest

from catalog.mapping import key_names, row_of
from spark_jobs import jobs
from tests.table_env import (assert_each_batch_once_and_in_order, dead_letter_reasons, fold_change_topic,
                             isolated_runtime, port, read_topic)
from tests.test_query_api import _get, _serve

GRACE_MS, BEFORE_MS, AFTER_MS = 30_000, 5_000, 20_000
HEADER = ("-- topic: {orders}\n-- schema: id BIGINT, customer STRING, ts TIMESTAMP\n-- partitions: 3\n"
          "-- join_topic: {shipments}\n-- join_schema: order_id BIGINT, carrier STRING, ts TIMESTAMP\n"
          "-- join_grace: 30s\n")
JOINS = {    # name -> (kind, SQL)
    "shipped": ("inner", "-- output_topic: {out}\nCREATE TABLE shipped AS SELECT o.id, o.customer, s.carrier, "
                         "s.ts AS shipped_at FROM orders o JOIN shipments s ON o.id = s.order_id "
                         "AND s.ts BETWEEN o.ts - INTERVAL '5' SECOND AND o.ts + INTERVAL '20' SECOND;"),
    "orders_shipped": ("left", "CREATE TABLE orders_shipped AS SELECT o.id, o.customer, s.carrier FROM orders o "
                               "LEFT JOIN shipments s ON o.id = s.order_id AND s.ts BETWEEN o.ts - INTERVAL '5' SECOND "
                               "AND o.ts + INTERVAL '20' SECOND;"),
    "all_shipments": ("full", "CREATE TABLE all_shipments AS SELECT o.id, o.customer, s.carrier FROM orders o "
                              "FULL OUTER JOIN shipments s ON s.order_id = o.id AND o.ts BETWEEN "
                              "s.ts - INTERVAL '20' SECOND AND s.ts + INTERVAL '5' SECOND WHERE s.carrier IS NULL "
                              "OR s.carrier <> 'pigeon';"),
    # An aggregate over a left join's rows (Nexmark q4's shape): the pairs and the orders left
    # unmatched are folded into their (order, carrier) group, never stored as rows.
    "order_carriers": ("left", "-- output_topic: {out}-groups\nCREATE TABLE order_carriers AS SELECT o.id AS order_id, "
                               "s.carrier, COUNT(*) AS pairs, COUNT(s.ts) AS shipments, MAX(s.ts) AS last_shipped, "
                               "COUNT(DISTINCT o.customer) AS customers FROM orders o LEFT JOIN shipments s "
                               "ON o.id = s.order_id AND s.ts BETWEEN o.ts - INTERVAL '5' SECOND AND o.ts + INTERVAL "
                               "'20' SECOND WHERE s.carrier IS NULL OR s.carrier <> 'pigeon' GROUP BY o.id, s.carrier;"),
    # Grouped by the join key alone, so a table on it can read its change topic (by_shipments)
    "order_shipments": ("left", "-- output_topic: {out}-orders\nCREATE TABLE order_shipments AS SELECT o.id, "
                                "COUNT(s.ts) AS shipments, MAX(s.ts) AS last_shipped FROM orders o LEFT JOIN shipments s "
                                "ON o.id = s.order_id AND s.ts BETWEEN o.ts - INTERVAL '5' SECOND AND o.ts + INTERVAL "
                                "'20' SECOND GROUP BY o.id;"),
}
GROUPED = {"order_carriers", "order_shipments"}
BASE = 1_700_000_000_000


class Feed:
    """The two topics, what a user puts on them, and what pandas makes of what they hold."""

    def __init__(self, rt, suffix: str, seed: int, names=tuple(JOINS)) -> None:
        from confluent_kafka import Producer

        from ops.topics import create_topic

        self.rt, self.rng, self.clock = rt, random.Random(seed), BASE
        self.orders, self.shipments, self.out = "orders" + suffix, "shipments" + suffix, "shipped" + suffix
        self.producer = Producer({"bootstrap.servers": rt.bootstrap})
        self.names = names
        for name in names:
            (rt.tables_dir / f"{name}.sql").write_text(
                HEADER.format(orders=self.orders, shipments=self.shipments) + JOINS[name][1].format(out=self.out))
        # As a user makes them (`statetable create-topic`): both streams' topics, with the table's partitions.
        made = create_topic(names[0], rt)["topics"]
        assert [(m["topic"], m["partitions"], m["created"]) for m in made] == \
            [(self.orders, 3, True), (self.shipments, 3, True)], made
        self.late: set = set()          # (topic, value) of the records produced behind the watermark

    def send(self, topic: str, value) -> None:
        self.producer.produce(topic, value if isinstance(value, bytes) or value is None else json.dumps(value).encode())

    def round(self, orders: int = 40, span_ms: int = 20_000) -> None:
        """Orders, and shipments of some of them, out of order by up to 8 s (within the grace)."""
        start, self.clock = self.clock, self.clock + span_ms + 40_000    # the next round after this one's shipments
        events = []
        for _ in range(orders):
            order = {"id": self.rng.randrange(30), "customer": self.rng.choice(["ann", "bo", None]),
                     "ts": start + self.rng.randrange(span_ms)}
            events.append((order["ts"], self.orders, order))
            for _ in range(self.rng.choice([0, 1, 1, 2])):       # none, one, or two shipments
                shipment = {"order_id": order["id"], "carrier": self.rng.choice(["ups", "dhl", "pigeon"]),
                            "ts": order["ts"] + self.rng.randrange(-8_000, 30_000)}
                events.append((shipment["ts"], self.shipments, shipment))
        for _, topic, value in sorted(events, key=lambda e: e[0] + self.rng.randrange(8_000)):
            self.send(topic, value)
        self.producer.flush()

    def hostile(self) -> None:
        """A late record on each side, one without a join key, one without a time, a malformed one."""
        for topic, value in ((self.orders, {"id": 1, "customer": "late", "ts": self.clock - 10 * GRACE_MS}),
                             (self.shipments, {"order_id": 1, "carrier": "late", "ts": self.clock - 10 * GRACE_MS})):
            self.send(topic, value)
            self.late.add((topic, json.dumps(value)))
        self.send(self.orders, {"id": None, "customer": "nokey", "ts": self.clock})
        self.send(self.shipments, {"order_id": 2, "carrier": "notime"})
        self.send(self.shipments, b"{not json")
        self.producer.flush()

    def records(self, topic: str) -> pd.DataFrame:
        rows = []
        for msg in read_topic(self.rt.bootstrap, topic):
            try:
                value = json.loads(msg.value())
            except (TypeError, ValueError):
                continue
            key = value.get("id") if topic == self.orders else value.get("order_id")
            if (topic, json.dumps(value)) in self.late or key is None or value.get("ts") is None:
                continue
            rows.append({**value, "pos": f"{msg.partition()}:{msg.offset()}"})
        fields = ["id", "customer"] if topic == self.orders else ["order_id", "carrier"]
        return pd.DataFrame(rows, columns=[*fields, "ts", "pos"])

    def want(self, name: str) -> dict:
        """(id, "o-pos|s-pos") -> row: pandas' interval join, and the unmatched of the outer sides
        whose window has closed by the watermark (the newest event time less the grace)."""
        kind = JOINS[name][0]
        orders, shipments = self.records(self.orders), self.records(self.shipments)
        watermark = max(orders["ts"].max(), shipments["ts"].max()) - GRACE_MS
        pairs = orders.merge(shipments, left_on="id", right_on="order_id", suffixes=("_o", "_s"))
        pairs = pairs[(pairs["ts_s"] >= pairs["ts_o"] - BEFORE_MS) & (pairs["ts_s"] <= pairs["ts_o"] + AFTER_MS)]
        out = {}

        def put(key, order, shipment) -> None:
            carrier = None if shipment is None else shipment["carrier"]
            if name in ("all_shipments", "order_carriers") and carrier == "pigeon":
                return
            row = {"id": key, "rowposition": f"{'' if order is None else order['pos']}|"
                                             f"{'' if shipment is None else shipment['pos']}",
                   "customer": None if order is None else order["customer"], "carrier": carrier}
            if name == "shipped" or name in GROUPED:
                row["shipped_at"] = None if shipment is None else shipment["ts"]
            out[(row["id"], row["rowposition"])] = row

        for _, p in pairs.iterrows():
            put(int(p["id"]), {"pos": p["pos_o"], "customer": p["customer"]}, {"pos": p["pos_s"], "carrier": p["carrier"],
                                                                            "ts": int(p["ts_s"])})
        if kind in ("left", "full"):
            for _, o in orders[~orders["pos"].isin(pairs["pos_o"])].iterrows():
                if o["ts"] + AFTER_MS < watermark:
                    put(int(o["id"]), o, None)
        if kind == "full":
            for _, s in shipments[~shipments["pos"].isin(pairs["pos_s"])].iterrows():
                if s["ts"] + BEFORE_MS < watermark:
                    put(int(s["order_id"]), None, s)
        return grouped(name, out.values()) if name in GROUPED else out


def grouped(name: str, rows) -> dict:
    """order_carriers by pandas: the joined rows per (order, carrier), NULL carriers a group;
    order_shipments: per order."""
    frame = pd.DataFrame(list(rows), columns=["id", "customer", "carrier", "shipped_at"])
    if name == "order_shipments":
        return {(int(order),): {"id": int(order), "shipments": int(g["shipped_at"].notna().sum()),
                                "last_shipped": None if g["shipped_at"].isna().all() else int(g["shipped_at"].max())}
                for order, g in frame.groupby("id")}
    out = {}
    for (order, carrier), g in frame.groupby(["id", "carrier"], dropna=False):
        carrier = None if pd.isna(carrier) else carrier
        shipped = g["shipped_at"].dropna()
        out[(int(order), carrier)] = {"order_id": int(order), "carrier": carrier, "pairs": len(g),
                                      "shipments": len(shipped),
                                      "last_shipped": int(shipped.max()) if len(shipped) else None,
                                      "customers": int(g["customer"].nunique())}
    return out


def shown(rt, name: str) -> dict:
    """The table's rows as the product shows them, timestamps as epoch ms."""
    table, _ = jobs.load_table(name, rt)
    return {tuple(key): row_of(table, key, value) for key, value in jobs.state_rows(name, rt).items()}


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_a_windowed_join_of_two_streams_equals_pandas_batch_after_batch(env, spark):
    """Inner and full outer joins over the same two streams, in rounds of many small
    batches: each round's pairs appear, an outer side's unmatched records appear only once their
    window has closed, late and broken records are dead letters; then a lost disk and a restore,
    and the rounds go on from the restored state."""
    from ops import failures
    from spark_jobs.batches.planning import lag
    from spark_jobs.recompute.rebuild import rebuild
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    names = ("shipped", "all_shipments", "order_carriers", "order_shipments")   # the left join's rules: also
    # tests/unit/state and ksqlDB's cases
    feed = Feed(rt, suffix, 69, names=names)
    # A table on the join, as a user chains them: it reads the join's change topic, not its streams.
    (rt.tables_dir / "per_carrier.sql").write_text(
        "CREATE TABLE per_carrier AS SELECT carrier, COUNT(*) AS pairs, MAX(shipped_at) AS last_shipped "
        "FROM shipped GROUP BY carrier;")
    (rt.tables_dir / "by_shipments.sql").write_text(
        "CREATE TABLE by_shipments AS SELECT shipments, COUNT(*) AS orders, MIN(last_shipped) AS first_last "
        "FROM order_shipments GROUP BY shipments;")

    def check(round_no: int) -> list:
        commits = [c for name in names for c in jobs.run(name, until_caught_up=True, spark=spark, rt=rt,
                                                         max_records_per_batch=30)]
        for name in names:
            assert shown(rt, name) == feed.want(name), f"{name} after round {round_no}"
            assert lag(name, rt) == 0
        jobs.run("per_carrier", until_caught_up=True, spark=spark, rt=rt)
        rows = pd.DataFrame(list(feed.want("shipped").values()), columns=["carrier", "shipped_at"])
        want = {(c,): {"carrier": c, "pairs": len(g), "last_shipped": int(g["shipped_at"].max())}
                for c, g in rows.groupby("carrier")}
        assert shown(rt, "per_carrier") == want, f"per_carrier after round {round_no}"
        # A table on an aggregate over the join (grouped by the join key) reads its groups' change
        # topic: a group that grows moves its old contribution out, as on any table.
        jobs.run("by_shipments", until_caught_up=True, spark=spark, rt=rt)
        groups = pd.DataFrame(list(feed.want("order_shipments").values()), columns=["shipments", "last_shipped"])
        want = {(int(n),): {"shipments": int(n), "orders": len(g), "first_last": None if g["last_shipped"].isna().all()
                            else int(g["last_shipped"].min())} for n, g in groups.groupby("shipments")}
        assert shown(rt, "by_shipments") == want, f"by_shipments after round {round_no}"
        return commits

    assert check(0) == []                       # nothing produced: no batch, no rows, no error
    feed.round()
    commits = check(1)
    assert shown(rt, "shipped") and len(commits) >= 3 * len(names)       # many batches each
    feed.hostile()
    commits = check(2)
    assert sum(c.counts.get("dead_late", 0) for c in commits) == 2 * len(names)
    reasons = sorted(dead_letter_reasons(rt, "shipped", by_topic=True).values())   # two topics' offsets may meet
    assert reasons == ["late", "late", "malformed_json", "missing_event_time", "missing_key"]
    unmatched_before = {k for k in shown(rt, "all_shipments") if k[1].endswith("|")}
    feed.round()
    check(3)
    unmatched = {k for k in shown(rt, "all_shipments") if k[1].endswith("|")}
    assert unmatched > unmatched_before and {k for k in shown(rt, "all_shipments") if k[1].startswith("|")}

    folded, seen = fold_change_topic(rt.bootstrap, feed.out)
    assert_each_batch_once_and_in_order(seen)
    assert {(v["id"], v["rowposition"]) for v in folded.values()} == set(shown(rt, "shipped"))
    folded, seen = fold_change_topic(rt.bootstrap, feed.out + "-groups")     # the groups, never the pairs
    assert_each_batch_once_and_in_order(seen)
    assert {(v["order_id"], v["carrier"]): v for v in folded.values()} == shown(rt, "order_carriers")

    before = shown(rt, "all_shipments")
    failures.inject("all_shipments", "wipe_local_store", rt)
    jobs.restore("all_shipments", rt=rt)
    assert shown(rt, "all_shipments") == before
    for name in names:      # the history replayed batch by batch, late records judged as their batch did
        result = verify(name, spark=spark, rt=rt)
        assert result.ok and result.keys_compared == len(shown(rt, name)), result.summary()
    commit = rebuild("all_shipments", spark=spark, rt=rt)
    assert commit.counts["keys_changed"] == 0
    feed.round()            # the restored and rebuilt waiting records still find their partners and close
    check(4)
    # As a reader sees them: every join kind's rows, paged through `statetable serve`'s REST API,
    # equal pandas's (the pairs, an aggregate over them, a table over that aggregate).
    with contextmanager(_serve)(rt, port(28441)) as base:
        for name in ("shipped", "order_carriers", "by_shipments"):
            table, _ = jobs.load_table(name, rt)
            rows, cursor, pages = [], None, 0
            while pages == 0 or cursor:
                page = _get(base, f"/tables/{name}/rows", limit=40, times="epoch_ms",
                            **({"cursor": cursor} if cursor else {}))
                assert page.status_code == 200, page.text
                rows += page.json()["rows"]
                cursor, pages = page.json()["next_cursor"], pages + 1
            want = feed.want(name) if name != "by_shipments" else shown(rt, name)
            assert {tuple(r[k] for k in key_names(table)): r for r in rows} == want, name
            assert len(rows) == len(want) and (pages > 1 or len(rows) <= 40)
        one = next(iter(feed.want("order_carriers").values()))
        answer = _get(base, f"/tables/order_carriers/rows/{json.dumps([one['order_id'], one['carrier']])}",
                      times="epoch_ms")
        assert answer.status_code == 200 and answer.json()["row"] == one


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", ["all_shipments", "order_carriers"])
def test_a_windowed_join_of_two_streams_is_exact_after_a_kill_at_every_point_of_its_steps(kafka, engine, spark,
                                                                                          tmp_path, name):
    """The full outer join, and the aggregate over a left join, killed at each point of its steps
    (JOIN_POINTS), a round of both streams produced before every kill; then its rows and folded
    change topic equal pandas and no (key, batch) reaches the change topic twice (a group's
    pairs folded twice would count twice)."""
    from spark_jobs.recompute.verify import verify
    from tests.test_table_aggregates import JOIN_POINTS, _kill_at_every_point

    rt, suffix = isolated_runtime(kafka, tmp_path)
    feed = Feed(rt, suffix, 70, names=(name,))
    path = rt.tables_dir / f"{name}.sql"
    out = feed.out + "-groups" if name in GROUPED else feed.out
    path.write_text("-- mirror_every: 2\n-- snapshot_every: 3\n" + path.read_text().replace(
        "CREATE TABLE", f"-- output_topic: {feed.out}\nCREATE TABLE" if name not in GROUPED else "CREATE TABLE"))
    _kill_at_every_point(rt, engine, name, lambda: feed.round(orders=25), JOIN_POINTS)
    want = feed.want(name)
    assert want and shown(rt, name) == want
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert_each_batch_once_and_in_order(seen)
    if name in GROUPED:
        assert {(v["order_id"], v["carrier"]): v for v in folded.values()} == want
    else:
        assert {(v["id"], v["rowposition"]): v for v in folded.values()} == want
    result = verify(name, spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(want), result.summary()


def test_a_windowed_join_definition_says_what_it_reads_and_refuses_what_cannot_mean_anything(tmp_path):
    """Pure logic (catalog.definitions): the window, the kinds, the key, and one-line refusals."""
    from catalog.definitions import DefinitionError, input_definition, load_all

    for name, (kind, sql) in JOINS.items():
        (tmp_path / f"{name}.sql").write_text(HEADER.format(orders="o", shipments="s") + sql.format(out="out"))
    tables = load_all(tmp_path)
    full, inner = tables["all_shipments"].stream_join, tables["shipped"].stream_join
    assert (full.kind, full.lower_ms, full.upper_ms) == ("full", -5_000, 20_000)   # a.ts BETWEEN b.ts ... swapped
    assert (inner.kind, inner.lower_ms, inner.upper_ms, inner.grace_ms) == ("inner", -5_000, 20_000, 30_000)
    assert tables["shipped"].key_columns == ["id", "rowposition"] and tables["shipped"].routing_width == 1
    assert tables["shipped"].value_columns == ["id", "rowposition", "customer", "carrier", "shipped_at"]
    assert not tables["shipped"].table_join
    grouped_join = tables["order_carriers"]     # an aggregate over the join: keyed by its groups
    assert (grouped_join.kind, grouped_join.key_columns, grouped_join.routing_width) == \
        ("aggregate", ["order_id", "carrier"], 1)
    assert [(a.name, a.function, a.args) for a in grouped_join.aggregates] == [
        ("pairs", "count", ()), ("shipments", "count", ("s.ts",)), ("last_shipped", "max", ("s.ts",)),
        ("customers", "count_distinct", ("o.customer",))]
    from ops.status import shape
    assert shape(grouped_join) == "aggregate by order_id, carrier over a windowed left join of streams o and s"
    for path in tmp_path.glob("*.sql"):
        path.unlink()
    header = HEADER.format(orders="o", shipments="s")
    for sql, message in [
        ("CREATE TABLE j AS SELECT o.id FROM orders o JOIN shipments s ON o.id = s.order_id;",
         "one equality and one BETWEEN"),
        ("CREATE TABLE j AS SELECT o.id FROM orders o JOIN shipments s ON o.id = s.order_id AND s.ts BETWEEN "
         "o.ts + INTERVAL '5' SECOND AND o.ts;", "is empty"),
        ("CREATE TABLE j AS SELECT o.id FROM orders o JOIN shipments s ON o.customer = s.order_id AND s.ts BETWEEN "
         "o.ts AND o.ts + INTERVAL '5' SECOND;", "compares STRING with BIGINT"),
        ("CREATE TABLE j AS SELECT o.id FROM orders o JOIN shipments s ON o.id = s.order_id AND s.carrier BETWEEN "
         "o.ts AND o.ts;", "a join window's columns are event times"),
        ("CREATE TABLE j AS SELECT o.id FROM orders o RIGHT JOIN shipments s ON o.id = s.order_id AND s.ts BETWEEN "
         "o.ts AND o.ts;", "swap the streams"),
        ("CREATE TABLE j AS SELECT o.id, s.nothing FROM orders o JOIN shipments s ON o.id = s.order_id AND s.ts "
         "BETWEEN o.ts AND o.ts;", "unknown column s.nothing"),
        ("CREATE TABLE j AS SELECT s.carrier, COUNT(*) AS n FROM orders o JOIN shipments s ON o.id = s.order_id "
         "AND s.ts BETWEEN o.ts AND o.ts GROUP BY s.carrier, o.id;", "groups by its join key first"),
        ("CREATE TABLE j AS SELECT o.id, o.customer, COUNT(*) AS n FROM orders o JOIN shipments s ON o.id = "
         "s.order_id AND s.ts BETWEEN o.ts AND o.ts GROUP BY o.id;", "neither in GROUP BY nor aggregated"),
        ("CREATE TABLE j AS SELECT o.id, LATEST_BY_OFFSET(s.carrier) AS c FROM orders o JOIN shipments s ON o.id = "
         "s.order_id AND s.ts BETWEEN o.ts AND o.ts GROUP BY o.id;", "found in no stream's order"),
        ("CREATE TABLE j AS SELECT o.id, COUNT(*) AS n FROM orders o JOIN shipments s ON o.id = s.order_id AND "
         "s.ts BETWEEN o.ts AND o.ts GROUP BY o.id HAVING COUNT(*) > 1;", "HAVING in a join of two streams"),
    ]:
        (tmp_path / "j.sql").write_text(header + sql)
        with pytest.raises(DefinitionError, match=message) as caught:
            load_all(tmp_path)
        assert "\n" not in str(caught.value) and "'j'" in str(caught.value) or "j.sql" in str(caught.value)
    (tmp_path / "j.sql").write_text(header.replace("-- join_schema: order_id BIGINT, carrier STRING, ts TIMESTAMP\n",
                                                   "") + JOINS["shipped"][1].format(out="x"))
    with pytest.raises(DefinitionError, match="-- join_schema: field TYPE"):
        load_all(tmp_path)
    # A table on a windowed join reads its change topic; without one, the refusal says what to add.
    (tmp_path / "j.sql").write_text(header + JOINS["shipped"][1].format(out="shipped-out"))
    (tmp_path / "per_customer.sql").write_text("CREATE TABLE per_customer AS SELECT customer, COUNT(*) AS n "
                                               "FROM shipped GROUP BY customer;")
    tables = load_all(tmp_path)
    source = input_definition(tables["per_customer"], tables)
    assert (source.topic, source.stream_join, source.key_columns) == ("shipped-out", None, ["rowposition"])
    (tmp_path / "j.sql").write_text(header + JOINS["shipped"][1].replace("-- output_topic: {out}\n", ""))
    with pytest.raises(DefinitionError, match="add '-- output_topic: <topic>' to") as caught:
        load_all(tmp_path)
    assert "table 'per_customer'" in str(caught.value) and "\n" not in str(caught.value)
    (tmp_path / "per_customer.sql").unlink()
    # A table on an aggregate over the join reads it by its one key: grouped by more, it says so.
    (tmp_path / "j.sql").write_text(header + JOINS["order_carriers"][1].format(out="x"))
    (tmp_path / "per_carrier.sql").write_text("CREATE TABLE per_carrier AS SELECT carrier, COUNT(*) AS n "
                                              "FROM order_carriers GROUP BY carrier;")
    with pytest.raises(DefinitionError, match="grouped by its join key alone") as caught:
        load_all(tmp_path)
    assert "table 'per_carrier'" in str(caught.value) and "\n" not in str(caught.value)
    (tmp_path / "j.sql").write_text(header + JOINS["order_shipments"][1].format(out="x"))
    (tmp_path / "per_carrier.sql").write_text("CREATE TABLE per_carrier AS SELECT shipments, COUNT(*) AS n "
                                              "FROM order_shipments GROUP BY shipments;")
    source = input_definition(load_all(tmp_path)["per_carrier"], load_all(tmp_path))
    assert (source.kind, source.topic, source.key_columns, source.schema) == (
        "source", "x-orders", ["id"], [("id", "BIGINT"), ("shipments", "BIGINT"), ("last_shipped", "TIMESTAMP")])
    (tmp_path / "per_carrier.sql").unlink()
    # No grace at all is a choice of its own (`0s`); a grace that is not a duration is refused.
    (tmp_path / "j.sql").write_text(header.replace("30s", "0s") + JOINS["shipped"][1].format(out="x"))
    assert load_all(tmp_path)["shipped"].stream_join.grace_ms == 0
    (tmp_path / "j.sql").write_text(header.replace("30s", "-5s") + JOINS["shipped"][1].format(out="x"))
    with pytest.raises(DefinitionError, match="join_grace"):
        load_all(tmp_path)


def test_a_user_makes_both_topics_and_produces_to_each_stream_of_a_windowed_join(env, spark):
    """`statetable create-topic` and `statetable produce [--join]` (ops.topics), as a user feeds a
    join of two streams: each stream's lines reach its own topic, keyed by its join column, and
    pair; --join on a table of one topic is refused in one line."""
    from catalog.errors import UserError
    from ops.topics import create_topic, produce_lines

    rt, suffix = env
    orders, shipments = "orders" + suffix, "shipments" + suffix
    (rt.tables_dir / "shipped.sql").write_text(HEADER.format(orders=orders, shipments=shipments)
                                               + JOINS["shipped"][1].format(out="shipped" + suffix))
    assert [m["topic"] for m in create_topic("shipped", rt)["topics"]] == [orders, shipments]
    a = produce_lines("shipped", ['{"id": 7, "customer": "ann", "ts": 1700000000000}', "not json"], rt)
    b = produce_lines("shipped", ['{"order_id": 7, "carrier": "ups", "ts": 1700000004000}'], rt, join=True)
    assert (a.topic, a.records, a.not_json_objects, b.topic, b.records) == (orders, 2, 1, shipments, 1)
    keys = {m.topic(): m.key() for m in read_topic(rt.bootstrap, orders) + read_topic(rt.bootstrap, shipments)
            if m.value() != b"not json"}
    assert keys == {orders: b"[7]", shipments: b"[7]"}
    jobs.run("shipped", until_caught_up=True, spark=spark, rt=rt)
    assert [(r["id"], r["customer"], r["carrier"]) for r in shown(rt, "shipped").values()] == [(7, "ann", "ups")]
    (rt.tables_dir / "plain.sql").write_text(f"-- topic: {orders}\n-- schema: id BIGINT, customer STRING\n"
                                            "CREATE TABLE plain AS SELECT customer, COUNT(*) AS n FROM o GROUP BY customer;")
    with pytest.raises(UserError, match="--join is for a windowed join") as caught:
        produce_lines("plain", ['{"id": 1}'], rt, join=True)
    assert "\n" not in str(caught.value)


def test_a_record_whose_window_would_stay_open_for_years_is_a_dead_letter_not_a_resident(env, spark):
    """A join whose window ends at a column of a (Nexmark's auction `expires`): an `a` record
    whose end is past `-- join_max_window` goes to the dead letters as window_too_long, counted;
    one within it pairs; the bound is refused when it is not a positive duration."""
    from catalog.definitions import DefinitionError, load_all
    from ops.topics import create_topic, produce_lines

    rt, suffix = env
    orders, shipments = "due_orders" + suffix, "due_shipments" + suffix
    header = (f"-- topic: {orders}\n-- schema: id BIGINT, customer STRING, ts TIMESTAMP, due TIMESTAMP\n"
              f"-- join_topic: {shipments}\n-- join_schema: order_id BIGINT, carrier STRING, ts TIMESTAMP\n"
              "-- join_max_window: 1d\n")
    sql = ("CREATE TABLE on_time AS SELECT o.id, o.customer, s.carrier FROM orders o JOIN shipments s "
           "ON o.id = s.order_id AND s.ts BETWEEN o.ts AND o.due;")
    (rt.tables_dir / "on_time.sql").write_text(header + sql)
    create_topic("on_time", rt)
    produce_lines("on_time", ['{"id": 1, "customer": "ann", "ts": 1700000000000, "due": 1700003600000}',
                              '{"id": 2, "customer": "bob", "ts": 1700000000000, "due": "9999-12-31T00:00:00Z"}'], rt)
    produce_lines("on_time", ['{"order_id": 1, "carrier": "ups", "ts": 1700000100000}',
                              '{"order_id": 2, "carrier": "dhl", "ts": 1700000100000}'], rt, join=True)
    commits = jobs.run("on_time", until_caught_up=True, spark=spark, rt=rt)
    assert sum(c.counts.get("dead_window_too_long", 0) for c in commits) == 1
    assert sorted(dead_letter_reasons(rt, "on_time").values()) == ["window_too_long"]
    assert [(r["id"], r["carrier"]) for r in shown(rt, "on_time").values()] == [(1, "ups")]
    (rt.tables_dir / "on_time.sql").write_text(header.replace("1d", "0s") + sql)
    with pytest.raises(DefinitionError, match="join_max_window"):
        load_all(rt.tables_dir)
