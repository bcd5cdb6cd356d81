"""Definitions a ksqlDB or Flink user writes, each of which parsed and then gave wrong rows or
wedged on 2cf5383: NOT LIKE, MIN/MAX/LATEST_BY_OFFSET/TOPK over TIMESTAMP, DATE and STRING,
LATEST_BY_OFFSET skipping nulls (ksqlDB's default), a zero grace, window bounds in SELECT, and
computed keys from SUBSTRING and arithmetic. Every table runs in two batches on the real stack
and its rows (through the query API's read path) equal pandas over the produced records."""
from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from serving.query import QueryService
from spark_jobs import jobs
from spark_jobs.batches.microbatch import engine_of
from catalog.registry import load_table
from tests.table_env import isolated_runtime, new_table


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


def _rows(rt, table: str) -> dict:
    service = QueryService(rt, background=False)
    try:
        rows = json.loads(json.dumps(service.scan(table).rows))      # as the API's JSON shows them
        return {json.dumps([r[k] for k in sorted(r) if k in _KEYS[table]]): r for r in rows}
    finally:
        service.close()


_KEYS = {"times": {"k"}, "notlike": {"k"}, "minutes": {"k", "window_start"}, "computed": {"p", "ab"}}


def _table(rt, suffix: str, name: str, schema: str, select: str, options: str = ""):
    """(topic, producer) of a new table `name` over its own topic (2 partitions)."""
    topic = name + suffix
    return topic, new_table(rt, name, f"-- topic: {topic}\n-- schema: {schema}\n-- partitions: 2\n{options}"
                                      f"CREATE TABLE {name} AS {select}", topic)


def _run_in_two(rt, spark, producer, topic: str, table: str, records: list[dict], partitions=(None, None)) -> None:
    """`partitions`: the topic partition of each half (None: the producer's choice)."""
    half = len(records) // 2
    for part, partition in zip((records[:half], records[half:]), partitions):
        for record in part:
            producer.produce(topic, json.dumps(record).encode(), **({} if partition is None else {"partition": partition}))
        assert producer.flush(10) == 0
        jobs.run(table, until_caught_up=True, spark=spark, rt=rt)


def _plain(expected: dict) -> dict:
    """pandas' numpy scalars as the JSON the API answers with."""
    return json.loads(json.dumps(expected, default=lambda v: v.item()))


def _ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _days(text: str) -> int:
    return (dt.date.fromisoformat(text) - dt.date(1970, 1, 1)).days


def _latest(series: pd.Series):
    valid = series.dropna()
    return None if valid.empty else valid.iloc[-1]


def _top(series: pd.Series, n: int) -> list:
    """TOPK's order: value descending, ties to the earlier event (a stable sort)."""
    return [[v] for v in series.dropna().sort_values(ascending=False, kind="stable").head(n)]


def test_times_dates_and_strings_in_min_max_latest_and_topk_match_pandas(env, spark):
    rt, suffix = env
    topic, producer = _table(rt, suffix, "times", "k STRING, v STRING, ts TIMESTAMP, d DATE", (
        "SELECT k, COUNT(*) AS n, MIN(ts) AS first_ts, MAX(ts) AS last_ts,\n"
        "  LATEST_BY_OFFSET(ts) AS latest_ts, MIN(d) AS first_d, MAX(d) AS last_d, LATEST_BY_OFFSET(d) AS latest_d,\n"
        "  LATEST_BY_OFFSET(v) AS latest_v, TOPK(2, v) AS top_v, TOPK(2, ts) AS top_ts, TOPK(2, d) AS top_d\n"
        "FROM events WHERE v NOT LIKE 'p%' OR v IS NULL GROUP BY k"))
    records = [
        {"k": "a", "v": "kiwi", "ts": "2026-11-01T10:00:00Z", "d": "2026-11-01"},
        {"k": "a", "v": "plum", "ts": "2026-11-01T09:00:00Z", "d": "2026-10-01"},      # NOT LIKE drops it
        {"k": "b", "v": "fig", "ts": "2026-11-02T08:30:00Z", "d": "2025-01-31"},
        {"k": "a", "v": "apple", "ts": "2026-11-01T08:00:00Z", "d": "2026-12-24"},
        {"k": "a", "v": "zucchini", "ts": "2026-11-03T00:00:01Z", "d": "2026-01-01"},
        {"k": "c", "v": "pear", "ts": "2026-11-01T00:00:00Z", "d": "2026-11-01"},      # every event filtered
        {"k": "b", "v": "date", "ts": "2026-11-02T08:29:59Z", "d": "2025-02-01"},
        {"k": "b", "v": None, "ts": None, "d": None},                                  # nulls: latest keeps date
    ]
    # The second batch's events sit at lower offsets (of another partition) than the first's: the
    # later batch still holds the latest value.
    _run_in_two(rt, spark, producer, topic, "times", records, partitions=(1, 0))

    frame = pd.DataFrame(records)
    frame = frame[~frame["v"].fillna("").str.startswith("p") | frame["v"].isna()]
    frame["ts_ms"] = frame["ts"].map(lambda t: None if t is None else _ms(t)).astype("Int64")
    frame["d_days"] = frame["d"].map(lambda t: None if t is None else _days(t)).astype("Int64")
    expected = {}
    for k, g in frame.groupby("k"):
        expected[json.dumps([k])] = {
            "k": k, "n": len(g), "first_ts": g["ts_ms"].min(), "last_ts": g["ts_ms"].max(),
            "latest_ts": _latest(g["ts_ms"]), "first_d": g["d_days"].min(), "last_d": g["d_days"].max(),
            "latest_d": _latest(g["d_days"]), "latest_v": _latest(g["v"]), "top_v": _top(g["v"], 2),
            "top_ts": [[float(v)] for (v,) in _top(g["ts_ms"], 2)], "top_d": [[float(v)] for (v,) in _top(g["d_days"], 2)]}
    got = _rows(rt, "times")
    assert got == _plain(expected)
    assert got['["b"]']["latest_v"] == "date" and got['["a"]']["top_v"] == [["zucchini"], ["kiwi"]]


