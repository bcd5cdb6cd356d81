"""The Arrow read of a table of tables' input (spark_jobs/frames/arrow_rows.py) against Spark SQL's
(parse.classify, then table_frames.latest_rows): the same dead letters with the same reasons, and
the same latest row per key, over hostile records, keys Spark's try_cast reads its own way,
tombstones, and one key in two Kafka partitions."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from catalog.definitions import _stream, parse
from spark_jobs.frames import arrow_rows
from spark_jobs.frames import parse as spark_parse
from spark_jobs.frames.table_frames import latest_rows

SCHEMA = "id BIGINT PRIMARY KEY, name STRING, price DOUBLE, at TIMESTAMP, day DATE"


def _table(tmp_path, pk: str = "BIGINT", key_format: str | None = None):
    path = tmp_path / "items.sql"
    header = f"-- key_format: {key_format}\n" if key_format else ""
    path.write_text(header + f"CREATE TABLE items ({SCHEMA.replace('BIGINT', pk, 1)}) WITH (topic='items');\n")
    return parse(path)


def _value(id_, name="n", price=1.5, at="2026-01-02T03:04:05.678901Z", day="2026-01-02", **extra) -> bytes:
    return json.dumps({"id": id_, "name": name, "price": price, "at": at, "day": day, **extra}).encode()


def _records(key_text=lambda k: k) -> list[tuple[int, bytes | None, bytes | None]]:
    """(Kafka partition, key, value): every rule a table's record meets."""
    k = lambda text: None if text is None else key_text(text).encode()   # noqa: E731
    return [
        (0, k("1"), _value(1, "first")),
        (0, k("01"), _value(1, "zero-led key")),          # Spark's try_cast reads it as 1
        (0, k(" 2"), _value(2)),
        (0, k("+3"), _value(3)),
        (0, k("4.0"), _value(4)),
        (0, k("x"), _value(5)),                           # key_mismatch
        (0, k("6"), _value(7)),                           # key_mismatch
        (0, None, _value(8, "no Kafka key")),
        (0, k("9"), None),                                # a delete of a key never seen
        (0, None, None),                                  # tombstone_without_key
        (0, k("abc"), None),                              # bad_tombstone_key
        (0, k("99999999999999999999"), None),
        (0, k("007"), None),                              # Spark reads 7
        (0, k(" 10 "), None),
        (0, k("11"), _value(11, at="1969-12-31T23:59:59.9995Z", day="1969-12-31")),
        (0, k("12"), b'{"id": 12, "name": "trailing"} {}'),
        (0, k("13"), b'{"id": 13, "price": "cheap"}'),
        (0, k("14"), b'{"name": "no id"}'),
        (0, k("15"), b'{"id": 15, "name": "\\ud800"}'),
        (0, k("16"), b"not json"),
        (0, k("17"), b'{"id": 17, "price": NaN}'),
        (0, k("1"), _value(1, "latest in partition 0")),
        (1, k("1"), _value(1, "in partition 1: the window's latest")),
        (1, k("18"), _value(18)),
        (1, k("18"), None),                               # deleted in the same batch
        (1, k("19"), _value(19, name=None, price=None, at=None, day=None)),
        (1, k("20"), _value(20, at=1767000000123, day="2026-1-2")),
        (1, k("21"), _value(21, at="1767000000123")),
        (1, k("-22"), _value(-22)),
        (1, k("-0"), _value(0)),
    ]


