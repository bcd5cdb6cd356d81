"""The Spark task that merges one state partition's deltas for one batch.

It runs on an executor: it opens (hydrating if needed) partition p of the
table, folds in the batch's partial aggregates, commits (a no-op when the
batch was already applied, which makes task retries and job re-runs safe),
and returns the partition's commit summary and the batch's keys with their
values after the batch, for the Delta mirror.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from state import codec, faults
from state.table import StateTable
from state.windows import purge
from spark_jobs.compile import state_spec
from spark_jobs.definitions import TableDefinition
from spark_jobs.priority import yield_cpu_to_queries

PUT, DELETE, MERGE = "put", "delete", "merge"


@dataclass(frozen=True)
class MergeContext:
    table: TableDefinition
    batch_id: int
    state_dir: str
    bootstrap: str
    snapshot_uri: str
    purge_watermark: int | None = None
    namespace: str = ""
    changelog: str | None = None    # the state version's changelog topic (see jobs.spec_of)


def merge_partition(ctx: MergeContext, partition: int, rows):
    """rows: (partition, (op, key, payload)) pairs; yields ("summary", ...) then ("row", key, value)."""
    yield_cpu_to_queries()     # on a cluster the executor's workers did not inherit it from a local JVM
    # The driver created the changelog topic; tasks only use it.
    spec = state_spec(ctx.table, ctx.namespace)
    table = StateTable(replace(spec, changelog=ctx.changelog or spec.changelog), ctx.state_dir, bootstrap=ctx.bootstrap,
                       snapshot_uri=ctx.snapshot_uri, create_topics=False)
    try:
        part = table.open(partition)
        keys = []
        tx = part.begin(ctx.batch_id)
        for _, (op, key, payload) in rows:
            keys.append(key)
            if op == MERGE:
                tx.merge(key, payload)
            elif op == PUT:
                tx.put(key, payload)
            else:
                tx.delete(key)
        summary = _commit(ctx, partition, part, tx)
        values = [part.get(k) for k in keys]
        yield ("summary", partition, summary)
        for key, value in zip(keys, values):
            yield ("row", key, value)
    finally:
        table.close()


def _commit(ctx: MergeContext, partition: int, part, tx) -> dict:
    """Purge expired windows, commit the partition's batch, and summarise it for the driver."""
    purged = 0
    if ctx.purge_watermark is not None and ctx.table.window is not None:
        purged = purge(part, tx, ctx.table.window, ctx.purge_watermark)
    result = tx.commit()
    if partition == 0:
        faults.point("batch.mid_merge")
    meta = part.meta
    return {
        "noop": result.noop, "keys_changed": result.keys_changed, "changelog_offset": meta.changelog_offset,
        "digest": format(meta.digest, "016x"), "key_count": meta.key_count, "applied_batch": meta.applied_batch,
        "purged": purged, "rejected": [(list(codec.decode_key(k)), reason) for k, reason in result.rejected],
    }


SUMMARY_DDL = "summary STRING"


def _partial_values(table, column, function: str) -> list:
    """A partial column from the Arrow pass as the Python values the aggregates fold."""
    values = column.to_pylist()
    if function in ("sum",):
        return [None if v is None else _number(v) for v in values]
    if function == "avg":
        return [None if v is None else (_number(v["s"]), v["n"]) for v in values]
    if function == "count_distinct":
        return [tuple(sorted(v)) if v is not None else () for v in values]
    if function == "latest_by_offset":
        return [None if v is None else (v["o"], v["v"]) for v in values]
    if function == "topk":
        return [tuple(sorted(((e["score"], e["o"], tuple(e["typed"].values())) for e in (v or [])),
                             key=lambda e: (-e[0], e[1]))) for v in values]
    return values


def _number(v):
    import decimal

    return int(v) if isinstance(v, decimal.Decimal) else v


def _key_columns(partials) -> list[str]:
    """The key columns of the Arrow pass's partials, in order (_k0, _k1, ...; the window start last)."""
    return sorted((c for c in partials.column_names if c[:2] == "_k" and c[2:].isdigit()), key=lambda c: int(c[2:]))


