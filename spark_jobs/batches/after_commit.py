"""What follows a batch's commit entry: the mirror's change files committed (and folded when
due), a table of tables' retraction files dropped, snapshots when due, the consumer group's
offsets for lag tools, the Delta tables compacted and vacuumed when due, and the batch log
compacted when due. All of it is repeated for the last committed batch when a runner starts,
so a crash after the commit entry leaves nothing undone; each step has its fault point."""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from catalog.batch_log import BatchCommit
from catalog.runtime import task_state_dir
from spark_jobs.delta import delta_maintenance, mirror
from spark_jobs.engine.partition_tasks import task_faults
from spark_jobs.engine.session import struct
from spark_jobs.passes import pass_for
from spark_jobs.steps.table_run import TableRun
from state import faults
from spark_jobs.steps.task_context import TaskContext

__all__ = ["finish", "snapshot_if_due", "commit_group_offsets"]

log = logging.getLogger("statetable.microbatch")


def finish(run: TableRun, commit: BatchCommit, snapshots: bool = True) -> None:
    """`snapshots=False` leaves snapshots to the caller (the Airflow DAG has a task of its own for them)."""
    mirror.commit_changes(run.rt, run.table.name, commit.batch_id)
    faults.point("mirror.after_changes")
    pass_for(run.table).after_commit(run.rt, commit.batch_id)
    mirror.fold_if_due(run.spark, run.rt, run.table, commit.batch_id)
    if snapshots:
        snapshot_if_due(run, commit)
    faults.point("batch.after_snapshot")
    commit_group_offsets(run, commit)
    faults.point("batch.after_offsets")
    delta_maintenance.maintain_if_due(run.spark, run.rt, run.table, commit)    # every maintain_every batches
    run.log.compact_if_due()            # old commits folded into one checkpoint file (BatchLog.compact)


def snapshot_if_due(run: TableRun, commit: BatchCommit) -> None:
    from catalog.registry import due_snapshots

    table, rt = run.table, run.rt
    due = due_snapshots(table, rt, commit.batch_id)
    if not due:
        return
    ctx = TaskContext.of(rt, table, commit.batch_id, replica_roots=(), spec=run.spec, armed=task_faults(run.spark))
    started = time.monotonic()
    run.describe(commit.batch_id, "snapshot")
    from pyspark.sql import functions as F

    # One task per partition from spark.range, not a Python list: the same empty job took
    # 0.36-0.50 s warm (4.5 s cold) from createDataFrame + repartition, and 0.21-0.27 s from range.
    specs = [ctx]
    if pass_for(table).rows_stage:  # the rows stage is snapshotted with its groups, at the same batches
        from catalog.mapping import rows_spec

        specs.append(replace(ctx, spec=rows_spec(table, rt.namespace)))
    for each in specs:
        (run.spark.range(0, table.partitions, 1, table.partitions).select(F.col("id").cast("int").alias("p"))
         .where(F.col("p").isin(due)).mapInArrow(lambda batches, c=each: _snapshot_partitions(c, batches), struct(run.spark, "p INT"))
         .collect())
    log.info("%s: snapshot of partitions %s at batch %d in %.2fs", table.name, due, commit.batch_id,
             time.monotonic() - started)


def commit_group_offsets(run: TableRun, commit: BatchCommit) -> None:
    """The batch's end offsets in a consumer group, for the lag tools users already run. The
    batch log holds the offsets that count, so a refusal here warns (naming the group and the
    ACL that fixes it) and never fails a committed batch."""
    from confluent_kafka import KafkaException, TopicPartition

    from state.kafka_admin import group_committer

    group = f"statetable.{run.rt.namespace}{run.table.name}"
    try:
        group_committer(run.rt.bootstrap, group).commit(
            offsets=[TopicPartition(commit.topic, p, end) for p, (_, end) in commit.ranges.items()],
            asynchronous=False)
    except KafkaException as exc:
        log.warning("%s batch %d is committed, but its offsets were not committed to consumer group %s, so lag "
                    "tools show the group behind (%s); if the broker's ACLs refuse it, grant READ on groups "
                    "prefixed 'statetable.' to statetable's principal", run.table.name, commit.batch_id, group,
                    exc.args[0].str())


def _snapshot_partitions(ctx: TaskContext, batches):
    """mapInArrow body: snapshot the partitions named in `batches` on this executor."""
    from state.table import StateTable

    faults.arm(*ctx.armed)
    for batch in batches:
        for partition in batch.column("p").to_pylist():
            # The batch's changelog exists (it was just written): a snapshot asks no broker anything,
            # so a broker lost meanwhile costs it nothing.
            table = StateTable(ctx.spec, task_state_dir(ctx.state_dir), bootstrap=ctx.bootstrap,
                               snapshot_uri=ctx.snapshot_uri, create_topics=False)
            try:
                table.snapshot(partition)
            finally:
                table.close()
            yield batch.slice(0, 0)
