"""How many tables one local stack runs at `*/5`: orchestration cost grows with tables, not data.

A private stack (Kafka, the Spark Connect server, Airflow on PostgreSQL with the LocalExecutor
sized from the machine) gets N copies of the payments table. Each wave produces --events new
records into every table's topic, then runs every table's `__incremental` DAG once, and is
timed from the first trigger to the last run's end (the records are produced before the
clock starts). Two shapes of wave:

  - `together`: all N runs triggered in the same second: what N unspread `*/5` crons did;
  - `spread`: the runs in the groups their spread crons fire in (`k-59/5`: one group a
    minute), each group timed alone; the wave's cost is its slowest group.

Every run is checked: success, and the stats its task returned say it read what was produced
and left lag 0. Prints one JSON object: per wave, seconds, each run's queue wait (run created
to task start) and task time; and `max_tables_within_interval`: the largest N whose
`together` wave fits in the 300 s interval, extrapolated from the measured per-table cost of
the largest N measured (stated as such).

    .venv/bin/python -m bench.tables_per_stack [--tables 20 40] [--waves 3] [--events 10000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import zlib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

INTERVAL_S = 300
TABLE_SQL = """-- topic: {topic}
-- schema: customer_id STRING, amount DOUBLE, payment_ts TIMESTAMP
-- partitions: 4
-- schedule: */5 * * * *
CREATE TABLE {table} AS
SELECT customer_id, COUNT(amount) AS payments, SUM(amount) AS total, MAX(amount) AS largest
FROM {topic}
GROUP BY customer_id;
"""


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, nargs="+", default=[100])
    parser.add_argument("--waves", type=int, default=12, help="waves per table count (the first warms up)")
    parser.add_argument("--shapes", nargs="+", default=["together", "spread"], choices=["together", "spread"])
    parser.add_argument("--spread-waves", type=int, help="run the spread shape in the first N waves only")
    parser.add_argument("--out", help="also write the JSON here (and a plot beside it, .png)")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--port", type=int, default=25092)
    parser.add_argument("--celery-workers", type=int, default=0,
                        help="run the tasks on N Celery workers (the stack's CeleryExecutor) instead of LocalExecutor")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="statetable-bench-tables-"))
    tables_dir = root / "tables"
    tables_dir.mkdir()
    os.environ.update({
        "STATETABLE_STACK_DIR": str(root / "stack"), "STATETABLE_TABLES_DIR": str(tables_dir),
        "STATETABLE_KAFKA_PORT": str(args.port), "STATETABLE_KAFKA_CONTROLLER_PORT": str(args.port + 1),
        "STATETABLE_AIRFLOW_PORT": str(args.port - 12), "STATETABLE_SPARK_CONNECT_PORT": str(args.port - 90),
        "STATETABLE_POSTGRES_PORT": str(args.port - 60), "STATETABLE_BATCH_PORT": str(args.port - 14),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",     # the waves below are the schedule
    })
    if args.celery_workers:
        os.environ["STATETABLE_AIRFLOW_EXECUTOR"] = "celery"
    from catalog import settings
    from deploy import airflow_server, connect_server, kafka_server, samples
    from deploy.airflow_api import AirflowApi
    from state.kafka_admin import ensure_topic

    cfg = settings.load()
    out: dict = {"events_per_table_per_wave": args.events, "cores": os.cpu_count(),
                 "executor_parallelism": airflow_server.parallelism(), "waves": []}
    names = [f"pay_{i:03d}" for i in range(max(args.tables))]
    kafka_server.start(cfg)
    connect_server.start(cfg)
    try:
        kafka_server.wait_healthy(cfg)
        connect_server.wait_healthy(cfg)
        print(connect_server.warm(cfg), flush=True)
        for name in names:
            ensure_topic(cfg.kafka_bootstrap, name, 4)
        airflow_server.start(cfg)
        extra_workers = _more_celery_workers(cfg, args.celery_workers - 1)
        airflow_server.wait_healthy(cfg)
        out["celery_workers"] = args.celery_workers
        api = AirflowApi(cfg)
        active: list[str] = []
        for count in sorted(args.tables):
            for name in names[len(active):count]:
                (tables_dir / f"{name}.sql").write_text(TABLE_SQL.format(table=name, topic=name))
            active = names[:count]
            groups = _minute_groups(api, active)
            out.setdefault("minute_groups", {})[count] = {m: len(g) for m, g in sorted(groups.items())}
            for wave in range(args.waves):
                for shape, batches in (("together", [active]), ("spread", list(groups.values()))):
                    if shape not in args.shapes or shape == "spread" and args.spread_waves is not None \
                            and wave >= args.spread_waves:
                        continue
                    result = {"tables": count, "wave": wave, "shape": shape, "groups": [],
                              "machine": {"calibration_ms": _calibration()}}
                    cpu: dict = defaultdict(float)
                    machine: dict = defaultdict(float)
                    for group in batches:
                        with ThreadPoolExecutor(8) as pool:
                            list(pool.map(lambda n: samples.produce_payments(cfg.kafka_bootstrap, n, args.events,
                                                                             zlib.crc32(f"{n}{wave}".encode())),
                                          group))
                        split, ticks, jvm = CpuSplit(), _machine_ticks(), _connect_jvm()   # the runs', not the producer's
                        result["groups"].append(_wave(api, group, args.events))
                        for kind, seconds in split.done().items():
                            cpu[kind] += seconds
                        for state, seconds in _machine_delta(ticks, _machine_ticks()).items():
                            machine[state] += seconds
                        for part, seconds in _connect_jvm().items():
                            machine[f"connect_{part}"] += seconds - jvm.get(part, 0.0)
                    result["seconds"] = max(g["seconds"] for g in result["groups"])
                    result["machine"]["cpu_s"] = {k: round(v, 1) for k, v in machine.items()}
                    result["cpu_s"] = {k: round(v, 1) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
                    result["phases_median_s"] = _phase_medians([r for g in result["groups"]
                                                                for r in g["runs"].values()])
                    out["waves"].append(result)
                    print(json.dumps({k: v for k, v in result.items() if k != "groups"}
                                     | {"runs": sum(len(g["runs"]) for g in result["groups"])}), flush=True)
        measured = [w for w in out["waves"] if w["shape"] == "together" and w["wave"] > 0]
        largest = max(w["tables"] for w in measured)
        per_table = statistics.median(w["seconds"] for w in measured if w["tables"] == largest) / largest
        out["together_wave_median_s"] = {n: statistics.median(w["seconds"] for w in measured if w["tables"] == n)
                                         for n in sorted(args.tables)}
        out["spread_wave_median_s"] = {
            n: statistics.median(spread) for n in sorted(args.tables)
            if (spread := [w["seconds"] for w in out["waves"] if w["shape"] == "spread" and w["wave"] > 0
                           and w["tables"] == n])}
        out["seconds_per_table_at_largest"] = round(per_table, 2)
        out["trend"] = _trend(out["waves"])
        out["exact"] = _check_exact(cfg, active, deep=3)
        out["max_tables_within_interval"] = {"together": int(INTERVAL_S / per_table),
                                             "how": f"300 s / the per-table cost of a together wave at "
                                                    f"{largest} tables (extrapolated beyond {largest})"}
    finally:
        for worker in locals().get("extra_workers", []):
            worker.stop(timeout=15)
        airflow_server.stop(cfg)
        connect_server.stop(cfg)
        kafka_server.process(cfg).stop(timeout=25)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1, default=str))
    if args.out:           # each run's figures stay in the printed JSON; the file keeps each group's medians
        kept = {**out, "waves": [{**w, "groups": [{k: v for k, v in g.items() if k != "runs"} for g in w["groups"]]}
                                 for w in out["waves"]]}
        Path(args.out).write_text(json.dumps(kept, indent=1, default=str) + "\n")
        _plot(out, Path(args.out).with_suffix(".png"))


def _check_exact(cfg, names: list[str], deep: int) -> dict:
    """Every table against its topic once the waves are done: its payments summed over its keys
    equal the records in its topic (its partitions' offsets); and for `deep` tables every key's
    count, sum and max equal pandas over the topic read back with a plain consumer. Neither side
    uses the product's code to compute the expected rows."""
    import math

    import pandas as pd
    from confluent_kafka import Consumer, TopicPartition

    from catalog.registry import state_rows
    from catalog.runtime import Runtime

    rt = Runtime.from_env()
    consumer = Consumer({"bootstrap.servers": cfg.kafka_bootstrap, "group.id": "bench-exact",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    counted_all = 0
    try:
        for name in names:
            state = state_rows(name, rt)
            parts = consumer.list_topics(name, timeout=10).topics[name].partitions
            records = sum(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in parts)
            counted = sum(row[0] for row in state.values())
            assert counted == records, f"{name}: its state counts {counted} payments, its topic holds {records}"
            counted_all += counted
        for name in names[:deep]:
            parts = consumer.list_topics(name, timeout=10).topics[name].partitions
            consumer.assign([TopicPartition(name, p, 0) for p in parts])
            rows, ended = [], set()
            while len(ended) < len(parts):
                message = consumer.poll(10)
                assert message is not None, f"{name}: the topic stopped answering while read back"
                if message.error():
                    ended.add(message.partition())
                    continue
                rows.append(json.loads(message.value()))
            expected = pd.DataFrame(rows).groupby("customer_id")["amount"].agg(["count", "sum", "max"])
            state = {key[0]: value for key, value in state_rows(name, rt).items()}
            assert set(state) == set(expected.index), f"{name}: keys differ from its topic's"
            for customer, (count, total, largest) in state.items():
                row = expected.loc[customer]
                assert count == row["count"] and largest == row["max"] and math.isclose(total, row["sum"],
                                                                                          rel_tol=1e-9), \
                    (name, customer, (count, total, largest), tuple(row))
    finally:
        consumer.close()
    return {"tables_counted": len(names), "tables_recomputed_with_pandas": min(deep, len(names)),
            "records": counted_all}


def _more_celery_workers(cfg, count: int) -> list:
    """Celery workers beyond the stack's one, each its own process and Celery node name, as
    another machine's worker would be (here they share this machine's cores)."""
    from deploy import airflow_server
    from deploy.processes import ManagedProcess

    workers = []
    for n in range(2, count + 2):
        worker = ManagedProcess(f"airflow-celery-worker-{n}", cfg.airflow_home)
        worker.start([str(airflow_server.VENV_BIN / "airflow"), "celery", "worker", "--skip-serve-logs",
                      "--celery-hostname", f"worker{n}@%h"], env=airflow_server.airflow_env(cfg),
                     cwd=cfg.airflow_home)
        workers.append(worker)
    return workers


def _minute_groups(api, names: list[str]) -> dict[str, list[str]]:
    """The tables by the minute their deployed `*/5` cron fires, as Airflow's REST API shows the
    schedule: read until two reads a parse interval apart agree, since a parse that ran while the
    table files were being written saw fewer tables to spread over."""
    for name in names:
        api.wait_for_dag(f"{name}__incremental", timeout=900)
    before = None
    while True:
        schedules = {n: api.wait_for_dag(f"{n}__incremental")["timetable_summary"] for n in names}
        if schedules == before:
            break
        before = schedules
        time.sleep(35)
    groups = defaultdict(list)
    for name, cron in schedules.items():
        groups[cron.split()[0]].append(name)
    print(json.dumps({"minute_groups": {m: len(g) for m, g in sorted(groups.items())}}), flush=True)
    return groups


def _wait_all(api, runs: dict[str, str], since: float, timeout: float = 3600) -> dict[str, dict]:
    """Each table's run once it ended, from one listing of every DAG's runs each 2 s: the
    observer asking after each run in turn made ~400 API calls a wave, CPU the API server
    then took from the runs it measured."""
    from datetime import timezone

    from deploy.airflow_api import TERMINAL_RUN_STATES

    wanted = {(f"{name}__incremental", run_id): name for name, run_id in runs.items()}
    iso = datetime.fromtimestamp(since - 1, timezone.utc).isoformat()
    ended: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < len(wanted):
        for run in api.runs_after(iso):
            name = wanted.get((run["dag_id"], run["dag_run_id"]))
            if name is not None and run["state"] in TERMINAL_RUN_STATES:
                ended[name] = run
        if len(ended) < len(wanted):
            assert time.monotonic() < deadline, f"runs not ended after {timeout:.0f} s: {sorted(set(runs) - set(ended))}"
            time.sleep(2)
    return ended


def _wave(api, group: list[str], events: int) -> dict:
    started = time.time()
    runs = {name: api.trigger(f"{name}__incremental") for name in group}
    ended = _wait_all(api, runs, started)
    outcome = {}
    for name, run_id in runs.items():      # the details once every run ended: the wave's seconds are its runs' own
        run = ended[name]
        ti = api.task_instances(f"{name}__incremental", run_id)["run_batches"]
        stats = api.xcom(f"{name}__incremental", run_id, "run_batches") if ti["state"] == "success" else {}
        assert run["state"] == "success" and stats.get("lag") == 0 and stats.get("read", 0) >= events, \
            (name, run["state"], stats, api.failed_logs(f"{name}__incremental", run_id))
        outcome[name] = {"queued_s": round(_stamp(ti["start_date"]) - _stamp(run["queued_at"] or run["start_date"]), 2),
                         "task_s": round(_stamp(ti["end_date"]) - _stamp(ti["start_date"]), 2),
                         "end": _stamp(run["end_date"]), **_phases(ti, stats.get("phases"))}
    seconds = max(r["end"] for r in outcome.values()) - started
    return {"seconds": round(seconds, 1), "runs": {n: {k: v for k, v in r.items() if k != "end"}
                                                  for n, r in outcome.items()},
            "median_task_s": statistics.median(r["task_s"] for r in outcome.values()),
            "median_queued_s": statistics.median(r["queued_s"] for r in outcome.values())}


PHASES = ("queued_s", "to_process_s", "process_to_execute", "service_queue", "service_run", "lag_check", "session",
          "batches", "snapshot", "lag_after", "run", "stats", "after_return_s", "task_s")


def _phases(ti: dict, phases: dict | None) -> dict:
    """A run's seconds from its task instance's stamps and the phases its task returned
    (statetable_airflow.operators.RunPhases): queued for a slot, the executor starting the task
    process, the process parsing the DAG file and importing (to `execute`), the operator's steps,
    and Airflow's way out (XCom, Asset events, the state update) after `execute` returned."""
    if not phases:
        return {}
    out = {k: phases[k] for k in PHASES if k in phases}
    if "process_started" in phases:         # a task process ran it (else the run ended in the triggerer)
        out["to_process_s"] = round(phases["process_started"] - _stamp(ti["start_date"]), 2)
        out["after_return_s"] = round(_stamp(ti["end_date"]) - phases["returned_at"], 2)
    return out


def _calibration() -> dict:
    """A fixed workload's milliseconds, timed before each wave on a quiet stack: the machine's
    own speed that wave (a neighbour on the host, a slower CPU), so that a wave's growth can be
    told from the code's. CPU ms of a pure-Python loop and of hashing 64 MB in C, and their wall ms."""
    import hashlib

    def timed(name: str, work) -> dict:
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        return {f"{name}_cpu": round((time.process_time() - cpu) * 1000),
                f"{name}_wall": round((time.perf_counter() - wall) * 1000)}

    data = b"x" * (64 << 20)
    return {**timed("python", lambda: sum(i * i % 7 for i in range(2_000_000))),
            **timed("sha256", lambda: hashlib.sha256(data).hexdigest())}


MACHINE_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _machine_ticks() -> list[int]:
    """The machine's CPU ticks since boot by state (/proc/stat's first line)."""
    with open("/proc/stat") as stat:
        return [int(v) for v in stat.readline().split()[1:1 + len(MACHINE_FIELDS)]]


def _machine_delta(before: list[int], after: list[int]) -> dict:
    """CPU seconds of every core over a wave by state; `steal` is time the host gave to others."""
    hz = os.sysconf("SC_CLK_TCK")
    return {f: round((a - b) / hz, 1) for f, a, b in zip(MACHINE_FIELDS, after, before)}


def _connect_jvm() -> dict:
    """The Spark Connect server JVM's seconds so far in garbage collection (all collectors) and in
    JIT compiling, from jstat: its CPU per wave fell by half over 12 waves (55 -> 30 CPU s), and
    these two tell a JVM still warming up from the work itself. Empty where jstat cannot say."""
    import subprocess

    from bench.suite_cpu import _processes

    pids = [pid for (pid, _), (kind, _, cmd) in _processes().items()
            if kind == "spark-connect server" and cmd.split()[0].endswith("java")]
    if not pids:
        return {}
    out = {}
    for option, column, name in (("-gcutil", "GCT", "gc_s"), ("-compiler", "Time", "jit_s")):
        try:
            header, values = subprocess.run(["jstat", option, str(pids[0])], capture_output=True, text=True,
                                            timeout=10).stdout.split("\n")[:2]
            out[name] = float(values.split()[header.split().index(column)])
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
    return out


def _phase_medians(runs: list[dict]) -> dict:
    return {p: round(statistics.median(r[p] for r in runs if p in r), 2) for p in PHASES if any(p in r for r in runs)}


def _trend(waves: list[dict]) -> dict:
    """Wave over wave: the last three `together` waves against waves 2-4 (1-based; the first warms
    up), per table count; a ratio over 1.1 is growth the acceptance refuses."""
    out = {}
    for count in sorted({w["tables"] for w in waves}):
        seconds = [w["seconds"] for w in waves if w["tables"] == count and w["shape"] == "together"]
        if len(seconds) >= 5:
            early, late = statistics.mean(seconds[1:4]), statistics.mean(seconds[-3:])
            out[count] = {"together_waves_s": seconds, "waves_2_4_mean_s": round(early, 1),
                          "last_3_mean_s": round(late, 1), "ratio": round(late / early, 3)}
    return out


class CpuSplit:
    """CPU seconds per kind of process (Airflow's parts, the Connect server and its Python workers,
    Kafka, PostgreSQL) over a wave, sampled from /proc every half second in a thread: a task
    process lives seconds, so few of its seconds are missed."""

    def __init__(self, every: float = 0.5) -> None:
        import threading

        from bench.suite_cpu import _processes

        self._read = _processes
        self.first = {k: v[1] for k, v in self._read().items()}
        self.seen: dict = {}
        self.kinds: dict = {}           # a process's kind when first seen: an exiting one has no command line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), daemon=True)
        self._thread.start()

    def _loop(self, every: float) -> None:
        while not self._stop.wait(every):
            self._sample()

    def _sample(self) -> None:
        for key, (kind, cpu, _) in self._read().items():
            self.seen[key] = (self.kinds.setdefault(key, kind), cpu)

    def done(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._sample()
        used: dict = defaultdict(float)
        for key, (kind, cpu) in self.seen.items():
            used[kind] += cpu - self.first.get(key, 0.0)
        return {k: round(v, 1) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def _plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for count in sorted({w["tables"] for w in out["waves"]}):
        for shape, style in (("together", "o-"), ("spread", "s--")):
            waves = [w for w in out["waves"] if w["tables"] == count and w["shape"] == shape]
            if waves:
                ax.plot([w["wave"] + 1 for w in waves], [w["seconds"] for w in waves], style,
                        label=f"{count} tables, {shape}" + (" (slowest minute group)" if shape == "spread" else ""))
    ax.axhline(60, color="grey", lw=0.8, ls=":")
    ax.axhline(20, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("wave")
    ax.set_ylabel("seconds")
    ax.set_title(f"Tables per stack: {out['cores']} cores, {out['events_per_table_per_wave']:,} events per table per wave")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
