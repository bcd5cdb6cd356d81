"""Micro-batches end to end against Kafka, Spark and RocksDB, checked against
independent recomputations (pandas over the topic, not the project's code)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from confluent_kafka import Producer

from spark_jobs import jobs
from deploy import samples
from catalog.batch_log import BatchLog
from serving.query import lookup
from tests.table_env import (OUT_OF_ORDER_BATCHES, hourly_table, isolated_runtime, new_table, produce_minutes,
                              read_topic)
from tests.tamper import corrupt_value


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _group_offsets(bootstrap: str, group: str) -> set[tuple[int, int]]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {(tp.partition, tp.offset) for tp in answer.topic_partitions}


def _ends(bootstrap: str, topic: str):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-ends"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return [TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
                for p in partitions]
    finally:
        consumer.close()


def _state_rows(rt, table_name):
    return jobs.state_rows(table_name, rt)


def test_movie_tickets_in_batches_equal_pandas_and_bronze_holds_each_offset_once(env, spark):
    rt, suffix = env
    samples.produce("movie_tickets_sold", rt.bootstrap, 30000, suffix=suffix)
    commits = jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=8000)
    assert [c.batch_id for c in commits] == [0, 1, 2, 3]
    assert sum(c.counts["read"] for c in commits) == 30000 == sum(c.counts["parsed"] for c in commits)

    records = read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)
    frame = pd.DataFrame([json.loads(m.value()) for m in records])
    expected = frame.groupby("title")["ticket_total_value"].count().to_dict()
    assert {k[0]: v[0] for k, v in _state_rows(rt, "movie_tickets_sold").items()} == expected

    bronze = spark.read.format("delta").load(rt.delta_path("movie_tickets_sold", "bronze"))
    coordinates = bronze.select("source_partition", "source_offset").collect()
    assert len(coordinates) == len(set(coordinates)) == 30000

    # The lag tools users run see the table's consumer group at the topic's end, each partition.
    assert _group_offsets(rt.bootstrap, f"statetable.{rt.namespace}movie_tickets_sold") == \
        {(tp.partition, tp.offset) for tp in _ends(rt.bootstrap, "movie_ticket_sales" + suffix)}

    # A second run finds nothing new and changes nothing.
    assert jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt) == []
    title = sorted(expected)[0]
    assert lookup("movie_tickets_sold", (title,), rt=rt) == {"title": title, "tickets_sold": expected[title]}


def test_a_table_without_bronze_keeps_no_input_copy_and_says_verify_needs_it(env, spark):
    from spark_jobs.recompute.verify import verify
    from spark_jobs.delta import delta_files

    rt, suffix = env
    sql = rt.tables_dir / "movie_tickets_sold.sql"
    sql.write_text("-- bronze: off\n" + sql.read_text())
    samples.produce("movie_tickets_sold", rt.bootstrap, 3000, suffix=suffix)
    commits = jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=2000)
    assert sum(c.counts["parsed"] for c in commits) == 3000
    assert not delta_files.exists(rt.delta_path("movie_tickets_sold", "bronze"))
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)])
    expected = frame.groupby("title")["ticket_total_value"].count().to_dict()
    assert {k[0]: v[0] for k, v in _state_rows(rt, "movie_tickets_sold").items()} == expected
    with pytest.raises(ValueError, match=r"movie_tickets_sold.*bronze: off.*bronze: on"):
        verify("movie_tickets_sold", spark=spark, rt=rt)


def test_the_mirror_folds_every_n_batches_and_its_view_equals_the_state_after_every_batch(env, spark, monkeypatch):
    """mirror_every: 2: the changes table gets every batch's changes, a MERGE folds them into the
    mirror after batches 1, 3, 5, ... (the version after batch 3 holds batches 0-3 only, by pandas
    over their offsets), and the view (mirror overlaid with newer changes) equals the state.
    The first folds are delta-rs's on the driver; with the row bound at 0, the later ones are
    Spark's MERGE on the same mirror."""
    from delta.tables import DeltaTable

    from spark_jobs.delta import mirror

    rt, suffix = env
    sql = rt.tables_dir / "movie_tickets_sold.sql"
    sql.write_text(sql.read_text().replace("-- snapshot_every: 10", "-- snapshot_every: 10\n-- mirror_every: 2"))
    samples.produce("movie_tickets_sold", rt.bootstrap, 5000, suffix=suffix)
    commits = jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=1000)
    ids = [c.batch_id for c in commits]
    assert ids == list(range(len(ids))) and len(ids) >= 5

    path = mirror.mirror_path(rt, "movie_tickets_sold")
    merges = DeltaTable.forPath(spark, path).history().where("operation = 'MERGE'").orderBy("version").collect()
    assert len(merges) == len(ids) // 2                         # after batches 1, 3, 5, ...

    def counts(frame):
        return {json.loads(r["key"])[0]: json.loads(r["row"])["tickets_sold"] for r in frame.collect()}

    records = read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)
    upto3 = {(p, o) for c in commits[:4] for p, (start, end) in c.ranges.items() for o in range(start, end)}
    frame = pd.DataFrame([json.loads(m.value()) for m in records if (m.partition(), m.offset()) in upto3])
    assert counts(spark.read.format("delta").option("versionAsOf", merges[1]["version"]).load(path)) == \
        frame.groupby("title")["ticket_total_value"].count().to_dict()

    # After each run the view equals the state; the folded copy lags by the batches since the last
    # fold, and only those batches are left in the changes table.
    for more in (0, 700, 700):
        if more:
            monkeypatch.setattr(mirror, "DRIVER_FOLD_ROWS", 0)          # Spark's MERGE from here on
            samples.produce("movie_tickets_sold", rt.bootstrap, more, suffix=suffix)
            ids += [c.batch_id for c in jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt)]
        last_fold = max(i for i in ids if i % 2 == 1)
        state = {k[0]: v[0] for k, v in _state_rows(rt, "movie_tickets_sold").items()}
        assert counts(mirror.frame(spark, rt, "movie_tickets_sold")) == state
        batch, rows = mirror.committed_rows(rt, "movie_tickets_sold")     # delta-rs reads what Spark merged
        assert batch == ids[-1]
        assert {json.loads(k)[0]: json.loads(r)["tickets_sold"] for k, r in zip(*rows.to_pydict().values())} == state
        changes = spark.read.format("delta").load(mirror.changes_path(rt, "movie_tickets_sold"))
        assert {r["batch_id"] for r in changes.select("batch_id").distinct().collect()} == \
            {i for i in ids if i > last_fold}
        folded = counts(spark.read.format("delta").load(path))
        assert (folded == state) == (ids[-1] == last_fold)
    assert sum(state.values()) == 6400
    engines = [r["engineInfo"] for r in DeltaTable.forPath(spark, path).history().where("operation = 'MERGE'")
               .orderBy("version").collect()]
    assert len(engines) == sum(i % 2 for i in ids)                # one fold after each odd batch
    assert engines[0].startswith("delta-rs") and "Delta-Lake" in engines[-1], engines


