"""Joins of two tables (issue #33): a foreign-key join (`ON o.cust = c.id`) and a primary-key join
(`ON o.id = n.id`), inner and left, with changes and deletes on both sides, in separate batches
and in the same one; after every round each join table equals a pandas merge of the two tables'
current rows (their topics read back with confluent-kafka and folded by key). Run in a user's
order: the joins before the joined tables ever ran, then the joined tables alone changing."""
from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from catalog.mapping import row_of
from spark_jobs import jobs
from tests.table_env import (assert_each_batch_once_and_in_order, current_rows, fold_change_topic, isolated_runtime,
                             new_table)

SOURCES = {
    "orders": "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount BIGINT) WITH (topic='{topic}');",
    "customers": "CREATE TABLE customers (id BIGINT PRIMARY KEY, tier STRING) WITH (topic='{topic}');",
    "notes": "CREATE TABLE notes (id BIGINT PRIMARY KEY, note STRING) WITH (topic='{topic}');",
}
JOINS = {   # name -> (SQL, right table, left column, right column, how, output columns)
    "orders_tier": ("SELECT o.id, o.amount, c.tier FROM orders o JOIN customers c ON o.cust = c.id",
                    "customers", "cust", "inner", ["id", "amount", "tier"]),
    "orders_tier_left": ("SELECT o.id, o.cust AS customer, c.tier FROM orders o LEFT JOIN customers c ON o.cust = c.id",
                         "customers", "cust", "left", ["id", "cust", "tier"]),
    "orders_note": ("SELECT o.id, o.amount, n.note FROM orders o JOIN notes n ON o.id = n.id",
                    "notes", "id", "inner", ["id", "amount", "note"]),
    "orders_note_left": ("SELECT o.id, n.note, o.amount FROM orders o LEFT JOIN notes n ON n.id = o.id",
                         "notes", "id", "left", ["id", "note", "amount"]),
    # WHERE over both sides of the joined row: a change on either side adds or deletes the row
    "orders_gold": ("SELECT o.id, o.amount, c.tier FROM orders o LEFT JOIN customers c ON o.cust = c.id "
                    "WHERE o.amount > 30 AND (c.tier = 'gold' OR c.tier IS NULL)",
                    "customers", "cust", "left", ["id", "amount", "tier"]),
}
OUTPUT_NAMES = {"orders_tier_left": ["id", "customer", "tier"]}
WHERE = {"orders_gold": lambda row: row["amount"] > 30 and row["tier"] in ("gold", None)}


def expected(name: str, frames: dict) -> dict:
    _, right, on, how, columns = JOINS[name]
    a = frames["orders"]
    b = frames[right].rename(columns={c: f"r_{c}" for c in frames[right].columns})
    a = a.assign(_on=a[on].map(lambda v: -1 if v is None else v))      # a NULL key matches nothing
    merged = a.merge(b, left_on="_on", right_on="r_id", how=how)
    names = OUTPUT_NAMES.get(name, columns)
    out = {}
    for _, row in merged.iterrows():
        values = [row[c] if c in a.columns and c not in ("tier", "note") else row.get(f"r_{c}") for c in columns]
        shown = {n: (None if v is None or (isinstance(v, float) and pd.isna(v)) else v) for n, v in zip(names, values)}
        if WHERE.get(name, bool)(shown):
            out[int(row["id"])] = shown
    return out


def shown(rt, name: str) -> dict:
    table, _ = jobs.load_table(name, rt)
    return {key[0]: row_of(table, key, value) for key, value in jobs.state_rows(name, rt).items()}


