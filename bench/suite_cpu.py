"""Where a test run's CPU goes (#44: `make test` in 35 minutes on 2 cores), by kind of process.

Samples every process's CPU time from /proc while a command runs (every --every seconds; a
process that lives less than that is missed) and prints JSON: the machine's busy share, and the
CPU seconds of each kind of process (the Spark Connect servers, Kafka brokers, Airflow's
components, pytest's workers, `statetable` job processes, ...). When the machine is busy most of
the time, a run is bound by this CPU work, not by waiting, and running tests side by side
cannot make it shorter.

    .venv/bin/python -m bench.suite_cpu [--every 5] -- make test
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
KINDS = (                       # first match wins: (kind, substring of the command line)
    ("spark-connect server", "SparkConnectServer"),
    ("spark driver JVMs of jobs (CLI, spark-submit)", "org.apache.spark.deploy.SparkSubmit"),
    ("spark driver JVMs of jobs (CLI, spark-submit)", "pyspark-shell"),
    ("spark standalone master and workers", "org.apache.spark.deploy"),
    ("spark executors", "CoarseGrainedExecutorBackend"),
    ("kafka broker", "kafka.Kafka"),
    ("airflow scheduler", "airflow scheduler"),
    ("airflow dag-processor", "airflow dag-processor"),
    ("airflow triggerer", "airflow triggerer"),
    ("airflow api-server", "api_server"),
    ("airflow api-server", "airflow api-server"),
    ("airflow task", "airflow task"),
    ("airflow task", "supervisor"),
    ("postgres", "postgres: "),            # its backends' titles name the database, "airflow"
    ("airflow (other)", "airflow"),
    ("postgres", "postgres"),
    ("object store (moto)", "moto"),
    ("statetable batch service", "ops.batch_service"),
    ("pyspark python workers", "pyspark.daemon"),
    ("pyspark python workers", "worker_daemon"),
    ("pytest workers", "pytest"),
    ("pytest workers", "exec(eval(sys.stdin.readline()))"),     # xdist's workers, as execnet starts them
    ("statetable CLI and jobs", "statetable"),
    ("uv and installs", "uv "),
    ("uv and installs", "compileall"),
    ("maven", "maven"),
    ("chromium", "chrom"),
    ("other java", "java"),
    ("other python", "python"),
)


def _kind(cmdline: str) -> str:
    for kind, marker in KINDS:
        if marker in cmdline:
            return kind
    return "other" if cmdline.strip() else "kernel threads and unnamed"


IN_PROCESS = "spark driver JVMs of long-lived local sessions (pytest's `spark` fixture)"


def _processes() -> dict[tuple[int, str], tuple[str, float, str]]:
    """(pid, start time) -> (kind, CPU seconds so far, command line). A driver
    JVM whose parent is not a `statetable` command or spark-submit is a long-lived session (a
    pytest worker's), apart from the short-lived drivers of jobs a test starts."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry.name)] = (fields, cmdline)
    out = {}
    for pid, (fields, cmdline) in found.items():
        kind = _kind(cmdline)
        parent = found.get(int(fields[1]), ((), ""))[1]
        if kind.startswith("spark driver JVMs") and not any(m in parent for m in ("statetable", "spark-submit")):
            kind = IN_PROCESS
        cpu = sum(int(f) for f in fields[11:13]) / TICKS        # utime, stime
        out[(pid, fields[19])] = (kind, cpu, cmdline)
    return out


def cpu_by_kind(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each kind of process used between two `_processes()` readings (a process that
    started in between counts from zero): the one reading of them the benchmarks share."""
    used: dict[str, float] = defaultdict(float)
    for key, (kind, cpu, _) in after.items():
        used[kind] += cpu - before.get(key, (kind, 0.0, ""))[1]
    return dict(used)


def _command(cmdline: str, width: int = 140) -> str:
    """A command line shortened to what tells one process of a kind from another: no temporary
    folders' names, no port numbers, no classpath."""
    words = [w for w in cmdline.split() if not w.startswith(("-cp", "/tmp/pytest")) and len(w) < 200]
    return re.sub(r"\d{3,}", "N", " ".join(words))[:width]


def jvm_threads(brokers: bool = True) -> dict[tuple[str, str], tuple[str, str, float]]:
    """(pid, tid) -> (command line, thread name with digits folded, CPU seconds) of every JVM's
    threads: whether a JVM's CPU is its work, its JIT compilers or its collector."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "java" not in cmdline.split(" ", 1)[0] or (not brokers and "kafka.Kafka" in cmdline):
                continue
            for task in (proc / "task").iterdir():
                stat = (task / "stat").read_text()
                name = re.sub(r"\d+", "#", stat[stat.index("(") + 1:stat.rindex(")")])
                fields = stat.rsplit(")", 1)[1].split()
                out[(proc.name, task.name)] = (cmdline, name, (int(fields[11]) + int(fields[12])) / TICKS)
        except OSError:
            continue
    return out


def _busy() -> tuple[int, int]:
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


CORE_LOOPS = 10_000_000


def core_seconds() -> float:
    """Seconds one core takes for a fixed loop of Python additions, the best of three, before and
    after the run. The same suite took 4,374 CPU s on one day and 10,292 on another of the same
    2-core machine: the host's speed moves, and a run's figures are read beside this one."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(CORE_LOOPS):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=0, help="also the K command lines of most CPU, per kind")
    parser.add_argument("--threads", action="store_true", help="also the JVMs' CPU by kind and thread name")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    speed_before = core_seconds()
    before = _processes()              # what ran before the command counts from here on
    seen: dict[tuple[int, str], tuple[str, float, str]] = {}
    threads0 = jvm_threads() if args.threads else {}
    threads: dict[tuple[str, str], tuple[str, str, float]] = {}
    busy0, total0 = _busy()
    started = time.monotonic()
    job = subprocess.Popen(args.command)
    while job.poll() is None:
        for key, (kind, cpu, cmdline) in _processes().items():       # an exiting process has no command line
            seen[key] = (seen[key][0], cpu, seen[key][2]) if key in seen else (kind, cpu, cmdline)
        if args.threads:
            threads.update(jvm_threads())
        time.sleep(args.every)
    busy1, total1 = _busy()
    wall = round(time.monotonic() - started)
    speed_after = core_seconds()
    by_kind: dict[str, float] = defaultdict(float)
    by_command: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (kind, cpu, cmdline) in seen.items():
        used = cpu - before.get(key, (kind, 0.0, ""))[1]
        by_kind[kind] += used
        by_command[kind][_command(cmdline)] += used
    top = {kind: {c: round(v) for c, v in sorted(cmds.items(), key=lambda kv: -kv[1])[:args.top]}
           for kind, cmds in by_command.items() if args.top}
    by_thread: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (cmdline, name, cpu) in threads.items():
        by_thread[_kind(cmdline)][name] += cpu - threads0.get(key, ("", "", 0.0))[2]
    thread_cpu = {kind: {n: round(v, 1) for n, v in sorted(names.items(), key=lambda kv: -kv[1]) if v >= 1}
                  for kind, names in by_thread.items()}
    print(json.dumps({"command": args.command, "exit": job.returncode,
                      "wall_seconds": wall, "cores": os.cpu_count(),
                      "core_seconds_for_10M_additions": {"before": speed_before, "after": speed_after},
                      "busy_share": round((busy1 - busy0) / max(total1 - total0, 1), 3),
                      "cpu_seconds_by_kind": {k: round(v) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
                      "cpu_seconds_seen": round(sum(by_kind.values())),
                      **({"top_commands_by_kind": top} if top else {}),
                      **({"jvm_cpu_seconds_by_thread": thread_cpu} if args.threads else {})}, indent=1))
    raise SystemExit(job.returncode)


if __name__ == "__main__":
    main()
