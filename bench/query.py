"""Query API benchmark: point lookups on a 1M-key table over loopback.

Builds a 1M-key count table through the state library (with its changelog on
a private broker), starts `statetable serve` as its own process, and drives
it from a separate load process at a fixed concurrency:

  1. paced at --rate requests/s (latency at the target load),
  2. as fast as the concurrency allows (throughput),
  3. paced again while another process commits batches to the same table.

Prints one JSON object. Target: p99 <= 10 ms at 500 requests/s.

The writer runs at the batch path's CPU priority (catalog.priority), as
the pipeline's merge tasks do; --batch-nice 0 makes it compete as an equal.
Each phase also reports the host's steal (CPU time the hypervisor gave to
other guests) and which slow requests were in flight while it happened: on a
shared VM those wait whatever the server does.

    .venv/bin/python -m bench.query [--keys 1000000] [--rate 500] [--seconds 20] [--concurrency 16]
                                    [--readers 3] [--partitions 16] [--warmup 10] [--batch-nice N]
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOKEN = "bench-token-" + "y" * 24
SLOW_SECONDS = 0.010   # the target p99
SQL = """-- topic: bench_kv_events
-- schema: k STRING, v DOUBLE
-- partitions: {partitions}
CREATE TABLE bench_kv AS SELECT k, COUNT(v) AS n FROM bench_kv_events GROUP BY k;
"""


def _key(i: int) -> str:
    return f"key{i:07d}"


def build_table(rt, keys: int) -> float:
    from catalog.mapping import state_spec
    from catalog.definitions import parse
    from state import codec
    from state.table import StateTable

    table = parse(rt.tables_dir / "bench_kv.sql")
    st = StateTable(state_spec(table), rt.state_dir, bootstrap=rt.bootstrap)
    started = time.perf_counter()
    try:
        for p in range(table.partitions):
            part = st.open(p)
            with part.begin(0) as tx:
                for i in range(keys):
                    key = (_key(i),)
                    if st.partition_of(key) == p:
                        tx.merge_encoded(codec.encode_key(key), (1,))
    finally:
        st.close()
    return time.perf_counter() - started


def commit_batches(rt_env: dict, keys: int, stop_at: float, every: float, result) -> None:
    """Another process, as Spark merge tasks would be: a batch of 50k key updates every `every` seconds
    (back to back when a batch takes longer) until `stop_at`, at the batch path's CPU priority."""
    os.environ.update(rt_env)
    from catalog.mapping import state_spec
    from catalog.definitions import parse
    from catalog.priority import yield_cpu_to_queries
    from catalog.runtime import Runtime
    from state import codec
    from state.table import StateTable

    yield_cpu_to_queries()
    rt = Runtime.from_env()
    table = parse(rt.tables_dir / "bench_kv.sql")
    st = StateTable(state_spec(table), rt.state_dir, bootstrap=rt.bootstrap)
    batch, rng = 1, random.Random(7)
    try:
        next_at = time.time()
        while time.time() < stop_at:
            time.sleep(max(0.0, next_at - time.time()))
            next_at += every
            chosen = [(_key(rng.randrange(keys)),) for _ in range(50_000)]
            for p in range(table.partitions):
                with st.open(p).begin(batch) as tx:
                    for key in chosen:
                        if st.partition_of(key) == p:
                            tx.merge_encoded(codec.encode_key(key), (1,))
            batch += 1
    finally:
        st.close()
    result.value = batch - 1


