"""The batch path: recompute a table from full history with the same SQL.

History is the bronze Delta table (exactly the events the incremental path
applied, late ones excluded), or for source tables the topic itself over the
committed offsets. `verify` compares the recomputation with the state;
`rebuild` replaces the state with it as a new state version (its own batch
id, changelog records and snapshots).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field

from catalog.batch_log import BatchCommit, BatchLog, BatchPlan
from catalog.definitions import TableDefinition
from spark_jobs.partition_tasks import per_state_partition
from spark_jobs.passes import pass_for
from spark_jobs.table_frames import TableFrames
from catalog.runtime import Runtime, task_state_dir
from spark_jobs import mirror
from catalog import registry
from catalog.mapping import state_spec
from state import faults
from state.errors import DefinitionChanged
from catalog.errors import UserError

log = logging.getLogger("statetable.batch")


@dataclass
class VerifyResult:
    table: str
    batch_id: int | None
    keys_compared: int = 0
    missing: int = 0          # in the recomputation, not in the state
    unexpected: int = 0       # in the state, not in the recomputation
    different: int = 0
    digest_mismatches: list[int] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    upstream: list["VerifyResult"] = field(default_factory=list)    # the tables whose change topic it reads
    chained_from: int | None = None      # recomputed from the checkpoint verified at this batch (verify_chain)
    note: str = ""                       # why a chained verify ran in full (a refused checkpoint)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.different or self.digest_mismatches) \
            and all(u.ok for u in self.upstream)

    def summary(self) -> str:
        how = "in full" if self.chained_from is None else f"from the checkpoint verified at batch {self.chained_from}"
        head = (f"{self.table} at batch {self.batch_id} ({how}{'; ' + self.note if self.note else ''}): "
                f"{self.keys_compared} keys compared, {self.missing} missing, "
                f"{self.unexpected} unexpected, {self.different} different, digest mismatches in partitions "
                f"{self.digest_mismatches or 'none'}")
        lines = [head] + [f"  key {e['key']}: state={e['state']!r} recomputed={e['recomputed']!r}" for e in self.examples]
        lines += [f"  upstream {line}" for u in self.upstream for line in u.summary().splitlines()]
        return "\n".join(lines)


def recompute(spark, table: TableDefinition, tables: dict, rt: Runtime) -> dict[tuple, object]:
    """Every key's final state from full history, on the driver (a rebuild writes it)."""
    from spark_jobs.merge_task import partial_rows

    partials, purged_at = recomputed(spark, table, tables, rt)
    if partials is None:
        return {}
    keys, values = partial_rows(table, partials.drop("_sp").toArrow())
    return {k: v for k, v in zip(keys, values) if _kept(table, k, v, purged_at)}


def _kept(table: TableDefinition, key: tuple, value, purged_at: int | None) -> bool:
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
    return pass_for(table).recompute(TableFrames(spark, table, tables, rt), last, spark, rt)


