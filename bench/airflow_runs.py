"""Wall time of the generated DAGs on a private local stack (Kafka + Airflow, LocalExecutor).

  - `movie_tickets_sold__incremental` with 1 new record and with --events new records;
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
    args = parser.parse_args()
    os.environ.update({
        "STATETABLE_STACK_DIR": tempfile.mkdtemp(prefix="statetable-bench-airflow-"),
        "STATETABLE_KAFKA_PORT": str(args.port), "STATETABLE_KAFKA_CONTROLLER_PORT": str(args.port + 1),
        "STATETABLE_AIRFLOW_PORT": str(args.airflow_port),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",     # only the runs measured here
    })
    from deploy import airflow_server, kafka_server
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
    try:
        kafka_server.wait_healthy(cfg)
        airflow_server.start(cfg)
        try:
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

            samples.produce(table, cfg.kafka_bootstrap, 1)
            out["incremental_1_record"] = timed(f"{table}__incremental")
            samples.produce(table, cfg.kafka_bootstrap, args.events)
            big = timed(f"{table}__incremental")
            big["stats"] = api.xcom(f"{table}__incremental", big["run_id"], "record_stats")
            out[f"incremental_{args.events}_records"] = big
            out["restore_verify"] = {}
            for failure in FAILURES:
                if failure == "kill_mid_batch":
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
        kafka_server.process(cfg).stop(timeout=25)
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
