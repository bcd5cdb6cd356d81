"""rebuild: replace a table's state with its recomputation from history, as a new batch with its
own changelog records and snapshots; or adopt a changed definition beside the old state, cut
over by the batch log's commit.
"""
from __future__ import annotations

import json
import logging
import time

from catalog.batch_log import BatchCommit, BatchLog, BatchPlan
from catalog.definitions import TableDefinition
from spark_jobs.engine.partition_tasks import per_state_partition
from spark_jobs.passes import pass_for
from catalog.runtime import Runtime
from spark_jobs.delta import mirror
from catalog import registry
from catalog.mapping import state_spec
from state import faults
from state.errors import DefinitionChanged
from catalog.errors import UserError

log = logging.getLogger("statetable.batch")

from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.task_context import TaskContext
from spark_jobs.recompute.history import kept, partition_here, recompute, recomputed

log = logging.getLogger("statetable.rebuild")


def repeated_full_rebuild(name: str, rt: Runtime | None = None) -> str | None:
    """Why a full rebuild now would repeat the last one (None if it would not): the last commit
    is a full rebuild, so nothing has changed the input or the state since. A backfill of a
    table without windows over three days asked for three identical full rebuilds."""
    rt = rt or Runtime.from_env()
    last = BatchLog(rt.batch_dir(name)).last_commit()
    if last is None or not last.counts.get("rebuild") or "window_from_ms" in last.counts:
        return None
    return (f"table {name!r} was rebuilt in full at batch {last.batch_id} and no batch has committed since, so "
            f"another full rebuild would compute the same state (a table without windows rebuilds in full for "
            f"any day; a backfill runs it once)")


def rebuild_window(table: TableDefinition, window_from: str | None, window_to: str | None, full: bool,
                   interval: tuple | None) -> tuple[int, int] | None:
    """The [from, to) epoch-ms range of windows a rebuild run recomputes, or None for all of them.

    Explicit `window_from`/`window_to` (ISO dates or timestamps) win; else a
    scheduled or backfill run's data interval; else (a manual run) the whole
    table. Tables without windows always rebuild in full. Raises ValueError,
    naming the table and the param, before any work is done.
    """
    from datetime import datetime, timezone

    def parse(name: str, raw: str) -> int:
        try:
            moment = datetime.fromisoformat(raw)
        except (TypeError, ValueError):
            raise UserError(f"table {table.name!r}: param {name}={raw!r} is not an ISO date or timestamp, "
                            f"e.g. 2026-03-01 or 2026-03-01T06:00:00+00:00") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)

    if full and (window_from or window_to):
        raise UserError(f"table {table.name!r}: params full=true and window_from/window_to exclude each other; "
                        f"drop one of them")
    if (window_from is None) != (window_to is None):
        raise UserError(f"table {table.name!r}: give both params window_from and window_to, or neither")
    if window_from is not None:
        lo, hi = parse("window_from", window_from), parse("window_to", window_to)
        if lo >= hi:
            raise UserError(f"table {table.name!r}: param window_from={window_from} must be before "
                            f"window_to={window_to}")
        if table.window is None:
            raise UserError(f"table {table.name!r} has no windows, so window_from/window_to cannot apply; "
                            f"leave them empty to rebuild it in full")
        return lo, hi
    if full or table.window is None or interval is None or None in interval:
        return None
    return int(interval[0].timestamp() * 1000), int(interval[1].timestamp() * 1000)


def rebuild(name: str, spark=None, rt: Runtime | None = None,
            window_range: tuple[int, int] | None = None, unless_repeated: bool = False) -> BatchCommit:
    """Replace the state with a recomputation, as a new batch with its own changelog records.

    `window_range` (epoch ms, [from, to)) limits a windowed table's rebuild to
    the windows starting in that range, which is what a backfill of a date
    range means; other keys are left as they are. Tables without windows
    always rebuild in full. `unless_repeated`: return the last commit instead
    when it already is a full rebuild (decided under the table's lock, so the
    days of a backfill, which Airflow runs side by side, rebuild once).
    """
    rt = rt or Runtime.from_env()
    table, _ = registry.load_table(name, rt)
    if window_range is not None:
        lo, hi = window_range
        if lo >= hi:
            raise UserError(f"table {name!r}: rebuild range start {lo} must be before its end {hi}")
        if table.window is None:
            log.info("rebuild %s: the table has no windows, so the range is ignored and it rebuilds in full", name)
            window_range = None
    with registry.table_lock(name, rt):
        if unless_repeated and window_range is None and (why := repeated_full_rebuild(name, rt)):
            log.info("rebuild %s: not run: %s", name, why)
            return BatchLog(rt.batch_dir(name)).last_commit()
        return _rebuild(name, spark, rt, window_range)


