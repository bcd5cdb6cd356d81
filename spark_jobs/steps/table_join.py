"""A join of two tables (`CREATE TABLE t AS SELECT ... FROM a [LEFT] JOIN b ON a.fk = b.id`): a row
per row of `a`, keyed by a's key, with the columns of b's row whose key is a's `fk` (a foreign-key
join, Kafka Streams' KIP-213; `ON a.id = b.id` is the primary-key join). An inner join has no row
where b has none; a left join shows b's columns as NULL.

A batch reads a's records in its plan's ranges, and joins b's committed state pinned in the plan
(as a stream-table join does, planning.pin_joins); b's changes since the previous batch's
pin are the keys whose rows differ between the two pinned files. One task per partition of a's
keys then:

1. rows stage (`<t>.rows`): a's new rows by key, and an index (INDEX, fk, a-key) so that a change of
   b's row `fk` finds the a-rows that point at it (Kafka Streams' subscription store), committed
   at the batch id;
2. the affected keys, a's changed keys plus those the index finds for b's changed keys, get their
   row again from the rows stage and the pinned b, committed to the table's own state with its
   change topic and mirror changes.

Step 2 reads only what step 1 leaves, whether or not step 1 ran in this attempt, so a re-run of a
partition that died between them writes the same rows.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp

from catalog.definitions import TableDefinition, input_definition
from catalog.mapping import compiled, rows_spec, state_spec
from catalog.runtime import arrow_filesystem
from state import codec, faults
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.clock import StepClock, TaskLaps
from spark_jobs.steps.table_stages import INDEX, ROWS_BY_FK, a_rows_filter, a_rows_kept, input_history, open_stage, read_input, summary
from spark_jobs.frames.arrow_blobs import rows_of
from spark_jobs.frames.arrow_rows import latest_per_key
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.task_context import TaskContext

log = logging.getLogger(__name__)



class JoinShape:
    """Where each output column comes from, and which of a's columns points at b."""

    def __init__(self, table: TableDefinition, left: TableDefinition, right: TableDefinition) -> None:
        join = table.joins[0]
        self.inner = join.kind == "inner"
        self.fk = left.value_columns.index(join.stream_column.split(".")[-1])
        self.picks = [self._pick(table, left, right, qualified) for qualified, _ in table.join_columns]
        self._no_b = (None,) * len(right.value_columns)        # a left join's missing b: every column NULL
        self.where, self.where_picks = None, []
        if table.where:
            names = {f"{alias}.{c}" for alias, side in ((table.stream_alias, left), (join.alias, right))
                     for c in side.value_columns}
            self.where = compiled("compile_predicate", table.where, names)
            referenced = {c.name for c in sqlglot.parse_one(table.where, dialect="spark").find_all(exp.Column)}
            self.where_picks = [(name, *self._pick(table, left, right, name)) for name in sorted(referenced)]

    @staticmethod
    def _pick(table: TableDefinition, left: TableDefinition, right: TableDefinition, qualified: str) -> tuple:
        """("a" or "b", the column's place in that side's rows) of `alias.column`."""
        alias, column = qualified.split(".")
        side = "a" if alias == table.stream_alias else "b"
        return side, (left if side == "a" else right).value_columns.index(column)

    def row(self, a_row: tuple | None, b_rows: dict) -> tuple | None:
        """The joined row of one a-row (None: no row: a has none, an inner join found no b, or
        the WHERE does not pass)."""
        if a_row is None:
            return None
        fk = a_row[self.fk]
        b_row = None if fk is None else b_rows.get(fk)
        if b_row is None:
            if self.inner:
                return None
            b_row = self._no_b
        if self.where is not None and not self.where(
                {name: (a_row if side == "a" else b_row)[i] for name, side, i in self.where_picks}):
            return None
        return tuple((a_row if side == "a" else b_row)[i] for side, i in self.picks)


_PINNED: dict[str, dict] = {}      # pinned file -> b's rows by key, once per worker process


