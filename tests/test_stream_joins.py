"""A stream joined with a table (issue #69, Nexmark's q3, q4, q20): `FROM bid b JOIN auction a ON
b.auction = a.id WHERE b.dateTime BETWEEN a.dateTime AND a.expires`, the stream declared by the
join's `-- topic:` and `-- schema:`. Every record of the stream is a row of its own, keyed by its
position, so a bid that arrives before its auction joins when the auction comes, and an auction
that changes re-joins its bids (Flink's regular join, whose final answer Nexmark checks).

Checked against pandas over the records read back with confluent-kafka: the bids by position,
the auctions folded by key. Run in a user's order: the join before its table ever ran, then the
table alone changing, then both; with equal bids twice, a NULL foreign key, a malformed record
and a tombstone (dead letters, counted), a lost disk, verify and rebuild; then killed at every
point of the join's steps."""
from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from catalog.mapping import row_of
from spark_jobs import jobs
from tests.table_env import (assert_each_batch_once_and_in_order, current_rows, dead_letter_reasons,
                             fold_change_topic, isolated_runtime, new_table, read_topic)

AUCTION = ("CREATE TABLE auction (id BIGINT PRIMARY KEY, category BIGINT, dateTime TIMESTAMP, expires TIMESTAMP) "
           "WITH (topic='{topic}');")
BID = "-- topic: {topic}\n-- schema: auction BIGINT, price BIGINT, dateTime TIMESTAMP\n-- partitions: 3\n"
JOINS = {
    # q20's shape with q4's interval: only bids inside their auction's open window, category 10;
    # a bid under 100 is left at the read (the WHERE's part over the stream alone)
    "open_bids": ("-- output_topic: {out}\nCREATE TABLE open_bids AS SELECT b.auction, b.price, a.category "
                  "FROM bid b JOIN auction a ON b.auction = a.id "
                  "WHERE a.category = 10 AND b.price >= 100 AND b.dateTime BETWEEN a.dateTime AND a.expires;"),
    # every bid, with its auction's category when there is one
    "bid_category": ("CREATE TABLE bid_category AS SELECT b.rowposition AS rowposition, b.price, a.category "
                     "FROM bid b LEFT JOIN auction a ON b.auction = a.id;"),
    # q20's shape: a WHERE over the table's side alone, so a batch's bids join column by column
    "category_bids": ("-- output_topic: {out}-category\nCREATE TABLE category_bids AS SELECT b.auction, b.price, "
                      "a.category FROM bid b JOIN auction a ON b.auction = a.id WHERE a.category = 10;"),
}
BASE = 1_700_000_000_000


def bids_now(bootstrap: str, topic: str) -> pd.DataFrame:
    """Every good bid by its position ("partition:offset"), read back; a record that is no JSON
    object (or a tombstone) is a dead letter, no row."""
    rows = []
    for msg in read_topic(bootstrap, topic):
        try:
            value = json.loads(msg.value())
        except (TypeError, ValueError):
            continue
        rows.append({"rowposition": f"{msg.partition()}:{msg.offset()}", **value})
    return pd.DataFrame(rows, columns=["rowposition", "auction", "price", "dateTime"], dtype=object)


def expected(name: str, bids: pd.DataFrame, auctions: pd.DataFrame) -> dict:
    merged = bids.assign(_on=bids["auction"].map(lambda v: -1 if v is None else v)).merge(
        auctions.rename(columns={"id": "a_id", "dateTime": "a_time"}), left_on="_on", right_on="a_id",
        how="left" if name == "bid_category" else "inner")
    out = {}
    for _, r in merged.iterrows():
        category = None if pd.isna(r["category"]) else int(r["category"])
        if name == "open_bids":
            if category == 10 and r["price"] >= 100 and r["a_time"] <= r["dateTime"] <= r["expires"]:
                out[r["rowposition"]] = {"rowposition": r["rowposition"], "auction": int(r["auction"]),
                                         "price": int(r["price"]), "category": category}
        elif name == "category_bids":
            if category == 10:
                out[r["rowposition"]] = {"rowposition": r["rowposition"], "auction": int(r["auction"]),
                                         "price": int(r["price"]), "category": category}
        else:
            out[r["rowposition"]] = {"rowposition": r["rowposition"], "price": int(r["price"]), "category": category}
    return out


