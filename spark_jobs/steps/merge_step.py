"""A batch's merge, from the driver: the partials grouped by state partition and one merge task
per partition (merge_task.merge_arrow, beside the state), each committing the partition's
transaction and publishing its changes; the driver gets one summary per partition back."""
from __future__ import annotations

import json
import logging
from dataclasses import replace

from catalog.definitions import TableDefinition
from spark_jobs.delta import mirror
from spark_jobs.steps.task_context import TaskContext
from spark_jobs.engine.partition_tasks import per_state_partition
from spark_jobs.steps.table_run import TableRun
from spark_jobs.steps.summary import PartitionSummary

__all__ = ["merge", "purge_at"]

log = logging.getLogger("statetable.microbatch")


def purge_at(table: TableDefinition, batch_id: int, watermark: int | None) -> int | None:
    """The watermark this batch purges expired windows at, or None: every snapshot_every batches,
    at the table's snapshot phase (registry.snapshot_phase), so that tables started together do
    not all purge in the same batch, as they did not all snapshot in it. A verify reads the
    purge's watermark from the batch log, so the batch a purge falls on is free to choose."""
    from catalog.registry import snapshot_phase

    if table.window is None:
        return None
    return watermark if batch_id % table.snapshot_every == snapshot_phase(table) else None


def merge(run: TableRun, partials, batch_id: int, watermark: int | None, previous_watermark: int | None,
          begun_at: float) -> dict[int, PartitionSummary]:
    """The partials (`_kind` = "partial", `_sp`, keys and values), grouped by state partition (a
    shuffle of one row per key and input batch), and one merge task per partition; a marker
    row per partition makes every partition commit. `begun_at`: the batch's wall-clock start,
    to tell merge tasks forked by a daemon that started during the batch (a cold engine)."""
    from spark_jobs.steps.merge_task import merge_arrow

    table, rt = run.table, run.rt
    ctx = TaskContext.of(rt, table, batch_id, purge_watermark=purge_at(table, batch_id, watermark),
                         changelog=run.spec.changelog,
                         closing=(previous_watermark, watermark) if table.emit == "final" else None,
                         expire_before=watermark - table.ttl_ms if table.ttl_ms and watermark is not None else None)
    mirror_dir = mirror.changes_path(rt, table.name)
    reports = PartitionSummary.all_of(per_state_partition(
        run.spark, partials, table.partitions, lambda group: merge_arrow(ctx, mirror_dir, group),
        f"{table.name} batch {batch_id}: merge"))
    # Forked by a daemon that began during this batch: a cold engine.
    summaries = {p: replace(s, cold=not 0 < s.daemon_started < begun_at) for p, s in reports.items()}
    _report(table, batch_id, summaries)
    return summaries


def _report(table: TableDefinition, batch_id: int, summaries: dict[int, PartitionSummary]) -> None:
    """One line on how the merge went: the slowest task, which worker served which partitions,
    and the partitions that started cold, were restored or were seeded from a query replica."""
    slowest = max(summaries.values(), key=lambda s: sum(s.ms.values()))
    served: dict[str, list[int]] = {}
    for p, s in sorted(summaries.items()):
        served.setdefault(s.worker or "?", []).append(p)
    cold = [p for p, s in sorted(summaries.items()) if s.cold]
    if cold:
        log.info("%s batch %d: partitions %s were merged by Python workers that started cold (their daemon "
                 "began during this batch, imports and all): the engine was not warm", table.name, batch_id, cold)
    seeded = [p for p, s in sorted(summaries.items()) if s.seeded]
    hydrated = [p for p, s in sorted(summaries.items()) if s.hydrated and p not in seeded]
    log.info("%s batch %d: merged %d keys into %d partitions; the slowest task's ms: %s; partitions served by "
             "%s%s%s", table.name, batch_id, sum(s.delta_keys for s in summaries.values()), len(summaries),
             slowest.ms, json.dumps(served, sort_keys=True),
             f"; restored from snapshots and the changelog (no local copy): {hydrated}" if hydrated else "",
             f"; copied from a local query replica, then the changelog: {seeded}" if seeded else "")
