"""A table's change topic (`-- output_topic`): committed changes as JSON upserts, published in the
changelog's Kafka transaction. Checked with confluent-kafka and pandas over the input topic, not
with the product's code."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from confluent_kafka import Producer

from spark_jobs import jobs
from deploy import samples
from serving.query import lookup
from tests.table_env import assert_each_batch_once_and_in_order, fold_change_topic, isolated_runtime, read_topic


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_an_aggregate_tables_change_topic_folds_to_the_table_and_follows_a_rebuild(env, spark):
    from spark_jobs import batch

    rt, suffix = env
    out = "movie_tickets_sold_changes" + suffix         # the shipped table's output_topic
    samples.produce("movie_tickets_sold", rt.bootstrap, 6000, suffix=suffix)
    commits = jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=2000)
    assert len(commits) >= 3

    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)])
    expected = frame.groupby("title")["ticket_total_value"].count().to_dict()
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert folded == {json.dumps({"title": t}): {"title": t, "tickets_sold": n} for t, n in expected.items()}
    assert_each_batch_once_and_in_order(seen)
    assert {b for _, b in seen} == {c.batch_id for c in commits}
    title = sorted(expected)[0]         # the value is the row as the API shows it
    assert folded[json.dumps({"title": title})] == lookup("movie_tickets_sold", (title,), rt=rt)

    # A run with nothing new publishes nothing.
    before = len(seen)
    assert jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt) == []
    assert len(fold_change_topic(rt.bootstrap, out)[1]) == before

    # A rebuild repairs a corrupted key: the repair reaches the topic as that key's one change in
    # the rebuild's batch (the other keys did not change).
    from state import codec

    table, _ = jobs.load_table("movie_tickets_sold", rt)
    st = jobs.state_table(table, rt)
    try:
        part = st.open(st.partition_of((title,)))
        part.backend.corrupt_value(codec.encode_key((title,)), codec.encode_value((expected[title] + 1000,)))
    finally:
        st.close()
    commit = batch.rebuild("movie_tickets_sold", spark=spark, rt=rt)
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert [key for key, b in seen if b == commit.batch_id] == [json.dumps({"title": title})]
    assert folded == {json.dumps({"title": t}): {"title": t, "tickets_sold": n} for t, n in expected.items()}
    assert_each_batch_once_and_in_order(seen)


def test_a_source_tables_delete_is_a_tombstone_on_its_change_topic(env, spark):
    rt, suffix = env
    out = "players-changes" + suffix
    sql = rt.tables_dir / "players.sql"
    sql.write_text(f"-- output_topic: {out}\n" + sql.read_text())
    from state.kafka_admin import ensure_topic

    producer = Producer({"bootstrap.servers": rt.bootstrap})
    topic = "players" + suffix
    ensure_topic(rt.bootstrap, topic, 2)
    for pid, name in ((1, "Ann"), (2, "Bo"), (3, "Cy")):
        producer.produce(topic, json.dumps({"id": pid, "name": name}).encode(), key=str(pid).encode())
    producer.flush()
    jobs.run("players", until_caught_up=True, spark=spark, rt=rt)
    producer.produce(topic, None, key=b"2")                   # a delete
    producer.produce(topic, json.dumps({"id": 3, "name": "Cyd"}).encode(), key=b"3")
    producer.flush()
    jobs.run("players", until_caught_up=True, spark=spark, rt=rt)

    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert folded == {'{"id": 1}': {"id": 1, "name": "Ann"}, '{"id": 3}': {"id": 3, "name": "Cyd"}}
    assert ('{"id": 2}', 1) in seen                           # the tombstone, in batch 1
    assert_each_batch_once_and_in_order(seen)


def test_an_output_topic_that_is_no_topic_name_fails_at_parse(tmp_path):
    from catalog.definitions import DefinitionError, parse

    text = ("-- topic: events\n-- schema: k STRING, v BIGINT\n-- output_topic: {}\n"
            "CREATE TABLE c AS SELECT k, COUNT(v) AS n FROM events GROUP BY k;")
    with pytest.raises(DefinitionError, match=r"c.sql:3:1: option output_topic='a b' is not a Kafka topic name"):
        parse(tmp_path / "c.sql", text.format("a b"))
    with pytest.raises(DefinitionError, match=r"'c' would write its changes to its own input topic 'events'"):
        parse(tmp_path / "c.sql", text.format("events"))


def test_a_chained_table_restored_after_a_wiped_store_is_exact_and_verify_checks_the_chain(env, spark):
    """movie_ticket_totals reads movie_tickets_sold's change topic (the shipped chain). After its
    local store is wiped it is restored, and verify recomputes the chain upstream first."""
    from ops import failures
    from spark_jobs import batch

    rt, suffix = env
    samples.produce("movie_tickets_sold", rt.bootstrap, 5000, suffix=suffix)
    jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=2000)
    jobs.run("movie_ticket_totals", until_caught_up=True, spark=spark, rt=rt)
    samples.produce("movie_tickets_sold", rt.bootstrap, 2000, suffix=suffix)     # more, in later batches
    jobs.run("movie_tickets_sold", until_caught_up=True, spark=spark, rt=rt)
    jobs.run("movie_ticket_totals", until_caught_up=True, spark=spark, rt=rt)

    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)])
    expected = {(t,): n for t, n in frame.groupby("title")["ticket_total_value"].count().items()}

    def totals() -> dict:
        return {k: v["tickets_sold"] if isinstance(v, dict) else v[-1]
                for k, v in jobs.state_rows("movie_ticket_totals", rt).items()}

    assert totals() == expected
    failures.inject("movie_ticket_totals", "wipe_local_store", rt)
    jobs.restore("movie_ticket_totals", rt=rt)
    assert totals() == expected
    result = batch.verify("movie_ticket_totals", spark=spark, rt=rt)
    assert result.ok, result.summary()
    assert [u.table for u in result.upstream] == ["movie_tickets_sold"] and result.upstream[0].ok
    assert result.keys_compared == result.upstream[0].keys_compared == len(expected)
