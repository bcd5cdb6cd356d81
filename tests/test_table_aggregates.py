"""Aggregates over a table's rows (`FROM some_table GROUP BY ...`, issue #33): random upserts,
group moves and deletes over a keyed input table, many batches; after every batch the aggregate
table equals pandas over the input's current rows (the topic read back with confluent-kafka and
folded by key), groups that empty out are deleted, and MIN/MAX/TOPK whose extreme row leaves fall
back to the next one. Then the local store is wiped, restored and verified."""
from __future__ import annotations

import json
import math
import os
import random

import pandas as pd
import pytest

from catalog.mapping import row_of
from spark_jobs import jobs
from state import faults
from tests.table_env import (KILL_EVERY_POINT, assert_each_batch_once_and_in_order, current_rows, fold_change_topic, isolated_runtime,
                             new_table, read_topic)
from tests.tamper import corrupt_value

ITEMS = ("-- partitions: 2\n"
         "CREATE TABLE items (id BIGINT PRIMARY KEY, grp STRING, v BIGINT, score DOUBLE) WITH (topic='{topic}');")
BY_GROUP = ("-- partitions: 3\n-- output_topic: {out}\n"
            "CREATE TABLE items_by_grp AS\n"
            "SELECT grp, COUNT(*) AS n, COUNT(v) AS nv, SUM(v) AS total, AVG(v) AS mean, MIN(v) AS low,\n"
            "       MAX(v) AS high, COUNT(DISTINCT v) AS kinds, TOPK(2, score, id) AS top\n"
            "FROM items GROUP BY grp;")
GROUPS = ["a", "b", "c", "d", "e"]


def items_now(bootstrap: str, topic: str) -> pd.DataFrame:
    return current_rows(bootstrap, topic, ["id", "grp", "v", "score"],
                        valid=lambda row: row.get("v") is None or isinstance(row["v"], int))


def expected_groups(frame: pd.DataFrame) -> dict:
    out = {}
    for grp, g in frame.groupby("grp"):
        v = g["v"].dropna()
        top = g.dropna(subset=["score"]).sort_values(["score", "id"], ascending=[False, True]).head(2)
        out[grp] = {
            "grp": grp, "n": len(g), "nv": len(v), "total": int(v.sum()) if len(v) else None,
            "mean": float(v.mean()) if len(v) else None, "low": int(v.min()) if len(v) else None,
            "high": int(v.max()) if len(v) else None, "kinds": int(v.nunique()),
            "top": [[float(s), int(i)] for s, i in zip(top["score"], top["id"])],
        }
    return out


def shown(rt, name: str) -> dict:
    table, _ = jobs.load_table(name, rt)
    rows = {}
    for key, value in jobs.state_rows(name, rt).items():
        row = row_of(table, key, value)
        row["top"] = [list(entry) for entry in row["top"]]
        rows[key[0]] = row
    return rows