def _batches(records) -> list[pa.RecordBatch]:
    batches = []
    for partition in sorted({p for p, _, _ in records}):
        mine = [(key, value) for p, key, value in records if p == partition]
        n = len(mine)
        batches.append(pa.RecordBatch.from_pydict({
            "partition": pa.array([partition] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([0] * n, pa.timestamp("us")),
            "key": pa.array([key for key, _ in mine], pa.binary()),
            "value": pa.array([value for _, value in mine], pa.binary())}))
    return batches


def _spark_side(spark, source, batches):
    from pyspark.sql import functions as F

    raw = spark.createDataFrame(pa.Table.from_batches(batches).to_pandas()).select(
        "partition", "offset", "key", "value", F.col("timestamp").cast("timestamp"))
    classified = spark_parse.classify(raw, source, [] if source.stream else source.key_columns, rows=True)
    dead = {(r["_partition"], r["_offset"]): r["reason"] for r in classified.where("reason IS NOT NULL").collect()
            if source.stream or r["reason"] != "null_value"}
    # latest_rows' `_del` is NULL for a put (reason = 'null_value' over a NULL reason): not a delete
    rows = {r["_k0"]: (bool(r["_del"]), *tuple(r)[2:]) for r in latest_rows(classified, source).collect()}
    return dead, rows


def _arrow_side(spark, source, batches, partitions: int = 3):

    spec = arrow_rows.RowsSpec(source, partitions, 1, now_ms=None)
    schema = pa.schema([(name, dtype) for name, _, dtype in arrow_rows.output_columns(source)])
    out = pa.concat_tables(pa.Table.from_batches([b]) for batch in batches for b in arrow_rows.run(spec, [batch]))
    frame = arrow_rows.judged(spark.createDataFrame(out.cast(schema).to_pandas(), arrow_rows.output_ddl(source)), source)
    dead = {(r["source_partition"], r["source_offset"]): r["reason"]
            for r in frame.where("reason IS NOT NULL").collect()}
    accepted = frame.where("_kind = 'row' AND reason IS NULL").select(
        "_k0", "_del", *[f"_v{i}" for i in range(len(source.value_columns))], "_partition", "_offset", "_sp").toArrow()
    latest = arrow_rows.latest_per_key(accepted, unique=source.stream)
    rows = {r["_k0"]: tuple(v for c, v in r.items() if c not in ("_k0", "_sp")) for r in latest.to_pylist()}
    stats: dict[str, int] = {}
    for r in out.filter(pa.compute.equal(out.column("_kind"), "stat")).to_pylist():
        stats[r["stat"]] = stats.get(r["stat"], 0) + r["stat_value"]
    return dead, rows, stats, latest


@pytest.mark.parametrize("case", ["bigint", "string", "json_key", "stream"])
def test_the_arrow_read_of_a_table_s_records_equals_spark_sql_s_record_by_record(spark, tmp_path, case):
    if case == "stream":
        source = _stream("s", tmp_path / "s.sql", "s", [("id", "BIGINT"), ("name", "STRING"), ("price", "DOUBLE"),
                                                         ("at", "TIMESTAMP"), ("day", "DATE")])
        records = _records()
    elif case == "json_key":
        source = _table(tmp_path, key_format="json")
        records = _records(lambda k: json.dumps({"id": int(k)}) if k.strip().lstrip("+-").isdigit()
                           and len(k) < 10 else json.dumps({"payload": {"id": k}}))
    else:
        source = _table(tmp_path, "STRING" if case == "string" else "BIGINT")
        records = _records()
        if case == "string":
            records = [(p, key, None if value is None else value.replace(b'"id": ', b'"id": "', 1).replace(
                b', "name"', b'", "name"', 1)) for p, key, value in records]
    batches = _batches(records)
    spark_dead, spark_rows = _spark_side(spark, source, batches)
    arrow_dead, arrow_rows_, stats, latest = _arrow_side(spark, source, batches)
    assert arrow_dead == spark_dead
    assert arrow_rows_ == spark_rows
    assert stats["read"] == len(records)
    # The test can fail: there are dead letters and rows of each kind to compare.
    assert len(spark_dead) >= 6 and len(spark_rows) >= 8
    if case == "bigint":
        assert spark_dead[(0, 5)] == "key_mismatch" and spark_dead[(0, 10)] == "bad_tombstone_key"
        assert spark_rows[1][2] == "in partition 1: the window's latest" and spark_rows[7][0] is True
        assert stats["undecided"] > 0          # Spark judged the keys that were not plainly their text
    # Each row's state partition is the one the Spark-SQL read gives it (TableFrames.partitioned).
    from spark_jobs.frames.arrow_keys import state_partitions

    # (A tombstone whose key Spark read has none yet: the batch's step gives its rows theirs.)
    placed = latest.filter(pa.compute.is_valid(latest.column("_sp")))
    assert placed.num_rows >= 8
    assert placed.column("_sp").to_pylist() == state_partitions(placed.select(["_k0"]), 3).to_pylist()


def test_the_arrow_read_of_a_windowed_join_s_stream_equals_spark_sql_s(spark, tmp_path):
    """A windowed join's side (stream_join): the join key required, then its event-time reasons in
    stream_join._judged's order, each partition's newest accepted time, and the rows it hands on."""
    from spark_jobs.steps.stream_join import _judged, _side_rows

    source = _stream("a", tmp_path / "a.sql", "a", [("id", "BIGINT"), ("auction", "BIGINT"), ("ts", "TIMESTAMP"),
                                                    ("until", "TIMESTAMP"), ("price", "BIGINT")])
    now, watermark, longest = 1_767_000_000_000, 1_766_999_000_000, 3_600_000
    at = lambda ms: ms                                                       # noqa: E731 - epoch ms in JSON

    def value(**fields) -> bytes:
        return json.dumps({"id": 1, "auction": 7, "ts": at(now - 5000), "until": at(now - 1000), "price": 3,
                           **fields}).encode()
    records = [(0, None, value()), (0, None, value(auction=None)), (0, None, value(ts=None)),
               (0, None, value(until=None)), (0, None, value(ts=now + 10_000_000)),
               (0, None, value(ts=now - 2 * longest, until=now)), (0, None, value(ts=watermark - 1, until=watermark)),
               (0, None, value(ts=watermark, until=watermark + 5, auction=8)), (0, None, None), (0, None, b"{"),
               (1, None, value(ts=now - 7000, auction=9)), (1, None, value(ts="1970-01-01T00:00:00.0015Z",
                                                                          until=watermark + 1)),
               (1, None, value(price="three"))]
    batches = _batches(records)
    from pyspark.sql import functions as F

    raw = spark.createDataFrame(pa.Table.from_batches(batches).to_pandas()).select(
        "partition", "offset", "key", "value", F.col("timestamp").cast("timestamp"))
    classified = _judged(spark_parse.classify(raw, source, ["auction"], rows=True), source, "ts", "until", watermark,
                         now, longest)
    spark_dead = {(r["_partition"], r["_offset"]): r["reason"] for r in classified.where("reason IS NOT NULL").collect()}
    spark_newest = {r["_partition"]: r["t"] for r in classified.where("reason IS NULL")
                    .groupBy("_partition").agg(F.max("_t").alias("t")).collect()}
    used = {"price"}            # what the join's rows read of this side: the other fields wait as NULLs
    spark_rows = sorted(tuple(r) for r in _side_rows(latest_rows(classified, source), source, "a", "auction", "ts",
                                                     "until", used).collect())

    spec = arrow_rows.RowsSpec(source, 4, 1, now, join_key="auction",
                               window=arrow_rows.WindowRule("ts", "until", watermark, longest),
                               keep=frozenset(used | {"auction", "ts", "until"}),
                               exchange=arrow_rows.SideExchange("a", "auction", "ts", "until", frozenset(used)))
    schema = pa.schema([(name, dtype) for name, _, dtype in arrow_rows.output_columns(source)])
    out = pa.concat_tables(pa.Table.from_batches([b]) for batch in batches for b in arrow_rows.run(spec, [batch]))
    frame = spark.createDataFrame(out.cast(schema).to_pandas(), arrow_rows.output_ddl(source))
    assert {(r["source_partition"], r["source_offset"]): r["reason"]
            for r in frame.where("reason IS NOT NULL").collect()} == spark_dead
    assert arrow_rows.collected_stats(frame) == {
        "read": len(records), **{f"dead_{r}": list(spark_dead.values()).count(r) for r in set(spark_dead.values())},
        **{f"newest_{p}": t for p, t in spark_newest.items()}}
    # The rows handed on: the Arrow read's blobs (one a state partition), opened as a merge task
    # opens them, equal to Spark's side rows
    blobs = out.filter(pa.compute.equal(out.column("_kind"), arrow_rows.BLOB))
    opened = arrow_rows.exchanged(pa.table({"_blob": blobs.column("value")}))
    arrow_side = sorted((*row, tuple(a.values())) for *row, a in zip(
        *[opened.column(c).to_pylist() for c in ("_k0", "_k1", "_side", "_t", "_u", "_a")]))
    assert arrow_side == sorted((*r[:5], tuple(r[5])) for r in spark_rows)
    assert {(a[-1] is not None, a[0], a[1]) for *_, a in arrow_side} == {(True, None, None)}
    assert len(spark_rows) == 3 and set(spark_dead.values()) >= {"missing_key", "missing_event_time", "future_event_time",
                                                                "window_too_long", "late", "null_value",
                                                                "malformed_json", "wrong_type"}
    # Each row waits in the state partition of its join key (a windowed join's routing width is 1).
    from spark_jobs.frames.arrow_keys import state_partitions

    for sp, blob in zip(blobs.column("_sp").to_pylist(), blobs.column("value").to_pylist()):
        keys = arrow_rows.exchanged(pa.table({"_blob": pa.array([blob], pa.binary())})).select(["_k0"])
        assert set(state_partitions(keys, 4).to_pylist()) == {sp}
