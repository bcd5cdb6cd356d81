"""One record through a table's incremental DAG, triggered over REST: what a user waits for.

A private stack (Kafka, the warm Spark Connect server, Airflow on PostgreSQL) with the shipped
tables and the scheduler on, as `make run` leaves it. One event is produced to
`movie_ticket_sales`, `movie_tickets_sold__incremental` is triggered over Airflow's REST API,
and the run is timed by Airflow's own clock, from the run being queued to its end (the client's
poll interval is not in the figure). Measured twice: right after the stack came up (the
scheduler, dag-processor and engine still busy with their start), and on a quiet stack after
`--quiet-after` seconds of idling. Each run's row is checked: the title's ticket count grew by
one. Prints one JSON object with every run and the two medians.

    .venv/bin/python -m bench.first_record [--runs 5] [--quiet-after 180]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

DAG = "movie_tickets_sold__incremental"


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _count(lookup, rt) -> int:
    """Heat's committed ticket count (0 before the table's first batch)."""
    try:
        return (lookup("movie_tickets_sold", ("Heat",), rt=rt) or {}).get("tickets_sold", 0)
    except Exception:       # noqa: BLE001 - no state yet
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quiet-after", type=float, default=180)
    parser.add_argument("--port", type=int, default=25092)
    parser.add_argument("--deployed", type=int, default=0,
                        help="also deploy this many tables of the payments shape beside the shipped ones (#70: "
                             "one record's wait with 100 tables on the stack), their topics idle")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="statetable-bench-first-record-"))
    if args.deployed:
        from bench.tables_per_stack import TABLE_SQL
        from catalog.settings import PROJECT_ROOT

        tables = root / "tables"
        shutil.copytree(PROJECT_ROOT / "dags" / "tables", tables)
        for i in range(args.deployed):
            (tables / f"pay_{i:03d}.sql").write_text(TABLE_SQL.format(table=f"pay_{i:03d}", topic=f"pay_{i:03d}"))
        os.environ["STATETABLE_TABLES_DIR"] = str(tables)
    os.environ.update({
        "STATETABLE_STACK_DIR": str(root / "stack"),
        "STATETABLE_KAFKA_PORT": str(args.port), "STATETABLE_KAFKA_CONTROLLER_PORT": str(args.port + 1),
        "STATETABLE_AIRFLOW_PORT": str(args.port - 12), "STATETABLE_SPARK_CONNECT_PORT": str(args.port - 90),
        "STATETABLE_POSTGRES_PORT": str(args.port - 60), "STATETABLE_BATCH_PORT": str(args.port - 14),
    })
    from catalog import settings
    from catalog.runtime import Runtime
    from deploy import stack
    from deploy.airflow_api import AirflowApi
    from serving.query import lookup
    from state.kafka_admin import ensure_topic
    from confluent_kafka import Producer

    cfg = settings.load()
    out: dict = {"cores": os.cpu_count(), "dag": DAG, "tables_deployed_beside": args.deployed, "phases": {}}
    started = time.monotonic()
    stack.up(cfg)
    out["stack_up_seconds"] = round(time.monotonic() - started, 1)
    try:
        api = AirflowApi(cfg)
        api.wait_for_dag(DAG, timeout=300)
        ensure_topic(cfg.kafka_bootstrap, "movie_ticket_sales", 4)
        for i in range(args.deployed):
            ensure_topic(cfg.kafka_bootstrap, f"pay_{i:03d}", 4)
            api.wait_for_dag(f"pay_{i:03d}__incremental", timeout=600)
        producer = Producer({"bootstrap.servers": cfg.kafka_bootstrap})
        rt = Runtime.from_env()
        for phase, pause in (("right_after_stack_up", 0.0), ("quiet_stack", args.quiet_after)):
            time.sleep(pause)
            runs = []
            for i in range(args.runs):
                before = _count(lookup, rt)
                producer.produce("movie_ticket_sales", json.dumps(
                    {"title": "Heat", "ticket_total_value": 12.5, "sale_ts": "2026-11-26T10:00:00Z"}).encode())
                assert producer.flush(10) == 0
                run_id = api.trigger(DAG)
                run = api.wait_run(DAG, run_id, timeout=600)
                after = _count(lookup, rt)
                ti = api.task_instances(DAG, run_id)["run_batches"]
                runs.append({"state": run["state"], "seconds": round(_stamp(run["end_date"]) - _stamp(run["queued_at"]), 2),
                             "queued_to_task_start": round(_stamp(ti["start_date"]) - _stamp(run["queued_at"]), 2),
                             "task_seconds": round(ti["duration"] or 0, 2), "row_grew_by": after - before})
                print(json.dumps({"phase": phase, **runs[-1]}), flush=True)
            out["phases"][phase] = {"runs": runs, "median_seconds": statistics.median(r["seconds"] for r in runs)}
    finally:
        stack.down(cfg)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
