"""Workload 3: time from producing one event to seeing it in the queried state.

statetable is read through the query API's read path, in two modes: scheduled
(the local stack's Airflow runs the table's `__incremental` DAG every minute,
each task a thin client of the stack's Spark Connect server) and with a warm runner (`statetable run T --follow`:
one Spark session, a batch whenever there is input). Quix Streams is read from
the output topic it commits together with its state (read_committed). The
first sample of each is a warm-up and is dropped.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.compare import peers
from bench.peers import statetable_count
from state.kafka_admin import ensure_topic


def _sample(bootstrap: str, topic: str, key: str, visible, timeout: float = 120) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    started = time.perf_counter()
    producer.produce(topic, b'{"k":"%s","v":1}' % key.encode(), key=key.encode())
    producer.flush(10)
    while time.perf_counter() - started < timeout:
        if visible(key):
            return time.perf_counter() - started
        time.sleep(0.02)
    raise RuntimeError(f"freshness: {key} not visible after {timeout}s")


def _summary(name: str, latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {"system": name, "samples": len(ordered), "median_s": round(statistics.median(ordered), 3),
            "max_s": round(ordered[-1], 3), "min_s": round(ordered[0], 3),
            "all_s": [round(x, 3) for x in latencies]}


def _visible_in(table: str, rt):
    from serving.query import StateUnavailable, lookup

    def visible(key: str) -> bool:
        try:
            return lookup(table, (key,), rt) is not None
        except StateUnavailable:     # before the first commit there is no state yet
            return False
    return visible


def statetable_scheduled(bootstrap: str, work: Path, samples: int, airflow_port: int) -> dict:
    """Airflow schedules the table every minute; events arrive at random moments of the minute."""
    import random

    from deploy import airflow_server, connect_server
    from catalog import settings
    from deploy.airflow_api import AirflowApi
    from catalog.runtime import Runtime

    table, topic = "bench_sched", "bench-fresh-sched"
    tables = work / "scheduled-tables"
    tables.mkdir(parents=True, exist_ok=True)
    (tables / f"{table}.sql").write_text(statetable_count.TABLE_SQL.format(
        topic=topic, table=table, batch=1_000_000, snapshot_every=10).replace(
        "-- partitions: 4", "-- partitions: 4\n-- schedule: * * * * *"))
    os.environ.update({"STATETABLE_TABLES_DIR": str(tables), "STATETABLE_AIRFLOW_PORT": str(airflow_port),
                       "STATETABLE_SPARK_CONNECT_PORT": str(airflow_port + 5),
                       "STATETABLE_BATCH_PORT": str(airflow_port + 6)})
    ensure_topic(bootstrap, topic, 4)
    cfg = settings.load()
    rng = random.Random(7)
    connect_server.start(cfg)
    airflow_server.start(cfg)
    try:
        connect_server.wait_healthy(cfg)
        airflow_server.wait_healthy(cfg)
        AirflowApi(cfg).wait_for_dag(f"{table}__incremental")
        visible = _visible_in(table, Runtime.from_env())
        latencies = []
        for i in range(samples + 1):
            time.sleep(rng.uniform(0, 60) if i else 0)
            latencies.append(_sample(bootstrap, topic, f"fresh{i:03d}", visible, timeout=300))
            print(f"[freshness] statetable scheduled: {[round(x, 1) for x in latencies]}", flush=True)
    finally:
        airflow_server.stop(cfg)
        connect_server.stop(cfg)
    return _summary("statetable (scheduled, every minute)", latencies[1:])


def statetable_warm(bootstrap: str, work: Path, samples: int) -> dict:
    spec = SimpleNamespace(data_dir=work / "statetable", topic="bench-fresh", table="bench_fresh",
                           batch=1_000_000, snapshot=False, bootstrap=bootstrap)
    rt = statetable_count.runtime(spec)
    ensure_topic(bootstrap, spec.topic, 4)
    log = (work / "statetable-follow.log").open("w")
    follower = subprocess.Popen([sys.executable, "-m", "deploy.cli", "run", spec.table, "--follow",
                                 "--poll-seconds", "0.1"], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **rt.as_env(), **peers.QUIET_SPARK})
    try:
        visible = _visible_in(spec.table, rt)
        latencies = [_sample(bootstrap, spec.topic, f"fresh{i:03d}", visible) for i in range(samples + 1)]
        print(f"[freshness] statetable warm runner: {[round(x, 2) for x in latencies]}", flush=True)
    finally:
        follower.terminate()
        follower.wait(60)
        log.close()
    return _summary("statetable (warm runner)", latencies[1:])


def quix(bootstrap: str, work: Path, samples: int) -> dict:
    topic, output = "bench-fresh-quix", "bench-fresh-quix-out"
    ensure_topic(bootstrap, topic, 4)
    ensure_topic(bootstrap, output, 4)
    out = work / "quix"
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.txt").open("w")
    app = subprocess.Popen([str(c) for c in peers.quix(bootstrap, topic, out, out / "state", "bench-fresh",
                                                       "--mode", "serve", "--output-topic", output)],
                           stdout=log, stderr=subprocess.STDOUT)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-fresh-reader",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(output, p, 0) for p in range(4)])
    seen: set[str] = set()

    def visible(key: str) -> bool:
        for msg in consumer.consume(100, timeout=0.02):
            if not msg.error() and msg.key():
                seen.add(msg.key().decode())
        return key in seen

    try:
        latencies = [_sample(bootstrap, topic, f"fresh{i:03d}", visible) for i in range(samples + 1)]
        print(f"[freshness] Quix Streams: {[round(x, 2) for x in latencies]}", flush=True)
    finally:
        consumer.close()
        app.terminate()
        app.wait(60)
        log.close()
    return _summary("Quix Streams", latencies[1:])
