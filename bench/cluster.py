"""Scale-out benchmark: one table, the same events and batch size, on three engines in turn.

  - local2:     the Spark Connect server on local[2], the store in folders (today's default, 2 cores);
  - local2_s3:  the same with the durable parts (batch log, snapshots, Delta) in the S3 store;
  - cluster2:   the Connect server against a standalone master with 2 workers of 1 core each,
                every worker with its own state folder, the store in S3 (`stack up --workers 2`).

Each mode runs its batches one at a time from this process (a Connect client, as an Airflow
task is) and prints, as JSON:
  - steady events/s: the batches after the first (which warms the workers), and the last
    batch's time by step;
  - the store's cost per batch: requests by method, from the S3 server's request log;
  - what reached the driver: the bytes tasks returned to it (Spark's REST API, stage
    `resultSize`, over the whole run), per event, and the tasks each executor ran. A driver
    that funnelled the rows would get about an event's size per event (a JSON value here is
    about 24 bytes), and would get more as the events grow.

    .venv/bin/python -m bench.cluster [--events 600000] [--batch 100000] [--modes local2,local2_s3,cluster2]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench import pipeline

PORTS = {"STATETABLE_SPARK_CONNECT_PORT": "29702", "STATETABLE_S3_PORT": "29710",
         "STATETABLE_SPARK_MASTER_PORT": "29777"}
# bench.pipeline's table, snapshotting every other batch as a production table would.
TABLE_SQL = pipeline.TABLE_SQL.replace("-- snapshot_every: 1000", "-- snapshot_every: 2")
REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--modes", default="local2,local2_s3,cluster2")
    args = parser.parse_args()
    for key, value in PORTS.items():
        os.environ.setdefault(key, value)
    os.environ["STATETABLE_SPARK_UI"] = "true"           # the REST API below reads the stages

    from bench.broker import private_broker

    results = {"events": args.events, "keys": args.keys, "batch": args.batch, "modes": {}}
    with private_broker(29692) as cfg:
        root = Path(tempfile.mkdtemp(prefix="statetable-bench-cluster-"))
        topic = f"bench-scale-{uuid.uuid4().hex[:6]}"
        expected = pipeline.produce(cfg.kafka_bootstrap, topic, args.events, args.keys)
        try:
            for mode in args.modes.split(","):
                results["modes"][mode] = run_mode(mode, cfg, root / mode, topic, args, expected)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    local = results["modes"].get("local2", {}).get("steady_events_per_s")
    cluster = results["modes"].get("cluster2", {}).get("steady_events_per_s")
    if local and cluster:
        results["cluster2_to_local2"] = round(cluster / local, 2)
    print(json.dumps(results, indent=1))


def run_mode(mode: str, cfg, root: Path, topic: str, args, expected: dict) -> dict:
    from catalog.runtime import Runtime
    from deploy import connect_server, object_store, spark_cluster
    from deploy.stack import _start_cluster
    from spark_jobs import jobs
    from spark_jobs.engine import session

    settings = replace(cfg, state_dir=root / "stack")
    table = "bench_scale"
    (root / "tables").mkdir(parents=True)
    (root / "tables" / f"{table}.sql").write_text(TABLE_SQL.format(topic=topic, table=table, batch=args.batch))
    saved = dict(os.environ)
    try:
        store = ""
        if mode == "cluster2":
            with contextlib.redirect_stdout(sys.stderr):      # stdout is the JSON alone
                _start_cluster(settings, 2, time.monotonic())
        elif mode == "local2_s3":
            object_store.start(settings)
            object_store.wait_healthy(settings)
        if mode != "local2":
            os.environ.update(object_store.client_env(settings))
            store = f"s3://statetable/{mode}"
        os.environ["STATETABLE_SPARK_MASTER"] = "local[2]"      # ignored against a cluster
        started = time.monotonic()
        connect_server.start(settings)
        connect_server.wait_healthy(settings)
        engine_s = time.monotonic() - started
        os.environ["STATETABLE_SPARK_REMOTE"] = session.client_url(settings.connect_url,
                                                                  connect_server.token(settings))
        data = root / "data"
        rt = Runtime(bootstrap=cfg.kafka_bootstrap, data_dir=data, tables_dir=root / "tables",
                     snapshot_uri=f"{store}/snapshots" if store else str(data / "snapshots"),
                     namespace=f"b{uuid.uuid4().hex[:6]}.", store_uri=store)
        spark = session.get_or_create("statetable-bench-cluster")
        ui = _ui_url()
        s3_log = settings.s3_dir / "s3.log"
        batches, requests = [], []
        while True:
            seen = _requests(s3_log)
            commits = jobs.run(table, max_batches=1, spark=spark, rt=rt)
            if not commits:
                break
            batches.append(commits[0])
            requests.append(_requests(s3_log) - seen)
        stages, executors = _spark_rest(ui)
        state = {k[0]: v for k, v in jobs.state_rows(table, rt).items()} if mode == "local2" else None
    finally:
        connect_server.stop(settings)
        spark_cluster.stop(settings)
        object_store.stop(settings)
        os.environ.clear()
        os.environ.update(saved)
    assert sum(c.counts["read"] for c in batches) == args.events
    if state is not None:
        assert state == expected, f"{mode}: the state differs from the generator's counts"
    steady = batches[1:]
    steady_s = sum(c.seconds for c in steady)
    per_batch = Counter()
    for counted in requests[1:]:
        per_batch.update(counted)
    return {
        "engine_start_seconds": round(engine_s, 1),
        "batches": len(batches), "batch_seconds": [c.seconds for c in batches],
        "steady_events_per_s": round(sum(c.counts["read"] for c in steady) / steady_s) if steady_s else None,
        "s3_requests_per_steady_batch": {m: round(n / len(steady), 1) for m, n in sorted(per_batch.items())}
        if steady and store else None,
        "last_batch_step_ms": {k[3:]: v for k, v in batches[-1].counts.items() if k.startswith("ms_")},
        "bytes_returned_to_driver": stages["resultSize"],
        "bytes_returned_to_driver_per_event": round(stages["resultSize"] / args.events, 3),
        "tasks_per_executor": executors,
    }


def _requests(log: Path) -> Counter:
    try:
        return Counter(REQUEST.findall(log.read_text(errors="replace")))
    except FileNotFoundError:
        return Counter()


def _ui_url(timeout: float = 60) -> str:
    """The Connect server's UI: Spark takes the first free port from 4040 (its log says which
    only at INFO, which the project's log config leaves out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for port in range(4040, 4060):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=2) as answer:
                    if any(app["name"] == "statetable-connect" for app in json.load(answer)):
                        return f"http://127.0.0.1:{port}"
            except OSError:
                continue
        time.sleep(1)
    raise RuntimeError("no Spark UI of the Connect server answers on ports 4040-4059")


def _spark_rest(ui: str) -> tuple[dict, dict]:
    """Totals over every stage of the application, and the tasks each executor ran."""
    def get(path: str):
        with urllib.request.urlopen(f"{ui}/api/v1/{path}", timeout=30) as answer:
            return json.load(answer)

    (app,) = get("applications")
    totals = Counter()
    for stage in get(f"applications/{app['id']}/stages"):
        totals["resultSize"] += stage.get("resultSize", 0)
    executors = {e["id"] if e["id"] == "driver" else e["hostPort"]: e["totalTasks"]
                 for e in get(f"applications/{app['id']}/allexecutors")}
    return dict(totals), executors


if __name__ == "__main__":
    main()
