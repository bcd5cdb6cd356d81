"""The read's Arrow batches: sized by record count from the records' size, Spark's per-row byte
check off (spark_jobs.engine.arrow_batches). A wrong size would let a batch of large records grow
past what a Python worker can hold, so the real test counts the Arrow batches the pass saw
(bronze writes one Parquet file per Arrow batch) against a cap computed here from the bytes
produced."""
from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest

from spark_jobs.engine import arrow_batches

from spark_jobs import jobs
from tests.table_env import isolated_runtime, new_table, read_topic

SQL = """-- topic: {topic}
-- schema: k STRING, v BIGINT
-- partitions: 2
CREATE TABLE {table} AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;
"""


def test_the_record_cap_fills_a_batch_of_the_target_bytes_and_never_rounds_to_zero():
    assert arrow_batches.records_per_batch(None) is None
    assert arrow_batches.records_per_batch(0) is None
    assert arrow_batches.records_per_batch(26) == arrow_batches.max_records()          # small records: the cap
    assert arrow_batches.records_per_batch(1 << 20) == (64 << 20) // ((1 << 20) + 24)   # 63 records of 1 MiB
    assert arrow_batches.records_per_batch(1 << 30) == 1


def test_the_size_is_the_larger_of_the_last_batch_and_this_batchs_sample(monkeypatch):
    last = SimpleNamespace(topic="t", counts={"read": 1000, "read_bytes": 50_000})
    monkeypatch.setattr(arrow_batches, "sample_bytes", lambda *a, **k: (30.0, 64))
    assert arrow_batches.record_bytes(last, "unused:1", "t", {0: (0, 10)}) == (50.0, "the last batch's 1,000 records")
    # Issue 66: 1 MiB records after a history of 25-byte ones. The last batch's mean alone gave the
    # 200,000-record cap, a >2 GiB Arrow batch, and the retry computed the same cap.
    history = SimpleNamespace(topic="t", counts={"read": 100_000, "read_bytes": 2_500_000})
    monkeypatch.setattr(arrow_batches, "sample_bytes", lambda *a, **k: (float(1 << 20), 64))
    records, why = arrow_batches.records_for(history, "unused:1", "t", {0: (0, 2000)})
    assert records == 32 and "64 sampled records" in why
    assert arrow_batches.records_for(history, "unused:1", "t", {0: (0, 2000)}, resumed=True)[0] is None
    monkeypatch.setattr(arrow_batches, "sample_bytes", lambda *a, **k: None)
    assert arrow_batches.records_for(history, "unused:1", "t", {0: (0, 2000)})[0] is None   # unknown: Spark's check


def _bronze_files(rt, table: str, batch: int) -> list:
    from pathlib import Path

    prefix = f"part-b{batch:012d}-"
    return sorted(p.name for p in Path(rt.delta_path(table, "bronze")).glob(f"{prefix}*.parquet"))


def test_large_records_get_small_arrow_batches_from_a_sample_then_from_the_last_batch(kafka, tmp_path, spark,
                                                                                          monkeypatch, caplog):
    rt, suffix = isolated_runtime(kafka, tmp_path)
    table, topic = "sized_batches", f"sized-batches{suffix}"
    producer = new_table(rt, table, SQL.format(topic=topic, table=table), topic)
    monkeypatch.setattr(arrow_batches, "BATCH_BYTES", 1 << 20)       # 1 MiB batches: a few MB of input shows it
    small = [json.dumps({"k": f"k{i % 7}", "v": i}).encode() for i in range(500)]
    large = [json.dumps({"k": f"k{i % 7}", "v": i, "pad": "x" * 5000}).encode() for i in range(500)]
    for value in small:
        producer.produce(topic, value, partition=0)
    for value in large:
        producer.produce(topic, value, partition=1)
    assert producer.flush(30) == 0
    byte_check = spark.conf.get(arrow_batches.MAX_BYTES_CONF)

    caplog.set_level(logging.INFO, logger="statetable.microbatch")
    (first,) = jobs.run(table, spark=spark, rt=rt, max_batches=1)
    # The sample takes partition 1's mean (the larger): 64 records of the same size.
    cap = arrow_batches.bucket((1 << 20) // (len(large[0]) + 24))     # rounded down to a power of two
    assert f"up to {cap:,} records" in caplog.text and "128 sampled records" in caplog.text
    files = _bronze_files(rt, table, 0)
    assert len([f for f in files if "-p00001-" in f]) == math.ceil(500 / cap)
    assert len([f for f in files if "-p00000-" in f]) == math.ceil(500 / cap)
    assert first.counts["read_bytes"] == sum(len(m.value()) for m in read_topic(rt.bootstrap, topic))

    caplog.clear()
    for value in small:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    (second,) = jobs.run(table, spark=spark, rt=rt, max_batches=1)
    cap = arrow_batches.bucket(int((1 << 20) // (first.counts["read_bytes"] / 1000 + 24)))
    assert "the last batch's 1,000 records" in caplog.text
    assert len(_bronze_files(rt, table, 1)) == math.ceil(500 / cap) > 1
    assert second.counts["read_bytes"] == sum(len(v) for v in small)
    assert spark.conf.get(arrow_batches.MAX_BYTES_CONF) == byte_check        # the session's own setting is back

    caplog.clear()                       # large records after a batch of small ones: the sample sets the cap
    for value in large:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    jobs.run(table, spark=spark, rt=rt, max_batches=1)
    cap = arrow_batches.bucket((1 << 20) // (len(large[0]) + 24))
    assert f"up to {cap:,} records" in caplog.text and "64 sampled records" in caplog.text
    assert len(_bronze_files(rt, table, 2)) == math.ceil(500 / cap)

    expected: dict[str, list[int]] = {}
    for value in small + large + small + large:
        row = json.loads(value)
        expected.setdefault(row["k"], []).append(row["v"])
    state = {key[0]: (row["n"], row["s"]) if isinstance(row, dict) else tuple(row)
             for key, row in jobs.state_rows(table, rt).items()}
    assert state == {k: (len(v), sum(v)) for k, v in expected.items()}


def test_kafka_batch_reads_take_spark_s_v2_scan(kafka, spark, capsys):
    """The V1 Kafka relation turns every record into an external Row and back; the session makes
    Spark read Kafka batches through KafkaScan (session.V1_SOURCES)."""
    from spark_jobs.steps.offsets import OffsetRange, spark_reader
    from state.kafka_admin import ensure_topic

    ensure_topic(kafka, "v2-scan-check", 1)
    spark_reader(spark, kafka, OffsetRange("v2-scan-check", {0: (0, 0)})).explain()
    plan = capsys.readouterr().out
    assert "BatchScan" in plan and "KafkaRelation" not in plan, plan