def _combined(partials, table: TableDefinition):
    """Partials of one key from several Arrow batches, folded in Arrow when every aggregate is a
    plain one (count, sum, min, max, avg), so the state sees one merge per key, not one per batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    functions = [a.function for a in table.aggregates]
    if not partials.num_rows or any(f not in ("count", "sum", "min", "max", "avg") for f in functions):
        return partials
    keys = _key_columns(partials)
    flat, aggs = {k: partials.column(k) for k in keys}, []
    for i, function in enumerate(functions):
        col = partials.column(f"_a{i}")
        if function == "avg":
            flat[f"_a{i}s"], flat[f"_a{i}n"] = pc.struct_field(col, "s"), pc.struct_field(col, "n")
            aggs += [(f"_a{i}s", "sum"), (f"_a{i}n", "sum")]
        else:
            flat[f"_a{i}"] = col
            aggs.append((f"_a{i}", {"count": "sum", "sum": "sum", "min": "min", "max": "max"}[function],
                         pc.ScalarAggregateOptions(min_count=1)) if function == "sum" else
                        (f"_a{i}", {"count": "sum", "min": "min", "max": "max"}[function]))
    grouped = pa.table(flat).group_by(keys, use_threads=False).aggregate(aggs)
    out = {k: grouped.column(k) for k in keys}
    for i, function in enumerate(functions):
        if function == "avg":
            out[f"_a{i}"] = pa.StructArray.from_arrays(
                [grouped.column(f"_a{i}s_sum").combine_chunks(), grouped.column(f"_a{i}n_sum").combine_chunks()],
                names=["s", "n"])
        else:
            out[f"_a{i}"] = grouped.column(f"_a{i}_{ {'count': 'sum', 'sum': 'sum'}.get(function, function) }")
    return pa.table(out)


def merge_arrow(ctx: MergeContext, mirror_dir: str | None, group):
    """applyInArrow body: one state partition's partials of one batch (`group`, with one marker row
    so that every partition commits, even one without input). Returns the commit summary; the
    changed rows go to a Parquet file of the batch's mirror changes, never through the driver."""
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs.compile import row_of
    from spark_jobs.mirror import change_schema, write_changes

    yield_cpu_to_queries()
    clock = [time.monotonic()]
    ms: dict[str, int] = {}

    def lap(step: str) -> None:
        now = time.monotonic()
        ms[step] = round((now - clock[0]) * 1000)
        clock[0] = now

    partition = group.column("_sp")[0].as_py()
    partials = _combined(group.filter(pc.equal(group.column("_kind"), "partial")), ctx.table)
    lap("combine")
    spec = state_spec(ctx.table, ctx.namespace)
    table = StateTable(replace(spec, changelog=ctx.changelog or spec.changelog), ctx.state_dir, bootstrap=ctx.bootstrap,
                       snapshot_uri=ctx.snapshot_uri, create_topics=False)
    lap("table")
    try:
        part = table.open(partition)
        lap("open")
        keys = list(zip(*[partials.column(c).to_pylist() for c in _key_columns(partials)])) if partials.num_rows else []
        columns = [_partial_values(partials, partials.column(f"_a{i}"), a.function)
                   for i, a in enumerate(ctx.table.aggregates)]
        tx = part.begin(ctx.batch_id)
        for row, key in enumerate(keys):
            tx.merge(key, tuple(col[row] for col in columns))
        lap("fold")
        summary = {"partition": partition, **_commit(ctx, partition, part, tx)}
        lap("commit")
        changed = list(dict.fromkeys(keys))
        if mirror_dir is not None:
            aggregator = spec.aggregator
            values = [part.get(k) for k in changed]
            write_changes(mirror_dir, ctx.batch_id, partition, pa.table({
                "key": [json.dumps(list(k), default=str) for k in changed],
                "row": [json.dumps(row_of(ctx.table, k, v, aggregator), default=str) for k, v in zip(changed, values)],
                "batch_id": [ctx.batch_id] * len(changed),
                "deleted": [v is None for v in values]}, schema=change_schema()))
            lap("mirror_changes")
        summary["delta_keys"] = len(changed)
        summary["ms"] = ms
    finally:
        table.close()
    return pa.table({"summary": [json.dumps(summary, default=str)]})