SEED_BOARD = [
    {"playerId": 3, "productId": 1, "playerName": "Isabelle", "gameName": "Super Smash Bros", "score": 4000},
    {"playerId": 2, "productId": 1, "playerName": "Mitch", "gameName": "Super Smash Bros", "score": 2000},
    {"playerId": 1, "productId": 1, "playerName": "Elyse", "gameName": "Super Smash Bros", "score": 1000},
]


def test_leaderboard_sample_gives_the_seed_output(env, spark):
    rt, suffix = env
    samples.produce("leaderboard", rt.bootstrap, suffix=suffix)
    for name in ("players", "products"):
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    (commit,) = jobs.run("leaderboard", until_caught_up=True, spark=spark, rt=rt)
    assert commit.counts["join_unmatched"] == 1          # player 404 is unknown: dropped, and counted
    from deploy.cli import present

    board = present("leaderboard", lookup("leaderboard", ("1",), rt=rt))
    assert board == SEED_BOARD
    assert [e["score"] for e in present("leaderboard", lookup("leaderboard", ("6",), rt=rt))] == [9000, 8000, 7000]

    # A deleted player (a tombstone) enriches nothing afterwards: the inner join drops the score.
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    producer.produce("players" + suffix, None, key=b"3")
    producer.produce("score-events" + suffix, json.dumps({"score": 5000, "product_id": 1, "player_id": 3}).encode())
    assert producer.flush(10) == 0
    jobs.run("players", until_caught_up=True, spark=spark, rt=rt)
    (commit,) = jobs.run("leaderboard", until_caught_up=True, spark=spark, rt=rt)
    assert commit.counts["join_unmatched"] == 1
    assert present("leaderboard", lookup("leaderboard", ("1",), rt=rt)) == board

    # Each batch joined the players of its time; a rename later must not make verify disagree.
    from spark_jobs.recompute.verify import verify

    producer.produce("players" + suffix, json.dumps({"id": 2, "name": "Mitchell"}).encode(), key=b"2")
    assert producer.flush(10) == 0
    jobs.run("players", until_caught_up=True, spark=spark, rt=rt)
    result = verify("leaderboard", spark=spark, rt=rt)
    assert result.ok, result.summary()
    assert [e["playerName"] for e in present("leaderboard", lookup("leaderboard", ("1",), rt=rt))] == \
        ["Isabelle", "Mitch", "Elyse"]


