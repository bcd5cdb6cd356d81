"""Spark jobs of one task per state partition: a batch's merge, verify's compare, a table over a
table's two stages. Rows go to the task of their `_sp`, and every partition runs, also one
without rows, so that every partition commits (or compares) each batch."""
from __future__ import annotations

import json

from state import faults
from spark_jobs.errors import TaskReportMismatch


def task_faults(spark) -> tuple[str | None, str | None]:
    """The fault point a job's tasks arm (state.faults.armed): workers of a Spark Connect server
    never saw the client's environment, and reused workers must forget an earlier job's point.
    On a shared server a task dies alone (scope group): the server is not the job's to kill."""
    from spark_jobs.engine.session import is_connect

    point, scope = faults.armed()
    return point, None if is_connect(spark) and scope == "group" else scope


def per_state_partition(spark, partials, partitions: int, body, what: str) -> dict[int, dict]:
    """One Spark task per state partition over `partials` (rows with `_kind` = "partial" and
    `_sp`), plus a marker row per partition so that every partition runs, also one without rows.
    `body(group)` returns a one-row Arrow table whose `summary` is JSON with its `partition`.

    Rows go to the task whose index is their `_sp` (repartitionById). A groupBy would hash the
    ids: with 4 partitions, ids 0, 1 and 3 hash to one shuffle partition, so one task merged three
    partitions in turn while another idled."""
    from pyspark.sql import functions as F

    from spark_jobs.engine.session import struct

    markers = spark.range(partitions).select(F.lit("marker").alias("_kind"), F.col("id").cast("int").alias("_sp"))
    rows = markers if partials is None else partials.unionByName(markers, allowMissingColumns=True)
    armed = task_faults(spark)

    def run(batches):
        import gc

        import pyarrow as pa
        import pyarrow.compute as pc

        faults.arm(*armed)
        batches = list(batches)
        if not batches:
            return
        task = pa.Table.from_batches(batches)
        # No cyclic garbage collection while the task runs: a merge holds a record, a tuple and a
        # row per input record (a million), none of them in cycles, and the collector's full
        # passes over them cost more than the work (a windowed join's 460,000 change rows: 1.33 s
        # with it, 0.52 s without). It resumes when the task ends; the worker lives on.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for sp in sorted(pc.unique(task.column("_sp")).to_pylist()):     # one, unless tasks were merged
                yield from body(task.filter(pc.equal(task.column("_sp"), sp))).to_batches()
        finally:
            if collecting:
                gc.enable()

    summaries = {}
    for row in rows.repartitionById(partitions, "_sp").mapInArrow(run, struct(spark, "summary STRING")).collect():
        summary = json.loads(row["summary"])
        summaries[summary.pop("partition")] = summary
    if sorted(summaries) != list(range(partitions)):
        raise TaskReportMismatch(f"{what} tasks reported partitions {sorted(summaries)}")
    return summaries
