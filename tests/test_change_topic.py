"""A table's change topic (`-- output_topic`): committed changes as JSON upserts, published in the
changelog's Kafka transaction. Checked with confluent-kafka and pandas over the input topic, not
with the product's code."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from confluent_kafka import Producer

from catalog.mapping import row_of
from spark_jobs import jobs
from deploy import samples
from serving.query import lookup
from tests.table_env import (OUT_OF_ORDER_BATCHES, assert_each_batch_once_and_in_order, fold_change_topic,
                              hourly_table, isolated_runtime, new_table, produce_minutes, read_topic)
from tests.tamper import corrupt_value


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def test_an_aggregate_tables_change_topic_folds_to_the_table_and_follows_a_rebuild(env, spark):
    from spark_jobs.recompute.rebuild import rebuild

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
        corrupt_value(part.backend, codec.encode_key((title,)), codec.encode_value((expected[title] + 1000,)))
    finally:
        st.close()
    commit = rebuild("movie_tickets_sold", spark=spark, rt=rt)
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


def test_a_change_topic_without_batch_headers_holds_the_same_records_in_the_same_partitions(env, spark):
    """`output_headers: none` sends a batch's change records in one produce_batch (no headers):
    two tables over one topic, one with the header and one without, publish the same records,
    each in the same partition (the partitioner places both alike), many batches and deletes;
    the one without carries no headers, and folds to the pandas count."""
    rt, suffix = env
    topic = "headed" + suffix
    outs = {"with_header": f"with-header{suffix}", "without_header": f"without-header{suffix}"}
    for name, out in outs.items():
        option = "" if name == "with_header" else "-- output_headers: none\n"
        producer = new_table(rt, name, f"-- topic: {topic}\n-- schema: k STRING, v BIGINT\n-- partitions: 3\n"
                             f"-- output_topic: {out}\n{option}CREATE TABLE {name} AS SELECT k, COUNT(*) AS n, "
                             f"SUM(v) AS s FROM events GROUP BY k;\n", topic)
    sent = []
    for batch in range(4):
        for i in range(300):
            k, v = f"k{(i * 7 + batch) % 120}", i + batch
            producer.produce(topic, json.dumps({"k": k, "v": v}).encode())
            sent.append((k, v))
        assert producer.flush(10) == 0
        for name in outs:
            assert len(jobs.run(name, until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=200)) == 2
    placed = {}
    for name, out in outs.items():
        records = sorted(read_topic(rt.bootstrap, out), key=lambda m: (m.partition(), m.offset()))
        placed[name] = {}           # a key's changes in order (state partitions' commits interleave)
        for m in records:
            placed[name].setdefault((m.partition(), m.key()), []).append(m.value())
        headers = {tuple(k for k, _ in (m.headers() or ())) for m in records}
        assert headers == ({("batch",)} if name == "with_header" else {()})
    assert placed["with_header"] == placed["without_header"]
    assert len({p for p, _ in placed["without_header"]}) == 3
    frame = pd.DataFrame(sent, columns=["k", "v"]).groupby("k")["v"].agg(["count", "sum"])
    folded = {key.decode(): json.loads(values[-1]) for (_, key), values in placed["without_header"].items()}
    assert folded == {json.dumps({"k": k}): {"k": k, "n": int(r["count"]), "s": int(r["sum"])}
                      for k, r in frame.iterrows()}


def test_an_output_topic_that_is_no_topic_name_fails_at_parse(tmp_path):
    from catalog.definitions import DefinitionError, parse

    text = ("-- topic: events\n-- schema: k STRING, v BIGINT\n-- output_topic: {}\n"
            "CREATE TABLE c AS SELECT k, COUNT(v) AS n FROM events GROUP BY k;")
    with pytest.raises(DefinitionError, match=r"c.sql:3:1: option output_topic='a b' is not a Kafka topic name"):
        parse(tmp_path / "c.sql", text.format("a b"))
    with pytest.raises(DefinitionError, match=r"'c' would write its changes to its own input topic 'events'"):
        parse(tmp_path / "c.sql", text.format("events"))
    with pytest.raises(DefinitionError, match=r"c.sql:4:1: table 'c': emit: final needs a windowed table"):
        parse(tmp_path / "c.sql", text.format("out").replace("CREATE", "-- emit: final\nCREATE"))
    with pytest.raises(DefinitionError, match=r"option emit='last' must be changes .* or final"):
        parse(tmp_path / "c.sql", text.format("out").replace("CREATE", "-- emit: last\nCREATE"))
    with pytest.raises(DefinitionError, match=r"c.sql:4:1: table 'c': option output_headers='off' must be batch .* "
                                              r"or none"):
        parse(tmp_path / "c.sql", text.format("out").replace("CREATE", "-- output_headers: off\nCREATE"))
    with pytest.raises(DefinitionError, match=r"c.sql:3:1: table 'c' has no output_topic, whose records the option "
                                              r"sets; add '-- output_topic: <topic>' or remove it"):
        parse(tmp_path / "c.sql", text.replace("-- output_topic: {}", "-- output_headers: none"))
    assert parse(tmp_path / "c.sql", text.format("out").replace("CREATE", "-- output_headers: none\nCREATE")) \
        .output_headers == "none"


def test_a_chained_table_restored_after_a_wiped_store_is_exact_and_verify_checks_the_chain(env, spark):
    """movie_ticket_totals reads movie_tickets_sold's change topic (the shipped chain). After its
    local store is wiped it is restored, and verify recomputes the chain upstream first."""
    from ops import failures
    from spark_jobs.recompute.verify import verify

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
    result = verify("movie_ticket_totals", spark=spark, rt=rt)
    assert result.ok, result.summary()
    assert [u.table for u in result.upstream] == ["movie_tickets_sold"] and result.upstream[0].ok
    assert result.keys_compared == result.upstream[0].keys_compared == len(expected)

    # The rest of the shipped chain: the join with movies (a genre per title), then tickets per
    # genre over the join's rows. The join runs before movies ever ran (no genres yet), then a
    # title changes genre and another leaves the catalogue: their tickets move between genres.
    jobs.run("movie_ticket_genres", until_caught_up=True, spark=spark, rt=rt)
    jobs.run("tickets_per_genre", until_caught_up=True, spark=spark, rt=rt)
    assert {k[0]: v[1] for k, v in jobs.state_rows("tickets_per_genre", rt).items()} == {None: len(expected)}
    samples.produce("movies", rt.bootstrap, suffix=suffix)
    genres = dict(samples.GENRES)
    jobs.run("movies", until_caught_up=True, spark=spark, rt=rt)
    jobs.run("movie_ticket_genres", until_caught_up=True, spark=spark, rt=rt)
    jobs.run("tickets_per_genre", until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=4)
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    producer.produce("movies" + suffix, json.dumps({"title": "Alien", "genre": "horror"}).encode(), key=b"Alien")
    producer.produce("movies" + suffix, None, key=b"Heat")
    producer.flush()
    genres["Alien"] = "horror"
    del genres["Heat"]
    for table in ("movies", "movie_ticket_genres", "tickets_per_genre"):
        jobs.run(table, until_caught_up=True, spark=spark, rt=rt)

    sold = frame.groupby("title")["ticket_total_value"].count().rename("tickets_sold").reset_index()
    sold["genre"] = sold["title"].map(genres)            # a LEFT join: no genre is NULL
    want = {}
    for genre, group in sold.groupby(sold["genre"].fillna("\0null"), sort=False):
        best = group.sort_values(["tickets_sold", "title"], ascending=[False, True]).head(3)
        want[None if genre == "\0null" else genre] = {
            "genre": None if genre == "\0null" else genre, "titles": len(group),
            "tickets_sold": int(group["tickets_sold"].sum()), "best": int(group["tickets_sold"].max()),
            "best_sellers": [[int(n), t] for n, t in zip(best["tickets_sold"], best["title"])]}

    def per_genre() -> dict:
        table, _ = jobs.load_table("tickets_per_genre", rt)
        rows = {k[0]: row_of(table, k, v) for k, v in jobs.state_rows("tickets_per_genre", rt).items()}
        return {g: {**row, "best_sellers": [list(e) for e in row["best_sellers"]]} for g, row in rows.items()}

    assert per_genre() == want
    for table in ("movie_ticket_genres", "tickets_per_genre"):
        failures.inject(table, "wipe_local_store", rt)
        jobs.restore(table, rt=rt)
    assert per_genre() == want
    result = verify("tickets_per_genre", spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(want), result.summary()
    assert [u.table for u in result.upstream] == ["movie_ticket_genres"] and result.upstream[0].ok
    assert result.upstream[0].keys_compared == len(expected)

def test_emit_final_emits_each_window_once_when_it_closes_with_its_final_value(env, spark):
    """Out-of-order events over four batches (as the windowed test in test_microbatch): with
    `emit: final` each window reaches the change topic once, in the batch whose watermark passes
    its end plus grace, with the value pandas computes over the events that were not late; a
    window still open at the end is not emitted."""
    rt, suffix = env
    topic, out = "final_sales" + suffix, "hourly-final" + suffix
    producer = hourly_table(rt, "hourly_final", topic, f"-- output_topic: {out}\n-- emit: final\n")
    day = 1_793_491_200_000
    accepted, watermark, closed_in = [], None, {}
    for batch_id, events in enumerate(OUT_OF_ORDER_BATCHES):
        produce_minutes(producer, topic, events)
        assert len(jobs.run("hourly_final", until_caught_up=True, spark=spark, rt=rt)) == 1
        on_time = [(m, t) for m, t in events if watermark is None or (m // 60) * 60 + 70 > watermark]
        accepted += on_time
        previous, watermark = watermark, max([watermark or 0] + [m for m, _ in on_time])
        for start in {(m // 60) * 60 for m, _ in accepted}:
            if (previous is None or start + 70 > previous) and start + 70 <= watermark:
                closed_in[start] = batch_id
    frame = pd.DataFrame(accepted, columns=["minute", "title"])
    frame["start"] = (frame["minute"] // 60) * 60
    expected = {json.dumps({"title": t, "window_start": day + s * 60_000}): {"title": t, "window_start":
                day + s * 60_000, "n": int(n)} for (t, s), n in frame.groupby(["title", "start"]).size().items()
                if s in closed_in}
    assert closed_in == {0: 0, 60: 2}
    records = sorted(read_topic(rt.bootstrap, out), key=lambda m: (m.partition(), m.offset()))
    keys = [m.key().decode() for m in records]
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    assert {m.key().decode(): json.loads(m.value()) for m in records} == expected
    for m in records:
        start = (json.loads(m.key())["window_start"] - day) // 60_000
        assert int(dict(m.headers())["batch"]) == closed_in[start]


def _table_with_change_topic(env, name: str, schema: str, select: str):
    """(runtime, change topic, input topic, producer) of table `name` keyed by `k`, 2 partitions."""
    rt, suffix = env
    topic, out = f"{name}_events{suffix}", f"{name}-out{suffix}"
    producer = new_table(rt, name, f"-- topic: {topic}\n-- schema: {schema}\n-- partitions: 2\n-- output_topic: {out}\n"
                         f"CREATE TABLE {name} AS {select};\n", topic)
    return rt, out, topic, producer


def test_having_hides_rows_from_the_api_and_the_change_topic_while_the_state_keeps_them(env, spark):
    rt, out, topic, producer = _table_with_change_topic(
        env, "busy", "k STRING, v BIGINT",
        "SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k\nHAVING COUNT(v) >= 2 AND s < 100")
    produced = []
    for batch in ([("a", 1), ("b", 2), ("b", 3), ("c", 50), ("c", 60)], [("a", 4), ("d", 7)]):
        for k, v in batch:
            produced.append((k, v))
            producer.produce(topic, json.dumps({"k": k, "v": v}).encode(), key=k.encode())
        producer.flush()
        jobs.run("busy", until_caught_up=True, spark=spark, rt=rt)
        if len(produced) == 5:
            assert lookup("busy", ("a",), rt=rt) is None           # one event: hidden
            assert lookup("busy", ("b",), rt=rt) == {"k": "b", "n": 2, "s": 5}

    frame = pd.DataFrame(produced, columns=["k", "v"]).groupby("k")["v"].agg(["count", "sum"])
    every = {k: {"k": k, "n": int(r["count"]), "s": int(r["sum"])} for k, r in frame.iterrows()}
    shown = {k: row for k, row in every.items() if row["n"] >= 2 and row["s"] < 100}
    assert set(shown) == {"a", "b"}                               # c sums past 100, d has one event
    assert {k[0] for k in jobs.state_rows("busy", rt)} == set(every)     # the state keeps every key
    assert {k: lookup("busy", (k,), rt=rt) for k in every} == {k: shown.get(k) for k in every}
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert folded == {json.dumps({"k": k}): row for k, row in shown.items()}
    assert (json.dumps({"k": "a"}), 0) in seen                   # a's first change was a tombstone


def test_select_columns_computed_from_aggregates_show_in_the_api_and_the_change_topic(env, spark):
    """`SUM(amount) / COUNT(*) AS mean` and `MAX(amount) - MIN(amount) AS spread`: the state keeps
    the aggregates (SUM, MAX and MIN hidden), the rows show the computed columns, and HAVING
    can use them."""
    rt, out, topic, producer = _table_with_change_topic(
        env, "spreads", "k STRING, amount DOUBLE",
        "SELECT k, COUNT(*) AS n, SUM(amount) / COUNT(*) AS mean, MAX(amount) - MIN(amount) AS spread FROM events "
        "GROUP BY k HAVING mean > 2")
    produced = [("a", 1.0), ("a", 2.0), ("b", 4.0), ("b", 7.5), ("c", 0.5), ("a", 9.0)]
    for k, amount in produced:
        producer.produce(topic, json.dumps({"k": k, "amount": amount}).encode(), key=k.encode())
    producer.flush()
    jobs.run("spreads", until_caught_up=True, spark=spark, rt=rt)

    frame = pd.DataFrame(produced, columns=["k", "amount"]).groupby("k")["amount"]
    every = {k: {"k": k, "n": int(g.count()), "mean": g.sum() / g.count(), "spread": g.max() - g.min()}
             for k, g in frame}
    shown = {k: row for k, row in every.items() if row["mean"] > 2}
    assert set(shown) == {"a", "b"}
    for k in every:
        row = lookup("spreads", (k,), rt=rt)
        if k not in shown:
            assert row is None, row
            continue
        assert list(row) == ["k", "n", "mean", "spread"]          # the hidden aggregates stay hidden
        assert row["n"] == shown[k]["n"] and abs(row["mean"] - shown[k]["mean"]) < 1e-9
        assert abs(row["spread"] - shown[k]["spread"]) < 1e-9
    folded, _ = fold_change_topic(rt.bootstrap, out)
    assert folded == {json.dumps({"k": k}): lookup("spreads", (k,), rt=rt) for k in shown}


def test_case_cast_coalesce_and_string_functions_in_select_match_pandas(env, spark):
    """SELECT columns with CASE, CAST, COALESCE, ROUND, UPPER, CONCAT and SUBSTRING, over keys and
    aggregates (one over the keys alone), computed when rows are shown; pandas computes the same."""
    rt, out, topic, producer = _table_with_change_topic(
        env, "labels", "k STRING, amount DOUBLE",
        "SELECT k, COUNT(*) AS n, UPPER(SUBSTRING(k, 1, 3)) AS tag,\n"
        "  CASE WHEN SUM(amount) >= 10 THEN 'big' WHEN SUM(amount) > 0 THEN 'small' ELSE 'none' END AS size,\n"
        "  CAST(ROUND(AVG(amount), 1) AS STRING) AS mean_text, COALESCE(MAX(amount), -1) AS top,\n"
        "  CONCAT(k, ':', CAST(COUNT(*) AS STRING)) AS label\n"
        "FROM events GROUP BY k")
    produced = [("alpha", 1.25), ("alpha", 2.0), ("beta", 4.0), ("beta", 7.5), ("gamma", None), ("alpha", 9.0)]
    for k, amount in produced:
        producer.produce(topic, json.dumps({"k": k, "amount": amount}).encode(), key=k.encode())
    producer.flush()
    jobs.run("labels", until_caught_up=True, spark=spark, rt=rt)

    frame = pd.DataFrame(produced, columns=["k", "amount"])
    expected = {}
    for k, g in frame.groupby("k"):
        total, mean, top = g["amount"].sum(min_count=1), g["amount"].mean(), g["amount"].max()
        size = "big" if total >= 10 else "small" if total > 0 else "none"
        expected[k] = {"k": k, "n": len(g), "tag": k[:3].upper(), "size": size,
                       "mean_text": None if pd.isna(mean) else str(float(f"{mean + 1e-12:.1f}")),
                       "top": -1 if pd.isna(top) else top, "label": f"{k}:{len(g)}"}
    assert expected["alpha"]["mean_text"] == "4.1" and expected["gamma"]["size"] == "none"
    assert {k: lookup("labels", (k,), rt=rt) for k in expected} == expected
    folded, _ = fold_change_topic(rt.bootstrap, out)
    assert folded == {json.dumps({"k": k}): row for k, row in expected.items()}
