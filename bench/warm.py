"""Warm rows of `make bench`: the systems as deployed, after their engine's first job.

Two parts, on the same topic and reference as the cold rows:
  1. one local Spark session that has run a first job (bench/peers/warm_session.py): the raw read
     and the minimal pass (the floor), statetable's batch and Spark Structured Streaming;
  2. statetable as its DAGs run it: a client process of a Spark Connect server that warmed itself
     when it started (`stack up`, `restart-engine`), one batch of every event; then, after a
     restart, a table in 1M-record batches, whose first batch is set against the next. The same
     restart with the warm-up off shows what the warm-up saves.
Peak RSS counts the server's processes with the client's, per process group.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.compare import peers
from bench.compare.measure import run_peer
from bench.workload import compare


def _session_rows(bootstrap: str, topic: str, work: Path, reference: dict) -> tuple[list[dict], dict]:
    run = run_peer("warm session (raw read, minimal pass, statetable, Spark SS)",
                   [sys.executable, "-m", "bench.peers.warm_session", "--bootstrap", bootstrap, "--topic", topic,
                    "--out", work / "session"], work / "session", env={**peers.QUIET_SPARK, "STATETABLE_SPARK_REMOTE": "local"})
    result, rows = run.result, []
    events = result["events"]
    for system, seconds in result["seconds"].items():
        best = min(seconds)
        check = compare(f"warm {system}", result["counts"][system], reference) if system in result["counts"] else \
            {"differences": int(result["raw_read_records"] != events), "keys_expected": events}
        rows.append({"system": f"{system} (warm session)", "seconds": seconds, "processing_seconds": best,
                     "events_per_s": round(events / best), "check": check, "floor": system in ("raw read", "minimal pass")})
    shared = {"peak_rss_mb": run.peak_rss_mb, "rss_split_mb": run.rss_split_mb, "wall_seconds": run.wall_seconds,
              "first_job_seconds": result["first_job_seconds"], "batches": result["statetable_batches"]}
    return rows, shared


def _connect(settings, records: int) -> tuple[str, dict, dict]:
    """Start (or restart) the bench's own Connect server, warmed with `records`: the warm-up's line,
    a client's environment, and how long the server took to answer and to be up."""
    from deploy import connect_server
    from spark_jobs.engine import session
    from spark_jobs import warmup

    connect_server.stop(settings)
    os.environ[warmup.RECORDS_ENV] = str(records)
    started = time.perf_counter()
    connect_server.start(settings)
    connect_server.wait_healthy(settings)
    answered = time.perf_counter() - started
    line = connect_server.warm(settings)
    print(f"[connect] {line}", flush=True)
    env = {"STATETABLE_SPARK_REMOTE": settings.connect_url, session.TOKEN_ENV: connect_server.token(settings),
           **peers.QUIET_SPARK}     # the client's environment only: the token is never written to the results
    return line, env, {"answers_seconds": round(answered, 2), "up_seconds": round(time.perf_counter() - started, 2)}


def _client(name: str, settings, bootstrap: str, topic: str, work: Path, env: dict, *extra: str):
    from deploy import connect_server

    server = connect_server.process(settings).pid()
    return run_peer(name, peers.statetable(bootstrap, topic, work, work / "data", *extra), work, env=env,
                    also=[server] if server else [])


def _first_and_next(run) -> dict:
    batches = run.result["batches"]
    first, second = batches[0]["seconds"], batches[1]["seconds"] if len(batches) > 1 else None
    return {"system": run.name, "first_batch_seconds": first, "next_batch_seconds": second,
            "first_over_next": round(first / second, 2) if second else None,
            "cold_workers_first_batch": batches[0].get("cold_workers"),
            "batch_records": batches[0]["read"], "batch_seconds": [b["seconds"] for b in batches]}


def connect_rows(bootstrap: str, topic: str, work: Path, reference: dict, port: int) -> tuple[list[dict], list[dict]]:
    from catalog import settings as stack_settings
    from deploy import connect_server
    from spark_jobs import warmup

    os.environ["STATETABLE_SPARK_CONNECT_PORT"] = str(port)
    settings = stack_settings.load()
    events = sum(n for n, _ in reference.values())
    rows, first_batches = [], []
    try:
        # Twice, a fresh table each time, as the warm session runs each system: the best run is the
        # server's steady figure, the first also pays the server's first big job after its warm-up.
        line, env, server = _connect(settings, warmup.DEFAULT_RECORDS)
        runs = [_client(f"statetable (Connect server, warmed), table {i + 1}", settings, bootstrap, topic,
                        work / f"connect-{i}", env, "--batch", str(events), "--table", f"bench_connect_{i}")
                for i in range(2)]
        checks = [compare(run.name, run.result.pop("counts"), reference) for run in runs]
        best = min(runs, key=lambda run: run.result["processing_seconds"])
        rows.append({"system": "statetable (Connect server, warmed)",
                     "seconds": [run.result["processing_seconds"] for run in runs],
                     "processing_seconds": best.result["processing_seconds"],
                     "events_per_s": round(events / best.result["processing_seconds"]),
                     "wall_seconds": best.wall_seconds, "peak_rss_mb": max(run.peak_rss_mb for run in runs),
                     "rss_split_mb": max(runs, key=lambda run: run.peak_rss_mb).rss_split_mb,
                     "check": max(checks, key=lambda check: check["differences"]),
                     "warmup": line, "server": server, "batches": [run.result["batches"] for run in runs]})
        for warm_records, label in ((warmup.DEFAULT_RECORDS, "warmed"), (0, "not warmed")):
            line, env, server = _connect(settings, warm_records)
            run = _client(f"statetable, 1M-record batches after a restart ({label})", settings, bootstrap, topic,
                          work / f"restart-{warm_records}", env, "--batch", "1000000",
                          "--table", f"bench_restart_{warm_records}")
            check = compare(run.name, run.result.pop("counts"), reference)
            first_batches.append({**_first_and_next(run), "warmup": line, "server": server, "check": check,
                                  "peak_rss_mb": run.peak_rss_mb, "rss_split_mb": run.rss_split_mb})
    finally:
        connect_server.stop(settings)
        os.environ.pop(warmup.RECORDS_ENV, None)
    return rows, first_batches


def warm_rows(bootstrap: str, topic: str, work: Path, reference: dict, port: int) -> dict:
    session_rows, session = _session_rows(bootstrap, topic, work, reference)
    connect, first_batches = connect_rows(bootstrap, topic, work, reference, port)
    return {"rows": session_rows + connect, "session": session, "first_batches": first_batches}
