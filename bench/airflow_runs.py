"""Wall time of the generated DAGs on a private local stack (Kafka, the Spark Connect server,
Airflow with its LocalExecutor).

  - `movie_tickets_sold__incremental` with 1 new record, --runs times (median), each split into
    Airflow's own time (trigger to the first task's start, and between tasks), the tasks' time,
    and the Spark part (the batch's seconds as the job reports them);
  - the same DAG with --events new records;
  - `movie_tickets_sold__restore_verify` for every failure mode (restore time too).

Prints one JSON object. Wall time is trigger to terminal state over the REST
API, so it includes Airflow's scheduling and each task's process start.

    .venv/bin/python -m bench.airflow_runs [--events 1000000]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--port", type=int, default=26092)
    parser.add_argument("--airflow-port", type=int, default=26080)
    parser.add_argument("--connect-port", type=int, default=26002)
    parser.add_argument("--runs", type=int, default=5, help="runs of the 1-record incremental DAG")
    parser.add_argument("--skip-drills", action="store_true", help="leave out the restore_verify runs")
    args = parser.parse_args()
    os.environ.update({
        "STATETABLE_SPARK_CONNECT_PORT": str(args.connect_port),
        "STATETABLE_STACK_DIR": tempfile.mkdtemp(prefix="statetable-bench-airflow-"),
        "STATETABLE_KAFKA_PORT": str(args.port), "STATETABLE_KAFKA_CONTROLLER_PORT": str(args.port + 1),
        "STATETABLE_AIRFLOW_PORT": str(args.airflow_port),
        "STATETABLE_POSTGRES_PORT": str(args.airflow_port + 2), "STATETABLE_BATCH_PORT": str(args.airflow_port + 4),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",     # only the runs measured here
    })
    import statistics
    from datetime import datetime

    from deploy import airflow_server, connect_server, kafka_server
    from catalog import settings
    from deploy.airflow_api import AirflowApi
    from deploy import samples
    from ops import status
    from ops.failures import FAILURES
    from catalog.runtime import Runtime

    cfg = settings.load()
    table = "movie_tickets_sold"
    out: dict = {"events": args.events}
    kafka_server.start(cfg)
    connect_server.start(cfg)
    try:
        kafka_server.wait_healthy(cfg)
        airflow_server.start(cfg)
        try:
            connect_server.wait_healthy(cfg)
            airflow_server.wait_healthy(cfg)
            api = AirflowApi(cfg)
            rt = Runtime.from_env()

            def timed(dag_id: str, conf: dict | None = None) -> dict:
                api.wait_for_dag(dag_id)
                started = time.monotonic()
                run_id = api.trigger(dag_id, conf)
                run = api.wait_run(dag_id, run_id, timeout=3600)
                return {"state": run["state"], "seconds": round(time.monotonic() - started, 1),
                        "tasks": api.task_states(dag_id, run_id), "run_id": run_id}

            def split(dag_id: str, result: dict, triggered_at: float) -> dict:
                """Airflow's own time (before the first task and between tasks), the tasks' time, Spark's."""
                tis = [ti for ti in api.task_instances(dag_id, result["run_id"]).values() if ti.get("start_date")]
                stamp = lambda value: datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()  # noqa: E731
                tasks = {ti["task_id"]: round(stamp(ti["end_date"]) - stamp(ti["start_date"]), 2) for ti in tis}
                stats = api.xcom(dag_id, result["run_id"], "run_batches")
                first = min(stamp(ti["start_date"]) for ti in tis)
                return {"seconds": result["seconds"], "tasks_s": tasks, "tasks_total_s": round(sum(tasks.values()), 2),
                        "airflow_before_first_task_s": round(first - triggered_at, 2),
                        "airflow_between_tasks_s": round(result["seconds"] - (first - triggered_at)
                                                         - sum(tasks.values()), 2),
                        "spark_s": stats["seconds"], "read": stats["read"]}

            dag = f"{table}__incremental"
            samples.produce(table, cfg.kafka_bootstrap, 1)
            timed(dag)      # the first run warms the server's session for the table
            ones = []
            for _ in range(args.runs):
                samples.produce(table, cfg.kafka_bootstrap, 1)
                triggered_at = time.time()
                ones.append(split(dag, timed(dag), triggered_at))
                print("1 record:", json.dumps(ones[-1]), flush=True)
            out["incremental_1_record"] = {
                "runs": ones, "median_s": statistics.median(r["seconds"] for r in ones),
                "median_spark_s": statistics.median(r["spark_s"] for r in ones)}
            samples.produce(table, cfg.kafka_bootstrap, args.events)
            triggered_at = time.time()
            big = timed(dag)
            big.update(split(dag, big, triggered_at))
            out[f"incremental_{args.events}_records"] = big
            print(f"{args.events} records:", json.dumps(big, default=str), flush=True)
            if args.skip_drills:
                print(json.dumps(out, indent=1, default=str))
                return
            out["restore_verify"] = {}
            for failure in FAILURES:
                if failure in ("kill_mid_batch", "kill_engine"):
                    samples.produce(table, cfg.kafka_bootstrap, 10_000)
                result = timed(f"{table}__restore_verify", {"failure": failure})
                record = status.verify_history(rt, table, limit=1)[0]
                result.update({k: record.get(k) for k in ("ok", "restore_seconds", "keys_compared", "differences",
                                                          "verify_seconds")})
                out["restore_verify"][failure] = result
                print(failure, json.dumps(result), flush=True)
        finally:
            airflow_server.stop(cfg)
    finally:
        connect_server.stop(cfg)
        kafka_server.process(cfg).stop(timeout=25)
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
