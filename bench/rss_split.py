"""Where statetable's peak RSS is: the JVM, the Python workers, the driver's Python.

`make bench` reports one number per system, the largest sum of RSS over its process tree. This
runs the statetable peer on the same workload (one batch of --events events over 10k keys) with
the default driver heap and smaller ones, samples every process every 100 ms, and prints, for
each setting, the split at the peak. Prints JSON.

    .venv/bin/python -m bench.rss_split [--events 5000000] [--port 29592]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

SETTINGS = [
    {"STATETABLE_SPARK_DRIVER_MEMORY": "1g"},
    {"STATETABLE_SPARK_DRIVER_MEMORY": "512m"},
    {"STATETABLE_SPARK_DRIVER_MEMORY": "512m", "STATETABLE_ARROW_BATCH_RECORDS": "50000"},
]


def peak_split(cmd: list[str], env: dict) -> dict:
    from bench.compare.measure import rss_by_group

    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    root = psutil.Process(child.pid)
    peak, split = 0, {}
    while child.poll() is None:
        parts = rss_by_group([root])
        if sum(parts.values()) > peak:
            peak, split = sum(parts.values()), parts
        time.sleep(0.1)
    if child.returncode:
        raise SystemExit(f"{cmd}: exit {child.returncode}")
    return {"peak_mb": round(peak / 2**20), **{k: round(v / 2**20) for k, v in sorted(split.items())}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--port", type=int, default=29592)
    args = parser.parse_args()

    from bench.broker import private_broker
    from bench.compare import peers
    from bench.workload import produce_random

    work = Path(tempfile.mkdtemp(prefix="rss-split-"))
    rows = []
    with private_broker(args.port) as cfg:
        bootstrap = f"127.0.0.1:{cfg.kafka_port}"
        produce_random(bootstrap, "rss", args.events, 10_000)
        for i, setting in enumerate(SETTINGS):
            out = work / f"run{i}"
            cmd = peers.statetable(bootstrap, "rss", out, out / "data", "--batch", str(args.events),
                                   "--table", f"rss_{i}")
            out.mkdir(parents=True)
            split = peak_split([str(c) for c in cmd], {**os.environ, **peers.QUIET_SPARK, **setting})
            result = json.loads((out / "result.json").read_text())
            rows.append({"setting": setting, **split, "processing_seconds": result["processing_seconds"]})
    print(json.dumps({"events": args.events, "keys": 10_000, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
