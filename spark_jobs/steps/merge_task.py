"""The Spark task that merges one state partition's deltas for one batch.

It runs on an executor: it opens (hydrating if needed) partition p of the
table, folds in the batch's partials (aggregates) or rows (source tables),
commits (a no-op when the batch was already applied, which makes task retries
and job re-runs safe), writes the changed rows for the Delta mirror, and
returns the partition's commit summary. Both passes feed it the same Arrow
shape (see `partial_rows`).
"""
from __future__ import annotations

import os
import socket
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from state import codec, faults
from state.aggregates import RowAggregator, ranked
from state.table import StateTable
from state.windows import expire_idle, merge_sessions, purge
from spark_jobs.frames.arrow_keys import LATEST, encoded_keys, encoded_latest, key_columns, latest_results
from spark_jobs.frames.arrow_fold import combine_partials
from spark_jobs.frames.arrow_pass import partials_of
from spark_jobs.steps.clock import TaskLaps
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.task_context import TaskContext
from catalog.mapping import state_spec
from catalog.runtime import task_replica_roots, task_state_dir
from catalog.definitions import TableDefinition
from catalog.priority import yield_cpu_to_queries

# Set by the worker daemon (spark_jobs/worker_daemon.py) when it has imported the pass: the time it did.
PRELOADED_ENV = "STATETABLE_WORKER_DAEMON_STARTED"


def _commit(ctx: TaskContext, partition: int, part, tx, outputs=None, touched=None) -> tuple[dict, dict, dict]:
    """Purge expired windows and keys past their TTL, commit the partition's batch, and summarise
    it for the driver; also the commit's changes (encoded key -> new bytes) and their new values
    (CommitResult.values). `outputs`: see
    Transaction.commit; `touched`: see state.windows.expire_idle."""
    purged = expired = 0
    window = ctx.table.window
    if ctx.purge_watermark is not None and window is not None and window.session:
        # judged on the merged sessions (`touched`): one this batch extended may still go
        purged = expire_idle(part, tx, ctx.table.session_last_index, window.expiry_horizon(ctx.purge_watermark),
                             touched or {})
    elif ctx.purge_watermark is not None and window is not None:
        purged = purge(part, tx, window, ctx.purge_watermark)
    if ctx.expire_before is not None and ctx.table.ttl_index is not None:
        expired = expire_idle(part, tx, ctx.table.ttl_index, ctx.expire_before, touched or {})
    result = tx.commit(outputs)
    if partition == 0:
        faults.point("batch.mid_merge")
    meta = part.meta
    return {
        "noop": result.noop, "keys_changed": result.keys_changed, "changelog_offset": meta.changelog_offset,
        "digest": format(meta.digest, "016x"), "key_count": meta.key_count, "applied_batch": meta.applied_batch,
        "purged": purged, "expired": expired,
        "rejected": tuple((list(codec.decode_key(k)), reason) for k, reason in result.rejected),
    }, result.changes, result.values


