"""`-- ttl:` on an aggregate table: a key whose newest event time is the TTL behind the table's
watermark is deleted in that batch's commit. Checked batch by batch against a plain-Python and
pandas replay of the documented rule over the produced events, then through a wiped store,
restore and verify, on both passes."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from spark_jobs import jobs

from spark_jobs.delta import mirror
from tests.table_env import assert_each_batch_once_and_in_order, fold_change_topic, isolated_runtime, new_table

TTL_MINUTES = 60
# (key, minute of 2026-11-01, value) per batch. The watermark is the newest event time so far.
BATCHES = [
    [("a", 0, 1), ("b", 30, 2), ("c", 50, 3)],     # watermark 50: nothing is an hour old
    [("c", 70, 4)],                                # watermark 70: a (newest 0) expires
    [("a", 80, 5), ("b", 20, 6)],                  # a comes back new; b's old event leaves its newest at 30
    [("d", 100, 7), ("e", 30, 8)],                 # watermark 100: b (30) expires; e is an hour old on arrival
    [("b", 95, 9)],                                # b comes back
]


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _replay(batches) -> list[dict]:
    """The rule, replayed: after each batch, the rows (key -> its live events) once every key
    whose newest event is TTL_MINUTES behind the newest event time so far is gone."""
    live: dict[str, list[tuple[int, int]]] = {}
    watermark, after = None, []
    for events in batches:
        for key, minute, value in events:
            live.setdefault(key, []).append((minute, value))
        watermark = max([watermark or 0] + [m for _, m, _ in events])
        live = {k: ev for k, ev in live.items() if max(m for m, _ in ev) > watermark - TTL_MINUTES}
        after.append({k: list(ev) for k, ev in live.items()})
    return after


def _rows(live: dict) -> dict:
    frame = pd.DataFrame([(k, v) for k, ev in live.items() for _, v in ev], columns=["k", "v"])
    grouped = frame.groupby("k")["v"].agg(["count", "sum"])
    return {k: {"k": k, "n": int(r["count"]), "total": int(r["sum"])} for k, r in grouped.iterrows()}


@pytest.mark.parametrize("total", ["SUM(v)", "SUM(v * 1)"], ids=["arrow_pass", "spark_sql_pass"])
def test_keys_expire_at_the_ttl_in_event_time_and_restore_and_verify_agree(env, spark, total):
    from ops import failures
    from serving.query import lookup
    from spark_jobs.recompute.verify import verify

    rt, suffix = env
    topic, out = "ttl_events" + suffix, "ttl-out" + suffix
    producer = new_table(rt, "idle", f"-- topic: {topic}\n-- schema: k STRING, v BIGINT, ts TIMESTAMP\n"
                         f"-- partitions: 2\n-- event_time: ts\n-- ttl: {TTL_MINUTES}m\n-- output_topic: {out}\n"
                         f"CREATE TABLE idle AS SELECT k, COUNT(*) AS n, {total} AS total FROM events GROUP BY k;\n",
                         topic)
    from catalog.registry import load_table
    from spark_jobs.batches.microbatch import engine_of

    assert engine_of(load_table("idle", rt)[0]) == ("arrow" if total == "SUM(v)" else "spark")
    expected_after = _replay(BATCHES)
    gone_counts = []
    for events, live in zip(BATCHES, expected_after):
        for key, minute, value in events:
            ts = f"2026-11-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
            producer.produce(topic, json.dumps({"k": key, "v": value, "ts": ts}).encode(), key=key.encode())
        assert producer.flush(10) == 0
        commits = jobs.run("idle", until_caught_up=True, spark=spark, rt=rt)
        assert len(commits) == 1
        gone_counts.append(commits[0].counts["expired_keys"])
        expected = _rows(live)
        assert {k[0] for k in jobs.state_rows("idle", rt)} == set(expected)
        assert {k: lookup("idle", (k,), rt=rt) for k in "abcde"} == {k: expected.get(k) for k in "abcde"}
    # a in batch 1; b, and e (expired on arrival, never stored) in batch 3
    assert gone_counts == [0, 1, 0, 2, 0]
    final = _rows(expected_after[-1])
    assert final == {"a": {"k": "a", "n": 1, "total": 5}, "b": {"k": "b", "n": 1, "total": 9},
                     "c": {"k": "c", "n": 2, "total": 7}, "d": {"k": "d", "n": 1, "total": 7}}

    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert folded == {json.dumps({"k": k}): row for k, row in final.items()}
    assert_each_batch_once_and_in_order(seen)
    assert (json.dumps({"k": "a"}), 1) in seen and (json.dumps({"k": "b"}), 3) in seen    # the expiries
    assert not any(key == json.dumps({"k": "e"}) for key, _ in seen)
    _, mirrored = mirror.committed_rows(rt, "idle")
    assert {json.loads(r)["k"]: json.loads(r) for r in mirrored.column("row").to_pylist()} == final

    result = verify("idle", spark=spark, rt=rt)
    assert result.ok and result.keys_compared == len(final), result.summary()
    before = jobs.state_rows("idle", rt)
    failures.inject("idle", "wipe_local_store", rt)
    jobs.restore("idle", rt=rt)
    assert jobs.state_rows("idle", rt) == before
    assert verify("idle", spark=spark, rt=rt).ok
