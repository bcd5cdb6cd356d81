"""statetable as a benchmark peer: the same count-and-sum table, declared in SQL.

Modes (one process each, like the other peers):
  count    - incremental run until caught up; report the rate and every key's (count, sum);
  build    - run until caught up; `--snapshot` then snapshots every partition, and
             without it the new changes stay in the changelog only (the tail a restore replays);
  recover  - wipe the local store (the restore-and-verify failure `wipe_local_store`),
             restore every partition from its newest snapshot plus the changelog tail,
             then read every key back.
Writes <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from catalog.runtime import Runtime

TABLE_SQL = """-- topic: {topic}
-- schema: k STRING, v BIGINT
-- partitions: 4
-- max_records_per_batch: {batch}
-- snapshot_every: {snapshot_every}
CREATE TABLE {table} AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;
"""


def runtime(args) -> Runtime:
    data = Path(args.data_dir)
    (data / "tables").mkdir(parents=True, exist_ok=True)
    (data / "tables" / f"{args.table}.sql").write_text(TABLE_SQL.format(
        topic=args.topic, table=args.table, batch=args.batch, snapshot_every=1 if args.snapshot else 1000))
    return Runtime(bootstrap=args.bootstrap, data_dir=data / "data", snapshot_uri=str(data / "data/snapshots"),
                   tables_dir=data / "tables", namespace=f"{args.table}.")


def counts(table: str, rt: Runtime) -> dict:
    from spark_jobs import jobs

    return {key[0]: (row["n"], row["s"]) if isinstance(row, dict) else tuple(row)
            for key, row in jobs.state_rows(table, rt).items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--topic", "--out", "--data-dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--table", default="bench_counts")
    parser.add_argument("--batch", type=int, default=1_000_000, help="max_records_per_batch")
    parser.add_argument("--mode", choices=("count", "build", "recover"), default="count")
    parser.add_argument("--snapshot", action="store_true", help="build: snapshot every partition at the end")
    parser.add_argument("--event-log", help="write Spark's event log here (stage metrics for the profile)")
    args = parser.parse_args()
    rt = runtime(args)
    from spark_jobs import jobs

    from importlib.metadata import version

    result: dict = {"system": "statetable", "version": version("statetable"), "mode": args.mode}
    if args.mode == "recover":
        from ops import failures

        failures.inject(args.table, "wipe_local_store", rt)
        started = time.perf_counter()
        restored = jobs.restore(args.table, rt=rt)
        result["processing_seconds"] = round(time.perf_counter() - started, 3)
        result["restored"] = [getattr(r, "__dict__", str(r)) for r in restored]
    else:
        from spark_jobs.engine import session

        started = time.perf_counter()
        events_log = {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
                      "spark.eventLog.rolling.enabled": "false",
                      "spark.eventLog.dir": Path(args.event_log).resolve().as_uri()} \
            if args.event_log else {}
        if args.event_log:
            Path(args.event_log).mkdir(parents=True, exist_ok=True)
        spark = session.get_or_create("bench-statetable", extra_conf=events_log)
        result["session_start_seconds"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        commits = jobs.run(args.table, until_caught_up=True, spark=spark, rt=rt, snapshots=args.mode == "count")
        result["processing_seconds"] = round(time.perf_counter() - started, 3)
        result["batches"] = [{"batch": c.batch_id, "seconds": c.seconds, **c.counts} for c in commits]
        session.done(spark)     # a local session stops (closing the event log); a Connect client lets go
        if args.snapshot:
            started = time.perf_counter()
            result["snapshot"] = jobs.snapshot_if_due(args.table, rt)
            result["snapshot_seconds"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    result["counts"] = counts(args.table, rt)
    result["read_back_seconds"] = round(time.perf_counter() - started, 3)
    Path(args.out, "result.json").write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