def same(have: dict, want: dict) -> bool:
    if set(have) != set(want):
        return False
    for grp, row in want.items():
        for column, value in row.items():
            got = have[grp][column]
            if isinstance(value, float) or isinstance(got, float):
                if value is None or got is None or not math.isclose(got, value, rel_tol=1e-9):
                    return False
            elif got != value:
                return False
    return True


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_an_aggregate_over_a_table_retracts_changed_and_deleted_rows_after_every_batch(env, spark):
    from ops import failures
    from spark_jobs.recompute.rebuild import rebuild
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic, out = "items" + suffix, "items-by-grp" + suffix
    producer = new_table(rt, "items", ITEMS.format(topic=topic), topic)
    (rt.tables_dir / "items_by_grp.sql").write_text(BY_GROUP.format(out=out))
    rng = random.Random(33)
    live: dict[int, dict] = {}
    next_id = 0

    def put(row: dict) -> None:
        live[row["id"]] = row
        producer.produce(topic, json.dumps(row).encode(), key=str(row["id"]).encode())

    def delete(item: int) -> None:
        live.pop(item, None)
        producer.produce(topic, None, key=str(item).encode())

    checked = 0
    for batch_no in range(7):
        for _ in range(rng.randint(20, 60)):
            roll = rng.random()
            if roll < 0.45 or not live:
                put({"id": next_id, "grp": rng.choice(GROUPS), "v": rng.choice([None, *range(10)]),
                     "score": rng.choice([None, float(rng.randint(0, 20))])})
                next_id += 1
            elif roll < 0.75:             # a row changes: value, score, and often its group
                item = rng.choice(sorted(live))
                put({**live[item], "grp": rng.choice(GROUPS) if rng.random() < 0.5 else live[item]["grp"],
                     "v": rng.choice([None, *range(10)]), "score": float(rng.randint(0, 20))})
            else:
                delete(rng.choice(sorted(live)))
        if batch_no == 3:                 # the extremes of a group leave, then the whole group
            target = max((r for r in live.values() if r["v"] is not None), key=lambda r: r["v"])
            delete(target["id"])
            for item in [i for i, r in live.items() if r["grp"] == "e"]:
                delete(item)
        if batch_no == 5:
            delete(10 ** 6)               # a delete of a row that never was: changes nothing
        if batch_no == 2:                 # bad input: dead-lettered with its reason, counted, nothing else
            producer.produce(topic, b"{not json", key=b"5000")
            producer.produce(topic, json.dumps({"id": 5001, "grp": "a", "v": "many", "score": 1.0}).encode(),
                             key=b"5001")
        producer.flush()
        commits = jobs.run("items_by_grp", until_caught_up=True, spark=spark, rt=rt)
        assert commits, f"batch {batch_no}: nothing ran"
        want = expected_groups(items_now(rt.bootstrap, topic))
        have = shown(rt, "items_by_grp")
        assert same(have, want), f"after batch {batch_no}:\nstate {have}\npandas {want}"
        if batch_no == 3:
            assert "e" not in have        # an emptied group is deleted, not shown as zeros
        checked += 1
    assert checked == 7
    from catalog.batch_log import BatchLog

    assert sum(c.counts["dead_lettered"] for c in BatchLog(rt.batch_dir("items_by_grp")).commits()) == 2
    reasons = sorted(dict(m.headers())["reason"].decode()
                     for m in read_topic(rt.bootstrap, rt.dead_letter_topic("items_by_grp")))
    assert len(reasons) == 2 and all(reasons), reasons

    # The change topic folds to the table, each batch's change of a group once.
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert_each_batch_once_and_in_order(seen)
    final = shown(rt, "items_by_grp")
    assert {json.loads(k)["grp"]: v for k, v in folded.items()} == \
        {g: {**row, "top": [list(e) for e in row["top"]]} for g, row in final.items()}

    # A lost disk: both state stages come back from snapshots and changelogs, and verify agrees.
    failures.inject("items_by_grp", "wipe_local_store", rt)
    reports = jobs.restore("items_by_grp", rt=rt)
    assert len(reports) == 2 * 3          # the groups and the rows stage, 3 partitions each
    assert same(shown(rt, "items_by_grp"), expected_groups(items_now(rt.bootstrap, topic)))
    result = verify("items_by_grp", spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(final), result.summary()

    # After the restore the retractions still find the rows they take out.
    for item in sorted(live)[:10]:
        delete(item)
    producer.flush()
    jobs.run("items_by_grp", until_caught_up=True, spark=spark, rt=rt)
    assert same(shown(rt, "items_by_grp"), expected_groups(items_now(rt.bootstrap, topic)))

    # A group's value flipped behind the table's back: verify names it, and a restore repairs it.
    # A rebuild recomputes both stages from the input's history, and later changes retract from
    # the rebuilt rows.
    from state import codec

    table, _ = jobs.load_table("items_by_grp", rt)
    victim = sorted(shown(rt, "items_by_grp"))[0]
    st = jobs.state_table(table, rt)
    try:
        part = st.open(st.partition_of((victim,)))
        value = part.get((victim,))
        corrupt_value(part.backend, codec.encode_key((victim,)), codec.encode_value((value[0] + 5,) + value[1:]))
    finally:
        st.close()
    broken = verify("items_by_grp", spark=spark, rt=rt)
    assert broken.different == 1 and broken.examples[0]["key"] == [victim], broken.summary()
    failures.inject("items_by_grp", "wipe_local_store", rt)
    jobs.restore("items_by_grp", rt=rt)
    assert verify("items_by_grp", spark=spark, rt=rt).ok
    commit = rebuild("items_by_grp", spark=spark, rt=rt)
    assert commit.counts["keys"] == len(shown(rt, "items_by_grp")) and commit.counts["keys_changed"] == 0
    assert verify("items_by_grp", spark=spark, rt=rt).ok
    for item in sorted(live)[:10]:
        put({**live[item], "grp": "b", "v": 3})
    producer.flush()
    jobs.run("items_by_grp", until_caught_up=True, spark=spark, rt=rt)
    assert same(shown(rt, "items_by_grp"), expected_groups(items_now(rt.bootstrap, topic)))
    assert verify("items_by_grp", spark=spark, rt=rt).ok

    # A changed definition (one more column): the batch refuses it, a rebuild adopts it from the
    # input's history, and the rows stage (the input's rows, whatever the aggregate) carries on.
    sql = rt.tables_dir / "items_by_grp.sql"
    sql.write_text(sql.read_text().replace("COUNT(*) AS n,", "COUNT(*) AS n, MIN(score) AS worst,"))
    for item in sorted(live)[10:20]:
        put({**live[item], "grp": "c", "score": float(rng.randint(0, 20))})
    producer.flush()
    with pytest.raises(ValueError, match="the definition changed"):
        jobs.run("items_by_grp", until_caught_up=True, spark=spark, rt=rt)
    rebuild("items_by_grp", spark=spark, rt=rt)
    delete(sorted(live)[10])
    producer.flush()
    jobs.run("items_by_grp", until_caught_up=True, spark=spark, rt=rt)
    frame = items_now(rt.bootstrap, topic)
    have = shown(rt, "items_by_grp")
    assert same(have, expected_groups(frame))
    assert {g: row["worst"] for g, row in have.items()} == \
        {g: (None if pd.isna(v) else v) for g, v in frame.groupby("grp")["score"].min().items()}
    assert verify("items_by_grp", spark=spark, rt=rt).ok


def test_retracting_aggregates_fold_in_any_grouping_and_delete_an_emptied_group():
    """Pure logic: random additions and retractions, folded one by one or in random chunks, equal
    the aggregates of the rows that remain; a group with no rows left is None (deleted)."""
    from catalog.mapping import retracting_of
    from catalog.definitions import AggregateColumn
    from state.aggregates import RetractingAggregator

    columns = {name: retracting_of(AggregateColumn(name, function, ("v",), n=2))
               for name, function in [("n", "count"), ("s", "sum"), ("a", "avg"), ("lo", "min"), ("hi", "max"),
                                      ("d", "count_distinct"), ("t", "topk")]}
    agg = RetractingAggregator(columns)
    rng = random.Random(7)
    for _ in range(200):
        rows, deltas = [], []
        for _ in range(rng.randint(1, 12)):
            if rows and rng.random() < 0.4:
                row = rows.pop(rng.randrange(len(rows)))
                deltas.append(agg.lift(row, -1))
            else:
                v = rng.choice([None, *range(5)])
                row = (v, v, v, v, v, v, (v, ("x", v)))
                rows.append(row)
                deltas.append(agg.lift(row, 1))
        one_by_one = None
        for d in deltas:
            one_by_one = agg.merge(one_by_one, d)
        chunked, i = None, 0
        while i < len(deltas):
            step = rng.randint(1, 4)
            part = None
            for d in deltas[i:i + step]:
                part = agg.merge(part, d)
            chunked = agg.merge(chunked, part)
            i += step
        state = agg.merge_or_delete(None, one_by_one)
        assert agg.merge_or_delete(None, chunked) == state
        values = [r[0] for r in rows if r[0] is not None]
        if not rows:
            assert state is None
            continue
        got = agg.result(state)
        top = sorted(values, reverse=True)[:2]
        assert got == {"n": len(values), "s": sum(values) if values else None,
                       "a": sum(values) / len(values) if values else None,
                       "lo": min(values, default=None), "hi": max(values, default=None), "d": len(set(values)),
                       "t": [(v, "x", v) for v in top]}


@pytest.mark.parametrize("sql, message", [
    ("CREATE TABLE t AS SELECT grp, LATEST_BY_OFFSET(v) AS v FROM items GROUP BY grp",
     r"table 't': LATEST_BY_OFFSET\(v\) over a table's rows: rows have no arrival order; use MAX or TOPK"),
    ("-- topic: other\nCREATE TABLE t AS SELECT grp, COUNT(*) AS n FROM items GROUP BY grp",
     r"t.sql:1:1: table 't' aggregates the rows of table 'items', so option 'topic' does not apply"),
    ("CREATE TABLE t AS SELECT i.grp, COUNT(*) AS n FROM items i JOIN players p ON i.v = p.id GROUP BY i.grp",
     r"a JOIN in an aggregate over table 'items' is not supported"),
    ("CREATE TABLE t AS SELECT grp, COUNT(*) AS n FROM itemz GROUP BY grp",
     r"reads stream 'itemz'; declare its JSON fields with '-- schema: field TYPE, ...', or name a source table"),
    ("CREATE TABLE t AS SELECT grp, COUNT(*) AS n FROM items GROUP BY grp, TUMBLE(score, INTERVAL '1' HOUR)",
     r"window event time"),
])
def test_an_aggregate_over_a_table_refuses_what_rows_cannot_mean_in_one_line(tmp_path, sql, message):
    from catalog.definitions import DefinitionError, load_all

    (tmp_path / "items.sql").write_text(ITEMS.format(topic="items"))
    (tmp_path / "players.sql").write_text("CREATE TABLE players (id BIGINT PRIMARY KEY, name STRING) "
                                          "WITH (topic='players');")
    (tmp_path / "t.sql").write_text(sql)
    with pytest.raises(DefinitionError, match=message) as caught:
        load_all(tmp_path)
    assert "\n" not in str(caught.value)


def test_an_aggregate_over_a_table_takes_the_tables_schema_topic_and_key_format(tmp_path):
    from catalog.definitions import load_all

    (tmp_path / "items.sql").write_text("-- key_format: json\n" + ITEMS.format(topic="items-topic"))
    (tmp_path / "by_grp.sql").write_text(BY_GROUP.format(out="o").replace("items_by_grp", "by_grp"))
    table = load_all(tmp_path)["by_grp"]
    assert (table.input_table, table.topic, table.key_format, table.bronze) == ("items", "items-topic", "json", False)
    assert table.schema == [("id", "BIGINT"), ("grp", "STRING"), ("v", "BIGINT"), ("score", "DOUBLE")]
    assert table.meaning()["input_table"] == "items"


JOIN = ("-- partitions: 2\n-- output_topic: {out}\nCREATE TABLE orders_tier AS "
        "SELECT o.id, o.amount, c.tier FROM orders o JOIN customers c ON o.cust = c.id;")
ORDERS = "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount BIGINT) WITH (topic='{topic}');"
CUSTOMERS = "CREATE TABLE customers (id BIGINT PRIMARY KEY, tier STRING) WITH (topic='{topic}');"


# Every batch point, the rows stage's two and one inside a changelog commit.
EVERY_POINT = sorted(faults.BATCH_POINTS) + sorted(faults.TABLE_AGGREGATE_POINTS) + ["commit.after_changelog"]
# A join's steps before its merge and after its commit are every table's (the aggregate here and
# tests/test_exactly_once.py crash at each); its own are the two-sided merge's: read, the rows
# stage, the merge and the changelog commit of what it changed (KILL_EVERY_POINT: every point).
JOIN_POINTS = EVERY_POINT if KILL_EVERY_POINT else [
    "batch.after_read", "rows.after_commit", "batch.after_rows", "batch.mid_merge", "commit.after_changelog",
    "batch.after_merge"]


def _kill_at_every_point(rt, engine: str, table: str, between=None, points=EVERY_POINT) -> None:
    """`statetable run <table>` as a client of the stack's Spark Connect server, killed at each of
    `points` (a point in the client SIGKILLs its process group; one in a task kills that task's
    worker and fails the run), `between()` before each, then run to the end."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    statetable = str(Path(sys.executable).parent / "statetable")
    env = {k: v for k, v in {**os.environ, **rt.as_env()}.items() if k != faults.ENV}
    env.update(STATETABLE_FAULT_SCOPE="group", STATETABLE_SPARK_REMOTE=engine)

    def run(fault: str | None, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([statetable, "run", table, "--max-records-per-batch", "100", *extra],
                              env=env | ({faults.ENV: fault} if fault else {}), capture_output=True, text=True,
                              timeout=600, start_new_session=True)

    for point in points:
        if between is not None:
            between()
        done = run(point, "--max-batches", "2")
        assert done.returncode != 0, f"{table} at {point}: exit {done.returncode}\n{done.stderr[-2000:]}"
        assert done.returncode == -signal.SIGKILL or "Traceback" not in done.stderr.splitlines()[-1], point
    final = run(None, "--until-caught-up")
    assert final.returncode == 0, final.stderr[-3000:]


@pytest.mark.timeout(1500)
def test_tables_of_tables_are_exact_after_a_kill_at_every_fault_point(kafka, engine, spark, tmp_path):
    """An aggregate over a table killed at every batch fault point, at both of its own
    (rows.after_commit: some rows partitions committed; batch.after_rows: all of them, nothing
    merged) and inside a changelog commit, then run to the end; a foreign-key join of tables
    killed at the points of its own steps (JOIN_POINTS). Each table and
    its folded change topic equal pandas over the inputs' current rows, no (key, batch) reaches the
    topic twice, and verify agrees. The join's other table changes and commits before every kill."""
    from spark_jobs.recompute.verify import verify

    rt, suffix = isolated_runtime(kafka, tmp_path)
    topic, out = "items" + suffix, "items-by-grp" + suffix
    producer = new_table(rt, "items", ITEMS.format(topic=topic), topic)
    (rt.tables_dir / "items_by_grp.sql").write_text(
        "-- mirror_every: 2\n-- snapshot_every: 3\n" + BY_GROUP.format(out=out))
    rng = random.Random(34)
    live: dict[int, dict] = {}
    for n in range(600):
        if live and rng.random() < 0.2:
            item = rng.choice(sorted(live))
            live.pop(item)
            producer.produce(topic, None, key=str(item).encode())
            continue
        item = rng.randrange(300)                 # new rows, and rows that change group and values
        live[item] = {"id": item, "grp": rng.choice(GROUPS), "v": rng.choice([None, *range(10)]),
                      "score": float(rng.randint(0, 50))}
        producer.produce(topic, json.dumps(live[item]).encode(), key=str(item).encode())
    producer.flush()
    _kill_at_every_point(rt, engine, "items_by_grp")
    want = expected_groups(items_now(rt.bootstrap, topic))
    assert same(shown(rt, "items_by_grp"), want)
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert_each_batch_once_and_in_order(seen)
    assert same({json.loads(k)["grp"]: {**v, "top": [list(e) for e in v["top"]]} for k, v in folded.items()}, want)
    result = verify("items_by_grp", spark=spark, rt=rt)
    assert result.ok, result.summary()

    # The foreign-key join: orders by customer's tier.
    orders, customers, joined = "orders" + suffix, "customers" + suffix, "orders-tier" + suffix
    producer = new_table(rt, "orders", ORDERS.format(topic=orders), orders)
    new_table(rt, "customers", CUSTOMERS.format(topic=customers), customers)
    (rt.tables_dir / "orders_tier.sql").write_text("-- mirror_every: 2\n-- snapshot_every: 3\n" + JOIN.format(out=joined))
    for n in range(600):
        item = rng.randrange(300)
        if rng.random() < 0.15:
            producer.produce(orders, None, key=str(item).encode())
        else:
            row = {"id": item, "cust": rng.choice([None, *range(30)]), "amount": rng.randrange(100)}
            producer.produce(orders, json.dumps(row).encode(), key=str(item).encode())
    producer.flush()

    def customers_change() -> None:
        for _ in range(8):
            key = rng.randrange(30)
            value = None if rng.random() < 0.2 else json.dumps({"id": key, "tier": rng.choice(["gold", "tin"])}).encode()
            producer.produce(customers, value, key=str(key).encode())
        producer.flush()
        jobs.run("customers", until_caught_up=True, spark=spark, rt=rt)

    _kill_at_every_point(rt, engine, "orders_tier", customers_change, JOIN_POINTS)
    a = current_rows(rt.bootstrap, orders, ["id", "cust", "amount"], dtype=object)
    b = current_rows(rt.bootstrap, customers, ["id", "tier"], dtype=object)
    merged = a.dropna(subset=["cust"]).merge(b, left_on="cust", right_on="id", suffixes=("", "_c"))
    want = {int(r["id"]): {"id": int(r["id"]), "amount": int(r["amount"]), "tier": r["tier"]}
            for _, r in merged.iterrows()}
    table, _ = jobs.load_table("orders_tier", rt)
    assert {k[0]: row_of(table, k, v) for k, v in jobs.state_rows("orders_tier", rt).items()} == want
    folded, seen = fold_change_topic(rt.bootstrap, joined)
    assert_each_batch_once_and_in_order(seen)
    assert {json.loads(k)["id"]: v for k, v in folded.items()} == want
    result = verify("orders_tier", spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(want), result.summary()


def test_a_rows_contribution_applies_where_computed_keys_and_expressions_as_sql_does(tmp_path):
    """Pure logic (spark_jobs.steps.table_aggregate.RowStage): WHERE, a computed GROUP BY key and an
    expression argument are evaluated per row, NULLs as SQL has them; a row WHERE drops
    contributes nothing, so a row that stops passing leaves its group."""
    from catalog.definitions import load_all
    from spark_jobs.steps.table_aggregate import RowStage

    (tmp_path / "items.sql").write_text(ITEMS.format(topic="items"))
    (tmp_path / "t.sql").write_text(
        "CREATE TABLE t AS SELECT UPPER(grp) AS g, COUNT(*) AS n, SUM(v * 2) AS twice, MAX(score) AS best "
        "FROM items WHERE v IS NULL OR v < 5 GROUP BY UPPER(grp)")
    tables = load_all(tmp_path)
    stage = RowStage(tables["t"], tables["items"])
    agg = stage.aggregator
    assert stage.contribution((1, "ab", 3, 2.5), 1) == (("AB",), agg.lift((1, 6, 2.5), 1))
    assert stage.contribution((1, "ab", None, None), -1) == (("AB",), agg.lift((1, None, None), -1))
    assert stage.contribution((1, "ab", 7, 2.5), 1) is None          # WHERE drops it
    assert stage.contribution((1, None, 1, 1.0), 1)[0] == (None,)    # UPPER(NULL) is a NULL group
    state = agg.merge_or_delete(None, agg.merge(stage.contribution((1, "ab", 3, 2.5), 1)[1],
                                                stage.contribution((2, "AB", 1, 9.0), 1)[1]))
    assert agg.result(state) == {"n": 2, "twice": 8, "best": 9.0}