def _rebuild(name: str, spark, rt: Runtime, window_range: tuple[int, int] | None) -> BatchCommit:
    from spark_jobs.engine import session

    started = time.monotonic()
    table, tables = registry.load_table(name, rt)
    batch_log = BatchLog(rt.batch_dir(table.name))
    last = batch_log.last_commit()
    if last is None:
        raise UserError(f"table {name!r} has no committed batch to rebuild from; run it first")
    if batch_log.pending_plan() is not None:
        raise UserError(f"table {name!r} has an unfinished batch; run it to completion before a rebuild")
    spark = spark or session.get_or_create(f"statetable-rebuild-{name}")      # after what a user can fix
    spec = registry.spec_of(table, rt)
    recorded = (last.definition or {}).get("fingerprint")
    if recorded and recorded != spec.fingerprint:
        return _adopt(table, tables, spark, rt, batch_log, last, started)
    from pyspark.sql import functions as F

    partials, purged_at = recomputed(spark, table, tables, rt)
    batch_id = last.batch_id + 1
    # Write-ahead like any batch, with an empty input range: if the rebuild dies
    # part-way, finishing this plan reads nothing and leaves every partition at
    # a state equal to the recomputation or to its value before, never a double count.
    topic, incarnation, ends, _ = batch_log.read_position()    # an accepted reset stays accepted
    no_input = {p: (end, end) for p, end in ends.items()}
    definition = {"fingerprint": spec.fingerprint, "meaning": spec.meaning_dict()}
    batch_log.write_plan(BatchPlan(batch_id, topic, no_input, last.watermark_ms, topic_id=incarnation,
                                   definition=definition))
    registry.drop_stale_cache(spec, rt)
    pass_for(table).rebuild_stages(spark, tables, rt, last, batch_id)    # a table of tables: its rows stage
    # Partition by partition, in Spark tasks beside the state (as verify compares): the driver
    # holds the commit summaries, never the table.
    ctx = TaskContext.of(rt, table, batch_id, replica_roots=(), spec=spec, purge_watermark=purged_at,
                         from_batch=last.batch_id, window_range=window_range,
                         mirror_dir=mirror.changes_path(rt, table.name))
    rows = None if partials is None else partials.withColumn("_kind", F.lit("partial"))
    summaries = PartitionSummary.all_of(per_state_partition(
        spark, rows, table.partitions, lambda group: _rebuild_group(ctx, group), f"rebuild {name}: write"))
    commit = BatchCommit(
        batch_id=batch_id, topic=topic, topic_id=incarnation, ranges=no_input,
        changelog_offsets={p: s.changelog_offset for p, s in summaries.items()},
        digests={p: s.digest for p, s in summaries.items()},
        key_counts={p: s.key_count for p, s in summaries.items()},
        counts={"rebuild": 1, "read": 0, "keys_changed": sum(s.keys_changed for s in summaries.values()),
                "keys": sum(s.counts["keys"] for s in summaries.values()),
                **({"window_from_ms": window_range[0], "window_to_ms": window_range[1]} if window_range else {})},
        watermark_ms=last.watermark_ms, seconds=round(time.monotonic() - started, 3), definition=definition,
        joins=last.joins,               # a join of tables was rebuilt against its last pins
        changelog=spec.changelog,
    )
    batch_log.write_commit(commit, name)
    mirror.commit_changes(rt, name, batch_id)         # else the next run's start does (see _after_commit)
    log.info("rebuild %s: batch %d, %d keys, %d changed, in %.1fs", name, batch_id, commit.counts["keys"],
             commit.counts["keys_changed"], commit.seconds)
    return commit


def _rebuild_group(ctx: TaskContext, group):
    """Rebuild-task body (see engine/partition_tasks.per_state_partition): one state partition replaced by its
    recomputed rows, in the task that holds it; on a cluster worker the partition is first brought
    to the last commit from the store and the changelog, as a merge task's is."""
    import pyarrow.compute as pc

    from spark_jobs.steps.merge_task import outputs_of, partial_rows

    table = ctx.table
    p = group.column("_sp")[0].as_py()
    keys, values = partial_rows(table, group.filter(pc.equal(group.column("_kind"), "partial")))
    mine = {k: v for k, v in zip(keys, values) if kept(table, k, v, ctx.purge_watermark) and ctx.in_scope(k)}
    st = partition_here(ctx.spec, ctx.state_dir, ctx.bootstrap, ctx.snapshot_uri, p, ctx.from_batch)
    try:
        part = st.open(p)
        tx = part.begin(ctx.batch_id)
        gone = [key for key, _ in part.items() if key not in mine and ctx.in_scope(key)]
        for key in gone:
            tx.delete(key)
        for key, value in mine.items():
            tx.put(key, value)
        _mirror_changes(table, ctx.mirror_dir, ctx.batch_id, p, gone + list(mine), [None] * len(gone) + list(mine.values()))
        result = tx.commit(outputs_of(table, ctx.spec.aggregator), recount=True)
        st.snapshot(p)
        meta = part.meta
        summary = PartitionSummary(partition=p, keys_changed=result.keys_changed, changelog_offset=meta.changelog_offset,
                                   digest=format(meta.digest, "016x"), key_count=meta.key_count,
                                   counts={"keys": len(mine)})
    finally:
        st.close()
    return summary.to_table()