def _partial_values(column, function: str) -> list:
    """A partial column from the Arrow pass as the Python values the aggregates fold."""
    if function in ("latest_by_offset", "latest_keeping_nulls"):
        # (order, value), None when every value was skipped (o null, or the struct itself): read
        # field by field, as a struct's to_pylist builds a dict per row (q18 folds five of these).
        import pyarrow.compute as pc

        orders = pc.struct_field(column, "o").to_pylist()
        values = pc.struct_field(column, "v").to_pylist()
        return [None if o is None else (o, v) for o, v in zip(orders, values)]
    values = column.to_pylist()
    if function == "sum" and (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        return values
    # Integer sums come as DECIMAL(38,0) (see arrow_pass._sum_type) and fold as ints; a DECIMAL
    # column's sum keeps its scale, exactly.
    whole = _whole_numbers(column.type if function == "sum" else
                           column.type.field("s").type if function == "avg" else None)
    if function in ("sum",):
        return [None if v is None else _number(v, whole) for v in values]
    if function == "avg":
        return [None if v is None else (_number(v["s"], whole), v["n"]) for v in values]
    if function == "count_distinct":
        return [tuple(sorted(v)) if v is not None else () for v in values]
    if function == "topk":
        return [tuple(ranked([(e["score"], e["o"], tuple(e["typed"].values())) for e in (v or [])]))
                for v in values]
    return values


def _whole_numbers(kind) -> bool:
    return kind is not None and pa.types.is_decimal(kind) and kind.scale == 0


def _number(v, whole: bool = True):
    import decimal

    return int(v) if whole and isinstance(v, decimal.Decimal) else v


def partial_rows(table: TableDefinition, partials) -> tuple[list[tuple], list]:
    """(keys, values) of a batch's partials (an Arrow table with _k0.. and _a0.., or a source
    table's _k0, _del, _v0..): the values an aggregate table folds in with `merge`, or the rows a
    source table puts (None: the key is deleted)."""
    if not partials.num_rows:
        return [], []
    keys = list(zip(*[partials.column(c).to_pylist() for c in key_columns(partials)]))
    if "_state" in partials.column_names:       # whole states (an aggregate over a table, recomputed)
        return keys, [codec.decode_value(v) for v in partials.column("_state").to_pylist()]
    return keys, partial_values(table, partials)


def partial_values(table: TableDefinition, partials) -> list:
    """The values of `partial_rows`, without the keys."""
    if not partials.num_rows:
        return []
    if "_del" in partials.column_names:      # a table's rows (table_frames.latest_rows), not partials
        columns = [partials.column(f"_v{i}").to_pylist() for i in range(len(table.value_columns))]
        rows = list(zip(*columns))
        return [None if deleted else row for row, deleted in zip(rows, partials.column("_del").to_pylist())]
    return list(zip(*[_partial_values(partials.column(f"_a{i}"), a.function) for i, a in enumerate(table.aggregates)]))


def _latest_states(table: TableDefinition, aggregator, partials) -> list[bytes] | None:
    """The batch's partials as state bytes built column-wise (arrow_keys.encoded_latest) when
    every aggregate keeps the latest value and nothing but the commit reads the Python values
    (no window, no TTL); None otherwise."""
    if type(aggregator) is not RowAggregator or table.window is not None or table.ttl_index is not None or \
            any(f"_a{i}" not in partials.column_names for i in range(len(table.aggregates))):
        return None
    return encoded_latest(partials, [a.function for a in table.aggregates])


def _changed_rows(ctx: TaskContext, aggregator, part, partials, last: dict, changes: dict | None,
                  values: dict | None = None, raw: bool = False):
    """The rows a commit changed, as mirror.change_columns (JSON per column). A re-run of a
    committed batch (`changes` None) takes every partial key's row from the state, since the first
    run may have died before its mirror file was written. `values`: the commit's new values as
    Python (CommitResult.values), used instead of decoding their bytes again (a table of long
    strings spent a fifth of its merge there: Nexmark q18). `raw`: the partials were merged as
    LATEST_BY_OFFSET states' bytes (Transaction.merge_raw_many), so a new key's row is its
    partial's."""
    from spark_jobs.delta.mirror import change_columns

    decode, values = codec.decode_value, values or {}
    if changes is None:
        rows = list(last.values())
        decoded = [None if r is None else decode(r) for r in part.get_raw_many(list(last))]
    else:
        if raw and _shown_as_partials(ctx.table):
            # A key new to the state took its partial's bytes (Transaction.merge_raw): its row is
            # the partial's values, read from the Arrow columns. A key merged (held, or twice in
            # the partials: LATEST_BY_OFFSET's are not folded before the state) has its Python
            # value in `values`. Nothing is decoded (q18: 40% of a merge task decoded the new keys).
            fresh, merged, order = [], {}, ([], [])       # order: each row's place among the changes
            for key, row in last.items():
                if key not in changes:
                    continue
                if key in values or changes[key] is None:
                    merged[key] = row
                    order[1].append(len(fresh) + len(merged) - 1)
                else:
                    fresh.append(row)
                    order[0].append(len(fresh) + len(merged) - 1)
            take = pa.array(fresh, pa.int64())
            shown = [c.take(take) for c in latest_results(partials, [a.function for a in ctx.table.aggregates])]
            out = change_columns(ctx.table, [partials.column(c).take(take) for c in key_columns(partials)],
                                 fresh, aggregator, results=shown)
            if not merged:
                return out
            take = pa.array(list(merged.values()), pa.int64())
            both = pa.concat_tables([out, change_columns(
                ctx.table, [partials.column(c).take(take) for c in key_columns(partials)],
                [None if changes[key] is None else values[key] for key in merged], aggregator)])
            # in the partials' order, as the change topic had them
            return both.take(pc.sort_indices(pa.array(order[0] + order[1], pa.int64())))
        rows = [row for key, row in last.items() if key in changes]
        decoded = [values[key] if key in values else None if changes[key] is None else decode(changes[key])
                   for key in last if key in changes]
    take = pa.array(rows, pa.int64())
    return change_columns(ctx.table, [partials.column(c).take(take) for c in key_columns(partials)], decoded,
                          aggregator)


def _shown_as_partials(table: TableDefinition) -> bool:
    """True for a table whose rows show its LATEST_BY_OFFSET states as they are (no HAVING, no
    computed column), so that a key's row can be its partial's values."""
    return table.having is None and not table.computed and bool(table.aggregates) and \
        all(a.function in LATEST for a in table.aggregates)


def unbatched_rows(table: TableDefinition, aggregator, last: dict, changes: dict):
    """change_columns of the changed keys that are not the batch's partial keys: windows past
    retention, keys a TTL expired, sessions merged under another start or swallowed; every one
    for a rebuild, whose commit holds no partials (`last` empty)."""
    from spark_jobs.delta.mirror import change_rows

    other = {k: v for k, v in changes.items() if k not in last}
    return change_rows(table, [codec.decode_key(k) for k in other],
                       [None if v is None else codec.decode_value(v) for v in other.values()], aggregator)


def outputs_of(table: TableDefinition, aggregator):
    """Transaction.commit's `outputs` for a commit that holds no partials (a rebuild): every
    changed key, decoded from the commit's own changes. None when the table has no change topic."""
    if table.output_topic is None:
        return None

    def outputs(changes: dict) -> list:
        return change_records(table.output_topic, unbatched_rows(table, aggregator, {}, changes)) if changes else []
    return outputs


def _closed_windows(ctx: TaskContext, aggregator, part, changes: dict, swallowed: frozenset) -> list:
    """emit: final: the windows this batch closed, once each, with their final values; nothing
    for a window still open, and nothing when the batch moved no watermark."""
    from spark_jobs.delta.mirror import change_rows
    from state.windows import closing

    if ctx.closing is None or ctx.closing[1] is None:
        return []
    closed = closing(part, ctx.table.window, changes, *ctx.closing, ctx.table.session_last_index, swallowed)
    if not closed:
        return []
    keys, values = zip(*closed)
    return change_records(ctx.table.output_topic, change_rows(ctx.table, list(keys), list(values), aggregator))


def change_records(topic: str, columns) -> list[tuple[str, bytes, bytes | None]]:
    """A commit's records for the table's change topic: key = the key as a JSON object, value =
    the row as the API shows it, None (a tombstone) for a deleted key."""
    keys = columns.column("key_object").to_pylist()
    rows = columns.column("row").to_pylist()
    deleted = columns.column("deleted").to_pylist()
    return [(topic, k.encode(), None if gone else r.encode()) for k, r, gone in zip(keys, rows, deleted)]


def merge_arrow(ctx: TaskContext, mirror_dir: str | None, group):
    """Merge-task body (see engine/partition_tasks.per_state_partition): one state partition's partials of one
    batch (`group`, with one marker row so that every partition commits, even one without input).
    Returns the commit summary; the changed rows go to a Parquet file of the batch's mirror
    changes, never through the driver."""
    yield_cpu_to_queries()
    lap = TaskLaps()
    ms = lap.ms

    partition = group.column("_sp")[0].as_py()
    partials = combine_partials(partials_of(group, ctx.table), ctx.table)
    lap("combine")
    spec = state_spec(ctx.table, ctx.namespace)
    table = StateTable(replace(spec, changelog=ctx.changelog or spec.changelog), task_state_dir(ctx.state_dir),
                       bootstrap=ctx.bootstrap, snapshot_uri=ctx.snapshot_uri, create_topics=False,
                       seed_dirs=task_replica_roots(ctx.replica_roots))
    lap("table")
    try:
        hydrated = not table.has_local_state(partition)      # this worker has no copy: open restores one
        part = table.open(partition)
        lap("open")
        keys = encoded_keys(partials)
        raw = _latest_states(ctx.table, spec.aggregator, partials)
        values = partial_values(ctx.table, partials) if raw is None else None
        tx = part.begin(ctx.batch_id)
        sessions = None
        if raw is not None:                    # LATEST_BY_OFFSET states, encoded column-wise
            tx.merge_raw_many(keys, raw)
        elif spec.aggregator is None:            # a table of rows: each key replaced or deleted
            for key, value in zip(keys, values):
                if value is None:
                    tx.delete_encoded(key)
                else:
                    tx.put_encoded(key, value)
        elif ctx.table.window is not None and ctx.table.window.session:
            sessions = merge_sessions(part, tx, ctx.table.window.size_ms, ctx.table.session_last_index,
                                      spec.aggregator.merge, list(zip(map(codec.decode_key, keys), values)))
        else:
            for key, value in zip(keys, values):
                tx.merge_encoded(key, value)
        lap("fold")
        last = {key: row for row, key in enumerate(keys)}     # a key's last row, once per key
        built = {}

        def outputs(changes):
            if ctx.table.emit == "final":
                return _closed_windows(ctx, spec.aggregator, part, changes,
                                       frozenset(sessions[1]) if sessions is not None else frozenset())
            if not changes:
                return []
            built["rows"] = _changed_rows(ctx, spec.aggregator, part, partials, last, changes, tx.values,
                                          raw is not None)
            built["other"] = unbatched_rows(ctx.table, spec.aggregator, last, changes)
            return change_records(ctx.table.output_topic, built["rows"]) + \
                change_records(ctx.table.output_topic, built["other"])

        ttl = ctx.table.ttl_index
        touched = None if ttl is None else {key: value[ttl] for key, value in zip(keys, values)}
        if sessions is not None:
            touched = sessions[0]
        commit, changes, new_values = _commit(ctx, partition, part, tx, outputs if ctx.table.output_topic else None,
                                              touched)
        lap("commit")
        if mirror_dir is not None:
            from spark_jobs.delta.mirror import write_change_rows

            rows = built.get("rows") if not commit["noop"] else None
            if rows is None:
                rows = _changed_rows(ctx, spec.aggregator, part, partials, last, None if commit["noop"] else changes,
                                     new_values, raw is not None)
            if not commit["noop"] and (ctx.table.ttl_ms or sessions is not None):
                other = built.get("other")
                rows = pa.concat_tables([rows, other if other is not None else
                                         unbatched_rows(ctx.table, spec.aggregator, last, changes)])
            write_change_rows(mirror_dir, ctx.batch_id, partition, rows)
            lap("mirror_changes")
        summary = PartitionSummary(
            partition=partition, **commit, delta_keys=len(last), ms=ms,
            worker=os.environ.get(faults.WORKER_ENV) or socket.gethostname(), hydrated=hydrated,
            daemon_started=float(os.environ.get(PRELOADED_ENV) or 0),
            seeded=bool(table.restored.get(partition) and table.restored[partition].seeded_from))
    finally:
        table.close()
    return summary.to_table()
