"""The Connect server's warm row of `make bench`, for two checkouts side by side in one run: the
same events on one private broker, each checkout's own Connect server (its code, its stack
folder), the checkouts taking turns, so a change's cost on the row is told from the machine's
drift between two `make bench` runs (#67: the row ran 2.45x the minimal pass in one run, 1.99x in
the run before, with every floor of that run 17% slower too).

    .venv/bin/python -m bench.ab_connect OTHER_CHECKOUT [--rounds 2] [--events 5000000]

OTHER_CHECKOUT is a worktree (e.g. `git worktree add /tmp/ab 4057ca8`) whose .venv and .cache
link to this one's. Prints JSON: each checkout's processing seconds per table run, and the
best of each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.broker import private_broker
from bench.workload import produce_random
from catalog.settings import PROJECT_ROOT

# Run inside a checkout: its bench.warm starts its Connect server (its code) and runs two tables.
ONE_CHECKOUT = """
import json, sys
from pathlib import Path
from catalog import settings as stack_settings
from deploy import connect_server
from bench import warm
settings = stack_settings.load()
line, env, _ = warm._connect(settings, int(sys.argv[4]))
runs = []
try:
    for i in range(2):
        work = Path(sys.argv[3]) / f"t{i}"
        run = warm._client(f"connect table {i}", settings, sys.argv[1], sys.argv[2], work, env,
                           "--batch", sys.argv[6], "--table", f"{sys.argv[5]}_{i}")
        runs.append(run.result["processing_seconds"])
finally:
    connect_server.stop(settings)
print("AB_RESULT " + json.dumps(runs))
"""


def one(root: Path, bootstrap: str, topic: str, work: Path, port: int, table: str, events: int) -> list[float]:
    env = {**os.environ, "STATETABLE_SPARK_CONNECT_PORT": str(port), "PYTHONPATH": str(root)}
    done = subprocess.run([str(root / ".venv" / "bin" / "python"), "-c", ONE_CHECKOUT, bootstrap, topic, str(work),
                           "100000", table, str(events)], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("AB_RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{root}: exit {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(lines[-1].split(" ", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--port", type=int, default=25692)
    args = parser.parse_args()
    roots = {"this": PROJECT_ROOT, "other": args.other.resolve()}
    seconds: dict[str, list[float]] = {name: [] for name in roots}
    work = Path(tempfile.mkdtemp(prefix="statetable-ab-"))
    with private_broker(args.port) as cfg:
        produce_random(cfg.kafka_bootstrap, "bench-ab", args.events, 10_000)
        os.sync()
        for r in range(args.rounds):
            for name, root in (roots.items() if r % 2 == 0 else reversed(roots.items())):
                seconds[name] += one(root, cfg.kafka_bootstrap, "bench-ab", work / f"{name}{r}", args.port + 7,
                                     f"bench_ab_{name}_{r}", args.events)
                print(f"[ab] {name} round {r}: {seconds[name][-2:]}", file=sys.stderr, flush=True)
    print(json.dumps({"checkouts": {n: str(p) for n, p in roots.items()}, "events": args.events,
                      "processing_seconds": seconds, "best": {n: min(s) for n, s in seconds.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
