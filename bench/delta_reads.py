"""What a read of one of our Delta tables costs before the query's own work: delta-spark's
reader (a job for the log's protocol and metadata, then a cached state reconstruction, each time
the table has a new version) against Spark over the files delta-rs lists
(spark_jobs/delta/delta_frames.py), side by side in one local session, a version added between
rounds as a batch adds one. Prints JSON: seconds per round, each way, and the rows both read.

    .venv/bin/python -m bench.delta_reads [--versions 20] [--rounds 4]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("STATETABLE_SPARK_REMOTE", "local")

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from spark_jobs.delta import delta_files, delta_frames
    from spark_jobs.engine import session

    path = tempfile.mkdtemp(prefix="delta-reads-")
    schema = pa.schema([("key", pa.string()), ("n", pa.int64()), ("batch_id", pa.int64())])

    def append(batch: int, rows: int) -> None:
        name = f"part-{batch:06d}.parquet"
        pq.write_table(pa.table({"key": [f"k{i}" for i in range(rows)], "n": list(range(rows)),
                                 "batch_id": [batch] * rows}, schema=schema), f"{path}/{name}")
        delta_files.commit_files(path, [delta_files.DataFile(name, os.path.getsize(f"{path}/{name}"), rows)],
                                 schema, "bench", batch)

    for batch in range(args.versions):
        append(batch, 300)
    spark = session.get_or_create("bench-delta-reads")

    def timed(frame_of) -> tuple[float, int]:
        started = time.monotonic()
        keys = frame_of().where(F.col("batch_id") > 3).groupBy("key").count().count()
        return round(time.monotonic() - started, 2), keys

    timed(lambda: spark.range(1).selectExpr("id AS key", "id AS batch_id"))     # the session's first query
    rounds = []
    for i in range(args.rounds):
        # Turn about which goes first: the first read of a new version may warm what both use.
        first, second = (("spark", "files"), ("files", "spark"))[i % 2]
        readers = {"spark": lambda: spark.read.format("delta").load(path), "files": lambda: delta_frames.read(spark, path)}
        got = {first: timed(readers[first])}
        got[second] = timed(readers[second])
        spark_seconds, spark_keys = got["spark"]
        files_seconds, files_keys = got["files"]
        rounds.append({"delta_spark_s": spark_seconds, "delta_rs_files_s": files_seconds,
                       "same_answer": spark_keys == files_keys})
        append(args.versions + i, 1)
    print(json.dumps({"versions": args.versions, "rounds": rounds}, indent=1))
    spark.stop()


if __name__ == "__main__":
    main()
