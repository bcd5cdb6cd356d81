"""verify: compare a table's committed state with its recomputation from history, partition by
partition in Spark tasks beside the state; from the last verified checkpoint when there is one
(verify_chain).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from spark_jobs.engine.partition_tasks import per_state_partition
from spark_jobs.passes import pass_for
from spark_jobs.steps.inputs import frames_of
from catalog.runtime import Runtime
from catalog import registry
from catalog.errors import UserError

log = logging.getLogger("statetable.batch")

from spark_jobs.recompute.history import kept, partition_here, recomputed

log = logging.getLogger("statetable.verify")


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


def _compare_group(ctx, group):
    """Verify-task body (see engine/partition_tasks.per_state_partition): one state partition against its recomputed partials (a marker row
    makes every partition compare, also one the recomputation has no row for)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs.steps.merge_task import partial_rows

    from spark_jobs.delta import verify_chain

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
    expected = {k: v for k, v in zip(keys, values) if kept(table, k, v, purged_at)}
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
    st = partition_here(spec, state_dir, bootstrap, snapshot_uri, partition, batch_id, create_topics=False)
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


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def verify(name: str, spark=None, rt: Runtime | None = None, examples: int = 10, _chain: tuple = (),
           full: bool = False) -> VerifyResult:
    """Compare the table's state with a recomputation from its history: from the last verified
    checkpoint and the batches since (spark_jobs.delta.verify_chain), or from the beginning when `full`,
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
    from spark_jobs.engine import session
    from spark_jobs.delta import verify_chain

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

    from spark_jobs.delta import delta_files, delta_frames

    path = rt.delta_path(table.name, "bronze")
    found = delta_files.load(path)
    if found is None:
        return None
    frames = frames_of(spark, table, tables, rt)
    bronze = delta_frames.read(spark, path, found).where(F.col("batch_id") > F.lit(after_batch))
    commits = BatchLog(rt.batch_dir(table.name)).commits_after(after_batch)
    refused = [(c.batch_id, tuple(key)) for c in commits for key, _ in (c.refused or [])]
    return frames.partitioned(frames.partials(frames.selected(frames.joined(bronze)), exclude=refused))

