"""Computed GROUP BY keys and aggregate arguments in the Arrow pass: the same values as Spark SQL.

A table like Nexmark's q15-q17 groups by `DATE_FORMAT(dateTime, 'yyyy-MM-dd')` and counts
`CASE WHEN price < 10000 THEN 1 END`: the Arrow pass now computes these itself
(arrow_where.value_expression) instead of handing the table to the Spark-SQL pass. Whatever it
accepts must give Spark's value row for row, nulls and times before 1970 included, or the two
passes (and verify, which recomputes in Spark) would keep different tables.
"""
from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pyarrow as pa
import pytest

from spark_jobs.frames.arrow_where import value_expression
from tests.fuzz import expressions as fuzz_expressions

FIELDS = {n: t for n, t in fuzz_expressions.COLUMNS.items() if n != "d"}     # the pass reads bare DECIMALs only
CHOSEN = [
    "CASE WHEN n < 10 THEN 1 END",
    "CASE WHEN n >= 0 AND n < 100 THEN n END",
    "CASE WHEN b THEN s ELSE 'no' END",
    "IF(x > 1.0, 'big', 'small')",
    "IF(b, n, 0)",
    "CASE WHEN s = 'abc' THEN x WHEN n IS NULL THEN -1.5 ELSE 0.0 END",
    "CASE WHEN n IN (7, 100) THEN s END",
    "CASE WHEN s LIKE 'a%' THEN TRUE ELSE FALSE END",
    "CASE WHEN x BETWEEN 0 AND 3 THEN n END",
    "CASE WHEN NOT b THEN 'off' WHEN b THEN 'on' END",
    "DATE_FORMAT(t, 'yyyy-MM-dd')",
    "DATE_FORMAT(t, 'HH:mm')",
    "DATE_FORMAT(t, 'yyyy-MM-dd HH:mm:ss')",
    "DATE_FORMAT(t, 'yyyyMMdd')",
    "CASE WHEN n > 0 THEN DATE_FORMAT(t, 'yyyy-MM') END",
]


def _rows_table() -> pa.Table:
    rows = fuzz_expressions.ROWS
    return pa.table({
        "n": pa.array([r["n"] for r in rows], pa.int64()),
        "x": pa.array([r["x"] for r in rows], pa.float64()),
        "s": pa.array([r["s"] for r in rows], pa.string()),
        "b": pa.array([r["b"] for r in rows], pa.bool_()),
        "t": pa.array([None if r["t"] is None else r["t"] * 1000 for r in rows], pa.int64())
        .cast(pa.timestamp("us", tz="UTC")),
    })


def _arrow_values(sql: str, rows: pa.Table):
    import pyarrow.acero as acero

    expression = value_expression(sql, FIELDS)
    plan = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(rows)),
        acero.Declaration("project", acero.ProjectNodeOptions([expression], ["v"]))])
    return plan.to_table(use_threads=False).column("v").to_pylist()


def _same(ours, theirs) -> bool:
    if isinstance(theirs, dt.datetime) or isinstance(ours, float) or isinstance(theirs, float):
        return ours == theirs or (ours is not None and theirs is not None and abs(float(ours) - float(theirs)) < 1e-12)
    return ours == theirs


def test_computed_values_the_arrow_pass_accepts_equal_spark_sqls(spark):
    """The chosen forms all convert; of the fuzz generator's expressions, whatever converts and
    runs gives Spark's values; the rest is refused (the Spark-SQL pass runs such a table)."""
    rows = _rows_table()
    generated = []
    for seed in (3, 4):
        generator = fuzz_expressions.Generator(seed)
        generated += [generator.expression() for _ in range(400)]
    candidates = [e for e in dict.fromkeys(CHOSEN + generated) if "d" not in
                  {c for c in e.replace("(", " ").replace(")", " ").replace(",", " ").split()}]
    ours, refused, failures = {}, 0, []
    for sql in candidates:
        try:                 # as arrow_pass.check_supported asks: converted, and run on no rows
            _arrow_values(sql, rows.slice(0, 0))
        except Exception:    # noqa: BLE001 - refused: the Spark-SQL pass runs such a table
            refused += 1
            continue
        try:                 # accepted: then no row may make it raise (a batch failing on every re-run)
            ours[sql] = _arrow_values(sql, rows)
        except Exception as exc:   # noqa: BLE001
            failures.append(f"{sql}: accepted, then raised on a row: {exc}")
    assert set(CHOSEN) <= set(ours), sorted(set(CHOSEN) - set(ours))
    theirs = fuzz_expressions.spark_values(spark, list(ours))
    compared = 0
    for sql, values in ours.items():
        if theirs.get(sql) is None:
            continue
        compared += 1
        spark_values, spark_type = theirs[sql]
        for row, mine, its in zip(fuzz_expressions.ROWS, values, spark_values):
            if not _same(mine, its):
                failures.append(f"{sql}\n  row {row}\n  Arrow {mine!r}, Spark {its!r} ({spark_type})")
                break
    assert compared >= len(CHOSEN), (compared, refused)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.timeout(600)
