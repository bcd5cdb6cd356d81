"""Warm rows of `make bench`: every system in one local Spark session, after a first job.

The cold rows time each system in a process of its own, so each pays its engine's first job
(class loading, JIT, Python workers). A deployed engine pays that once: this times the same
count-and-sum over the same offsets in one session that has already run a job, with the floor
beside them:
  raw read       Spark's Kafka source, count only: what reading costs;
  minimal pass   Spark's Kafka source -> mapInArrow (pyarrow's JSON reader, group_by) -> groupBy:
                 the least any Arrow pass over these records can do, with no state, in Arrow
                 batches as statetable's read makes them (Spark's per-row byte check off);
  statetable     the product's batch (`jobs.run`) on a fresh table, one batch of every event;
  Spark SS       Structured Streaming, RocksDB state store with changelog checkpointing,
                 availableNow, on a fresh checkpoint.
Each runs --reps times in turn; every result is checked by the caller against the reference.
Writes <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

from bench.peers.spark_structured_streaming import STATE_CONF


def parse_aggregate(batches):
    """The minimal pass: one pyarrow JSON parse and group_by per Arrow batch, nothing else."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    for batch in batches:
        text = pa.py_buffer(b"\n".join(batch.column("value").to_pylist()))
        parsed = pj.read_json(pa.BufferReader(text), read_options=pj.ReadOptions(use_threads=False, block_size=1 << 22),
                              parse_options=pj.ParseOptions(explicit_schema=schema))
        grouped = parsed.group_by("k").aggregate([("v", "count"), ("v", "sum")])
        yield from pa.Table.from_arrays([grouped["k"], grouped["v_count"], grouped["v_sum"]],
                                        names=["k", "n", "s"]).to_batches()


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--topic", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from bench.peers import statetable_count
    from spark_jobs.engine import arrow_batches
    from spark_jobs import jobs
    from spark_jobs.engine import session
    from spark_jobs.steps.offsets import full_range, spark_reader

    work = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    started = time.perf_counter()
    spark = session.get_or_create("bench-warm-session", local=True)
    result: dict = {"session_start_seconds": round(time.perf_counter() - started, 2)}
    offsets = full_range(args.bootstrap, args.topic)
    events = sum(high - low for low, high in offsets.ranges.values())
    read = lambda: spark_reader(spark, args.bootstrap, offsets)    # noqa: E731
    # The session's first job: the Kafka source and a Python worker, on a tenth of the records.
    started = time.perf_counter()
    first = spark_reader(spark, args.bootstrap, type(offsets)(offsets.topic, {
        p: (low, low + (high - low) // 10) for p, (low, high) in offsets.ranges.items()}))
    first.select("value").mapInArrow(parse_aggregate, "k STRING, n BIGINT, s BIGINT").count()
    result["first_job_seconds"] = round(time.perf_counter() - started, 2)

    def minimal() -> dict:
        # Arrow batches as statetable's read makes them (spark_jobs.engine.arrow_batches): the floor stays a floor.
        with arrow_batches.sized(spark, arrow_batches.max_records()):
            rows = read().select("value").mapInArrow(parse_aggregate, "k STRING, n BIGINT, s BIGINT") \
                .groupBy("k").agg(F.sum("n").alias("n"), F.sum("s").alias("s")).collect()
        return {r["k"]: (r["n"], r["s"]) for r in rows}

    def statetable(rep: int) -> dict:
        table = f"bench_warm_{rep}_{uuid.uuid4().hex[:4]}"
        rt = statetable_count.runtime(argparse.Namespace(data_dir=str(work / table), table=table, topic=args.topic,
                                                         batch=events, snapshot=False, bootstrap=args.bootstrap))
        commits = jobs.run(table, until_caught_up=True, spark=spark, rt=rt)
        return {"counts": statetable_count.counts(table, rt),
                "batches": [{"batch": c.batch_id, "seconds": c.seconds, **c.counts} for c in commits]}

    def spark_ss() -> dict:
        for key, value in STATE_CONF.items():
            spark.conf.set(key, value)
        checkpoint = str(work / f"ss-{uuid.uuid4().hex[:6]}")
        stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                  .option("subscribe", args.topic).option("startingOffsets", "earliest").load()
                  .select(F.from_json(F.col("value").cast("string"), "k STRING, v BIGINT").alias("e")).select("e.*")
                  .groupBy("k").agg(F.count("v").alias("n"), F.sum("v").alias("s")))
        query = (stream.writeStream.outputMode("update").format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        rows = spark.read.format("statestore").load(checkpoint) \
            .selectExpr("key.k", "value.count AS n", "value.sum AS s").collect()
        return {r["k"]: (r["n"], r["s"]) for r in rows}

    runs: dict[str, list] = {"raw read": [], "minimal pass": [], "statetable": [], "Spark Structured Streaming": []}
    outputs: dict[str, object] = {}
    for rep in range(args.reps):
        for name, run in (("raw read", lambda: read().count()), ("minimal pass", minimal),
                          ("statetable", lambda: statetable(rep)), ("Spark Structured Streaming", spark_ss)):
            started = time.perf_counter()
            out = run()
            runs[name].append(round(time.perf_counter() - started, 3))
            outputs[name] = out
            print(json.dumps({"rep": rep, "system": name, "seconds": runs[name][-1]}), flush=True)
    result["events"] = events
    result["seconds"] = runs
    result["raw_read_records"] = outputs["raw read"]
    result["counts"] = {"minimal pass": outputs["minimal pass"], "statetable": outputs["statetable"]["counts"],
                        "Spark Structured Streaming": outputs["Spark Structured Streaming"]}
    result["statetable_batches"] = outputs["statetable"]["batches"]
    result["processing_seconds"] = min(runs["statetable"])
    Path(args.out, "result.json").write_text(json.dumps(result, default=str))
    spark.stop()


if __name__ == "__main__":
    main()
