"""What a table's Delta maintenance costs, by Spark SQL (spark_jobs.delta.delta_maintenance.in_spark,
over its driver bound: the bronze trim's DELETE, OPTIMIZE, VACUUM) and by delta-rs on the driver
(delta_maintenance.on_driver, under the bound), side by side in one run on copies of one bronze
of many small files.

Every `maintain_every` batches a table runs it; the fold of the mirror moved to delta-rs under a
size bound once Spark's MERGE of a few rows proved to cost ~10 CPU s, and this measures whether
maintenance is the same case: bronze after `maintain_every` small batches is that many small
files, and what compacting them costs should follow their bytes, not Spark's planning.

    .venv/bin/python -m bench.delta_maintenance [--files 60] [--rows 200] [--repeats 3]

CPU by process uses bench.suite_cpu's kinds. It starts a local Spark session and stops it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time

import pyarrow as pa

from bench.suite_cpu import _processes, cpu_by_kind
from spark_jobs.delta import delta_maintenance


def _bronze(path: str, files: int, rows: int) -> None:
    from deltalake import write_deltalake

    for batch in range(files):
        write_deltalake(path, pa.table({
            "batch_id": pa.array([batch] * rows, pa.int64()),
            "key": [f"k{i}" for i in range(rows)],
            "value": [f'{{"amount": {i}}}' for i in range(rows)],
        }), mode="append")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _by_delta_rs(path: str, trim_below: int) -> dict:
    from deltalake import DeltaTable

    return delta_maintenance.on_driver(DeltaTable(path), trim_below, hours=0)


def _by_spark(spark, path: str, trim_below: int) -> dict:
    return delta_maintenance.in_spark(spark, path, trim_below, hours=0)


def _timed(run, source: str, copy: str) -> dict:
    from deltalake import DeltaTable

    shutil.copytree(source, copy)
    before, own, started = _processes(), _own_cpu(), time.monotonic()
    done = run(copy)
    wall, own, after = time.monotonic() - started, _own_cpu() - own, _processes()
    jvm = sum(cpu for kind, cpu in cpu_by_kind(before, after).items() if kind.startswith("spark driver JVMs"))
    return {**done,
            "rows_left": DeltaTable(copy).to_pyarrow_table().num_rows,      # both must leave the same table
            "parquet_files_left": sum(1 for _, _, names in os.walk(copy) for name in names
                                      if name.endswith(".parquet")),
            "wall_s": round(wall, 3), "driver_python_cpu_s": round(own, 3), "spark_jvm_cpu_s": round(jvm, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=60,
                        help="bronze's small files (batches since the last compaction)")
    parser.add_argument("--rows", type=int, default=200, help="rows per file")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from spark_jobs.engine import session

    # Spark's VACUUM prints to the JVM's stdout: keep stdout for the JSON alone.
    stdout = os.dup(1)
    os.dup2(2, 1)
    root = tempfile.mkdtemp(prefix="bench-delta-maintenance-")
    trim_below = args.files // 2           # the bronze retention drops the older half
    try:
        source = os.path.join(root, "bronze")
        _bronze(source, args.files, args.rows)
        started = time.monotonic()
        spark = session.get_or_create("bench-delta-maintenance")
        warm_up = time.monotonic() - started
        runs: dict[str, list[dict]] = {"spark_sql": [], "delta_rs": []}
        try:
            for repeat in range(args.repeats):
                runs["spark_sql"].append(_timed(lambda p: _by_spark(spark, p, trim_below), source,
                                                os.path.join(root, f"spark-{repeat}")))
                runs["delta_rs"].append(_timed(lambda p: _by_delta_rs(p, trim_below), source,
                                               os.path.join(root, f"rs-{repeat}")))
        finally:
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.dup2(stdout, 1)
    # The first Spark run pays the session's first OPTIMIZE (class loading, codegen): the warm figure is the rest.
    warm = {name: done[1:] or done for name, done in runs.items()}
    print(json.dumps({
        "files": args.files, "rows_per_file": args.rows, "session_start_s": round(warm_up, 1), "runs": runs,
        "warm_mean": {name: {field: round(sum(r[field] for r in done) / len(done), 3)
                             for field in ("wall_s", "driver_python_cpu_s", "spark_jvm_cpu_s")}
                      for name, done in warm.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
