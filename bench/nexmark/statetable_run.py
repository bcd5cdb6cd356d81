"""statetable's side of bench/nexmark, in a process of its own: each query's table run over the
whole topic (one local Spark session, started once), its rows, seconds, and the milliseconds of
each batch step (the step profile that names what holds a query back).

    .venv/bin/python -m bench.nexmark.statetable_run --bootstrap HOST:PORT --root DIR --out FILE [--queries q5 q8]
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from bench.nexmark.statetable_queries import CHAINS, QUERIES, SOURCES


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--root", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES))
    args = parser.parse_args()
    # The batches' own lines (each step's seconds, the slowest task's profile) in the peer's log.txt
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from catalog.mapping import row_of
    from catalog.runtime import Runtime
    from spark_jobs import jobs
    from spark_jobs.batches.microbatch import engine_of
    from spark_jobs.engine import session

    root = Path(args.root)
    tables = root / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    chained = {name: text for chain in CHAINS.values() for name, text in chain.items()}
    for name, text in {**SOURCES, **chained, **QUERIES}.items():
        header = "-- max_records_per_batch: 5000000\n" if name.startswith("q") and name != "q3" else ""
        (tables / f"{name}.sql").write_text(header + text.format(prefix="nexmark-"))
    rt = Runtime(bootstrap=args.bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data" / "s"),
                 tables_dir=tables, namespace="nexmark.")
    started = time.monotonic()
    spark = session.get_or_create("bench-nexmark")
    out: dict = {"_session_seconds": round(time.monotonic() - started, 2)}
    for query in ("auction", "person", *args.queries):
        started, done = time.monotonic(), []
        for name in (*CHAINS.get(query, ()), query):       # a chain's tables first, each caught up
            done += jobs.run(name, until_caught_up=True, spark=spark, rt=rt, snapshots=False)
        seconds = time.monotonic() - started
        if query in SOURCES:
            continue
        table = jobs.load_table(query, rt)[0]
        steps: dict = {}
        for commit in done:
            for name, ms in commit.counts.items():
                if name.startswith("ms_"):
                    steps[name[3:]] = steps.get(name[3:], 0) + ms
        out[query] = {"seconds": round(seconds, 2), "batches": len(done), "engine": engine_of(table),
                      "step_ms": steps, "rows": [row_of(table, k, v) for k, v in jobs.state_rows(query, rt).items()]}
        print(f"statetable {query}: {seconds:.2f} s ({engine_of(table)} pass; steps in ms: {steps})", flush=True)
    spark.stop()
    Path(args.out).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
