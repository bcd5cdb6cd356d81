"""Input that used to be counted wrongly, wedge a table or vanish: WHERE, non-finite numbers,
event times, source-table keys. Each table is checked against pandas over the records read
back from the topic, and every rejected record must be in the dead letters with its reason."""
from __future__ import annotations

import json
import math
import time

import pandas as pd
import pytest
from confluent_kafka import Producer

from spark_jobs import jobs
from deploy import samples
from catalog.batch_log import BatchLog
from serving.query import lookup
from state.kafka_admin import ensure_topic
from tests.table_env import dead_letter_reasons, isolated_runtime, read_topic


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _define(rt, name: str, text: str) -> None:
    (rt.tables_dir / f"{name}.sql").write_text(text)


def _produce(rt, topic: str, values, keys=None, partitions: int = 1) -> None:
    ensure_topic(rt.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        producer.produce(topic, value if value is None or isinstance(value, bytes) else json.dumps(value).encode(),
                         key=key, partition=0)
    assert producer.flush(30) == 0


def test_where_filters_in_the_batch_path_and_the_recomputation(env, spark):
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "movie_ticket_sales" + suffix
    _define(rt, "big_sales", f"-- topic: {topic}\n-- schema: title STRING, ticket_total_value DOUBLE\n"
                             "-- partitions: 2\n"
                             "CREATE TABLE big_sales AS SELECT title, COUNT(*) AS n, SUM(ticket_total_value) AS total\n"
                             "FROM sales WHERE ticket_total_value >= 12 AND title <> 'Up' GROUP BY title")
    samples.produce("movie_tickets_sold", rt.bootstrap, 3000, suffix=suffix)
    commits = jobs.run("big_sales", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=2000)

    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, topic)])
    kept = frame[(frame.ticket_total_value >= 12) & (frame.title != "Up")]
    assert 0 < len(kept) < len(frame)
    expected = kept.groupby("title")["ticket_total_value"].agg(["count", "sum"])
    state = jobs.state_rows("big_sales", rt)
    assert {k[0]: v[0] for k, v in state.items()} == expected["count"].to_dict()
    assert all(math.isclose(state[(t,)][1], total) for t, total in expected["sum"].items())
    assert sum(c.counts["filtered"] for c in commits) == len(frame) - len(kept)
    assert verify("big_sales", spark=spark, rt=rt).ok


def test_nan_infinity_and_overflowing_doubles_are_wrong_type_and_never_reach_max(env, spark):
    rt, suffix = env
    topic = "scores" + suffix
    _define(rt, "best", f"-- topic: {topic}\n-- schema: game BIGINT, score DOUBLE\n-- partitions: 1\n"
                        "CREATE TABLE best AS SELECT game, MAX(score) AS top, SUM(score) AS total, "
                        "TOPK(2, score, game) AS podium FROM scores GROUP BY game")
    good = [{"game": 1, "score": 10.0}, {"game": 1, "score": 30.0}, {"game": 2, "score": 5.5}]
    hostile = [b'{"game": 1, "score": "NaN"}', b'{"game": 1, "score": NaN}', b'{"game": 2, "score": "Infinity"}',
               b'{"game": 2, "score": -Infinity}', b'{"game": 1, "score": 1e400}']
    _produce(rt, topic, [good[0], *hostile[:3], good[1], *hostile[3:], good[2]])
    (commit,) = jobs.run("best", until_caught_up=True, spark=spark, rt=rt)
    assert commit.counts["dead_wrong_type"] == 5 and commit.counts["parsed"] == 3
    assert sorted(dead_letter_reasons(rt, "best").items()) == [(o, "wrong_type") for o in (1, 2, 3, 5, 6)]
    frame = pd.DataFrame(good)
    expected = frame.groupby("game")["score"].agg(["max", "sum"])
    state = jobs.state_rows("best", rt)
    assert {k[0]: (v[0], v[1]) for k, v in state.items()} == {g: (r["max"], r["sum"]) for g, r in expected.iterrows()}
    assert lookup("best", ("1",), rt=rt)["podium"] == [(30.0, 1), (10.0, 1)]


def test_stored_nan_is_served_as_null_not_as_an_error():
    from catalog.mapping import row_of
    from catalog.definitions import load_all
    from tests.table_env import SHIPPED

    tables = load_all(SHIPPED)
    row = row_of(tables["payments_per_customer"], ("c1",), (2, float("nan"), float("inf")))
    assert row == {"customer_id": "c1", "payments": 2, "total": None, "largest": None}
    json.dumps(row, allow_nan=False)
    board = row_of(tables["leaderboard"], (1,), (((float("nan"), 3, (7, 1, "Ann", "Pong")),),))
    assert board["top3"] == [(None, 7, 1, "Ann", "Pong")]


