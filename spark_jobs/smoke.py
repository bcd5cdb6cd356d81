"""The first end-to-end job: an exact Kafka offset range into a Delta table.

Run by spark-submit from the smoke DAG. It proves the wiring (Spark's Kafka
source, delta-spark, local jars) and reports count and sum of the `amount`
field so callers can check them against what was produced.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from spark_jobs.steps.offsets import OffsetRange, spark_reader


def read_range(spark, bootstrap: str, offsets: OffsetRange):
    return spark_reader(spark, bootstrap, offsets)


def run(spark, bootstrap: str, offsets: OffsetRange, delta_path: str, run_key: str = "adhoc") -> dict:
    """Each run owns the `run_key` partition and replaces only that, so
    concurrent runs (a backfill) never conflict and a re-run is idempotent."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    events = read_range(spark, bootstrap, offsets).select(
        "partition", "offset",
        F.get_json_object(F.col("value").cast("string"), "$.amount").cast("long").alias("amount"),
        F.lit(run_key).alias("run_key"),
    )
    (events.write.format("delta").mode("overwrite").partitionBy("run_key")
        .option("replaceWhere", f"run_key = '{_sql_string(run_key)}'").save(delta_path))
    stored = spark.read.format("delta").load(delta_path).where(F.col("run_key") == run_key)
    row = stored.agg(F.count("*").alias("count"), F.sum("amount").alias("sum")).first()
    return {
        "topic": offsets.topic,
        "planned": offsets.record_count,
        "count": int(row["count"]),
        "sum": int(row["sum"] or 0),
        "delta_path": delta_path,
        "seconds": round(time.monotonic() - started, 2),
    }


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--offsets", required=True, help="OffsetRange JSON")
    parser.add_argument("--delta-path", required=True)
    parser.add_argument("--result-file", required=True)
    parser.add_argument("--run-key", default="adhoc", help="the Delta partition this run owns")
    args = parser.parse_args(argv)

    from spark_jobs.engine import session

    spark = session.get_or_create("statetable-smoke")
    result = run(spark, args.bootstrap, OffsetRange.from_json(args.offsets), args.delta_path, args.run_key)
    Path(args.result_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result_file).write_text(json.dumps(result))
    print("SMOKE_RESULT " + json.dumps(result), flush=True)
    session.done(spark)
    return 0 if result["count"] == result["planned"] else 1


if __name__ == "__main__":
    sys.exit(main())
