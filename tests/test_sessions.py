"""SESSION(ts, gap, grace) in GROUP BY: sessions that merge when an event bridges them, also
across batches, late events dead-lettered, closed sessions purged and (`emit: final`) emitted
once. Checked against pandas over the produced events, not the product's code; one table runs
the Arrow pass, the other the Spark-SQL pass."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from spark_jobs import jobs
from tests.table_env import fold_change_topic, isolated_runtime, new_table, read_topic

GAP, GRACE, DAY = 10, 20, 1_793_491_200_000       # minutes, minutes, 2026-11-01 in epoch ms
# (minute, user, value) per batch; the watermark is the newest accepted event time
BATCHES = [
    [(0, "a", 1), (5, "a", 2), (30, "a", 3), (2, "b", 4)],   # a: [0-5] and [30]; b: [2]
    [(14, "a", 5), (22, "a", 6), (40, "b", 7)],               # 14 and 22 bridge a's two sessions into one
    [(3, "a", 8), (45, "c", 9), (50, "a", 10)],               # 3 is late (3 + grace < 40)
    [(41, "a", 11), (12, "b", 12)],                           # 41 opens a's [41-50]; 12 is late
    [(75, "c", 13)],                                          # watermark 75: a's [0-30] and b's [2] purged
]


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _reference():
    """(accepted events with their batch, sessions as a DataFrame, watermark after each batch)."""
    accepted, watermark, marks = [], None, []
    for batch_id, events in enumerate(BATCHES):
        on_time = [(m, u, v) for m, u, v in events if watermark is None or m + GRACE >= watermark]
        accepted += [(m, u, v, batch_id) for m, u, v in on_time]
        watermark = max([watermark or 0] + [m for m, _, _ in on_time])
        marks.append(watermark)
    frame = pd.DataFrame(accepted, columns=["minute", "visitor", "v", "batch"]).sort_values(["visitor", "minute"])
    frame["session"] = (frame.groupby("visitor")["minute"].diff().fillna(GAP + 1) > GAP).cumsum()   # inclusive gap
    sessions = frame.groupby(["visitor", "session"]).agg(start=("minute", "min"), end=("minute", "max"),
                                                       n=("v", "size"), total=("v", "sum")).reset_index()
    return accepted, sessions, marks


def _row(s) -> dict:
    return {"visitor": s.visitor, "window_start": DAY + int(s.start) * 60_000, "n": int(s.n), "total": int(s.total),
            "window_end": DAY + int(s.end) * 60_000}


def test_sessions_merge_across_batches_and_match_pandas_through_restore_verify_and_emit_final(env, spark):
    from ops import failures
    from serving.query import lookup
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic = "clicks" + suffix
    select = (f"SELECT visitor, COUNT(*) AS n, SUM(v) AS total FROM clicks "
              f"GROUP BY visitor, SESSION(ts, INTERVAL '{GAP}' MINUTE, INTERVAL '{GRACE}' MINUTE);\n")
    header = f"-- topic: {topic}\n-- schema: visitor STRING, v BIGINT, ts TIMESTAMP\n-- partitions: 2\n-- snapshot_every: 2\n-- snapshot_phase: 0\n"
    producer = new_table(rt, "visits", header + f"-- output_topic: visits-out{suffix}\nCREATE TABLE visits AS "
                         + select, topic)
    new_table(rt, "visits_final", header + f"-- output_topic: visits-final{suffix}\n-- emit: final\n"
              f"CREATE TABLE visits_final AS " + select.replace("SUM(v)", "SUM(v * 1)"), topic)
    names = ("visits", "visits_final")
    from catalog.registry import load_table
    from spark_jobs.batches.microbatch import engine_of

    assert [engine_of(load_table(n, rt)[0]) for n in names] == ["arrow", "spark"]     # both passes sessionise
    for batch_id, events in enumerate(BATCHES):
        for minute, visitor, value in events:
            ts = f"2026-11-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
            producer.produce(topic, json.dumps({"visitor": visitor, "v": value, "ts": ts}).encode(), key=visitor.encode())
        assert producer.flush(10) == 0
        for name in names:
            assert len(jobs.run(name, until_caught_up=True, spark=spark, rt=rt)) == 1
        if batch_id == 1:       # 14 and 22 bridged a's [0-5] and [30], which sat in the state
            for name in names:
                assert sorted((k, v) for k, v in jobs.state_rows(name, rt).items() if k[0] == "a") == [
                    (("a", DAY), (5, 17, DAY + 30 * 60_000))], name

    accepted, sessions, marks = _reference()
    assert marks == [30, 40, 50, 50, 75] and len(accepted) == 11          # 3 and 12 were late
    purge_mark = marks[4]                                                  # snapshot_every 2: batches 0, 2, 4 purge
    kept = sessions[sessions.end + GAP + GRACE + GAP > purge_mark]
    expected = {(s.visitor, DAY + int(s.start) * 60_000): _row(s) for s in kept.itertuples()}
    assert sorted((s.visitor, int(s.start), int(s.end)) for s in sessions.itertuples()) == [
        ("a", 0, 30), ("a", 41, 50), ("b", 2, 2), ("b", 40, 40), ("c", 45, 45), ("c", 75, 75)]
    assert set(jobs.state_rows("visits", rt)) == set(expected)
    assert jobs.state_rows("visits_final", rt) == jobs.state_rows("visits", rt)
    assert {k: lookup("visits", k, rt=rt) for k in expected} == expected

    # every change on the change topic; folded, a session's key holds its latest value or is gone
    folded, _ = fold_change_topic(rt.bootstrap, "visits-out" + suffix)
    assert folded == {json.dumps({"visitor": u, "window_start": s}): row for (u, s), row in expected.items()}
    dead = read_topic(rt.bootstrap, rt.dead_letter_topic("visits"))
    assert sorted(json.loads(m.value())["v"] for m in dead) == [8, 12]
    assert {dict(m.headers())["reason"] for m in dead} == {b"late"}

    # emit: final: each session once, in the batch whose watermark passes its last event + gap + grace
    records = sorted(read_topic(rt.bootstrap, "visits-final" + suffix), key=lambda m: (m.partition(), m.offset()))
    keys = [m.key().decode() for m in records]
    assert len(keys) == len(set(keys)), "a session was emitted twice"
    closed = {json.dumps({"visitor": s.visitor, "window_start": DAY + int(s.start) * 60_000}):
              (next(b for b, mark in enumerate(marks) if s.end + GAP + GRACE < mark), _row(s))
              for s in sessions.itertuples() if s.end + GAP + GRACE < marks[-1]}
    # Closed once the watermark passes its end plus gap and grace (Kafka Streams' rule): the gap is
    # inclusive, so at exactly that watermark an event could still join it.
    assert {m.key().decode(): (int(dict(m.headers())["batch"]), json.loads(m.value())) for m in records} == closed
    assert sorted(b for b, _ in closed.values()) == [1, 4, 4]      # b [2]; a [0-30], b [40] (c [45] at 75 + 1)

    for name in names:
        result = verify(name, spark=spark, rt=rt)
        assert result.ok and result.keys_compared == len(expected), result.summary()
    before = jobs.state_rows("visits", rt)
    failures.inject("visits", "wipe_local_store", rt)
    jobs.restore("visits", rt=rt)
    assert jobs.state_rows("visits", rt) == before
