"""The Spark task that merges one state partition's deltas for one batch.

It runs on an executor: it opens (hydrating if needed) partition p of the
table, folds in the batch's partial aggregates, commits (a no-op when the
batch was already applied, which makes task retries and job re-runs safe),
and returns the partition's commit summary and the batch's keys with their
values after the batch, for the Delta mirror.
"""
from __future__ import annotations

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
        purged = 0
        if ctx.purge_watermark is not None and ctx.table.window is not None:
            purged = purge(part, tx, ctx.table.window, ctx.purge_watermark)
        result = tx.commit()
        if partition == 0:
            faults.point("batch.mid_merge")
        values = [part.get(k) for k in keys]
        meta = part.meta
        yield ("summary", partition, {
            "noop": result.noop, "keys_changed": result.keys_changed, "changelog_offset": meta.changelog_offset,
            "digest": format(meta.digest, "016x"), "key_count": meta.key_count, "applied_batch": meta.applied_batch,
            "purged": purged, "rejected": [(list(codec.decode_key(k)), reason) for k, reason in result.rejected],
        })
        for key, value in zip(keys, values):
            yield ("row", key, value)
    finally:
        table.close()
