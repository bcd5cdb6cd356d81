"""#44's directions for a 35-minute suite, each measured alone on an idle machine: what they save
in CPU, which is what a suite already ~96% busy on 2 cores is bound by (bench/suite_cpu.py).

  - `cases`: ksqlDB conformance cases (tests/test_ksqldb_conformance.py) one after another, or
    `--side-by-side N` in one session (N threads), after `--warm` cases; prints the machine's
    CPU, the Spark jobs per case and the session JVM's CPU by thread (JIT compiler, py4j driver
    threads, executor tasks), so a `--jvm-options` variant shows where it moves the CPU;
  - `kills`: two tables, each crashed at three local fault points, one loop after the other or
    side by side.

It starts a broker of its own on ports 29592-29593 (cases) or 29692-29693 (kills) and stops it.

    .venv/bin/python -m bench.suite_directions cases [--cases 16] [--warm 12] [--side-by-side 3] \
        [--jvm-options "-XX:Tier4InvocationThreshold=50000 ..."]
    .venv/bin/python -m bench.suite_directions kills [--side-by-side]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import suite_cpu

TICKS = os.sysconf("SC_CLK_TCK")
KILL_POINTS = ("batch.after_plan", "batch.mid_merge", "batch.after_commit")


def _busy_seconds() -> float:
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS          # all but idle and iowait


def _jvm_threads() -> dict[tuple[str, str], float]:
    """CPU seconds of every thread of every non-broker JVM, by (tid, name with digits folded)."""
    return {(tid, name): cpu for (_, tid), (_, name, cpu) in suite_cpu.jvm_threads(brokers=False).items()}


def _broker(kafka_port: int):
    os.environ.update({"STATETABLE_STACK_DIR": tempfile.mkdtemp(prefix="suite-directions-"),
                       "STATETABLE_KAFKA_PORT": str(kafka_port), "STATETABLE_KAFKA_CONTROLLER_PORT": str(kafka_port + 1),
                       "STATETABLE_SPARK_REMOTE": "local",
                       "STATETABLE_SERVER_JVM_OPTIONS": "-XX:TieredStopAtLevel=1"})
    from catalog import settings
    from deploy import kafka_server

    cfg = settings.load()
    kafka_server.start(cfg)
    kafka_server.wait_healthy(cfg)
    return cfg, kafka_server.process(cfg)


def cases(args) -> dict:
    if args.jvm_options:
        os.environ["STATETABLE_JOB_JVM_OPTIONS"] = args.jvm_options
    cfg, broker = _broker(29592)
    try:
        from spark_jobs.engine import session
        from tests import test_ksqldb_conformance as conformance
        from tests.table_env import isolated_runtime

        spark = session.get_or_create("suite-directions")
        rt, suffix = isolated_runtime(cfg.kafka_bootstrap, Path(tempfile.mkdtemp()))

        def run_case(numbered) -> list[dict]:
            return conformance.run_case(rt, suffix, spark, *numbered)

        for numbered in conformance.RUNNABLE[:args.warm]:
            run_case(numbered)
        chosen = conformance.RUNNABLE[args.warm:args.warm + args.cases]
        scheduler = spark.sparkContext._jsc.sc().dagScheduler()
        jobs0, threads0, busy0, started = scheduler.numTotalJobs(), _jvm_threads(), _busy_seconds(), time.monotonic()
        with ThreadPoolExecutor(max(1, args.side_by_side)) as pool:       # one thread: one after another
            list(pool.map(run_case, chosen))
        wall, busy = time.monotonic() - started, _busy_seconds() - busy0
        by_thread: dict[str, float] = {}
        for (tid, name), cpu in _jvm_threads().items():
            by_thread[name] = by_thread.get(name, 0.0) + cpu - threads0.get((tid, name), 0.0)
        return {"direction": "cases", "cases": len(chosen), "warm": args.warm, "side_by_side": args.side_by_side,
                "jvm_options": args.jvm_options, "wall_s": round(wall, 1), "machine_cpu_s": round(busy, 1),
                "spark_jobs_per_case": round((scheduler.numTotalJobs() - jobs0) / len(chosen), 2),
                "session_jvm_cpu_s": round(sum(by_thread.values()), 1),
                "session_jvm_cpu_s_by_thread": {k: round(v, 1) for k, v in
                                                sorted(by_thread.items(), key=lambda kv: -kv[1])[:8]}}
    finally:
        broker.stop(timeout=25)


def kills(args) -> dict:
    os.environ.setdefault("STATETABLE_JOB_JVM_OPTIONS", "-XX:TieredStopAtLevel=1")     # as the suite's jobs
    cfg, broker = _broker(29692)
    try:
        from deploy import samples
        from tests import test_exactly_once as eo
        from tests.table_env import isolated_runtime

        runtimes = []
        for _ in range(2):
            rt, suffix = isolated_runtime(cfg.kafka_bootstrap, Path(tempfile.mkdtemp()))
            samples.produce(eo.TABLE, rt.bootstrap, args.events, suffix=suffix)
            runtimes.append(rt)

        def loop(rt) -> None:
            """As tests/test_exactly_once.py crashes a local session, one point after another."""
            for point in KILL_POINTS:
                job = eo.start_job(rt, point, max_batches=2)
                _, err = job.communicate(timeout=600)
                if job.returncode != -signal.SIGKILL:
                    raise SystemExit(f"{point}: exit {job.returncode}\n{err[-2000:]}")
                eo.wait_session_gone(job.pid)

        busy0, started = _busy_seconds(), time.monotonic()
        with ThreadPoolExecutor(2 if args.side_by_side else 1) as pool:
            list(pool.map(loop, runtimes))
        return {"direction": "kills", "loops": 2, "points_each": len(KILL_POINTS), "side_by_side": args.side_by_side,
                "wall_s": round(time.monotonic() - started, 1), "machine_cpu_s": round(_busy_seconds() - busy0, 1)}
    finally:
        broker.stop(timeout=25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    case_args = sub.add_parser("cases")
    case_args.add_argument("--cases", type=int, default=16)
    case_args.add_argument("--warm", type=int, default=12)
    case_args.add_argument("--side-by-side", type=int, default=1)
    case_args.add_argument("--jvm-options", default="")
    kill_args = sub.add_parser("kills")
    kill_args.add_argument("--side-by-side", action="store_true")
    kill_args.add_argument("--events", type=int, default=20000)
    args = parser.parse_args()
    print(json.dumps((cases if args.direction == "cases" else kills)(args), indent=1))


if __name__ == "__main__":
    main()
