"""Spark Structured Streaming peer: groupBy count and sum with Spark's own RocksDB state store.

`readStream` from Kafka, `RocksDBStateStoreProvider` with changelog
checkpointing, trigger `availableNow`, so the query stops once it has read
what the topic held at start. The state is then read back through Spark's
state data source (`format("statestore")`) to be checked. In `recover` mode
the query restarts on an existing checkpoint after the local state is gone:
its first batch reloads the state from the checkpoint.

Runs in statetable's venv (same pyspark 4.2.0) but uses none of statetable's
code beyond the session's jar list. Writes <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyspark

from spark_jobs.engine import session

STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--topic", "--out", "--checkpoint"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--mode", choices=("count", "recover"), default="count")
    parser.add_argument("--avro-schema", help="the values are unframed Avro of this writer schema (JSON): read with "
                                              "spark-avro's from_avro, the schema supplied by hand as Spark needs it")
    parser.add_argument("--first-job", action="store_true",
                        help="run one small Spark job before the query (bench.cold_start: Spark's own first-job cost)")
    args = parser.parse_args()

    spark = session.get_or_create("bench-spark-structured-streaming", local=True)
    for key, value in STATE_CONF.items():
        spark.conf.set(key, value)
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", args.bootstrap).option("subscribe", args.topic)
           .option("startingOffsets", "earliest").load())
    if args.avro_schema:
        from pyspark.sql.avro.functions import from_avro

        decoded = from_avro(F.col("value"), args.avro_schema, {"mode": "PERMISSIVE"})
    else:
        decoded = F.from_json(F.col("value").cast("string"), "k STRING, v BIGINT")
    events = raw.select(decoded.alias("e")).select("e.*")
    if args.first_job:
        spark.range(10).repartition(2).count()
    totals = events.groupBy("k").agg(F.count("v").alias("n"), F.sum("v").alias("s"))
    started = time.perf_counter()
    query = (totals.writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    rows = spark.read.format("statestore").load(args.checkpoint).selectExpr("key.k", "value.count AS n", "value.sum AS s").collect()
    result = {"system": "Spark Structured Streaming (RocksDB state store)", "version": pyspark.__version__,
              "mode": args.mode, "processing_seconds": round(seconds, 3),
              "batches": len(query.recentProgress),
              "input_rows": sum(p["numInputRows"] for p in query.recentProgress),
              "counts": {r["k"]: (r["n"], r["s"]) for r in rows}}
    Path(args.out, "result.json").write_text(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main()