def pinned_rows(folder: str | None, file: str | None, right: TableDefinition) -> dict:
    """b's rows by key, as pinned in `file` of the batch log's joins folder (None: b had no batch)."""
    if file is None or folder is None:
        return {}
    path = f"{folder}/{file}"
    if path not in _PINNED:
        import pyarrow.parquet as pq

        fs, root = arrow_filesystem(path)
        frame = pq.read_table(root, filesystem=fs)
        stored = [_as_stored(frame.column(c)) for c in right.value_columns]
        columns = [c.to_pylist() for c in stored]
        key = right.value_columns.index(right.key_columns[0])
        # Ints, strings, booleans and doubles read back from the codec as they went in: only a
        # row with other values needs the round trip (q3: 40,000 people, in every worker).
        plain = all(_plain_type(c.type) for c in stored)
        rows = {row[key]: row for row in zip(*columns)} if plain else {row[key]: _stored(row) for row in zip(*columns)}
        if len(_PINNED) > 8:
            _PINNED.clear()
        _PINNED[path] = rows
    return _PINNED[path]


def _as_stored(column):
    """A pinned column as the state holds its values: a TIMESTAMP as epoch milliseconds, a DATE as
    days since 1970 (the codec stores numbers; a datetime it cannot, and the batch failed on the
    first b with a TIMESTAMP column)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("ms", column.type.tz)).cast(pa.int64())
    if pa.types.is_date32(column.type):
        return column.cast(pa.int32())
    return column


def _plain(partials, width: int) -> bool:
    """Whether a's rows (`_v0`..) hold only values the codec reads back unchanged."""
    return all(_plain_type(partials.column(f"_v{i}").type) for i in range(width))


def _plain_type(kind) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind) \
        or pa.types.is_boolean(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)


def _stream_rows_put(tx, partials: pa.Table, shape: JoinShape) -> bool:
    """A stream's rows, each in its index entry (ROWS_BY_FK, fk, position) -> row, put as bytes
    built column by column (arrow_keys.encoded_keys, encoded_values), where the per-row codec
    cost a q20 task of 460,000 bids ~1.8 s. A row whose fk is NULL joins no b, ever: it is not
    kept. False, and nothing put, when a column needs the per-row codec or a row is a delete."""
    import pyarrow.compute as pc

    from spark_jobs.frames.arrow_keys import encoded_keys, encoded_values

    if not partials.num_rows:
        return True
    if pc.any(partials.column("_del")).as_py():
        return False
    values = encoded_values(partials.select(_value_names(partials)))
    if values is None:
        return False
    fk = partials.column(f"_v{shape.fk}")
    has = pc.is_valid(fk)
    kept = int(pc.sum(has.cast(pa.int64())).as_py() or 0)
    index = pa.table({"_k0": pa.repeat(pa.scalar(ROWS_BY_FK), kept).cast(pa.string()),
                      "_k1": fk.filter(has), "_k2": partials.column("_k0").filter(has)})
    tx.put_raw_many(encoded_keys(index), values if kept == partials.num_rows else
                    [v for v, h in zip(values, has.to_pylist()) if h])
    return True


def _value_names(partials: pa.Table) -> list[str]:
    return [c for c in partials.column_names if c[:2] == "_v" and c[2:].isdigit()]


def _put_rows(tx, part_rows, partials: pa.Table, keys: list, rows: list, shape: JoinShape, stream: bool) -> None:
    """The rows stage's step of a batch: each changed a-row and its index entry. A stream's rows
    are new positions, never changed, so there is no old row to read and one entry each."""
    if stream and _stream_rows_put(tx, partials, shape):
        return
    decode = codec.decode_value
    olds = [None] * len(keys) if stream else part_rows.get_raw_many(keys)
    for key, old, new in zip(keys, olds, rows):
        old = None if old is None else decode(old)
        if old == new:
            continue
        a_key = codec.decode_key(key)[0]
        old_fk, new_fk = (None if r is None else r[shape.fk] for r in (old, new))
        if stream:
            if new_fk is not None:
                tx.put((ROWS_BY_FK, new_fk, a_key), new)
            continue
        if old_fk is not None and old_fk != new_fk:
            tx.delete((INDEX, old_fk, a_key))
        if new_fk is not None and new_fk != old_fk:
            tx.put((INDEX, new_fk, a_key), ())
        if new is None:
            tx.delete_encoded(key)
        else:
            tx.put_encoded(key, new)


