"""Where a fresh process's first batch goes, against the same batch in a warm session.

`make bench` times statetable from `jobs.run` in a new process, so its one 5M-event batch pays
the engine's start: Spark's first job, the Python workers' start and imports, the Kafka
source's first read. This measures each of those in a fresh session, then the same table cold
(a new process, as `make bench` runs it) and warm (after a small batch of another table in the
same session), and Spark Structured Streaming cold and after one first job. Prints JSON.

    .venv/bin/python -m bench.cold_start [--events 5000000] [--port 29492]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(f) -> float:
    started = time.perf_counter()
    f()
    return round(time.perf_counter() - started, 2)


def _table_run(spark, work: Path, table: str, topic: str, bootstrap: str, batch: int) -> dict:
    from bench.peers import statetable_count
    from spark_jobs import jobs

    args = argparse.Namespace(data_dir=str(work / table), table=table, topic=topic, batch=batch,
                              snapshot=False, bootstrap=bootstrap)
    rt = statetable_count.runtime(args)
    started = time.perf_counter()
    commits = jobs.run(table, until_caught_up=True, spark=spark, rt=rt, snapshots=True)
    return {"seconds": round(time.perf_counter() - started, 2), "records": sum(c.counts["read"] for c in commits),
            "steps_ms": [{k: v for k, v in c.counts.items() if k.startswith("ms_")} for c in commits]}


def child(mode: str, bootstrap: str, work: Path, events: int) -> dict:
    from spark_jobs.engine import session

    out: dict = {"mode": mode}
    started = time.perf_counter()
    spark = session.get_or_create(f"cold-start-{mode}")
    out["session_start_s"] = round(time.perf_counter() - started, 2)
    if mode == "steps":
        def ident(batches):
            yield from batches

        def imports(batches):
            import spark_jobs.frames.arrow_pass  # noqa: F401
            import spark_jobs.steps.merge_task  # noqa: F401
            yield from batches

        raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", "cold")
               .option("startingOffsets", "earliest")
               .option("endingOffsets", json.dumps({"cold": {str(p): 100 for p in range(4)}})).load())
        out["first_spark_job_s"] = _timed(lambda: spark.range(10).repartition(2).count())
        out["second_spark_job_s"] = _timed(lambda: spark.range(10).repartition(2).count())
        out["python_workers_start_s"] = _timed(lambda: spark.range(10).repartition(2).mapInArrow(ident, "id long").collect())
        out["pass_imports_s"] = _timed(lambda: spark.range(10).repartition(2).mapInArrow(imports, "id long").collect())
        out["pass_imports_again_s"] = _timed(lambda: spark.range(10).repartition(2).mapInArrow(imports, "id long").collect())
        out["first_kafka_read_400_s"] = _timed(raw.count)
        out["second_kafka_read_400_s"] = _timed(raw.count)
    if mode == "warm":
        out["warm_up_table"] = _table_run(spark, work, "warm_up", "warm-up", bootstrap, 1_000_000)
    if mode in ("cold", "warm"):
        out["table"] = _table_run(spark, work, f"t_{mode}", "cold", bootstrap, events)
    if mode == "raw":
        raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", "cold")
               .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
        out["raw_count_s"] = [_timed(raw.count) for _ in range(2)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--port", type=int, default=29492)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.bootstrap, Path(args.work), args.events)))
        return

    from bench.broker import private_broker
    from bench.compare import peers
    from bench.workload import produce_random

    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    with private_broker(args.port) as cfg:
        bootstrap = f"127.0.0.1:{cfg.kafka_port}"
        produce_random(bootstrap, "cold", args.events, 10_000)
        produce_random(bootstrap, "warm-up", 20_000, 100)
        result: dict = {"events": args.events, "keys": 10_000}
        for mode in ("steps", "raw", "cold", "warm"):
            done = subprocess.run([sys.executable, "-m", "bench.cold_start", "--child", mode, "--bootstrap", bootstrap,
                                   "--work", str(work), "--events", str(args.events)],
                                  capture_output=True, text=True, env={**os.environ, **peers.QUIET_SPARK})
            if done.returncode:
                raise SystemExit(f"{mode}: {done.stderr[-3000:]}")
            result[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        for first_job in (False, True):
            out = work / f"sss-{first_job}"
            out.mkdir()
            cmd = peers.spark_structured_streaming(bootstrap, "cold", out, out / "checkpoint",
                                                   *(["--first-job"] if first_job else []))
            subprocess.run([str(c) for c in cmd], check=True, capture_output=True, env={**os.environ, **peers.QUIET_SPARK})
            ss = json.loads((out / "result.json").read_text())
            result["spark_structured_streaming" + ("_after_a_first_job" if first_job else "")] = {
                "seconds": ss["processing_seconds"], "input_rows": ss["input_rows"]}
    for mode in ("cold", "warm"):
        result[mode]["events_per_s"] = round(args.events / result[mode]["table"]["seconds"])
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