def gold_stage_orders(rt) -> set:
    """The orders orders_gold's rows stage holds (its a-rows, not the index entries)."""
    from catalog.registry import stage_tables

    table, _ = jobs.load_table("orders_gold", rt)
    own, stage = stage_tables(table, rt)
    own.close()
    held = set()
    try:
        for p in range(table.partitions):
            if stage.has_local_state(p):
                part = stage.open_readonly(p)
                try:
                    held.update(key[0] for key, _ in part.items() if len(key) == 1)
                finally:
                    part.close()
    finally:
        stage.close()
    return held


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_joins_of_tables_equal_a_pandas_merge_after_every_round_of_changes_on_either_side(env, spark):
    from ops import failures
    from spark_jobs.recompute.rebuild import rebuild
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topics = {name: name + suffix for name in SOURCES}
    producers = {name: new_table(rt, name, sql.format(topic=topics[name]), topics[name])
                 for name, sql in SOURCES.items()}
    out = "orders-tier-left" + suffix
    for name, (sql, *_rest) in JOINS.items():
        options = f"-- partitions: 3\n-- output_topic: {out}\n" if name == "orders_tier_left" else "-- partitions: 3\n"
        (rt.tables_dir / f"{name}.sql").write_text(f"{options}CREATE TABLE {name} AS {sql};")
    columns = {"orders": ["id", "cust", "amount"], "customers": ["id", "tier"], "notes": ["id", "note"]}
    live = {name: {} for name in SOURCES}
    rng = random.Random(33)

    def put(name: str, row: dict) -> None:
        live[name][row["id"]] = row
        producers[name].produce(topics[name], json.dumps(row).encode(), key=str(row["id"]).encode())

    def delete(name: str, key: int) -> None:
        live[name].pop(key, None)
        producers[name].produce(topics[name], None, key=str(key).encode())

    def change(name: str, n: int) -> None:
        for _ in range(n):
            if live[name] and rng.random() < 0.25:
                delete(name, rng.choice(sorted(live[name])))
            elif name == "orders":
                put(name, {"id": rng.randrange(80), "cust": rng.choice([None, *range(12)]),
                           "amount": rng.randrange(100)})
            elif name == "customers":
                put(name, {"id": rng.randrange(12), "tier": rng.choice(["gold", "silver", None])})
            else:
                put(name, {"id": rng.randrange(80), "note": rng.choice(["late", "gift", "vip"])})
        producers[name].flush()

    def check(round_no: int, run_sources: bool = True) -> None:
        if run_sources:
            for source in ("customers", "notes"):
                jobs.run(source, until_caught_up=True, spark=spark, rt=rt)
        for name in JOINS:
            jobs.run(name, until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=100)
        # The two tables' states: a joined table that never ran has no rows yet.
        frames = {name: current_rows(rt.bootstrap, topics[name], columns[name], dtype=object)
                  if run_sources or name == "orders" else pd.DataFrame([], columns=columns[name], dtype=object)
                  for name in SOURCES}
        for name in JOINS:
            assert shown(rt, name) == expected(name, frames), f"{name} after round {round_no}"

    # A user's order: orders and its joins run before customers or notes ever ran.
    change("orders", 60)
    change("customers", 10)
    change("notes", 30)
    check(0, run_sources=False)
    assert shown(rt, "orders_tier") == {} and shown(rt, "orders_note") == {}
    assert all(row["tier"] is None for row in shown(rt, "orders_tier_left").values())
    # The joined tables run; the joins have no records of their own, yet their rows follow.
    check(1)
    assert shown(rt, "orders_tier")
    for round_no, sides in enumerate([("orders",), ("customers",), ("notes",), ("orders", "customers", "notes"),
                                      ("customers",), ("orders", "customers")], start=2):
        for side in sides:
            change(side, rng.randint(10, 40))
        if round_no == 5:           # a customer many orders point at goes, in the batch that moves orders to it
            target = max(live["customers"], key=lambda c: sum(o["cust"] == c for o in live["orders"].values()))
            delete("customers", target)
            producers["customers"].flush()
        check(round_no)

    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert_each_batch_once_and_in_order(seen)
    assert {json.loads(k)["id"]: v for k, v in folded.items()} == shown(rt, "orders_tier_left")

    # The batches kept only the orders that can pass the WHERE's own part (amount > 30) in the stage.
    assert gold_stage_orders(rt) == {i for i, row in live["orders"].items() if row["amount"] > 30}
    # Lost disks: restored from snapshots and changelogs, then verify against a recomputation.
    for name in ("orders_tier", "orders_note_left", "orders_gold"):
        before = shown(rt, name)
        failures.inject(name, "wipe_local_store", rt)
        jobs.restore(name, rt=rt)
        assert shown(rt, name) == before
        result = verify(name, spark=spark, rt=rt)
        assert result.ok and result.keys_compared == len(before), result.summary()
    # A rebuild rewrites both stages; later changes still find their rows through the index. The
    # rows stage of orders_gold keeps only the orders with amount > 30 (the WHERE's own part of
    # orders), as its batches left it: the rebuild changes no key of the table.
    for name in ("orders_tier", "orders_gold"):
        commit = rebuild(name, spark=spark, rt=rt)
        assert commit.counts["keys_changed"] == 0, name
    assert gold_stage_orders(rt) == {i for i, row in live["orders"].items() if row["amount"] > 30}
    change("customers", 20)
    check(99)