def _compare_group(ctx, group):
    """Verify-task body (see microbatch.per_state_partition): one state partition against its recomputed partials (a marker row
    makes every partition compare, also one the recomputation has no row for)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs.merge_task import partial_rows

    from spark_jobs import verify_chain

    table, purged_at, compare, chain = ctx
    partition = group.column("_sp")[0].as_py()
    keys, values = partial_rows(table, group.filter(pc.equal(group.column("_kind"), "partial")))
    if chain is not None and chain.start is not None:
        try:
            checkpoint = verify_chain.checkpoint_table(chain.start, partition)
        except verify_chain.CheckpointCorrupt as exc:
            return pa.table({"summary": [json.dumps({"partition": partition, "checkpoint_refused": str(exc)})]})
        encoded = verify_chain.advance(checkpoint, keys, values, compare[0].aggregator.merge)
        summary = _compare_encoded(compare, partition, encoded)
        if _exact(summary):
            summary["checkpoint"] = verify_chain.write_encoded(chain.write_to, partition, encoded)
        return pa.table({"summary": [json.dumps(summary, default=str)]})
    expected = {k: v for k, v in zip(keys, values) if _kept(table, k, v, purged_at)}
    summary = _compare_partition(compare, partition, dict(expected))
    if chain is not None and _exact(summary):
        summary["checkpoint"] = verify_chain.write_partition(chain.write_to, partition, expected)
    return pa.table({"summary": [json.dumps(summary, default=str)]})


def _exact(summary: dict) -> bool:
    """A partition that verified exact: only then does what it was compared with become a checkpoint."""
    return not (summary["missing"] or summary["unexpected"] or summary["different"]) and summary["digest_ok"]


def _compare_partition(ctx, partition: int, expected: dict) -> dict:
    """One state partition against its recomputed rows, in the task that holds both."""
    examples = ctx[2]
    out = {"partition": partition, "keys_compared": 0, "missing": 0, "unexpected": 0, "different": 0,
           "digest_ok": True, "examples": []}

    def note(key, have, want, kind: str) -> None:
        out["keys_compared"] += 1
        if kind:
            out[kind] += 1
            if len(out["examples"]) < examples:
                out["examples"].append({"key": list(key), "state": have, "recomputed": want})

    for key, have in _live_items(ctx, partition, out):
        want = expected.pop(key, None)
        note(key, have, want, "unexpected" if want is None else ("" if _same(want, have) else "different"))
    for key, want in expected.items():
        note(key, None, want, "missing")
    return out


def _live_items(ctx, partition: int, out: dict, raw: bool = False):
    """The partition's live rows as this task's host holds them, decoded or as stored; sets
    out["digest_ok"] from a scan of the same store."""
    spec, state_dir, _, bootstrap, snapshot_uri, batch_id = ctx
    st = _partition_here(spec, state_dir, bootstrap, snapshot_uri, partition, batch_id, create_topics=False)
    try:
        if st.has_local_state(partition):
            part = st.open_readonly(partition)
            try:
                if raw:           # one scan for the digest and the compare
                    rows = list(part.raw_items())
                    out["digest_ok"] = bool(part.verify(rows)[0])
                    yield from rows
                else:
                    out["digest_ok"] = bool(part.verify()[0])
                    yield from part.items()
            finally:
                part.close()
    finally:
        st.close()


def _compare_encoded(ctx, partition: int, expected) -> dict:
    """`_compare_partition` against an expected state still encoded (an Arrow table of key and
    value bytes): keys are matched and values compared as bytes in Arrow, and only the rows whose
    bytes differ are decoded (equal values may encode differently, a float summed in another
    order), so Python's work grows with the differences, not with the table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from state import codec

    examples = ctx[2]
    out = {"partition": partition, "keys_compared": 0, "missing": 0, "unexpected": 0, "different": 0,
           "digest_ok": True, "examples": []}
    rows = list(_live_items(ctx, partition, out, raw=True))
    keys, values = [k for k, _ in rows], [v for _, v in rows]
    live_keys, live_values = pa.array(keys, pa.binary()), pa.array(values, pa.binary())
    want_keys, want_values = expected.column("key"), expected.column("value")
    at = pc.index_in(live_keys, value_set=want_keys)
    want = want_values.take(at)
    suspects = pc.indices_nonzero(pc.fill_null(pc.not_equal(live_values, want), True)).to_pylist()
    missing = pc.indices_nonzero(pc.invert(pc.is_in(want_keys, value_set=live_keys))).to_pylist()
    out["keys_compared"] = len(keys) + len(missing)

    def note(key: bytes, have: bytes | None, wanted: bytes | None, kind: str) -> None:
        out[kind] += 1
        if len(out["examples"]) < examples:
            out["examples"].append({"key": list(codec.decode_key(key)),
                                    "state": None if have is None else codec.decode_value(have),
                                    "recomputed": None if wanted is None else codec.decode_value(wanted)})

    for i in suspects:
        wanted = want[i].as_py()
        if wanted is None:
            note(keys[i], values[i], None, "unexpected")
        elif not _same(codec.decode_value(wanted), codec.decode_value(values[i])):
            note(keys[i], values[i], wanted, "different")
    for i in missing:
        note(want_keys[i].as_py(), None, want_values[i].as_py(), "missing")
    return out