def _mirror_changes(table: TableDefinition, folder: str, batch_id: int, partition: int, keys: list,
                    values: list) -> None:
    """A rebuild's changed rows for the Delta mirror, as a merge task writes them; committed with
    the batch like theirs, so the mirror (and the joins that read it) follow a rebuild too."""
    mirror.write_changes(folder, table, batch_id, partition, keys, values,
                         state_spec(table).aggregator)


def _adopt(table: TableDefinition, tables: dict, spark, rt: Runtime, batch_log: BatchLog, last: BatchCommit,
           started: float) -> BatchCommit:
    """A rebuild that adopts a changed definition: the new state is built beside the old one, in a
    folder and on a changelog topic of its own, so the old state keeps serving meanwhile. The
    batch log's commit is the cut-over: before it, the old state is the table (a crash leaves
    only litter); after it, the new one is, and the local folders are swapped (a crash before
    the swap leaves a stale cache that the next writer drops and restores)."""
    import shutil
    import uuid
    from dataclasses import replace

    from state.changelog import ensure_changelog
    from state.table import StateTable

    from spark_jobs.errors import HistoryTrimmed

    name = table.name
    spec = registry.spec_of(table, rt)
    try:
        expected = recompute(spark, table, tables, rt)
    except HistoryTrimmed:
        from spark_jobs.delta.verify_chain import bronze_from_batch

        raise HistoryTrimmed(str(DefinitionChanged(name, (last.definition or {}).get("meaning"), spec.meaning_dict(),
                                                   where=f"its last batch ({last.batch_id})",
                                                   history_from=bronze_from_batch(rt, name)))) from None
    batch_id = last.batch_id + 1
    spec = replace(spec, changelog=f"{rt.namespace}{name}-changelog-{spec.fingerprint[:8]}-{uuid.uuid4().hex[:6]}")
    ensure_changelog(rt.bootstrap, spec.changelog_topic, spec.partitions)
    side = rt.state_dir / f".rebuild-{name}-{uuid.uuid4().hex[:8]}"
    st = StateTable(spec, side, bootstrap=rt.bootstrap, snapshot_uri=rt.snapshot_uri)
    summaries = {}
    # The mirror's rows of the old definition go: every key is written anew, and the others deleted.
    old_keys = {tuple(json.loads(k)) for k in mirror.committed_rows(rt, name)[1].column("key").to_pylist()}
    gone = sorted(old_keys - set(expected), key=repr)
    try:
        for p in range(spec.partitions):
            part = st.open(p)
            tx = part.begin(batch_id)
            mine = {k: v for k, v in expected.items() if st.partition_of(k) == p}
            for key, value in mine.items():
                tx.put(key, value)
            extra = gone if p == 0 else []
            _mirror_changes(table, mirror.changes_path(rt, name), batch_id, p, extra + list(mine), [None] * len(extra) + list(mine.values()))
            tx.commit()
            meta = part.meta
            summaries[p] = (meta.changelog_offset, format(meta.digest, "016x"), meta.key_count)
    finally:
        st.close()
    faults.point("rebuild.before_cutover")
    topic, incarnation, ends, _ = batch_log.read_position()
    commit = BatchCommit(
        batch_id=batch_id, topic=topic, topic_id=incarnation, ranges={p: (end, end) for p, end in ends.items()},
        changelog_offsets={p: s[0] for p, s in summaries.items()}, digests={p: s[1] for p, s in summaries.items()},
        key_counts={p: s[2] for p, s in summaries.items()},
        counts={"rebuild": 1, "adopted_definition": 1, "read": 0, "keys_changed": len(expected),
                "keys": len(expected)},
        watermark_ms=last.watermark_ms, seconds=round(time.monotonic() - started, 3),
        definition={"fingerprint": spec.fingerprint, "meaning": spec.meaning_dict()}, changelog=spec.changelog,
    )
    batch_log.write_commit(commit, name)
    faults.point("rebuild.after_cutover")
    mirror.commit_changes(rt, name, batch_id)         # else the next run's start does (see _after_commit)
    live, old = rt.state_dir / name, rt.state_dir / f".replaced-{name}-{uuid.uuid4().hex[:8]}"
    if live.exists():
        live.rename(old)
    (side / name).rename(live)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(side, ignore_errors=True)
    st = registry.state_table(table, rt)
    try:
        for p in range(spec.partitions):
            st.snapshot(p)
    finally:
        st.close()
    log.info("rebuild %s: adopted the changed definition as batch %d (%d keys, changelog %s) in %.1fs",
             name, batch_id, len(expected), spec.changelog, commit.seconds)
    return commit