@pytest.mark.parametrize("sql, message", [
    ("SELECT c.id, o.amount FROM customers c JOIN orders o ON c.tier = o.id",
     r"c.tier = o.id compares STRING with BIGINT, so no row would match; declare c.tier as BIGINT"),
    ("SELECT o.id, c.tier FROM orders o JOIN customers c ON o.cust = c.tier",
     r"ON o.<column> = c.id \(b's primary key\)"),
    ("SELECT o.amount, c.tier FROM orders o JOIN customers c ON o.cust = c.id",
     r"SELECT o.id \(under its own name\): the rows of a join of tables have orders's key"),
    ("SELECT o.id, c.tier FROM orders o JOIN customers c ON o.cust = c.id WHERE amount > 3",
     r"amount \(columns are named alias.column, aliases \['c', 'o'\]\) is not supported"),
    ("SELECT o.id, c.tier FROM orders o JOIN customers c ON o.cust = c.id WHERE o.amount > 3 HAVING c.tier = 'x'",
     r"HAVING in a join of tables is not supported"),
    ("SELECT o.id, c.tier FROM orders o JOIN customers c ON o.cust = c.id WHERE o.note = 'x'",
     r"unknown column o.note"),
    ("SELECT o.id, c.tier FROM orders o JOIN customers c ON o.cust = c.id WHERE REGEXP_LIKE(c.tier, 'g.*')",
     r"table 'j': WHERE c.tier RLIKE 'g.\*': c.tier RLIKE 'g.\*' is not supported in a join's WHERE"),
    ("SELECT o.id, c.nope FROM orders o JOIN customers c ON o.cust = c.id",
     r"unknown column c.nope: table 'customers' has columns \['id', 'tier'\]"),
    ("SELECT o.id, n.x FROM orders o JOIN nothing n ON o.cust = n.id",
     r"JOIN nothing AS n \(not a source table defined beside it\)|JOIN nothing n \(not a source table"),
])
def test_a_join_of_tables_that_cannot_mean_anything_fails_in_one_line(tmp_path, sql, message):
    from catalog.definitions import DefinitionError, load_all

    for name, text in SOURCES.items():
        (tmp_path / f"{name}.sql").write_text(text.format(topic=name))
    (tmp_path / "j.sql").write_text(f"CREATE TABLE j AS {sql};")
    with pytest.raises(DefinitionError, match=message) as caught:
        load_all(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_joined_row_and_the_keys_a_pin_changed_are_what_sql_says(tmp_path):
    """Pure logic (spark_jobs.steps.table_join): the joined row of an a-row for inner and left joins, a
    NULL foreign key matching nothing, and b's changed keys between two pins (added, changed and
    deleted, not the unchanged)."""
    from catalog.definitions import load_all
    from spark_jobs.steps.table_join import JoinShape, changed_keys

    for name, text in SOURCES.items():
        (tmp_path / f"{name}.sql").write_text(text.format(topic=name))
    for name, (sql, *_rest) in JOINS.items():
        (tmp_path / f"{name}.sql").write_text(f"CREATE TABLE {name} AS {sql};")
    tables = load_all(tmp_path)
    inner = JoinShape(tables["orders_tier"], tables["orders"], tables["customers"])
    left = JoinShape(tables["orders_tier_left"], tables["orders"], tables["customers"])
    b_rows = {7: (7, "gold")}
    assert inner.row((1, 7, 50), b_rows) == (1, 50, "gold")
    assert inner.row((1, 8, 50), b_rows) is None and inner.row((1, None, 50), b_rows) is None
    assert left.row((1, 8, 50), b_rows) == (1, 8, None) and left.row((1, None, 50), b_rows) == (1, None, None)
    assert left.row(None, b_rows) is None
    # WHERE over both sides, NULL as SQL has it: a left join's missing b passes only `IS NULL`
    gold = JoinShape(tables["orders_gold"], tables["orders"], tables["customers"])
    assert gold.row((1, 7, 50), b_rows) == (1, 50, "gold") and gold.row((1, 7, 30), b_rows) is None
    assert gold.row((1, 8, 50), b_rows) == (1, 50, None) and gold.row((1, 7, 50), {7: (7, "silver")}) is None
    assert gold.row((1, 7, None), b_rows) is None
    assert changed_keys({1: (1, "a"), 2: (2, "b"), 3: (3, "c")}, {1: (1, "a"), 2: (2, "x"), 4: (4, "d")}) == [2, 3, 4]


def _orders_joined_where(tmp_path, where: str) -> dict:
    """The tables of a folder with orders, customers and notes and `j`: orders joined with
    customers under `where`."""
    from catalog.definitions import load_all

    for name, text in SOURCES.items():
        (tmp_path / f"{name}.sql").write_text(text.format(topic=name))
    (tmp_path / "j.sql").write_text("CREATE TABLE j AS SELECT o.id, c.tier FROM orders o JOIN customers c "
                                    f"ON o.cust = c.id WHERE {where};")
    return load_all(tmp_path)


@pytest.mark.parametrize("where, kept, dropped", [
    ("o.amount > 30 AND (c.tier = 'gold' OR c.tier IS NULL)", [(1, 7, 31)], [(1, 7, 30), (1, 7, None)]),
    ("o.amount > 30 AND o.cust IS NOT NULL AND c.tier = 'gold'", [(1, 7, 31)], [(1, None, 31), (1, 7, 3)]),
    ("(o.amount > 30 OR o.cust = 2) AND c.tier = 'gold'", [(1, 2, 3), (1, 7, 31)], [(1, 7, 3)]),
    # a part over both sides, or none over a alone: every a-row is kept
    ("o.amount > 30 OR c.tier = 'gold'", [(1, 7, 3), (1, 7, None)], []),
    ("c.tier = 'gold'", [(1, 7, 3)], []),
])
def test_the_rows_stage_keeps_the_a_rows_the_where_s_own_part_of_a_passes(tmp_path, where, kept, dropped):
    """Pure logic (table_stages.a_rows_kept): only a conjunct of the WHERE over a's columns alone
    decides which a-rows the stage keeps; NULL fails it, as the joined row's WHERE would."""
    from spark_jobs.steps.table_stages import a_rows_kept

    tables = _orders_joined_where(tmp_path, where)
    test = a_rows_kept(tables["j"], tables["orders"])
    if not dropped:
        assert test is None
        return
    assert [test(row) for row in kept + dropped] == [True] * len(kept) + [False] * len(dropped)


@pytest.mark.parametrize("where, spark_sql", [
    ("o.amount > 30 AND (c.tier = 'gold' OR c.tier IS NULL)", "(_v2 > 30)"),
    ("o.amount > 30 AND o.cust IS NOT NULL AND c.tier = 'gold'", "(_v2 > 30) AND (NOT _v1 IS NULL)"),
    ("(o.amount > 30 OR o.cust = 2) AND c.tier = 'gold'", "(_v2 > 30 OR _v1 = 2)"),
    ("o.cust IN (2, 3) AND o.amount <> 5", "(_v1 IN (2, 3)) AND (_v2 <> 5)"),
    # arithmetic (ANSI SQL would raise where the merge gives NULL), a literal of another kind,
    # two columns: left to the merge's a_rows_kept
    ("o.amount + 1 > 30", None),
    ("o.amount > '30'", None),
    ("o.amount > o.cust", None),
    ("o.cust IN (2, '3')", None),
    ("30 < o.amount", "(30 < _v2)"),
    ("o.cust IN (2, 3) AND o.amount + 1 > 3", "(_v1 IN (2, 3))"),
])
def test_a_stream_s_records_the_where_s_plain_part_fails_are_left_at_the_read(tmp_path, spark, where, spark_sql):
    """table_stages.a_rows_filter: Spark drops, before the shuffle, only records a_rows_kept drops
    too (over rows with NULLs, both ends of each comparison), so the merge sees every row it keeps."""
    from spark_jobs.steps.table_stages import a_rows_filter, a_rows_kept

    tables = _orders_joined_where(tmp_path, where)
    sql = a_rows_filter(tables["j"], tables["orders"])
    assert sql == spark_sql
    if sql is None:
        return
    rows = [(i, cust, amount) for i, (cust, amount) in enumerate(
        (c, a) for c in (None, 1, 2, 3, 7) for a in (None, 4, 5, 6, 29, 30, 31, 99))]
    frame = spark.createDataFrame(rows, "_v0 BIGINT, _v1 BIGINT, _v2 BIGINT")
    passed = {r["_v0"] for r in frame.where(sql).collect()}
    kept = a_rows_kept(tables["j"], tables["orders"])
    assert {r[0] for r in rows if kept(r)} <= passed
    assert len(passed) < len(rows)          # it drops some