def _partition_here(spec, state_dir: str, bootstrap: str, snapshot_uri: str, partition: int, batch_id: int | None,
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


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def verify(name: str, spark=None, rt: Runtime | None = None, examples: int = 10, _chain: tuple = (),
           full: bool = False) -> VerifyResult:
    """Compare the table's state with a recomputation from its history: from the last verified
    checkpoint and the batches since (spark_jobs.verify_chain), or from the beginning when `full`,
    when there is no checkpoint, or when its chain began a week ago. A table that reads another
    table's change topic is verified after that table, upstream first: its own recomputation is
    only as good as the topic it reads."""
    rt = rt or Runtime.from_env()
    table, tables = registry.load_table(name, rt)
    upstream = [verify(t.name, spark, rt, examples, _chain + (name,), full)
                for t in sorted(tables.values(), key=lambda t: t.name)
                if t.output_topic and t.output_topic == table.topic and t.name not in _chain + (name,)]
    with registry.table_lock(name, rt):
        result = _verify(name, spark, rt, examples, full)
    result.upstream = upstream
    return result


def _verify(name: str, spark, rt: Runtime, examples: int, full: bool = False) -> VerifyResult:
    from spark_jobs import session, verify_chain

    started = time.monotonic()
    table, tables = registry.load_table(name, rt)
    batch_log = BatchLog(rt.batch_dir(table.name))
    pending = batch_log.pending_plan()
    if pending is not None:
        raise UserError(f"table {name!r} has an unfinished batch {pending.batch_id}; "
                        f"finish it (`statetable run {name}`) before verifying")
    last = batch_log.last_commit()
    result = VerifyResult(table.name, last.batch_id if last else None)
    spec = registry.spec_of(table, rt)
    # The chain first: a verify that trimmed history refuses answers before a Spark driver starts.
    chain = verify_chain.plan(rt, table, spec.fingerprint, result.batch_id, full, pass_for(table).chains_verify())
    spark = spark or session.get_or_create(f"statetable-verify-{name}")
    # Partition by partition, in Spark tasks beside the state: the driver holds only the summaries.
    compare = (spec, str(rt.state_dir), examples, rt.bootstrap, rt.snapshot_uri, result.batch_id)
    summaries = _compare_all(spark, table, tables, rt, compare, chain)
    refused = sorted({s["checkpoint_refused"] for s in summaries.values() if s.get("checkpoint_refused")})
    if refused:
        result.note = (f"the checkpoint verified at batch {chain.start['batch_id']} was refused ({'; '.join(refused)}), "
                       f"so this verify recomputed from the beginning")
        log.warning("verify %s: %s", name, result.note)
        chain = verify_chain.Chain(None, chain.write_to)
        summaries = _compare_all(spark, table, tables, rt, compare, chain)
    result.chained_from = chain.start["batch_id"] if chain is not None and chain.start else None
    for p, s in sorted(summaries.items()):
        result.keys_compared += s["keys_compared"]
        result.missing += s["missing"]
        result.unexpected += s["unexpected"]
        result.different += s["different"]
        if not s["digest_ok"]:
            result.digest_mismatches.append(p)
        result.examples.extend(s["examples"][:max(0, examples - len(result.examples))])
    if chain is not None:
        files = {p: s["checkpoint"] for p, s in summaries.items() if s.get("checkpoint")}
        if result.ok and len(files) == table.partitions:
            verify_chain.record(rt, name, chain, result.batch_id, spec.fingerprint, files)
        else:
            verify_chain.discard(chain)
    result.seconds = round(time.monotonic() - started, 3)
    log.info("verify %s", result.summary())
    return result


def _compare_all(spark, table: TableDefinition, tables: dict, rt: Runtime, compare: tuple, chain) -> dict:
    """Every partition compared in its own task: against a recomputation from the beginning, or
    (a chain with a start) from the checkpoint plus bronze's batches after it."""
    from pyspark.sql import functions as F

    if chain is not None and chain.start is not None:
        partials, purged_at = _partials_since(spark, table, tables, rt, chain.start["batch_id"]), None
    else:
        partials, purged_at = recomputed(spark, table, tables, rt)
    ctx = (table, purged_at, compare, chain)
    rows = None if partials is None else partials.withColumn("_kind", F.lit("partial"))
    return per_state_partition(spark, rows, table.partitions, lambda group: _compare_group(ctx, group),
                               f"verify {table.name}: compare")


def _partials_since(spark, table: TableDefinition, tables: dict, rt: Runtime, after_batch: int):
    """The partials of bronze's batches after `after_batch`, as the batches applied them (WHERE,
    refused keys left out), with their state partitions; None when bronze holds none."""
    from pyspark.sql import functions as F

    from spark_jobs import delta_files

    path = rt.delta_path(table.name, "bronze")
    if not delta_files.exists(path):
        return None
    frames = TableFrames(spark, table, tables, rt)
    bronze = spark.read.format("delta").load(path).where(F.col("batch_id") > F.lit(after_batch))
    commits = BatchLog(rt.batch_dir(table.name)).commits_after(after_batch)
    refused = [(c.batch_id, tuple(key)) for c in commits for key, _ in (c.refused or [])]
    return frames.partitioned(frames.partials(frames.selected(frames.joined(bronze)), exclude=refused))


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
    from spark_jobs import session

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
    ctx = _RebuildContext(table, spec, str(rt.state_dir), rt, last.batch_id, batch_id, purged_at, window_range)
    rows = None if partials is None else partials.withColumn("_kind", F.lit("partial"))
    summaries = per_state_partition(spark, rows, table.partitions, lambda group: _rebuild_group(ctx, group),
                                    f"rebuild {name}: write")
    commit = BatchCommit(
        batch_id=batch_id, topic=topic, topic_id=incarnation, ranges=no_input,
        changelog_offsets={p: s["changelog_offset"] for p, s in summaries.items()},
        digests={p: s["digest"] for p, s in summaries.items()},
        key_counts={p: s["key_count"] for p, s in summaries.items()},
        counts={"rebuild": 1, "read": 0, "keys_changed": sum(s["keys_changed"] for s in summaries.values()),
                "keys": sum(s["keys"] for s in summaries.values()),
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


@dataclass(frozen=True)
class _RebuildContext:
    table: TableDefinition
    spec: object
    state_dir: str
    rt: Runtime
    last_batch: int
    batch_id: int
    purged_at: int | None
    window_range: tuple[int, int] | None

    def in_scope(self, key: tuple) -> bool:
        return self.window_range is None or self.window_range[0] <= key[-1] < self.window_range[1]


def _rebuild_group(ctx: _RebuildContext, group):
    """Rebuild-task body (see microbatch.per_state_partition): one state partition replaced by its
    recomputed rows, in the task that holds it; on a cluster worker the partition is first brought
    to the last commit from the store and the changelog, as a merge task's is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs.merge_task import outputs_of, partial_rows

    table, rt = ctx.table, ctx.rt
    p = group.column("_sp")[0].as_py()
    keys, values = partial_rows(table, group.filter(pc.equal(group.column("_kind"), "partial")))
    mine = {k: v for k, v in zip(keys, values) if _kept(table, k, v, ctx.purged_at) and ctx.in_scope(k)}
    st = _partition_here(ctx.spec, ctx.state_dir, rt.bootstrap, rt.snapshot_uri, p, ctx.last_batch)
    try:
        part = st.open(p)
        tx = part.begin(ctx.batch_id)
        gone = [key for key, _ in part.items() if key not in mine and ctx.in_scope(key)]
        for key in gone:
            tx.delete(key)
        for key, value in mine.items():
            tx.put(key, value)
        _mirror_changes(table, rt, ctx.batch_id, p, gone + list(mine), [None] * len(gone) + list(mine.values()))
        result = tx.commit(outputs_of(table, ctx.spec.aggregator), recount=True)
        st.snapshot(p)
        meta = part.meta
        summary = {"partition": p, "keys_changed": result.keys_changed, "changelog_offset": meta.changelog_offset,
                   "digest": format(meta.digest, "016x"), "key_count": meta.key_count, "keys": len(mine)}
    finally:
        st.close()
    return pa.table({"summary": [json.dumps(summary)]})


def _mirror_changes(table: TableDefinition, rt: Runtime, batch_id: int, partition: int, keys: list,
                    values: list) -> None:
    """A rebuild's changed rows for the Delta mirror, as a merge task writes them; committed with
    the batch like theirs, so the mirror (and the joins that read it) follow a rebuild too."""
    mirror.write_changes(mirror.changes_path(rt, table.name), table, batch_id, partition, keys, values,
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
        from spark_jobs.verify_chain import bronze_from_batch

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
            _mirror_changes(table, rt, batch_id, p, extra + list(mine), [None] * len(extra) + list(mine.values()))
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