def indexed(part_rows, changed_b: list) -> dict:
    """The a-rows that point at b's changed keys, through the index: a-key -> its row where the
    entry holds it (a stream's, ROWS_BY_FK), else None (read it by its key). A seek each, or,
    when b's changed keys are many beside what the stage holds (a first batch: every key of b is
    new), one pass over the index (q3's first batch: 40,000 seeks in each task)."""
    found: dict = {}
    if len(changed_b) * 4 >= part_rows.meta.key_count:
        wanted = set(changed_b)
        found.update((key[2], None) for key, _ in part_rows.items(prefix=(INDEX,)) if key[1] in wanted)
        for raw_key, raw in part_rows.raw_items(prefix=(ROWS_BY_FK,)):
            key = codec.decode_key(raw_key)
            if key[1] in wanted:
                found[key[2]] = codec.decode_value(raw)
        return found
    for fk in changed_b:
        found.update((key[2], None) for key, _ in part_rows.items(prefix=(INDEX, fk)))
        found.update((key[2], row) for key, row in part_rows.items(prefix=(ROWS_BY_FK, fk)))
    return found


def _batch_side(fk, shape: JoinShape, b_rows: dict, width: int) -> dict | None:
    """The b rows a batch's stream rows point at (their distinct foreign keys, so the cost grows
    with the batch, not with b), as Arrow columns for joining the rows column by column: their
    keys, their columns as the state stores them, whether each passes the WHERE, and whether a
    left join's missing b does. None when the WHERE reads a's columns too (judged row by row) or
    a column of b's is not one Arrow can hold as it is."""
    import pyarrow.compute as pc

    if shape.where is not None and any(side == "a" for _, side, _ in shape.where_picks):
        return None
    distinct = pc.unique(pc.drop_null(fk))
    wanted = [k for k in distinct.to_pylist() if k in b_rows]
    rows = [b_rows[k] for k in wanted]
    try:
        keys = pa.array(wanted, distinct.type)
        columns = [pa.array([r[i] for r in rows]) if rows else pa.array([], pa.null()) for i in range(width)]
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None

    def passes(b_row) -> bool:
        return shape.where is None or bool(shape.where({name: b_row[i] for name, _, i in shape.where_picks}))

    return {"keys": keys, "columns": columns, "ok": pa.array([passes(r) for r in rows], pa.bool_()),
            "missing_ok": not shape.inner and passes(shape._no_b)}


def _own_rows_joined(tx, partials: pa.Table, keys: list[bytes], shape: JoinShape, side: dict | None):
    """A stream's own rows of this batch joined column by column (q20: a Python row a bid cost a
    task of 460,000 bids 6 s): each row's b found by its fk (pyarrow index_in), the WHERE taken
    from b's row, the joined rows' bytes built in Arrow and put; the rows that join nothing
    deleted (a re-run after a half-done attempt). Returns the joined rows (JoinedRows), or None,
    and nothing done, where a row or a column needs the per-row path."""
    import pyarrow.compute as pc

    from spark_jobs.frames.arrow_keys import encoded_values

    if side is None or not partials.num_rows or pc.any(partials.column("_del")).as_py():
        return None
    fk = partials.column(f"_v{shape.fk}")
    try:
        found = pc.index_in(fk, value_set=side["keys"]) if len(side["keys"]) else pa.nulls(len(fk), pa.int32())
        columns = [partials.column(f"_v{i}") if where == "a" else side["columns"][i].take(found)
                   for where, i in shape.picks]
    except (pa.ArrowException, TypeError, ValueError):
        return None
    joined = pc.fill_null(side["ok"].take(found) if len(side["keys"]) else pa.nulls(len(fk), pa.bool_()), False)
    if side["missing_ok"]:
        joined = pc.or_(joined, pc.is_null(found))
    out = pa.table({f"c{i}": c for i, c in enumerate(columns)}).filter(joined)
    values = encoded_values(out)
    if values is None:
        return None
    flags = joined.to_pylist()
    put = [k for k, j in zip(keys, flags) if j]
    tx.put_raw_many(put, values)
    for key, j in zip(keys, flags):
        if not j:
            tx.delete_encoded(key)
    return JoinedRows(put, partials.column("_k0").filter(joined), out)