def test_not_like_and_latest_skipping_nulls_on_the_arrow_pass_match_pandas(env, spark):
    rt, suffix = env
    topic, producer = _table(rt, suffix, "notlike", "k STRING, v STRING, x BIGINT", (
        "SELECT k, COUNT(*) AS n, LATEST_BY_OFFSET(x) AS lx, TOPK(2, x) AS tx\n"
        "FROM events WHERE v NOT LIKE 'p%' GROUP BY k"))
    table, _ = load_table("notlike", rt)
    assert engine_of(table) == "arrow"
    records = [{"k": "a", "v": "apple", "x": 1}, {"k": "a", "v": "pear", "x": 2}, {"k": "b", "v": "bean", "x": 5},
               {"k": "a", "v": "kale", "x": None}, {"k": "b", "v": "corn", "x": 7}, {"k": "b", "v": "plum", "x": 9},
               {"k": "a", "v": "fig", "x": None}, {"k": "c", "v": "pea", "x": 3}]
    _run_in_two(rt, spark, producer, topic, "notlike", records, partitions=(1, 0))   # corn: a later batch, a lower offset
    frame = pd.DataFrame(records).astype({"x": "Int64"})
    frame = frame[~frame["v"].str.startswith("p")]
    expected = {json.dumps([k]): {"k": k, "n": len(g), "lx": _latest(g["x"]),
                                  "tx": [[float(v)] for (v,) in _top(g["x"], 2)]}
                for k, g in frame.groupby("k")}
    assert _rows(rt, "notlike") == _plain(expected)
    assert expected['["a"]']["lx"] == 1 and expected['["b"]']["lx"] == 7


def test_zero_grace_window_bounds_in_select_and_computed_keys_match_pandas(env, spark):
    rt, suffix = env
    topic, producer = _table(rt, suffix, "minutes", "k STRING, ts TIMESTAMP", (
        "SELECT k, COUNT(*) AS n, (window_end - window_start) / 60000 AS minutes,\n"
        "  window_start AS wstart, window_end\n"
        "FROM events GROUP BY k, TUMBLE(ts, INTERVAL '2' MINUTE, INTERVAL '0' SECOND)"))
    records = [{"k": "a", "ts": "2026-11-01T10:00:10Z"}, {"k": "a", "ts": "2026-11-01T10:01:59Z"},
               {"k": "b", "ts": "2026-11-01T10:03:00Z"}, {"k": "a", "ts": "2026-11-01T10:02:00Z"},
               {"k": "a", "ts": "2026-11-01T10:01:00Z"},     # its window closed at 10:02 with zero grace: late
               {"k": "b", "ts": "2026-11-01T10:05:00Z"}]
    _run_in_two(rt, spark, producer, topic, "minutes", records)
    expected = {}
    for r in records[:4] + records[5:]:
        start = _ms(r["ts"]) // 120000 * 120000
        row = expected.setdefault(json.dumps([r["k"], start]), {"k": r["k"], "window_start": start, "n": 0,
                                                                "minutes": 2.0, "wstart": start,
                                                                "window_end": start + 120000})
        row["n"] += 1
    assert _rows(rt, "minutes") == _plain(expected)

    topic, producer = _table(rt, suffix, "computed", "s STRING, a INT, b INT", (
        "SELECT SUBSTRING(s, 1, 2) AS p, a + b AS ab, COUNT(*) AS n\n"
        "FROM events GROUP BY SUBSTRING(s, 1, 2), (a + b)"))
    records = [{"s": "alpha", "a": 1, "b": 2}, {"s": "alps", "a": 2, "b": 1}, {"s": "beta", "a": 0, "b": 0},
               {"s": "alpha", "a": 3, "b": 0}, {"s": "alpha", "a": None, "b": 1}]
    _run_in_two(rt, spark, producer, topic, "computed", records)
    frame = pd.DataFrame(records).astype({"a": "Int64", "b": "Int64"})
    frame["p"], frame["ab"] = frame["s"].str[:2], frame["a"] + frame["b"]
    expected = {}
    for (p, ab), g in frame.groupby(["p", "ab"], dropna=False):
        ab = None if pd.isna(ab) else int(ab)
        expected[json.dumps([ab, p])] = {"p": p, "ab": ab, "n": len(g)}
    assert _rows(rt, "computed") == _plain(expected)