def shown(rt, name: str) -> dict:
    table, _ = jobs.load_table(name, rt)
    return {key[0]: row_of(table, key, value) for key, value in jobs.state_rows(name, rt).items()}


class Auctions:
    """The two topics and what a user puts on them."""

    def __init__(self, rt, suffix: str, seed: int) -> None:
        self.rt, self.rng = rt, random.Random(seed)
        self.auctions, self.bids, self.out = "auction" + suffix, "bid" + suffix, "open-bids" + suffix
        self.producer = new_table(rt, "auction", AUCTION.format(topic=self.auctions), self.auctions)
        from state.kafka_admin import ensure_topic

        ensure_topic(rt.bootstrap, self.bids, 3)
        for name, sql in JOINS.items():
            (rt.tables_dir / f"{name}.sql").write_text(BID.format(topic=self.bids) + sql.format(out=self.out))

    def bid(self, n: int) -> None:
        for _ in range(n):
            row = {"auction": self.rng.choice([None, *range(25)]), "price": self.rng.randrange(1000),
                   "dateTime": BASE + self.rng.randrange(100_000)}
            for _ in range(2 if self.rng.random() < 0.1 else 1):        # equal bids are two rows
                self.producer.produce(self.bids, json.dumps(row).encode())
        self.producer.flush()

    def auction(self, n: int) -> None:
        for _ in range(n):
            key = self.rng.randrange(20)
            start = BASE + self.rng.randrange(80_000)
            value = None if self.rng.random() < 0.1 else json.dumps(
                {"id": key, "category": self.rng.choice([10, 11]), "dateTime": start,
                 "expires": start + self.rng.randrange(40_000)}).encode()
            self.producer.produce(self.auctions, value, key=str(key).encode())
        self.producer.flush()

    def want(self, name: str) -> dict:
        auctions = current_rows(self.rt.bootstrap, self.auctions, ["id", "category", "dateTime", "expires"],
                                dtype=object)
        return expected(name, bids_now(self.rt.bootstrap, self.bids), auctions)


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_a_stream_joined_with_a_table_equals_pandas_in_any_order_of_arrival(env, spark):
    from ops import failures
    from spark_jobs.recompute.rebuild import rebuild
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    feed = Auctions(rt, suffix, 69)
    feed.bid(150)
    feed.producer.produce(feed.bids, b"{not json")                 # dead letters, counted, never rows
    feed.producer.produce(feed.bids, None)
    feed.producer.flush()
    feed.auction(15)

    def check(round_no: int, run_auctions: bool = True) -> list:
        if run_auctions:
            jobs.run("auction", until_caught_up=True, spark=spark, rt=rt)
        commits = {name: jobs.run(name, until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=70)
                   for name in JOINS}
        for name in JOINS:
            want = feed.want(name) if run_auctions else {
                k: {**v, "category": None} for k, v in feed.want("bid_category").items()} if name == "bid_category" \
                else {}
            assert shown(rt, name) == want, f"{name} after round {round_no}"
        return commits

    # The bids arrive before any auction ran: the inner join has no rows, the left one NULLs.
    per_table = check(0, run_auctions=False)
    commits = [c for done in per_table.values() for c in done]
    # A WHERE over the auction alone (or none) joins a batch's bids column by column; one over the
    # bid too judges them row by row (table_join._own_rows_joined): both paths are under test here.
    by_columns = {name: sum(c.counts.get("rows_joined_by_columns", 0) for c in done) for name, done in per_table.items()}
    assert by_columns["open_bids"] == 0 and by_columns["bid_category"] >= 150 and by_columns["category_bids"] >= 150
    assert len(shown(rt, "bid_category")) >= 150
    assert sum(c.counts.get("dead_malformed_json", 0) for c in commits) == len(JOINS)      # once per join table
    assert sum(c.counts.get("dead_null_value", 0) for c in commits) == len(JOINS)
    assert sorted(dead_letter_reasons(rt, "open_bids", by_partition=True).values()) == ["malformed_json", "null_value"]
    # The auctions run: the joins have no records of their own, yet their rows follow.
    check(1)
    assert shown(rt, "open_bids")
    for round_no, sides in enumerate([("auction",), ("bid",), ("bid", "auction"), ("auction",)], start=2):
        for side in sides:
            feed.auction(8) if side == "auction" else feed.bid(60)
        check(round_no)

    for name, topic in (("open_bids", feed.out), ("category_bids", feed.out + "-category")):
        folded, seen = fold_change_topic(rt.bootstrap, topic)
        assert_each_batch_once_and_in_order(seen)
        assert {json.loads(k)["rowposition"]: v for k, v in folded.items()} == shown(rt, name), name

    before = shown(rt, "open_bids")
    failures.inject("open_bids", "wipe_local_store", rt)
    jobs.restore("open_bids", rt=rt)
    assert shown(rt, "open_bids") == before
    for name in JOINS:
        result = verify(name, spark=spark, rt=rt)
        assert result.ok and result.keys_compared == len(shown(rt, name)), result.summary()
    commit = rebuild("open_bids", spark=spark, rt=rt)
    assert commit.counts["keys_changed"] == 0
    feed.auction(10)                # after a rebuild, an auction's change still finds its bids
    check(99)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name, topic", [("open_bids", ""), ("category_bids", "-category")])
