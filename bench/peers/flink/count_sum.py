"""Apache Flink SQL peer: streaming GROUP BY count and sum, RocksDB state backend, checkpoints.

Runs in its own venv (.bench/venvs/flink: PyFlink pins old pyarrow and numpy).
The Kafka source is bounded at the offsets present at start ('scan.bounded.mode'),
so the streaming job ends by itself once it has read them; results go to an
upsert-kafka topic, which is read back afterwards (last value per key) to be
checked. `--mini-batch` turns on Flink SQL's mini-batch aggregation, its
documented tuning for exactly this query. Writes <out>/result.json.
Standalone on purpose: it imports nothing of statetable's.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pyflink.version import __version__ as flink_version

from flink_job import latest_by_key, output_topic, table_env


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--topic", "--out", "--checkpoints", "--connector-jar"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--mini-batch", action="store_true")
    args = parser.parse_args()
    out_topic = output_topic(args.bootstrap, args.topic)
    t_env = table_env(args.connector_jar, args.parallelism, Path(args.checkpoints), **(
        {"table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "1s",
         "table.exec.mini-batch.size": "5000", "table.optimizer.agg-phase-strategy": "TWO_PHASE"}
        if args.mini_batch else {}))
    t_env.execute_sql(f"""
        CREATE TABLE events (k STRING, v BIGINT) WITH (
          'connector' = 'kafka', 'topic' = '{args.topic}',
          'properties.bootstrap.servers' = '{args.bootstrap}', 'properties.group.id' = '{out_topic}',
          'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset',
          'format' = 'json')""")
    t_env.execute_sql(f"""
        CREATE TABLE totals (k STRING, n BIGINT, s BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH (
          'connector' = 'upsert-kafka', 'topic' = '{out_topic}',
          'properties.bootstrap.servers' = '{args.bootstrap}',
          'key.format' = 'raw', 'value.format' = 'json')""")
    started = time.perf_counter()
    t_env.execute_sql("INSERT INTO totals SELECT k, COUNT(v), SUM(v) FROM events GROUP BY k").wait()
    seconds = time.perf_counter() - started
    result = {"system": "Apache Flink SQL" + (" (mini-batch)" if args.mini_batch else ""),
              "version": flink_version, "processing_seconds": round(seconds, 3),
              "counts": read_upserts(args.bootstrap, out_topic)}
    Path(args.out, "result.json").write_text(json.dumps(result))


def read_upserts(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """The last value of every key in the job's output topic, read to its end."""
    rows = (json.loads(value) for value in latest_by_key(bootstrap, topic).values() if value is not None)
    return {row["k"]: (row["n"], row["s"]) for row in rows}


if __name__ == "__main__":
    main()