def test_decimal_with_precision_and_scale_is_declared_and_aggregated_exactly(env, spark):
    import decimal

    rt, suffix = env
    topic, producer = _table(rt, suffix, "money", "k STRING, amount DECIMAL(4,1), whole DECIMAL", (
        "SELECT k, SUM(amount) AS total, MIN(amount) AS lo, MAX(amount) AS hi,\n"
        "  AVG(amount) AS mean, SUM(whole) AS wholes FROM events GROUP BY k"))
    records = [{"k": "a", "amount": 0.1, "whole": 3}, {"k": "a", "amount": 0.2, "whole": 4},
               {"k": "b", "amount": 999.9, "whole": 1}, {"k": "a", "amount": -12.5, "whole": None},
               {"k": "b", "amount": 999.9, "whole": 2}, {"k": "a", "amount": 0.3, "whole": 5}]
    _run_in_two(rt, spark, producer, topic, "money", records)
    _KEYS["money"] = {"k"}
    expected = {}
    for k in ("a", "b"):
        amounts = [decimal.Decimal(str(r["amount"])) for r in records if r["k"] == k]
        wholes = [r["whole"] for r in records if r["k"] == k and r["whole"] is not None]
        expected[json.dumps([k])] = {"k": k, "total": float(sum(amounts)), "lo": float(min(amounts)),
                                     "hi": float(max(amounts)), "mean": float(sum(amounts) / len(amounts)),
                                     "wholes": sum(wholes)}
    got = _rows(rt, "money")
    assert got == expected
    assert got['["a"]']["total"] == -11.9 and got['["b"]']["total"] == 1999.8     # exact, not 1999.8000000000002


def test_a_hop_event_skips_only_its_closed_windows_and_emit_final_publishes_each_once(env, spark):
    """Kafka Streams' and ksqlDB's rule: an event whose oldest window closed (end + grace at or
    before the batch's starting watermark) but whose newest is open joins the open ones only."""
    from spark_jobs.recompute.verify import verify
    from tests.table_env import fold_change_topic, read_topic

    rt, suffix = env
    out = "hops-final" + suffix
    topic, producer = _table(rt, suffix, "hops", "k STRING, ts TIMESTAMP", (
        "SELECT k, COUNT(*) AS n FROM events GROUP BY k, HOP(ts, INTERVAL '2' MINUTE, INTERVAL '1' MINUTE)"),
        f"-- snapshot_every: 100\n-- snapshot_phase: 0\n-- output_topic: {out}\n-- emit: final\n")
    _KEYS["hops"] = {"k", "window_start"}
    batches = [[("a", "10:00:30"), ("a", "10:02:00")],       # watermark 10:02: windows 9:59 and 10:00 close
               [("a", "10:01:30"), ("a", "10:04:10")]]       # 10:01:30 joins 10:01 only (10:00 closed)
    expected, mark = {}, None
    for events in batches:
        for k, clock in events:
            producer.produce(topic, json.dumps({"k": k, "ts": f"2026-11-01T{clock}Z"}).encode())
        assert producer.flush(10) == 0
        jobs.run("hops", until_caught_up=True, spark=spark, rt=rt)
        for k, clock in events:
            ts = _ms(f"2026-11-01T{clock}Z")
            for start in (ts // 60000 * 60000, ts // 60000 * 60000 - 60000):
                if mark is None or start + 120000 > mark:
                    row = expected.setdefault(json.dumps([k, start]), {"k": k, "window_start": start, "n": 0})
                    row["n"] += 1
        mark = max([mark or 0] + [_ms(f"2026-11-01T{c}Z") for _, c in events])
    assert _rows(rt, "hops") == expected
    assert expected[json.dumps(["a", _ms("2026-11-01T10:00:00Z")])]["n"] == 1
    emitted = [json.loads(m.value()) for m in read_topic(rt.bootstrap, out)]
    closed = {r["window_start"]: r["n"] for r in expected.values() if r["window_start"] + 120000 <= mark}
    assert sorted((e["window_start"], e["n"]) for e in emitted) == sorted(closed.items())
    folded, _ = fold_change_topic(rt.bootstrap, out)
    assert len(folded) == len(emitted)                    # each closed window published once
    result = verify("hops", spark=spark, rt=rt)
    assert result.ok, result.summary()