@dataclass
class JoinedRows:
    """A batch's own rows joined column by column: their encoded keys, their keys and their
    columns (the table's value columns, in order), for their change rows without a decode."""
    encoded: list[bytes]
    keys: object
    columns: pa.Table

    def change_rows(self, table: TableDefinition, changes: dict):
        """The mirror's change rows of a commit (mirror.change_columns): these rows' from their
        columns (those the commit changed), any other change's decoded (merge_task.unbatched_rows)."""
        from spark_jobs.delta.mirror import change_columns
        from spark_jobs.steps.merge_task import unbatched_rows

        changed = pa.array([k in changes for k in self.encoded], pa.bool_())
        mine = set(self.encoded)
        keys = self.keys.filter(changed)
        shown = change_columns(table, [keys], [()] * len(keys), None,
                               results=[c.filter(changed) for c in self.columns.columns])
        rest = {k: v for k, v in changes.items() if k not in mine}
        return pa.concat_tables([shown, unbatched_rows(table, None, {}, rest)]) if rest else shown


def _stored(row: tuple) -> tuple:
    """A pinned row as the state stores rows (the codec's round trip: what a-rows read back as)."""
    return codec.decode_value(codec.encode_value(row))


def merge_join(ctx: TaskContext, pins: dict, changed_b: list, mirror_dir: str | None, group) -> pa.Table:
    """One partition of a's keys: the rows stage, then the affected rows (see the module's docstring)."""
    from spark_jobs.frames.arrow_keys import encoded_keys
    from spark_jobs.steps.merge_task import unbatched_rows, outputs_of, partial_values
    from spark_jobs.delta.mirror import write_change_rows

    lap = TaskLaps()
    ms = lap.ms

    partition = group.column("_sp")[0].as_py()
    stream = ctx.source.stream
    partials = latest_per_key(rows_of(group), unique=stream)
    right = ctx.table.joins[0].table
    shape = JoinShape(ctx.table, ctx.source, pins["right"])
    b_rows = pinned_rows(pins.get("folder"), pins.get("file"), pins["right"])
    kept = a_rows_kept(ctx.table, ctx.source)
    # A stream's rows of plain values, with no a-only WHERE part to judge row by row, go through
    # both stages as Arrow columns; their Python rows are built only if a step needs them.
    columnar = stream and kept is None and partials.num_rows > 0 and _plain(partials, len(ctx.source.value_columns))
    keys = encoded_keys(partials)
    rows = [] if columnar else partial_values(ctx.source, partials)
    # An a-row that fails the WHERE's a-only part has no joined row: it is a deleted row to the
    # stage, and a stream's such records are left out at once (they were never stored).
    if kept is not None:
        rows = [None if r is None or not kept(r) else r for r in rows]
        if stream:
            partials = partials.filter(pa.array([r is not None for r in rows], pa.bool_()))
            keys, rows = [k for k, r in zip(keys, rows) if r is not None], [r for r in rows if r is not None]
    lap("rows_of")
    rows_tables, part_rows, hydrated = open_stage(rows_spec(ctx.table, ctx.namespace), ctx, partition)
    try:
        lap("open_rows")
        tx = part_rows.begin(ctx.batch_id)
        if part_rows.meta.applied_batch < ctx.batch_id:
            if columnar and not rows and not _stream_rows_put(tx, partials, shape):
                rows = partial_values(ctx.source, partials)
            if rows:
                _put_rows(tx, part_rows, partials, keys, rows, shape, stream)
        # A stage that held nothing before this batch indexes only this batch's own keys, affected
        # already (q20's first batch: a pass over 460,000 entries, 1.5 s a task, for none).
        held_before = part_rows.meta.key_count
        lap("rows_put")
        rows_result = tx.commit()
        lap("rows_commit")
        if partition == 0:
            faults.point("rows.after_commit")
        own = partials.column("_k0").to_pylist() if stream and keys else [codec.decode_key(k)[0] for k in keys]
        found = indexed(part_rows, changed_b) if held_before else {}
        # A stream's own rows are this batch's records, the same on every run of it: as read, not
        # read back (the codec's round trip, as the stored ones). Anything else is read back.
        # Rows of ints, strings, booleans and doubles come back from the codec as they go in: no
        # round trip for them (q20: 2.2 s of a 460,000-bid task).
        own_set = set(own) if stream else set()
        if not stream:
            a_rows = {}
        elif columnar:
            a_rows = {}         # joined column by column below, or made rows there
        elif not rows or _plain(partials, len(ctx.source.value_columns)):
            a_rows = dict(zip(own, rows))
        else:
            a_rows = {k: None if r is None else _stored(r) for k, r in zip(own, rows)}
        others = [k for k in (found.keys() | (set() if stream else set(own))) if k not in own_set]
        a_rows.update((k, found[k]) for k in others if found.get(k) is not None)
        unread = [k for k in others if found.get(k) is None]
        raw = part_rows.get_raw_many([codec.encode_key((k,)) for k in unread])
        a_rows.update((k, None if r is None else codec.decode_value(r)) for k, r in zip(unread, raw))
        lap("affected")
    finally:
        rows_tables.close()
    spec = state_spec(ctx.table, ctx.namespace)
    from dataclasses import replace

    spec = replace(spec, changelog=ctx.changelog or spec.changelog)
    table, part, _ = open_stage(spec, ctx, partition)
    try:
        lap("open")
        tx = part.begin(ctx.batch_id)
        joined_own = _own_rows_joined(tx, partials, keys, shape, _batch_side(
            partials.column(f"_v{shape.fk}"), shape, b_rows, len(pins["right"].value_columns))) if columnar else None
        if columnar and joined_own is None:
            a_rows.update(zip(own, rows or partial_values(ctx.source, partials)))
        for a_key, a_row in a_rows.items():
            joined = shape.row(a_row, b_rows)
            if joined is None:
                tx.delete((a_key,))
            else:
                tx.put((a_key,), joined)
        lap("join")
        result = tx.commit(outputs_of(ctx.table, None))
        lap("commit")
        if partition == 0:
            faults.point("batch.mid_merge")
        if mirror_dir is not None:
            changed = result.changes
            if result.noop:         # a re-run of a committed batch: every key it touched, as stored
                encoded = keys + [codec.encode_key((k,)) for k in a_rows if k not in own_set] if columnar else \
                    [codec.encode_key((k,)) for k in a_rows]
                changed = dict(zip(encoded, part.get_raw_many(encoded)))
            shown_as_columns = joined_own is not None and not result.noop and not ctx.table.computed \
                and ctx.table.having is None
            write_change_rows(mirror_dir, ctx.batch_id, partition, joined_own.change_rows(ctx.table, changed)
                              if shown_as_columns else unbatched_rows(ctx.table, None, {}, changed or {}))
            lap("mirror_changes")
        return summary(partition, part, result, ms, hydrated, delta_keys=len(keys), rows_changed=rows_result.keys_changed,
                        affected=len(own_set | a_rows.keys()), joined=right,
                        by_columns=0 if joined_own is None else partials.num_rows)
    finally:
        table.close()


