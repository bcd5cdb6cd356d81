"""What Spark alone reaches on this machine, for the pipeline targets of bench.pipeline.

Over the same offsets of a 10k-key JSON topic: Spark's raw Kafka read (count
only) and the bare minimum any Spark-based table must do, from_json plus
groupBy count and sum, with no dead letters, bronze, state, changelog or
mirror. Their ratio is the ceiling for bench.pipeline's ratio figure.

    .venv/bin/python -m bench.spark_ceiling [--events 5000000] [--keys 10000] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import time
import uuid

from bench.broker import private_broker
from bench.pipeline import produce
from spark_jobs.steps.offsets import full_range, spark_reader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    with private_broker(25892) as cfg:
        topic = f"ceiling-{uuid.uuid4().hex[:6]}"
        expected = produce(cfg.kafka_bootstrap, topic, args.events, args.keys)

        from pyspark.sql import functions as F

        from spark_jobs.engine import session

        spark = session.get_or_create("statetable-spark-ceiling", local=True)
        offsets = full_range(cfg.kafka_bootstrap, topic)
        spark_reader(spark, cfg.kafka_bootstrap, offsets).count()      # JIT and consumers warm
        runs = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            count = spark_reader(spark, cfg.kafka_bootstrap, offsets).count()
            raw_s = time.perf_counter() - started
            started = time.perf_counter()
            rows = (spark_reader(spark, cfg.kafka_bootstrap, offsets)
                    .select(F.from_json(F.col("value").cast("string"), "k STRING, v BIGINT").alias("e"))
                    .groupBy("e.k").agg(F.count("e.v").alias("n"), F.sum("e.v").alias("s")).collect())
            aggregate_s = time.perf_counter() - started
            assert count == args.events
            assert {r["k"]: (r["n"], r["s"]) for r in rows} == expected, "aggregate differs from the generator's"
            runs.append({"raw_count_per_s": round(count / raw_s), "from_json_group_by_per_s": round(count / aggregate_s),
                         "ratio": round(raw_s / aggregate_s, 3)})
            print(json.dumps(runs[-1]), flush=True)
        spark.stop()
    print(json.dumps({"events": args.events, "keys": args.keys, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
