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


@dataclass
class PeerRun:
    name: str
    wall_seconds: float
    peak_rss_mb: float
    result: dict = field(repr=False)
    log: Path = field(repr=False)


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def run_peer(name: str, cmd: list[str], out_dir: Path, env: dict | None = None, timeout: float = 1800) -> PeerRun:
    """Run `cmd` (which writes <out_dir>/result.json); fail loudly with the log tail if it fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").unlink(missing_ok=True)
    log = out_dir / "log.txt"
    print(f"[{name}] {' '.join(str(c) for c in cmd[:3])} ...", flush=True)
    started, peak = time.perf_counter(), 0
    with log.open("w") as sink:
        child = subprocess.Popen([str(c) for c in cmd], stdout=sink, stderr=subprocess.STDOUT,
                                 env={**os.environ, **(env or {})}, start_new_session=True)
        proc = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                peak = max(peak, _tree_rss(proc))
            except psutil.NoSuchProcess:
                pass
            if time.perf_counter() - started > timeout:
                os.killpg(child.pid, 9)
                raise RuntimeError(f"{name}: no result after {timeout:.0f}s; log: {log}")
            time.sleep(0.1)
    wall = time.perf_counter() - started
    result_file = out_dir / "result.json"
    if child.returncode != 0 or not result_file.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name}: exit {child.returncode}, no result; log {log}:\n{tail}")
    result = json.loads(result_file.read_text())
    print(f"[{name}] done in {wall:.1f}s (processing {result.get('processing_seconds')}s), "
          f"peak RSS {peak / 2**20:.0f} MB", flush=True)
    return PeerRun(name, round(wall, 2), round(peak / 2**20), result, log)