def test_a_join_re_run_after_a_kill_joins_the_reference_state_its_plan_pinned(env, spark):
    """The leaderboard's first batch is killed (the whole process tree, at batch.after_bronze);
    player 2 is then renamed and the players table runs. The re-run must join the players as
    its plan pinned them, so the board equals the clean run's (the seed output), not the rename."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from deploy.cli import present
    from state import faults

    rt, suffix = env
    samples.produce("leaderboard", rt.bootstrap, suffix=suffix)
    for name in ("players", "products"):
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    env_vars = {**os.environ, **rt.as_env(), faults.ENV: "batch.after_bronze", faults.SCOPE_ENV: "group"}
    job = subprocess.run([str(Path(sys.executable).parent / "statetable"), "run", "leaderboard", "--until-caught-up"],
                         env=env_vars, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert job.returncode in (faults.EXIT_CODE, -9), job.stderr[-2000:]
    log = BatchLog(rt.batch_dir("leaderboard"))
    pending = log.pending_plan()
    assert pending is not None and log.last_commit() is None
    assert pending.joins["players"]["batch"] == 0

    producer = Producer({"bootstrap.servers": rt.bootstrap})
    producer.produce("players" + suffix, json.dumps({"id": 2, "name": "Mitchell"}).encode(), key=b"2")
    assert producer.flush(10) == 0
    (renamed,) = jobs.run("players", until_caught_up=True, spark=spark, rt=rt)
    assert renamed.batch_id == 1

    (commit,) = jobs.run("leaderboard", until_caught_up=True, spark=spark, rt=rt)
    assert commit.batch_id == 0 and commit.counts["join_unmatched"] == 1
    assert present("leaderboard", lookup("leaderboard", ("1",), rt=rt)) == SEED_BOARD
    # The next batch joins the players as of their newest batch.
    producer.produce("score-events" + suffix, json.dumps({"score": 2500, "product_id": 1, "player_id": 2}).encode())
    assert producer.flush(10) == 0
    (commit,) = jobs.run("leaderboard", until_caught_up=True, spark=spark, rt=rt)
    assert BatchLog(rt.batch_dir("leaderboard")).plan(1).joins["players"]["batch"] == 1
    board = present("leaderboard", lookup("leaderboard", ("1",), rt=rt))
    assert [(e["playerName"], e["score"]) for e in board] == [("Isabelle", 4000), ("Mitchell", 2500), ("Mitch", 2000)]


def test_bad_records_are_dead_lettered_with_reasons_and_good_ones_counted(env, spark):
    rt, suffix = env
    topic = "movie_ticket_sales" + suffix
    samples.produce("movie_tickets_sold", rt.bootstrap, 500, suffix=suffix)
    producer = Producer({"bootstrap.servers": rt.bootstrap, "message.max.bytes": 8388608})
    bad = {
        "malformed_json": b'{"title": "Up", "ticket_total_value": ',
        "wrong_type": json.dumps({"title": "Up", "ticket_total_value": "lots", "sale_ts": "2026-11-01T00:00:00Z"}).encode(),
        "missing_key": json.dumps({"ticket_total_value": 9.5, "sale_ts": "2026-11-01T00:00:00Z"}).encode(),
        "too_large": json.dumps({"title": "Up", "pad": "x" * (2 << 20)}).encode(),
    }
    for value in bad.values():
        producer.produce(topic, value, partition=0)
    samples.send_records(producer, topic, samples.movie_ticket_sales(300, seed=9))
    assert producer.flush(30) == 0

    commits = jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt)
    counts = {k: sum(c.counts.get(k, 0) for c in commits) for k in ("read", "parsed", "dead_lettered")}
    assert counts == {"read": 804, "parsed": 800, "dead_lettered": 4}
    dlq = read_topic(rt.bootstrap, rt.dead_letter_topic("movie_tickets_sold"))
    reasons = sorted(dict(m.headers())["reason"].decode() for m in dlq)
    assert reasons == sorted(bad)
    for message in dlq:
        headers = dict(message.headers())
        assert headers["source_topic"].decode() == topic and int(headers["source_offset"]) >= 0
    total = sum(v[0] for v in _state_rows(rt, "movie_tickets_sold").values())
    assert total == 800
    assert BatchLog(rt.batch_dir("movie_tickets_sold")).last_commit().counts["dead_too_large"] == 1


def test_rebuild_equals_incremental_and_verify_names_a_flipped_key(env, spark, monkeypatch):
    from spark_jobs.recompute import history, rebuild as rebuild_module
    from spark_jobs.recompute.rebuild import rebuild
    from spark_jobs.recompute.verify import verify
    from catalog import registry
    from state import codec

    rt, suffix = env
    samples.produce("payments_per_customer", rt.bootstrap, 20000, suffix=suffix)
    jobs.run("payments_per_customer", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=7000)
    incremental = _state_rows(rt, "payments_per_customer")
    with monkeypatch.context() as patched:
        # Verify compares, and rebuild writes, partition by partition in Spark tasks: neither side
        # is gathered on the driver.
        def no_driver_copy(*args, **kwargs):
            raise AssertionError("a whole table was gathered on the driver")

        patched.setattr(history, "recompute", no_driver_copy)
        patched.setattr(rebuild_module, "recompute", no_driver_copy)
        patched.setattr(registry, "readonly_partitions", no_driver_copy)
        first = verify("payments_per_customer", spark=spark, rt=rt)
        assert first.ok and first.keys_compared == len(incremental), first.summary()
        commit = rebuild("payments_per_customer", spark=spark, rt=rt)
    assert commit.counts["keys"] == len(incremental)
    rebuilt = _state_rows(rt, "payments_per_customer")
    assert rebuilt.keys() == incremental.keys()
    assert all(rebuilt[k][0] == incremental[k][0] and abs(rebuilt[k][1] - incremental[k][1]) < 1e-6 for k in rebuilt)
    assert verify("payments_per_customer", spark=spark, rt=rt).ok

    victim = sorted(rebuilt)[3]
    table, _ = jobs.load_table("payments_per_customer", rt)
    st = jobs.state_table(table, rt)
    part = st.open(st.partition_of(victim))
    corrupt_value(part.backend, codec.encode_key(victim), codec.encode_value((999, 1.0, 1.0)))
    st.close()
    result = verify("payments_per_customer", spark=spark, rt=rt)
    assert not result.ok and result.different == 1
    assert result.examples[0]["key"] == list(victim) and result.examples[0]["state"] == [999, 1.0, 1.0]
    assert str(list(victim)) in result.summary()
    # A rebuild repairs it: the right value back and a digest of what the partition holds.
    rebuild("payments_per_customer", spark=spark, rt=rt)
    repaired = verify("payments_per_customer", spark=spark, rt=rt)
    assert repaired.ok, repaired.summary()
    assert _state_rows(rt, "payments_per_customer")[victim][0] == rebuilt[victim][0]


def test_windowed_count_with_out_of_order_and_late_events_matches_pandas(env, spark):
    rt, suffix = env
    topic = "window_sales" + suffix
    producer = hourly_table(rt, "hourly_sales", topic)
    accepted, late, watermark = [], 0, None
    for events in OUT_OF_ORDER_BATCHES:
        produce_minutes(producer, topic, events)
        commits = jobs.run("hourly_sales", until_caught_up=True, spark=spark, rt=rt)
        assert len(commits) == 1
        batch_late = [(m, t) for m, t in events if watermark is not None and (m // 60) * 60 + 60 + 10 <= watermark]
        assert commits[0].counts["late"] == len(batch_late)
        late += len(batch_late)
        on_time = [e for e in events if e not in batch_late]
        accepted += on_time
        watermark = max([watermark or 0] + [m for m, _ in on_time])
    frame = pd.DataFrame(accepted, columns=["minute", "title"])
    frame["window_start"] = (frame["minute"] // 60) * 3_600_000 + 1_793_491_200_000
    expected = {(t, w): n for (t, w), n in frame.groupby(["title", "window_start"]).size().items()}
    assert {k: v[0] for k, v in _state_rows(rt, "hourly_sales").items()} == expected
    dlq = read_topic(rt.bootstrap, rt.dead_letter_topic("hourly_sales"))
    assert sorted(dict(m.headers())["reason"].decode() for m in dlq) == ["late"] * late == ["late"] * 4

    # A backfill of one hour rebuilds the keys of that hour's windows, and only those.
    from spark_jobs.recompute.rebuild import rebuild
    from state import codec

    hour0, hour1 = 1_793_491_200_000, 1_793_491_200_000 + 3_600_000
    table, _ = jobs.load_table("hourly_sales", rt)
    st = jobs.state_table(table, rt)
    for key in (("a", hour0), ("a", hour1)):
        corrupt_value(st.open(st.partition_of(key)).backend, codec.encode_key(key), codec.encode_value((99,)))
    st.close()
    commit = rebuild("hourly_sales", spark=spark, rt=rt, window_range=(hour1, hour1 + 3_600_000))
    assert commit.counts["keys"] == len([w for _, w in expected if w == hour1])
    rows = {k: v[0] for k, v in _state_rows(rt, "hourly_sales").items()}
    assert rows == {**expected, ("a", hour0): 99}


def test_follow_commits_new_input_in_a_warm_session_until_stopped(env, spark):
    """The warm runner: one session, a batch per burst of input, nothing while idle, and a clean stop."""
    import threading
    import time

    rt, suffix = env
    stop, commits = threading.Event(), []
    follower = threading.Thread(target=jobs.follow, args=("movie_tickets_sold",),
                                kwargs={"poll_seconds": 0.2, "spark": spark, "rt": rt, "stop": stop,
                                        "on_commit": commits.append})
    follower.start()
    try:
        for produced, total in ((200, 200), (400, 600)):
            samples.produce("movie_tickets_sold", rt.bootstrap, produced, suffix=suffix)
            deadline = time.monotonic() + 120
            while sum(c.counts["read"] for c in commits) < total and time.monotonic() < deadline:
                time.sleep(0.2)
        time.sleep(1.0)        # idle: no empty batches are committed
    finally:
        stop.set()
        follower.join(60)
    assert not follower.is_alive()
    assert sum(c.counts["read"] for c in commits) == 600
    assert [c.batch_id for c in commits] == list(range(len(commits))) and len(commits) >= 2
    records = read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)
    expected = pd.DataFrame([json.loads(m.value()) for m in records]).groupby("title")["ticket_total_value"].count()
    assert {k[0]: v[0] for k, v in _state_rows(rt, "movie_tickets_sold").items()} == expected.to_dict()


def test_verify_agrees_after_retention_purged_windows(env, spark):
    """The state purges windows past retention; the recomputation from bronze must drop them too."""
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "purged_sales" + suffix
    producer = new_table(rt, "minute_sales", f"-- topic: {topic}\n-- schema: title STRING, ts TIMESTAMP\n"
                         "-- partitions: 2\n-- snapshot_every: 1\nCREATE TABLE minute_sales AS SELECT title, "
                         "COUNT(*) AS n FROM sales GROUP BY title, TUMBLE(ts, INTERVAL '1' MINUTE)", topic, partitions=1)
    for batch_minutes in ([0, 0, 1], [30, 31]):     # minute 30 expires windows 0 and 1 (end + retention <= 30)
        for minute in batch_minutes:
            producer.produce(topic, json.dumps({"title": "a", "ts": f"2026-11-01T00:{minute:02d}:10Z"}).encode())
        assert producer.flush(10) == 0
        jobs.run("minute_sales", until_caught_up=True, spark=spark, rt=rt)
    base = 1_793_491_200_000
    frame = pd.DataFrame({"minute": [0, 0, 1, 30, 31]})
    watermark = base + 31 * 60_000 + 10_000
    frame["start"] = base + frame["minute"] * 60_000
    kept = frame[frame["start"] + 2 * 60_000 > watermark]       # size + retention (= size), no grace
    expected = {("a", int(s)): int(n) for s, n in kept.groupby("start").size().items()}
    assert {k: v[0] for k, v in _state_rows(rt, "minute_sales").items()} == expected
    assert BatchLog(rt.batch_dir("minute_sales")).last_commit().counts["purged_windows"] == 2
    result = verify("minute_sales", spark=spark, rt=rt)
    assert result.ok, result.summary()


def test_where_with_expressions_keeps_the_events_pandas_keeps(env, spark):
    """CASE, CAST, COALESCE, string and date functions and arithmetic in WHERE (Spark evaluates
    them, in the Spark-SQL pass when the Arrow pass cannot translate them)."""
    rt, suffix = env
    topic = "expr_sales" + suffix
    where = ("UPPER(title) <> 'B' AND COALESCE(amount, 0) * 2 > 3 "
             "AND CASE WHEN HOUR(ts) < 1 THEN TRUE ELSE CAST(amount AS INT) >= 5 END")
    producer = new_table(rt, "expr_sales", f"-- topic: {topic}\n-- schema: title STRING, amount DOUBLE, ts TIMESTAMP\n"
                         f"CREATE TABLE expr_sales AS SELECT title, COUNT(*) AS n FROM sales WHERE {where} GROUP BY title",
                         topic)
    events = [{"title": t, "amount": a, "ts": f"2026-11-01T{h:02d}:15:00Z"}
              for t in ("a", "b", "B", "c") for a in (None, 1.0, 2.5, 4.9, 5.0, 9.0) for h in (0, 3)]
    for event in events:
        producer.produce(topic, json.dumps(event).encode())
    assert producer.flush(10) == 0
    commits = jobs.run("expr_sales", until_caught_up=True, spark=spark, rt=rt)
    frame = pd.DataFrame(events)
    amount = frame["amount"].fillna(0)
    hour = pd.to_datetime(frame["ts"]).dt.hour
    # CAST(NULL AS INT) >= 5 is NULL, which WHERE treats as false
    kept = frame[(frame["title"].str.upper() != "B") & (amount * 2 > 3)
                 & ((hour < 1) | (frame["amount"].notna() & (frame["amount"].fillna(0).astype(int) >= 5)))]
    assert {k[0]: v[0] for k, v in _state_rows(rt, "expr_sales").items()} == kept.groupby("title").size().to_dict()
    assert sum(c.counts.get("filtered", 0) for c in commits) == len(events) - len(kept)


def _run_in_two_batches(rt, spark, producer, topic: str, table: str, events: list[dict]) -> None:
    for half in (events[::2], events[1::2]):
        for event in half:
            producer.produce(topic, json.dumps(event).encode())
        assert producer.flush(10) == 0
        assert len(jobs.run(table, until_caught_up=True, spark=spark, rt=rt)) == 1


def test_expressions_in_aggregate_arguments_match_pandas_and_verify(env, spark):
    """SUM(amount * 2), COUNT(CASE ...), MAX(LENGTH(...)), AVG(COALESCE(...)), COUNT(DISTINCT FLOOR(...)),
    TOPK(2, amount * -1, UPPER(title)): computed per event
    before the aggregates fold them, in two batches; verify's recomputation from bronze agrees."""
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "derived_sales" + suffix
    producer = new_table(rt, "derived_sales", f"-- topic: {topic}\n-- schema: title STRING, amount DOUBLE\n"
                         "CREATE TABLE derived_sales AS SELECT title, SUM(amount * 2) AS doubled, "
                         "COUNT(CASE WHEN amount > 3 THEN 1 END) AS big, MAX(LENGTH(UPPER(title))) AS len, "
                         "AVG(COALESCE(amount, 10)) AS mean, COUNT(DISTINCT FLOOR(amount)) AS floors, "
                         "TOPK(2, amount * -1, UPPER(title)) AS cheapest FROM sales GROUP BY title", topic)
    events = [{"title": t, "amount": a} for t in ("a", "bb", "ccc") for a in (None, 1.5, 3.0, 4.5, 8.0)]
    _run_in_two_batches(rt, spark, producer, topic, "derived_sales", events)
    frame = pd.DataFrame(events)
    expected = {}
    for title, group in frame.groupby("title"):
        amounts = group["amount"]
        expected[(title,)] = {"title": title, "doubled": (amounts * 2).sum(), "big": int((amounts > 3).sum()),
                              "len": len(title), "mean": amounts.fillna(10).mean(),
                              "floors": amounts.dropna().floordiv(1).nunique(),
                              "cheapest": [[-a, title.upper()] for a in sorted(amounts.dropna())[:2]]}
    got = {(t,): lookup("derived_sales", (t,), rt=rt) for (t,) in expected}
    assert got.keys() == expected.keys()
    for key, row in got.items():
        want = expected[key]
        assert (row["title"], row["big"], row["len"]) == (want["title"], want["big"], want["len"]), row
        assert (row["floors"], [list(e) for e in row["cheapest"]]) == (want["floors"], want["cheapest"]), row
        assert abs(row["doubled"] - want["doubled"]) < 1e-9 and abs(row["mean"] - want["mean"]) < 1e-9, row
    assert verify("derived_sales", spark=spark, rt=rt).ok


