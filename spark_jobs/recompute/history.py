"""A table recomputed from its full history with the same SQL: the reference of verify and rebuild.

History is the bronze Delta table (exactly the events the incremental path applied, late ones
excluded), or for source tables the topic itself over the committed offsets; the table's Pass
says which (Pass.recompute). A task that compares or replaces a partition holds it as its host
does (partition_here).
"""
from __future__ import annotations

import logging

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from spark_jobs.passes import pass_for
from spark_jobs.steps.inputs import frames_of
from catalog.runtime import Runtime, task_state_dir

log = logging.getLogger("statetable.batch")


def recompute(spark, table: TableDefinition, tables: dict, rt: Runtime) -> dict[tuple, object]:
    """Every key's final state from full history, on the driver (a rebuild writes it)."""
    from spark_jobs.steps.merge_task import partial_rows

    partials, purged_at = recomputed(spark, table, tables, rt)
    if partials is None:
        return {}
    keys, values = partial_rows(table, partials.drop("_sp").toArrow())
    return {k: v for k, v in zip(keys, values) if kept(table, k, v, purged_at)}


def kept(table: TableDefinition, key: tuple, value, purged_at: int | None) -> bool:
    """A recomputed row the state holds: not a deleted source row, not a window purged at the last purge."""
    if value is None:
        return False
    return purged_at is None or not table.window.expired(table.window.anchor(key, value, table.session_last_index),
                                                         purged_at)


def recomputed(spark, table: TableDefinition, tables: dict, rt: Runtime):
    """(partials, purge watermark): every key's final state from full history as a DataFrame of
    partials with their state partitions (see TableFrames.partitioned), or None without
    history; and the watermark of the last purge, whose expired windows the state no longer
    holds. It applies what the batches applied: WHERE and the refused keys (see Transaction.commit)."""
    last = BatchLog(rt.batch_dir(table.name)).last_commit()
    return pass_for(table).recompute(frames_of(spark, table, tables, rt), last, spark, rt)


def partition_here(spec, state_dir: str, bootstrap: str, snapshot_uri: str, partition: int, batch_id: int | None,
                    create_topics: bool = True):
    """The state table as the task's host holds it: the driver's folder in local mode; on a
    cluster worker, its own, with `partition` brought to `batch_id` first (see _bring_to)."""
    from state.table import StateTable

    here = task_state_dir(state_dir)
    st = StateTable(spec, here, bootstrap=bootstrap, snapshot_uri=snapshot_uri, create_topics=create_topics)
    if here != state_dir:
        try:
            _bring_to(st, partition, batch_id)
        except BaseException:
            st.close()
            raise
    return st


def _bring_to(st, partition: int, batch_id: int | None) -> None:
    """On a cluster worker, the local copy is a cache of whatever batch this worker last served:
    one that is missing or at another batch is restored to `batch_id` from snapshots plus the
    changelog first, so verify checks what any worker would serve. A copy at `batch_id` is
    compared as it is (a corrupt cache is found, not repaired)."""
    if batch_id is None:
        return
    if st.has_local_state(partition):
        part = st.open_readonly(partition)
        try:
            if part.meta.applied_batch == batch_id:
                return
        finally:
            part.close()
    st.restore(partition, target_batch=batch_id)

