"""Pipeline benchmark: count and sum per key over 5M JSON events (10k keys).

Prints JSON with
  - incremental events/s in one Spark session, JVM start excluded;
  - the same for the table without bronze (`-- bronze: off`), run next in the warm session;
  - the same as a ratio to Spark's raw read of the same offsets (count only);
  - the fixed cost of a spark-submitted batch with one record.

    .venv/bin/python -m bench.pipeline [--events 5000000] [--batch 1000000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


from confluent_kafka import Producer  # noqa: E402

from bench.broker import private_broker  # noqa: E402
from spark_jobs import submit  # noqa: E402
from spark_jobs.steps.offsets import full_range, spark_reader  # noqa: E402
from catalog.runtime import Runtime  # noqa: E402
from state.kafka_admin import ensure_topic  # noqa: E402

TABLE_SQL = """-- topic: {topic}
-- schema: k STRING, v BIGINT
-- partitions: 4
-- max_records_per_batch: {batch}
-- snapshot_every: 1000
CREATE TABLE {table} AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;
"""


def produce(bootstrap: str, topic: str, events: int, keys: int) -> dict[str, tuple[int, int]]:
    ensure_topic(bootstrap, topic, 4)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 20000,
                         "queue.buffering.max.messages": 2000000, "compression.type": "lz4"})
    rng = random.Random(5)
    expected: dict[str, list[int]] = {}
    for i in range(events):
        key, value = f"key{rng.randrange(keys):05d}", rng.randrange(1000)
        slot = expected.setdefault(key, [0, 0])
        slot[0] += 1
        slot[1] += value
        payload = b'{"k":"%s","v":%d}' % (key.encode(), value)
        while True:
            try:
                producer.produce(topic, payload, partition=i % 4)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(300) == 0
    return {k: (n, s) for k, (n, s) in expected.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000_000)
    args = parser.parse_args()

    with private_broker(29592) as cfg:
        root = Path(tempfile.mkdtemp(prefix="statetable-bench-pipeline-"))
        suffix = uuid.uuid4().hex[:6]
        topic, table = f"bench-events-{suffix}", "bench_counts"
        (root / "tables").mkdir()
        (root / "tables" / f"{table}.sql").write_text(TABLE_SQL.format(topic=topic, table=table, batch=args.batch))
        (root / "tables" / f"{table}_nb.sql").write_text(     # the same table without bronze
            "-- bronze: off\n" + TABLE_SQL.format(topic=topic, table=f"{table}_nb", batch=args.batch))
        rt = Runtime(bootstrap=cfg.kafka_bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data/snapshots"),
                     tables_dir=root / "tables", namespace=f"b{suffix}.")
        started = time.perf_counter()
        expected = produce(rt.bootstrap, topic, args.events, args.keys)
        produce_s = time.perf_counter() - started

        from spark_jobs import jobs

        from spark_jobs.engine import session

        started = time.perf_counter()
        spark = session.get_or_create("statetable-bench")
        session_s = time.perf_counter() - started

        offsets = full_range(rt.bootstrap, topic)
        # Warm the JVM (JIT, Kafka consumers) once, so neither timing below pays for it.
        spark_reader(spark, rt.bootstrap, offsets).count()
        started = time.perf_counter()
        raw_count = spark_reader(spark, rt.bootstrap, offsets).count()
        raw_s = time.perf_counter() - started
        assert raw_count == args.events

        started = time.perf_counter()
        commits = jobs.run(table, until_caught_up=True, spark=spark, rt=rt)
        incremental_s = time.perf_counter() - started
        assert sum(c.counts["read"] for c in commits) == args.events

        state = {k[0]: v for k, v in jobs.state_rows(table, rt).items()}
        assert state == expected, "state differs from the generator's counts"

        # The same run without bronze, in the now warm session (compare the steady batches).
        started = time.perf_counter()
        no_bronze = jobs.run(f"{table}_nb", until_caught_up=True, spark=spark, rt=rt)
        no_bronze_s = time.perf_counter() - started
        assert {k[0]: v for k, v in jobs.state_rows(f"{table}_nb", rt).items()} == expected

        # A batch of 10 records in the same warm session: the per-batch fixed costs.
        one = Producer({"bootstrap.servers": rt.bootstrap})
        for i in range(10):
            one.produce(topic, b'{"k":"key00000","v":1}', partition=i % 4)
        one.flush(10)
        started = time.perf_counter()
        (small,) = jobs.run(table, until_caught_up=True, spark=spark, rt=rt)
        small_s = time.perf_counter() - started
        assert small.counts["read"] == 10

        # Fixed cost of one spark-submitted batch with a single record.
        one.produce(topic, b'{"k":"key00000","v":1}', partition=0)
        one.flush(10)
        env = {**os.environ, **rt.as_env(), "PYSPARK_PYTHON": sys.executable}
        command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[*]",
                  "--jars", ",".join(str(p) for p in session.spark_jars()),
                  "--driver-class-path", os.pathsep.join(str(p) for p in session.spark_jars()),
                  "--conf", "spark.driver.bindAddress=127.0.0.1", str(Path(submit.__file__)),
                  "run", table, "--until-caught-up"]
        spark.stop()
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        submit_s = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-3000:]
        assert '"read": 1,' in done.stdout, done.stdout[-500:]

        events_per_s = args.events / incremental_s
        raw_per_s = args.events / raw_s
        print(json.dumps({
            "events": args.events, "keys": args.keys, "batches": len(commits), "produce_seconds": round(produce_s, 1),
            "spark_session_start_seconds": round(session_s, 1),
            "incremental_seconds": round(incremental_s, 2), "incremental_events_per_s": round(events_per_s),
            "raw_read_seconds": round(raw_s, 2), "raw_read_events_per_s": round(raw_per_s),
            "ratio_to_raw_read": round(events_per_s / raw_per_s, 2),
            "engine": os.environ.get("STATETABLE_ENGINE", "arrow (default where the definition allows)"),
            "warm_batch_10_records_seconds": round(small_s, 2),
            "warm_batch_10_records_step_ms": {k[3:]: v for k, v in small.counts.items() if k.startswith("ms_")},
            "spark_submit_one_record_seconds": round(submit_s, 1),
            "batch_seconds": [c.seconds for c in commits],
            "steady_batch_seconds_mean": _steady(commits),
            "bronze_off": {"incremental_seconds": round(no_bronze_s, 2),
                           "incremental_events_per_s": round(args.events / no_bronze_s),
                           "ratio_to_raw_read": round(args.events / no_bronze_s / raw_per_s, 2),
                           "batch_seconds": [c.seconds for c in no_bronze],
                           "steady_batch_seconds_mean": _steady(no_bronze)},
            "batch_step_ms": [{k[3:]: v for k, v in c.counts.items() if k.startswith("ms_")} for c in commits],
        }, indent=1))
        shutil.rmtree(root, ignore_errors=True)


def _steady(commits) -> float | None:
    """Mean seconds of the batches after the first (which pays the session's warm-up)."""
    rest = [c.seconds for c in commits[1:]]
    return round(sum(rest) / len(rest), 2) if rest else None


if __name__ == "__main__":
    main()
