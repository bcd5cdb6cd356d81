"""How soon a committed batch is visible to queries: a query replica against the writer's
secondaries, side by side in one run.

A private broker; payments_per_customer runs real micro-batches (a local Spark session in this
process) back to back; two `statetable serve` processes answer from the same data dir, one
with STATETABLE_QUERY_FROM=writer (RocksDB secondaries of the writer's folders), one with
STATETABLE_QUERY_FROM=replica (its own copy following the changelog). A poller asks each for
one row every 20 ms and records when each batch first appears; the visibility of a batch is
that moment less the batch log's commit time (negative when the changelog transaction, which
commits first, was followed before the batch log entry was written). Prints one JSON object.

    .venv/bin/python -m bench.replica_lag [--batches 30] [--events-per-batch 20000]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOKEN = "bench-token-" + "r" * 24
TABLE = "payments_per_customer"


def _poll(port: int, seen: dict[int, float], stop: threading.Event) -> None:
    import httpx

    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5) as client:
        while not stop.is_set():
            try:
                answer = client.get(f"http://127.0.0.1:{port}/tables/{TABLE}/rows", params={"limit": 1})
                if answer.status_code == 200:
                    seen.setdefault(answer.json()["batch"], time.time())
            except httpx.TransportError:
                pass
            time.sleep(0.02)


def _summary(latencies: list[float]) -> dict:
    if not latencies:
        return {"batches": 0}
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {"batches": len(ordered), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": round(ordered[-1] * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--events-per-batch", type=int, default=20000)
    parser.add_argument("--broker-port", type=int, default=25592)
    parser.add_argument("--ports", type=int, nargs=2, default=(25581, 25582))
    args = parser.parse_args()

    from bench.broker import private_broker
    from catalog.batch_log import BatchLog
    from deploy import samples
    from deploy.processes import wait_until
    from spark_jobs import jobs
    from spark_jobs.engine import session
    from tests.table_env import isolated_runtime

    root = Path(tempfile.mkdtemp(prefix="statetable-bench-replica-"))
    with private_broker(args.broker_port) as cfg:
        rt, suffix = isolated_runtime(cfg.kafka_bootstrap, root)
        spark = session.get_or_create("bench-replica-lag")
        samples.produce(TABLE, rt.bootstrap, args.events_per_batch, suffix=suffix)
        jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt)      # batch 0: both servers start from it
        servers, seen, stop, pollers = {}, {}, threading.Event(), []
        try:
            for source, port in zip(("writer", "replica"), args.ports):
                env = {**os.environ, **rt.as_env(), "STATETABLE_API_TOKEN": TOKEN, "STATETABLE_QUERY_FROM": source}
                servers[source] = subprocess.Popen(
                    [str(Path(sys.executable).parent / "statetable"), "serve", "--port", str(port)],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                seen[source] = {}
                pollers.append(threading.Thread(target=_poll, args=(port, seen[source], stop), daemon=True))
            for poller in pollers:
                poller.start()
            wait_until(lambda: all(0 in s for s in seen.values()), 120, what="both servers answering batch 0")
            log = BatchLog(rt.batch_dir(TABLE))
            for _ in range(args.batches):
                samples.produce(TABLE, rt.bootstrap, args.events_per_batch, suffix=suffix)
                jobs.run(TABLE, max_batches=1, spark=spark, rt=rt)
            last = log.last_commit().batch_id
            wait_until(lambda: all(last in s for s in seen.values()), 60, what="the last batch on both servers")
            committed = {c.batch_id: c.committed_at for c in log.commits() if c.batch_id > 0}
        finally:
            stop.set()
            for server in servers.values():
                server.terminate()
                server.wait(timeout=30)
            spark.stop()
    result = {"table": TABLE, "events_per_batch": args.events_per_batch, "batches": len(committed)}
    for source in ("writer", "replica"):
        # A batch never seen was overtaken by the next within one poll: not counted as visible.
        latencies = [seen[source][b] - at for b, at in committed.items() if b in seen[source]]
        result[source] = {**_summary(latencies), "missed_between_polls": len(committed) - len(latencies)}
    result["target_met"] = result["replica"].get("p99_ms", 1e9) <= 2000
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