def test_event_times_take_epoch_millis_and_iso_and_missing_or_future_ones_are_dead_lettered(env, spark):
    rt, suffix = env
    topic = "clicks" + suffix
    _define(rt, "hourly_clicks", f"-- topic: {topic}\n-- schema: page STRING, ts TIMESTAMP\n-- partitions: 2\n"
                                 "-- event_time_skew: 1h\n"
                                 "CREATE TABLE hourly_clicks AS SELECT page, COUNT(*) AS n FROM clicks "
                                 "GROUP BY page, TUMBLE(ts, INTERVAL '1' HOUR)")
    hour = 1_793_491_200_000                                  # 2026-11-01T00:00Z
    now = int(time.time() * 1000)
    values = [
        {"page": "a", "ts": hour + 60_000},                   # epoch milliseconds, a JSON number
        {"page": "a", "ts": "2026-11-01T00:30:00Z"},          # ISO-8601
        {"page": "b", "ts": str(hour + 3_600_000)},           # epoch milliseconds as digits
        {"page": "a"},                                        # no event time
        {"page": "a", "ts": None},                            # null event time
        {"page": "a", "ts": now + 2 * 3_600_000},             # two hours ahead of the clock
        {"page": "a", "ts": "yesterday"},                     # not a time
        {"page": "b", "ts": hour + 3_600_000 + 5},
    ]
    _produce(rt, topic, values)
    (commit,) = jobs.run("hourly_clicks", until_caught_up=True, spark=spark, rt=rt)
    assert dead_letter_reasons(rt, "hourly_clicks") == {3: "missing_event_time", 4: "missing_event_time",
                                                  5: "future_event_time", 6: "wrong_type"}
    assert commit.counts["parsed"] == 4 and commit.counts["dead_lettered"] == 4
    # The watermark is the newest accepted event, not the year 58,700 or the future record.
    assert commit.watermark_ms == hour + 3_600_000 + 5
    accepted = pd.DataFrame([{"page": "a", "ms": hour + 60_000}, {"page": "a", "ms": hour + 1_800_000},
                             {"page": "b", "ms": hour + 3_600_000}, {"page": "b", "ms": hour + 3_600_005}])
    accepted["start"] = accepted.ms // 3_600_000 * 3_600_000
    expected = {(p, s): n for (p, s), n in accepted.groupby(["page", "start"]).size().items()}
    assert {k: v[0] for k, v in jobs.state_rows("hourly_clicks", rt).items()} == expected


def test_source_table_deletes_and_puts_must_name_the_same_key(env, spark):
    rt, suffix = env
    topic = "players" + suffix
    values = [{"id": 1, "name": "Elyse"}, {"id": 2, "name": "Mitch"}, {"id": 3, "name": "Isabelle"},
              {"id": 4, "name": "Wrong"},      # Kafka key 5: which row is this?
              None,                            # tombstone without a key
              None,                            # tombstone whose key is not a BIGINT
              None,                            # deletes player 2
              {"id": 6, "name": "Keyless"}]    # no Kafka key: the JSON key rules
    keys = [b"1", b"2", b"3", b"5", None, b"abc", b"2", None]
    _produce(rt, topic, values, keys)
    (commit,) = jobs.run("players", until_caught_up=True, spark=spark, rt=rt)
    assert dead_letter_reasons(rt, "players") == {3: "key_mismatch", 4: "tombstone_without_key",
                                            5: "bad_tombstone_key"}
    assert commit.counts["dead_lettered"] == 3
    assert {k[0]: v[1] for k, v in jobs.state_rows("players", rt).items()} == {1: "Elyse", 3: "Isabelle",
                                                                                6: "Keyless"}
    assert BatchLog(rt.batch_dir("players")).last_commit().counts["dead_key_mismatch"] == 1


def _recreate(rt, topic: str, partitions: int) -> None:
    from state.kafka_admin import admin, delete_topic

    delete_topic(rt.bootstrap, topic)
    deadline = time.monotonic() + 60
    while topic in admin(rt.bootstrap).list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(50):
        try:
            ensure_topic(rt.bootstrap, topic, partitions)
            return
        except Exception:       # still being deleted
            time.sleep(0.2)
    ensure_topic(rt.bootstrap, topic, partitions)