def test_computed_group_by_keys_group_as_pandas_groups_and_verify_agrees(env, spark):
    """GROUP BY UPPER(country) and a SELECT alias of CAST(FLOOR(amount) AS BIGINT): computed per
    event before grouping; rows show the keys under their SELECT names, typed for URL keys."""
    from catalog.registry import coerce_key, load_table
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "by_country" + suffix
    producer = new_table(rt, "by_country", f"-- topic: {topic}\n-- schema: country STRING, amount DOUBLE\n"
                         "CREATE TABLE by_country AS SELECT UPPER(country) AS c, CAST(FLOOR(amount) AS BIGINT) AS bucket,"
                         " COUNT(*) AS n, SUM(amount) AS total FROM sales GROUP BY UPPER(country), bucket", topic)
    events = [{"country": c, "amount": a} for c in ("de", "DE", "fr", "Fr") for a in (1.25, 1.5, 3.0, 7.75)]
    _run_in_two_batches(rt, spark, producer, topic, "by_country", events)
    frame = pd.DataFrame(events)
    frame["c"], frame["bucket"] = frame["country"].str.upper(), frame["amount"].floordiv(1).astype(int)
    expected = {(c, int(b)): {"c": c, "bucket": int(b), "n": len(g), "total": float(g["amount"].sum())}
                for (c, b), g in frame.groupby(["c", "bucket"])}
    assert set(jobs.state_rows("by_country", rt)) == set(expected)
    assert {k: lookup("by_country", k, rt=rt) for k in expected} == expected
    table = load_table("by_country", rt)[0]
    assert table.key_types == {"c": "STRING", "bucket": "BIGINT"} and coerce_key(table, ("DE", "7")) == ("DE", 7)
    assert verify("by_country", spark=spark, rt=rt).ok
