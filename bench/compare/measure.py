"""Run one peer as a child process and measure it from outside: wall time and peak RSS.

Peak RSS is the largest sum over the whole process tree (a PyFlink or PySpark
driver starts a JVM, Spark starts Python workers), sampled every 100 ms.
The peer's own result.json says how long processing took without its start.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


class PeerTimeout(RuntimeError):
    """A peer ran past its time and was killed: a lower bound on its seconds, not a failure of
    the run (a bench that waits an hour for a query a peer cannot finish measures nothing more)."""

    def __init__(self, name: str, seconds: float, log: Path):
        super().__init__(f"{name}: no result after {seconds:.0f}s; log: {log}")
        self.seconds = seconds


@dataclass
class PeerRun:
    name: str
    wall_seconds: float
    peak_rss_mb: float
    result: dict = field(repr=False)
    log: Path = field(repr=False)
    rss_split_mb: dict = field(default_factory=dict)     # at the peak: MB per process group


def process_group(process: psutil.Process) -> str:
    """Which of a run's process groups `process` is: a JVM (Spark's driver and executors, Flink's),
    a PySpark Python worker (its daemon and the workers forked from it), or a driver-side Python."""
    if "java" in process.name():
        return "jvm"
    command = " ".join(process.cmdline())
    return "python_workers" if "pyspark.daemon" in command or "worker_daemon" in command or \
        "pyspark/worker" in command else "driver_python"


def rss_by_group(roots: list[psutil.Process]) -> dict[str, int]:
    """Bytes of RSS per process group over the trees of `roots` (each process once)."""
    parts: dict[str, int] = {}
    seen: set[int] = set()
    for root in roots:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                kind = process_group(p)
                parts[kind] = parts.get(kind, 0) + p.memory_info().rss
            except psutil.Error:
                pass
    return parts


def _processing(result: dict) -> float | None:
    """A workload's result names its processing seconds; a Nexmark run's are its queries'."""
    if result.get("processing_seconds") is not None:
        return result["processing_seconds"]
    # Flink's Nexmark peer names its queries, Spark's its one query (a refused one has no seconds)
    queries = [result["query"]] if "query" in result else list((result.get("queries") or {}).values())
    queries = [q.get("seconds") for q in queries]
    return round(sum(queries), 3) if queries and None not in queries else None


TIMEOUT = 1800      # seconds a peer may run; Flink's Nexmark q9 and q20 took 1,344 and 1,067 s on a fast machine


def run_peer(name: str, cmd: list[str], out_dir: Path, env: dict | None = None, timeout: float = TIMEOUT,
             also: list[int] = ()) -> PeerRun:
    """Run `cmd` (which writes <out_dir>/result.json); fail loudly with the log tail if it fails.
    `also`: pids of servers the peer uses (the Spark Connect server), whose process trees count
    towards its RSS as its own children do."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").unlink(missing_ok=True)
    log = out_dir / "log.txt"
    print(f"[{name}] {' '.join(str(c) for c in cmd[:3])} ...", flush=True)
    started, peak, split = time.perf_counter(), 0, {}
    with log.open("w") as sink:
        child = subprocess.Popen([str(c) for c in cmd], stdout=sink, stderr=subprocess.STDOUT,
                                 env={**os.environ, **(env or {})}, start_new_session=True)
        roots = [psutil.Process(pid) for pid in (child.pid, *also)]
        try:
            while child.poll() is None:
                parts = rss_by_group(roots)
                if sum(parts.values()) > peak:
                    peak, split = sum(parts.values()), parts
                if time.perf_counter() - started > timeout:
                    print(f"[{name}] killed: no result after {timeout:.0f}s", flush=True)
                    raise PeerTimeout(name, timeout, log)
                time.sleep(0.1)
        except BaseException:       # the timeout, ^C or a SIGTERM the bench turned into SystemExit
            if child.poll() is None:
                os.killpg(child.pid, 9)
                child.wait()
            raise
    wall = time.perf_counter() - started
    result_file = out_dir / "result.json"
    if child.returncode != 0 or not result_file.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name}: exit {child.returncode}, no result; log {log}:\n{tail}")
    result = json.loads(result_file.read_text())
    processing = _processing(result)
    print(f"[{name}] done in {wall:.1f}s" + (f" (processing {processing}s)" if processing is not None else "") +
          f", peak RSS {peak / 2**20:.0f} MB", flush=True)
    return PeerRun(name, round(wall, 2), round(peak / 2**20), result, log,
                   {k: round(v / 2**20) for k, v in sorted(split.items())})
