"""What a small batch costs once warm: CPU by process (the session's JVM, its Python workers, the
driver, the broker), wall, and Spark jobs per batch (with their call sites), for a table on the
Arrow pass and on the Spark-SQL pass; the mirror's fold on the driver (delta-rs) and in Spark
side by side in one run. A table's day is many small batches (a */5 schedule, a few hundred
records each), and so is the test suite: their fixed cost, not their records, is what they pay.

    .venv/bin/python -m bench.small_batches [--table payments_per_customer] [--batches 20] [--per-batch 50]

CPU by process uses bench.suite_cpu's kinds. It starts a broker of its own on ports 29792-29793 and a local Spark session, and stops both.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.suite_cpu import _processes, cpu_by_kind
from bench.suite_directions import _broker, _busy_seconds

def _measure(spark, rt, table: str, batches: int, per_batch: int) -> dict:
    from spark_jobs import jobs

    tracker, scheduler = spark.sparkContext.statusTracker(), spark.sparkContext._jsc.sc().dagScheduler()
    jobs0, busy0, started, cpu0 = scheduler.numTotalJobs(), _busy_seconds(), time.monotonic(), _processes()
    done = jobs.run(table, max_batches=batches, spark=spark, rt=rt, max_records_per_batch=per_batch, snapshots=False)
    wall, busy, cpu1 = time.monotonic() - started, _busy_seconds() - busy0, _processes()
    assert len(done) == batches, f"{table}: {len(done)} batches of {batches}: produce more records"
    by_kind = cpu_by_kind(cpu0, cpu1)       # bench.suite_cpu's kinds: this session's JVM is the in-process one
    sites: Counter = Counter()
    for job in range(jobs0, scheduler.numTotalJobs()):
        info = tracker.getJobInfo(job)
        if info is not None:
            stage = tracker.getStageInfo(info.stageIds[0]) if info.stageIds else None
            sites[(stage.name if stage else "?").split(" at ")[-1]] += 1
    return {"batches": batches, "records_per_batch": per_batch, "wall_s_per_batch": round(wall / batches, 3),
            "machine_cpu_s_per_batch": round(busy / batches, 3),
            "cpu_s_per_batch_by_process": {k: round(v / batches, 3) for k, v in sorted(by_kind.items())},
            "spark_jobs_per_batch": round((scheduler.numTotalJobs() - jobs0) / batches, 2),
            "spark_jobs_by_call_site": {k: round(v / batches, 2) for k, v in sites.most_common(8)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default="payments_per_customer")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--per-batch", type=int, default=50)
    parser.add_argument("--warm-batches", type=int, default=5)
    args = parser.parse_args()
    cfg, broker = _broker(29792)
    try:
        from deploy import samples
        from spark_jobs import jobs
        from spark_jobs.delta import mirror
        from spark_jobs.engine import session
        from tests.table_env import isolated_runtime

        spark = session.get_or_create("bench-small-batches")
        results = {}
        variants = (("arrow", None), ("spark", None), ("arrow", 0))     # (engine, mirror's driver-fold bound)
        for engine, bound in variants:
            name = f"{engine} pass, mirror fold {'in Spark' if bound == 0 else 'on the driver'}"
            os.environ["STATETABLE_ENGINE"] = engine
            saved = mirror.DRIVER_FOLD_ROWS
            if bound is not None:
                mirror.DRIVER_FOLD_ROWS = bound
            try:
                rt, suffix = isolated_runtime(cfg.kafka_bootstrap, Path(tempfile.mkdtemp(prefix="small-batches-")))
                samples.produce(args.table, rt.bootstrap, args.per_batch * (args.batches + args.warm_batches),
                                suffix=suffix)
                jobs.run(args.table, max_batches=args.warm_batches, spark=spark, rt=rt,
                         max_records_per_batch=args.per_batch, snapshots=False)
                results[name] = _measure(spark, rt, args.table, args.batches, args.per_batch)
            finally:
                mirror.DRIVER_FOLD_ROWS = saved
        print(json.dumps({"table": args.table, "mirror_every": jobs.load_table(args.table, rt)[0].mirror_every,
                          "variants": results}, indent=1))
    finally:
        os.environ.pop("STATETABLE_ENGINE", None)
        broker.stop(timeout=25)


if __name__ == "__main__":
    main()