def changed_keys(old: dict, new: dict) -> list:
    """b's keys whose row differs between two pinned states (added, changed or deleted)."""
    return sorted((k for k in set(old) | set(new) if old.get(k) != new.get(k)), key=lambda k: codec.encode_key((k,)))


def run(table_run, plan, started: float) -> BatchStep:
    """One batch of a join of tables (passes.table_join): a's records in the plan's ranges
    (its source-table pass, dead letters as a source table's), b's changes between its pins, and
    one merge task per partition."""
    from pyspark.sql import functions as F

    from spark_jobs.delta import mirror
    from spark_jobs.engine.partition_tasks import per_state_partition

    table, rt, spark = table_run.table, table_run.rt, table_run.spark
    source = input_definition(table, table_run.tables)
    right = table_run.tables[table.joins[0].table]
    clock = StepClock(table_run, plan.batch_id, started)
    kept = a_rows_filter(table, source) if source.stream else None
    # A stream's rows go as blobs, unless Spark filters them first (a WHERE on a's own fields)
    read = read_input(table_run, plan, clock, source, blobs=source.stream and kept is None)

    folder = table_run.frames.inputs.pinned_folder
    pin = (plan.joins or {}).get(right.name, {})
    since = pin.get("since_file")
    b_now = pinned_rows(folder, pin.get("file"), right)
    changed_b = [] if pin.get("since") == pin.get("batch") and since is not None \
        else changed_keys(pinned_rows(folder, since, right), b_now)
    pins = {"folder": folder, "file": pin.get("file"), "right": right}
    ctx = TaskContext.of(rt, table, plan.batch_id, source=source, changelog=table_run.spec.changelog)
    mirror_dir = mirror.changes_path(rt, table.name)
    with clock.step("join", "batch.after_rows", "batch.after_merge"):
        rows = read.rows
        if kept is not None:        # a stream's record that cannot join is no row of a's either
            rows = rows.where(kept)
        rows = rows.withColumn("_kind", F.lit("partial"))
        summaries = PartitionSummary.all_of(per_state_partition(
            spark, rows, table.partitions, lambda group: merge_join(ctx, pins, changed_b, mirror_dir, group),
            f"{table.name} batch {plan.batch_id}: join"))
        read.persisted.unpersist()
    steps = clock.seconds
    slowest = max(summaries.values(), key=lambda s: sum(s.ms.values())).ms if summaries else {}
    log.info("%s batch %d: %d rows of %s changed, %d keys of %s changed (its batch %s); %d joined rows rewritten, "
             "%d changed, in %.1fs; the slowest task's ms: %s", table.name, plan.batch_id,
             sum(s.counts["rows_changed"] for s in summaries.values()), source.name, len(changed_b), right.name,
             pin.get("batch"), sum(s.counts["affected"] for s in summaries.values()),
             sum(s.keys_changed for s in summaries.values()), steps["join"], slowest)
    return BatchStep(reasons=read.reasons, read=read.read, dead=read.dead, summaries=summaries,
                     delta_keys=sum(s.delta_keys for s in summaries.values()), steps=steps,
                     extra={"joined_keys_changed": len(changed_b),
                            # the stream's records joined column by column, not row by row
                            "rows_joined_by_columns": sum(s.counts.get("by_columns", 0) for s in summaries.values())})


def recomputed(frames, rt, last):
    """Every joined row from a's whole history up to the last commit and b as that batch pinned it
    (verify, rebuild): rows with `_sp`, `_k0` and `_state` (the encoded row)."""
    from spark_jobs.steps.merge_task import partial_rows
    from state.table import partition_of

    spark, table = frames.spark, frames.table
    source = input_definition(table, frames.tables)
    right = frames.tables[table.joins[0].table]
    keys, rows = partial_rows(source, input_history(frames, rt.bootstrap, last, source).toArrow())
    pin = (last.joins or {}).get(right.name, {})
    b_rows = pinned_rows(frames.inputs.pinned_folder, pin.get("file"), right)
    shape = JoinShape(table, source, right)
    out = {}
    for key, row in zip(keys, rows):
        joined = shape.row(None if row is None else _stored(row), b_rows)
        if joined is not None:
            out[key] = joined
    encoded = [codec.encode_key(k) for k in out]
    frame = pa.table({"_k0": [k[0] for k in out], "_state": pa.array([codec.encode_value(v) for v in out.values()],
                                                                       pa.binary()),
                      "_sp": pa.array([partition_of(k, table.partitions) for k in encoded], pa.int32())})
    return spark.createDataFrame(frame) if frame.num_rows else None