def test_a_table_with_computed_keys_runs_the_arrow_pass_and_equals_pandas_and_verify(kafka, spark, tmp_path,
                                                                                       monkeypatch):
    """Nexmark q16's shape: per title and day, counts per price range, distinct users of one, the
    latest minute; in several batches on the Arrow pass (forced: it fails if the pass refuses),
    against pandas over the events read back, then verify's Spark recomputation from bronze."""
    from confluent_kafka import Producer

    from spark_jobs import jobs
    from spark_jobs.recompute.verify import verify
    from state.kafka_admin import ensure_topic
    from tests.table_env import isolated_runtime, read_topic

    rt, suffix = isolated_runtime(kafka, tmp_path)
    topic = f"derived{suffix}"
    ensure_topic(rt.bootstrap, topic, 2)
    (rt.tables_dir / "daily.sql").write_text(
        f"-- topic: {topic}\n-- schema: title STRING, user STRING, amount BIGINT, ts TIMESTAMP\n-- partitions: 3\n"
        "CREATE TABLE daily AS SELECT title, DATE_FORMAT(ts, 'yyyy-MM-dd') AS day, COUNT(*) AS n, "
        "COUNT(CASE WHEN amount < 100 THEN 1 END) AS small, COUNT(CASE WHEN amount >= 100 THEN 1 END) AS large, "
        "COUNT(DISTINCT CASE WHEN amount >= 100 THEN user END) AS large_users, "
        "MAX(DATE_FORMAT(ts, 'HH:mm')) AS last_minute FROM sales GROUP BY title, DATE_FORMAT(ts, 'yyyy-MM-dd');\n")
    # A TIMESTAMP as an aggregate's input (Nexmark q18 keeps each bid's dateTime): on one
    # partition, so that LATEST_BY_OFFSET's order is the topic's.
    stamps = f"stamps{suffix}"
    ensure_topic(rt.bootstrap, stamps, 1)
    (rt.tables_dir / "stamps.sql").write_text(
        f"-- topic: {stamps}\n-- schema: title STRING, amount BIGINT, ts TIMESTAMP\n-- partitions: 2\n"
        "CREATE TABLE stamps AS SELECT title, LATEST_BY_OFFSET(ts) AS last_ts, LATEST_BY_OFFSET(ts, false) AS "
        "last_kept, MIN(ts) AS first_ts, MAX(ts) AS max_ts, COUNT(DISTINCT ts) AS times, "
        "LATEST_BY_OFFSET(amount) AS amount FROM stamps GROUP BY title;\n")
    monkeypatch.setenv("STATETABLE_ENGINE", "arrow")
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    start = dt.datetime(1969, 12, 31, 22, 0, tzinfo=dt.timezone.utc)     # a day before 1970 too
    for batch in range(3):
        for i in range(60):
            at = start + dt.timedelta(minutes=37 * i + 11 * batch, milliseconds=-(i % 3))
            event = {"title": "abc"[i % 3], "user": f"u{i % 7}", "amount": None if i % 11 == 0 else (i * 13) % 250,
                     "ts": at.isoformat().replace("+00:00", "Z")}
            producer.produce(topic, json.dumps(event).encode(), partition=i % 2)
            if i % 5 == 4:     # a missing time: skipped by LATEST_BY_OFFSET(ts), kept by (ts, false)
                event = {**event, "ts": None}
            producer.produce(stamps, json.dumps(event).encode())
        producer.produce(topic, b'{"title": "a", "ts": "not a time"}')        # a dead letter, not a stop
        producer.produce(stamps, b'{"title": "a", "ts": "not a time"}')
        assert producer.flush(10) == 0
        for name in ("daily", "stamps"):
            commits = jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
            assert commits and sum(c.counts["dead_lettered"] for c in commits) == 1
            assert all("arrow_records" in c.counts for c in commits), name      # the Arrow step's own count
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, topic)])
    frame = frame[frame["ts"] != "not a time"]
    ts = pd.to_datetime(frame["ts"], utc=True, format="ISO8601")
    frame["day"], frame["minute"] = ts.dt.strftime("%Y-%m-%d"), ts.dt.strftime("%H:%M")
    expected = {}
    for (title, day), group in frame.groupby(["title", "day"]):
        large = group[group["amount"] >= 100]
        expected[(title, day)] = (len(group), int((group["amount"] < 100).sum()), len(large),
                                  large["user"].nunique(), group["minute"].max())
    assert "1969-12-31" in {day for _, day in expected}
    from catalog.mapping import row_of
    from catalog.registry import load_table

    definition = load_table("daily", rt)[0]
    got = {}
    for key, value in jobs.state_rows("daily", rt).items():
        row = row_of(definition, key, value)
        got[(row["title"], row["day"])] = (row["n"], row["small"], row["large"], row["large_users"], row["last_minute"])
    assert got == expected
    assert verify("daily", spark=spark, rt=rt).ok

    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, stamps)])
    frame = frame[frame["ts"] != "not a time"]
    at = pd.to_datetime(frame["ts"], utc=True, format="ISO8601")
    frame["ms"] = [None if pd.isna(t) else t.value // 1_000_000 for t in at]    # as the state keeps a TIMESTAMP
    expected = {}
    for title, group in frame.groupby("title"):
        times = group["ms"].dropna()
        expected[title] = (times.iloc[-1], group["ms"].iloc[-1], times.min(), times.max(), times.nunique(),
                           group["amount"].dropna().iloc[-1])
    expected = {t: tuple(None if pd.isna(v) else int(v) for v in r) for t, r in expected.items()}
    assert any(row[1] is None for row in expected.values()), "a title whose last event has no time"
    assert any(row[2] < 0 for row in expected.values()), "a time before 1970"
    definition = load_table("stamps", rt)[0]
    got = {}
    for key, value in jobs.state_rows("stamps", rt).items():
        row = row_of(definition, key, value)
        got[row["title"]] = tuple(row[c] for c in ("last_ts", "last_kept", "first_ts", "max_ts", "times", "amount"))
    assert got == expected
    assert verify("stamps", spark=spark, rt=rt).ok