def test_a_stream_join_is_exact_after_a_kill_at_every_point_of_its_steps(kafka, engine, spark, tmp_path, name, topic):
    """The join killed at each point of its steps (tests/test_table_aggregates.JOIN_POINTS), the
    auctions changing and committing before every kill; then its rows and folded change topic
    equal pandas, no (key, batch) reaches the topic twice, and verify agrees. open_bids judges
    its bids row by row, category_bids (q20's shape) joins them column by column."""
    from spark_jobs.recompute.verify import verify
    from tests.test_table_aggregates import JOIN_POINTS, _kill_at_every_point

    rt, suffix = isolated_runtime(kafka, tmp_path)
    feed = Auctions(rt, suffix, 70)
    for other in JOINS:
        if other != name:
            (rt.tables_dir / f"{other}.sql").unlink()
    (rt.tables_dir / f"{name}.sql").write_text(
        "-- mirror_every: 2\n-- snapshot_every: 3\n" + (rt.tables_dir / f"{name}.sql").read_text())
    feed.bid(700)
    feed.auction(20)

    def auctions_change() -> None:
        feed.auction(6)
        jobs.run("auction", until_caught_up=True, spark=spark, rt=rt)

    _kill_at_every_point(rt, engine, name, auctions_change, JOIN_POINTS)
    want = feed.want(name)
    assert want and shown(rt, name) == want
    folded, seen = fold_change_topic(rt.bootstrap, feed.out + topic)
    assert_each_batch_once_and_in_order(seen)
    assert {json.loads(k)["rowposition"]: v for k, v in folded.items()} == want
    result = verify(name, spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(want), result.summary()


def test_a_stream_join_definition_says_what_it_reads_and_refuses_what_cannot_mean_anything(tmp_path):
    """Pure logic (catalog.definitions): the stream's side, its key, and one-line refusals."""
    from catalog.definitions import DefinitionError, input_definition, load_all

    (tmp_path / "auction.sql").write_text(AUCTION.format(topic="auction"))
    (tmp_path / "open_bids.sql").write_text(BID.format(topic="bid") + JOINS["open_bids"].format(out="out"))
    tables = load_all(tmp_path)
    join = tables["open_bids"]
    assert join.table_join and join.key_columns == ["rowposition"] and join.topic == "bid"
    assert join.value_columns == ["rowposition", "auction", "price", "category"]
    stream = input_definition(join, tables)
    assert stream.stream and stream.value_columns == ["rowposition", "auction", "price", "dateTime"]
    for sql, message in [
        ("-- topic: bid\n-- schema: rowposition BIGINT, auction BIGINT\nCREATE TABLE j AS SELECT b.auction, "
         "a.category FROM bid b JOIN auction a ON b.auction = a.id;", "field 'rowposition' is the name of"),
        ("-- topic: bid\n-- schema: auction BIGINT\nCREATE TABLE j AS SELECT b.auction FROM bid b "
         "JOIN nothing a ON b.auction = a.id;", r"JOIN nothing AS a \(not a source table defined beside it\)"),
        ("-- topic: bid\n-- schema: auction BIGINT\n-- ttl: 1h\nCREATE TABLE j AS SELECT b.auction FROM bid b "
         "JOIN auction a ON b.auction = a.id;", "option 'ttl' does not apply"),
    ]:
        (tmp_path / "j.sql").write_text(sql)
        with pytest.raises(DefinitionError, match=message) as caught:
            load_all(tmp_path)
        assert "\n" not in str(caught.value)