def test_a_recreated_or_truncated_topic_stops_the_table_until_an_operator_accepts_it(env, spark):
    from confluent_kafka import TopicPartition

    from spark_jobs.batches import planning

    from spark_jobs.steps import offsets
    from spark_jobs.steps.offsets import OffsetDiscontinuity
    from state.kafka_admin import admin

    rt, suffix = env
    name, topic = "movie_tickets_sold", "movie_ticket_sales" + suffix
    samples.produce(name, rt.bootstrap, 1000, suffix=suffix)
    jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    history = [json.loads(m.value()) for m in read_topic(rt.bootstrap, topic)]

    def counts() -> dict:
        return {k[0]: v[0] for k, v in jobs.state_rows(name, rt).items()}

    before = counts()
    _recreate(rt, topic, 4)
    samples.produce(name, rt.bootstrap, 300, suffix=suffix)
    with pytest.raises(OffsetDiscontinuity) as err:
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    message = str(err.value)
    assert f"table '{name}', topic '{topic}'" in message and "accept-offsets" in message
    assert "deleted and recreated" in message or "before offset" in message
    with pytest.raises(OffsetDiscontinuity):
        planning.lag(name, rt)                    # a reset is never "nothing to read"
    assert counts() == before

    entry = jobs.accept_offsets(name, rt=rt, note="topic recreated by the test")
    assert entry["starts"] == {str(p): 0 for p in range(4)} and entry["previous"]["ends"]
    (commit,) = jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    assert commit.counts["read"] == 300 and commit.accepted["note"] == "topic recreated by the test"
    history += [json.loads(m.value()) for m in read_topic(rt.bootstrap, topic)]
    assert counts() == pd.DataFrame(history).groupby("title")["ticket_total_value"].count().to_dict()
    assert planning.lag(name, rt) == 0

    # Recreated again and grown past the old end: only the topic id can tell.
    _recreate(rt, topic, 4)
    samples.produce(name, rt.bootstrap, 1500, suffix=suffix)
    with pytest.raises(OffsetDiscontinuity, match="deleted and recreated"):
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    jobs.accept_offsets(name, rt=rt)
    jobs.run(name, until_caught_up=True, spark=spark, rt=rt)

    # Retention deleted records nobody read: a gap, named with its offsets. Records without a key
    # go to a partition the producer picks (sticky), so the gap is made where new records landed.
    read = {p: high for p, (_, high) in offsets.watermarks(rt.bootstrap, topic).items()}
    samples.produce(name, rt.bootstrap, 200, suffix=suffix)
    ends = {p: high for p, (_, high) in offsets.watermarks(rt.bootstrap, topic).items()}
    grown = max(ends, key=lambda p: ends[p] - read[p])
    assert ends[grown] > read[grown]
    client = admin(rt.bootstrap)
    for future in client.delete_records([TopicPartition(topic, grown, ends[grown])]).values():
        future.result(30)
    with pytest.raises(OffsetDiscontinuity,
                       match=rf"partition {grown}: offsets {read[grown]}\.\.{ends[grown] - 1} were deleted before they were read"):
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)


def test_a_sum_past_64_bits_dead_letters_its_events_and_the_rest_of_the_batch_commits(env, spark):
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "ledger" + suffix
    _define(rt, "ledger", f"-- topic: {topic}\n-- schema: account STRING, amount BIGINT\n-- partitions: 2\n"
                          "CREATE TABLE ledger AS SELECT account, SUM(amount) AS total, COUNT(*) AS n\n"
                          "FROM ledger GROUP BY account")
    big = 2**63 - 1000
    values = [{"account": "a", "amount": big}, {"account": "b", "amount": 1},
              {"account": "a", "amount": 5000}, {"account": "b", "amount": 5},     # a would pass 2^63 - 1
              {"account": "a", "amount": -5}, {"account": "b", "amount": 2}]
    _produce(rt, topic, values)
    commits = jobs.run("ledger", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=2)
    assert len(commits) == 3
    assert commits[1].counts["dead_sum_overflow"] == 1 and commits[1].refused == [[["a"], "sum_overflow"]]

    dead = dead_letter_reasons(rt, "ledger")
    assert dead == {2: "sum_overflow"}
    frame = pd.DataFrame([json.loads(m.value()) | {"offset": m.offset()} for m in read_topic(rt.bootstrap, topic)])
    kept = frame[~frame["offset"].isin(list(dead))]
    expected = {(acc,): (int(g["amount"].sum()), len(g)) for acc, g in kept.groupby("account")}
    assert expected[("a",)] == (big - 5, 2)
    st = jobs.state_table(jobs.load_table("ledger", rt)[0], rt)
    try:
        state = {k: v for p in range(2) for k, v in st.open(p).items()}
    finally:
        st.close()
    assert state == expected
    result = verify("ledger", spark=spark, rt=rt)
    assert result.ok, result.summary()


def test_a_lost_batch_log_stops_the_writer_instead_of_applying_batches_again(env, spark):
    """The changelog holds committed state, but the batch log that explains it is gone (a lost data
    folder, or a second deployment under the same namespace). Going on would restore that state and
    apply the topic's first batches on top of it again; the writer stops instead, names the table,
    the topic and the fixes, and writes nothing."""
    import shutil

    from catalog import registry
    from catalog.batch_log import BatchLogLost
    from spark_jobs.steps.offsets import watermarks

    rt, suffix = env
    name = "movie_tickets_sold"
    samples.produce(name, rt.bootstrap, 300, suffix=suffix)
    (commit,) = jobs.run(name, spark=spark, rt=rt)
    assert commit.counts["read"] == 300
    changelog = registry.spec_of(registry.load_table(name, rt)[0], rt).changelog_topic
    written = watermarks(rt.bootstrap, changelog)
    assert sum(high for _, high in written.values()) > 0

    shutil.rmtree(rt.batch_dir(name))
    with pytest.raises(BatchLogLost, match=rf"{name}: its batch log .* holds no batch, but its changelog topic "
                                           rf"{changelog} holds \d+ records.*STATETABLE_NAMESPACE"):
        jobs.run(name, spark=spark, rt=rt)
    assert watermarks(rt.bootstrap, changelog) == written, "the stopped writer wrote nothing"
    assert BatchLog(rt.batch_dir(name)).last_commit() is None and BatchLog(rt.batch_dir(name)).pending_plan() is None