class _Connection:
    """A minimal keep-alive HTTP/1.1 client: the load generator must cost far less CPU than the server."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def get(self, path: str) -> tuple[int, dict[str, str]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
                          .encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        headers = {k.lower(): v for k, v in headers.items()}
        await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(head[0].split(" ")[1]), headers


class _StealClock(threading.Thread):
    """When the hypervisor ran other guests on this VM's CPUs (the steal column of /proc/stat,
    read every 10 ms): a request in flight then can only wait, whatever the server does, so each
    slow request is checked against these moments."""

    def __init__(self, begun: float) -> None:
        super().__init__(daemon=True)
        self.begun, self.stolen_at = begun, []     # one entry per 10 ms tick stolen, seconds after `begun`
        self.done = threading.Event()

    def run(self) -> None:
        times = _cpu_times()
        if times is None:
            return
        last = times[7]
        while not self.done.wait(0.01):
            now = _cpu_times()[7]
            self.stolen_at.extend([time.perf_counter() - self.begun] * (now - last))
            last = now

    def met(self, at: float, latency: float) -> bool:
        """Whether a request started `at` and lasting `latency` was in flight during a steal tick,
        widened by the 10 ms a tick and a sample can each lag."""
        i = bisect.bisect_left(self.stolen_at, at - 0.01)
        return i < len(self.stolen_at) and self.stolen_at[i] <= at + latency + 0.02


async def _load(base: str, keys: int, seconds: float, concurrency: int, rate: float | None) -> dict:
    host, port = base.removeprefix("http://").split(":")
    spans, errors, batches = [], 0, set()      # spans: (start, latency) of each request, s after begun
    interval = None if rate is None else concurrency / rate
    deadline = time.perf_counter() + seconds

    async def worker(seed: int) -> None:
        nonlocal errors
        rng, conn = random.Random(seed), _Connection(host, int(port))
        next_at = time.perf_counter() + (0 if interval is None else rng.random() * interval)
        while True:
            if interval is not None:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += interval
            if time.perf_counter() >= deadline:
                return
            started = time.perf_counter()
            status, headers = await conn.get(f"/tables/bench_kv/rows/{_key(rng.randrange(keys))}")
            spans.append((started - begun, time.perf_counter() - started))
            if status != 200:
                errors += 1
            else:
                batches.add(headers["x-statetable-batch"])

    begun = time.perf_counter()
    steal = _StealClock(begun)
    steal.start()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - begun
    steal.done.set()
    steal.join()
    latencies = sorted(latency for _, latency in spans)
    slow = [span for span in spans if span[1] > SLOW_SECONDS]
    unstolen = sorted(latency for at, latency in spans if not steal.met(at, latency))

    def pct(values: list[float], q: float) -> float | None:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2) if values else None

    return {"requests": len(latencies), "errors": errors, "requests_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": pct(latencies, 0.50), "p99_ms": pct(latencies, 0.99), "max_ms": pct(latencies, 1.0),
            "batches_seen": len(batches), "over_10ms": len(slow),
            "over_10ms_during_steal": sum(steal.met(*span) for span in slow),
            "steal_ms": len(steal.stolen_at) * 10,
            "p99_ms_of_requests_without_steal": pct(unstolen, 0.99), "requests_without_steal": len(unstolen),
            "stalls": _stalls(slow, steal)}


def _stalls(slow: list[tuple[float, float]], steal: _StealClock, top: int = 5) -> list[dict]:
    """Where the slow requests cluster: the 100 ms windows holding most of them (a stall shows as a
    few crowded windows, CPU contention as many thin ones), and the host's steal in each."""
    windows: dict[int, list[float]] = {}
    for at, latency in slow:
        windows.setdefault(int(at * 10), []).append(latency)
    crowded = sorted(windows.items(), key=lambda item: -len(item[1]))[:top]
    return [{"at_s": w / 10, "requests": len(ls), "max_ms": round(max(ls) * 1000, 1),
             "steal_ms": 10 * sum(w / 10 - 0.05 <= t < w / 10 + 0.15 for t in steal.stolen_at)} for w, ls in crowded]


def _load_in_process(args_tuple, queue) -> None:
    gc.collect()
    gc.disable()    # the client's own collection pauses would be charged to the server's latency
    queue.put(asyncio.run(_load(*args_tuple)))


def load(base: str, keys: int, seconds: float, concurrency: int, rate: float | None) -> dict:
    """Run the load generator in its own process, so the client never shares a GIL with anything measured."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    before = _cpu_times()
    proc = ctx.Process(target=_load_in_process, args=((base, keys, seconds, concurrency, rate), queue))
    proc.start()
    result = queue.get()
    proc.join()
    return {**result, **_cpu_shares(before, _cpu_times())}


def _cpu_times() -> list[int] | None:
    """The machine's CPU time so far by kind (/proc/stat): user nice system idle iowait irq softirq steal."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def _cpu_shares(before: list[int] | None, after: list[int] | None) -> dict:
    """Busy and stolen shares of the machine's CPU time over a phase. Steal is time the hypervisor gave
    this VM's CPUs to other guests: a request in flight then waits, whatever the server does, so a
    phase's tail latency is read beside it."""
    if not before or not after:
        return {}
    spent = [b - a for a, b in zip(before, after)]
    total = sum(spent) or 1
    return {"cpu_busy_pct": round(100 * (total - spent[3] - spent[4] - spent[7]) / total, 1),
            "cpu_steal_pct": round(100 * spent[7] / total, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--commit-every", type=float, default=1.0, help="seconds between batch commits")
    parser.add_argument("--port", type=int, default=25481)
    parser.add_argument("--warmup", type=float, default=10, help="seconds of paced load before measuring")
    parser.add_argument("--readers", type=int, default=3, help="statetable serve --readers (0: in the server process); "
                        "with 3, two still answer while one catches up")
    parser.add_argument("--broker-port", type=int, default=25492)
    parser.add_argument("--batch-nice", type=int, default=None,
                        help="the writer's CPU niceness (STATETABLE_BATCH_NICE; default the product's, 10); "
                             "0 lets the batch compete with the queries for the cores")
    parser.add_argument("--partitions", type=int, default=16,
                        help="state partitions of the table: a catch-up after a batch holds the GIL per partition, "
                             "so more partitions cut the longest stall")
    args = parser.parse_args()

    from bench.broker import private_broker
    from deploy.processes import wait_until
    from catalog.priority import batch_niceness
    from catalog.runtime import Runtime

    root = Path(tempfile.mkdtemp(prefix="statetable-bench-query-"))
    (root / "tables").mkdir()
    (root / "tables" / "bench_kv.sql").write_text(SQL.format(partitions=args.partitions))
    with private_broker(args.broker_port) as cfg:
        rt = Runtime(bootstrap=cfg.kafka_bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data" / "snap"),
                     tables_dir=root / "tables", namespace="bench.")
        build_s = build_table(rt, args.keys)
        env = {**os.environ, **rt.as_env(), "STATETABLE_API_TOKEN": TOKEN}
        server = subprocess.Popen([str(Path(sys.executable).parent / "statetable"), "serve", "--port", str(args.port),
                                   "--readers", str(args.readers)],
                                  env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{args.port}"
        try:
            import httpx

            wait_until(lambda: _ok(httpx, base), 60, what="statetable serve")
            # Warm-up: every reader process opens the table's secondaries on its first turn, replaying the
            # writer's WAL of the 1M-key build; a few seconds leave some readers still opening.
            load(base, args.keys, args.warmup, args.concurrency, args.rate)
            paced = load(base, args.keys, args.seconds, args.concurrency, args.rate)
            flat_out = load(base, args.keys, args.seconds, args.concurrency, None)

            ctx = multiprocessing.get_context("spawn")
            committed = ctx.Value("i", 0)
            writer_seconds = args.seconds + 2      # it starts 1 s before the load and stops 1 s after
            writer_env = {**rt.as_env(), **({} if args.batch_nice is None else
                                            {"STATETABLE_BATCH_NICE": str(args.batch_nice)})}
            writer = ctx.Process(target=commit_batches,
                                 args=(writer_env, args.keys, time.time() + writer_seconds, args.commit_every,
                                       committed))
            writer.start()
            time.sleep(1)
            during = load(base, args.keys, args.seconds, args.concurrency, args.rate)
            writer.join()
        finally:
            server.terminate()
            server.wait(timeout=20)
    print(json.dumps({
        "keys": args.keys, "partitions": args.partitions, "readers": args.readers,
        "concurrency": args.concurrency, "target_rate": args.rate,
        "build_seconds": round(build_s, 1),
        "paced": paced, "max_throughput": flat_out,
        "paced_while_committing": {**during, "batches_committed": committed.value, "writer_seconds": writer_seconds,
                                   "batch": f"50000 key updates every {args.commit_every}s, back to back when a "
                                            f"batch takes longer",
                                   "writer_nice": args.batch_nice if args.batch_nice is not None else
                                   batch_niceness()},
        "target_met": paced["p99_ms"] <= 10 and during["p99_ms"] <= 10 and paced["requests_per_s"] >= args.rate * 0.95,
    }, indent=1))


def _ok(httpx, base: str) -> bool:
    try:
        return httpx.get(f"{base}/openapi.json", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    main()
