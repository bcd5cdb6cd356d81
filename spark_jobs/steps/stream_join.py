"""A windowed join of two streams (`FROM a [LEFT|FULL OUTER] JOIN b ON a.k = b.k AND b.ts BETWEEN
a.ts - INTERVAL ... AND a.ts + INTERVAL ...`; catalog.definitions.StreamJoin). The rules of
pairing, waiting and leaving are state/interval_join.py; this module runs them in a batch.

The plan fixes both streams' ranges before anything is read: a's in the plan's ranges, b's in
`plan.joins["stream"]` (planning.next_plan asks the pass for b's next ranges; the budget is
shared by both streams in proportion to what each holds, so their event times advance
together). Then:

1. read: both ranges, each record classified by its stream's fields; a record without a join key
   (missing_key) or event time (missing_event_time), one past the clock (future_event_time) and
   one behind the watermark the batch starts with (late) are dead letters, counted by reason;
2. the accepted records, keyed by (join key, position) and sent to the state partition of their
   join key (routing_width 1; from the Arrow read as one IPC blob a partition, arrow_rows'
   exchange), and the batch's new watermark: the newest accepted event time less the grace;
3. one task per partition: the pairs and the outer sides' records that leave unmatched are
   committed to the table's own state as rows (Written), or with GROUP BY folded into their
   groups (Folded), its change topic and mirror changes with it; then the rows stage
   (`<t>.rows`: the records waiting for partners, and an index of them by the time they
   leave) is committed at the batch id.

A re-run of a partition that died between the two commits finds the rows stage as the batch
found it and computes the same rows; the table's own commit is skipped as already applied.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

import pyarrow as pa

from catalog.definitions import POSITION, STREAM_JOIN_KEY, TableDefinition, stream_join_sides
from catalog.mapping import compiled, rows_spec, state_spec
from state import codec, faults
from state.interval_join import EXPIRY, WAITING, Waiting, Window, advanced, pair_position, step, watermark_after
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.clock import StepClock
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.frames import arrow_rows
from spark_jobs.frames.table_frames import latest_rows
from spark_jobs.steps.table_stages import arrow_rows_pass, open_stage, summary
from spark_jobs.steps.task_context import TaskContext

log = logging.getLogger(__name__)

SECOND = "stream"       # plan.joins' entry for b's ranges: {"topic", "topic_id", "ranges": {partition: [start, end)}}


def second_ranges(plan_joins: dict | None) -> tuple[str | None, str | None, dict[int, tuple[int, int]]]:
    """(topic, topic id, ranges) of b in a plan's or commit's `joins` (JSON keys are strings)."""
    entry = (plan_joins or {}).get(SECOND) or {}
    return entry.get("topic"), entry.get("topic_id"), {int(p): (int(r[0]), int(r[1]))
                                                        for p, r in (entry.get("ranges") or {}).items()}


class PairShape:
    """A joined row's columns, from a pair (either side may be None for an outer row), and the
    WHERE it must pass."""

    def __init__(self, table: TableDefinition) -> None:
        import sqlglot
        from sqlglot import exp

        join = table.stream_join
        fields = {"a": [f for f, _ in table.stream_schema], "b": [f for f, _ in join.schema]}
        aliases = {join.left_alias: "a", join.right_alias: "b"}

        def pick(source: str) -> tuple:
            if source in (STREAM_JOIN_KEY, POSITION):
                return source, None
            alias, column = source.split(".")
            return aliases[alias], fields[aliases[alias]].index(column)

        self.picks = [pick(source) for source, _ in table.join_columns]
        self.where, self.where_picks = None, []
        if table.where:
            names = {f"{alias}.{c}" for alias, side in aliases.items() for c in fields[side]}
            self.where = compiled("compile_predicate", table.where, names)
            referenced = {c.name for c in sqlglot.parse_one(table.where, dialect="spark").find_all(exp.Column)}
            self.where_picks = [(name, *pick(name)) for name in sorted(referenced)]
        # Each side's fields a row or the WHERE reads: the others are NULL in what the join reads
        # and stores (_side_rows, RowsSpec.keep), so a record waits with what it will give.
        self.used: dict[str, set[str]] = {"a": set(), "b": set()}
        for side, i in [*self.picks, *((side, i) for _, side, i in self.where_picks)]:
            if i is not None:
                self.used[side].add(fields[side][i])

        # The row as one expression over (a, b, their rows, the key), built once from the picks
        # (sides and field indexes, never a user's text): a pair's row without a loop over its
        # columns (Nexmark q4 shapes 460,000 pairs a task).
        assert {side for side, _ in self.picks} <= {"a", "b", STREAM_JOIN_KEY, POSITION}
        terms = ["key" if side == STREAM_JOIN_KEY else "pair_position(a, b)" if side == POSITION
                 else f"(None if r{side} is None else r{side}[{int(i)}])" for side, i in self.picks]
        self._build = eval(f"lambda a, b, ra, rb, key: ({', '.join(terms)},)",   # noqa: S307 - see above
                           {"pair_position": pair_position})

    def row(self, a: Waiting | None, b: Waiting | None) -> tuple | None:
        ra, rb = None if a is None else a.row, None if b is None else b.row
        if self.where is not None:
            rows = {"a": ra, "b": rb}
            if not self.where({name: None if rows[side] is None else rows[side][i]
                               for name, side, i in self.where_picks}):
                return None
        return self._build(a, b, ra, rb, (a or b).key)


def _records(partials: pa.Table) -> list[Waiting]:
    """The batch's accepted records of one partition, in position order on each side (sorted by
    Arrow on the positions' numbers, not in Python on their text)."""
    import pyarrow.compute as pc

    if not partials.num_rows:
        return []
    parts = pc.split_pattern(partials.column("_k1"), ":", max_splits=1)
    partials = partials.append_column("_pp", pc.list_element(parts, 0).cast(pa.int64())) \
        .append_column("_po", pc.list_element(parts, 1).cast(pa.int64())) \
        .sort_by([("_side", "ascending"), ("_pp", "ascending"), ("_po", "ascending")])
    n = partials.num_rows
    columns = [partials.column(c).to_pylist() for c in ("_k0", "_k1", "_side", "_t", "_u")]
    # Each side's fields as a tuple per row, read column by column (a struct's to_pylist makes a dict a row).
    sides = {}
    for side in ("a", "b"):
        name = f"_{side}"
        if name in partials.column_names:
            fields = [f.to_pylist() for f in partials.column(name).combine_chunks().flatten()]
            sides[side] = list(zip(*fields)) if fields else [()] * n
        else:
            sides[side] = [None] * n
    return [Waiting(side, key, position, t, u, False, sides[side][i])
            for i, (key, position, side, t, u) in enumerate(zip(*columns))]


def _partition_offset(record: Waiting) -> tuple[int, int]:
    partition, _, offset = record.position.partition(":")
    return int(partition), int(offset)


class PairGroups:
    """An aggregate over the pairs (catalog.definitions._pair_groups): a joined row's group key
    (its first columns) and its contribution, lifted as the aggregator folds it."""

    def __init__(self, table: TableDefinition) -> None:
        names = [name for _, name in table.join_columns]
        self.width = len(table.key_columns)
        self.args = [names.index(a.args[0]) if a.args else None for a in table.aggregates]
        self.lift = state_spec(table).aggregator.lift

    def contribution(self, row: tuple) -> tuple[tuple, tuple]:
        return row[:self.width], self.lift(tuple(1 if i is None else row[i] for i in self.args))  # COUNT(*): 1

    def fold(self, rows, merge) -> dict:
        """{group key: partial} of joined rows, each group's contributions merged."""
        partials: dict = {}
        for row in rows:
            key, partial = self.contribution(row)
            partials[key] = merge(partials.get(key), partial)
        return partials


class Written:
    """A batch's joined rows as the task put them: its change topic's records and its mirror
    changes are built from them once, not decoded back from the commit's bytes twice (Nexmark
    q4: 3.5 s of a 15.6 s task for 460,000 pairs)."""

    def __init__(self, table: TableDefinition) -> None:
        self.table, self.shape, self.keys, self.encoded, self.rows, self._built = \
            table, PairShape(table), [], [], [], None
        self.aggregator = state_spec(table).aggregator      # None for a join's rows

    def take(self, tx, pairs) -> None:
        """The batch's pairs (and unmatched records), each a row of its own."""
        for a, b in pairs:
            row = self.shape.row(a, b)
            if row is not None:
                key = ((a or b).key, pair_position(a, b))
                encoded = codec.encode_key(key)
                tx.put_encoded(encoded, row)
                self.add(key, encoded, row)

    def add(self, key: tuple, encoded: bytes, row: tuple) -> None:
        self.keys.append(key)
        self.encoded.append(encoded)
        self.rows.append(row)

    def changed(self, changes: dict) -> pa.Table:
        """change_rows of the rows the commit changed (`changes`: encoded key -> new bytes)."""
        from spark_jobs.delta.mirror import change_rows

        if self._built is None:
            picked = [i for i, k in enumerate(self.encoded) if changes.get(k) is not None]
            self._built = change_rows(self.table, [self.keys[i] for i in picked], [self.rows[i] for i in picked])
        return self._built

    def stored(self, part) -> pa.Table:
        """change_rows of what an earlier attempt of the batch committed, as stored."""
        from spark_jobs.steps.merge_task import unbatched_rows

        return unbatched_rows(self.table, self.aggregator, {}, dict(zip(self.encoded, part.get_raw_many(self.encoded))))


class Folded(Written):
    """A batch's pairs folded into their groups (an aggregate over the join): one merge a group
    into the state, and the change topic and mirror carry the groups, never the pairs (Nexmark
    q4: 1.84M pairs into 120,000 auctions)."""

    def take(self, tx, pairs) -> None:
        partials = PairGroups(self.table).fold(filter(None, (self.shape.row(a, b) for a, b in pairs)),
                                               self.aggregator.merge)
        for key, partial in partials.items():
            encoded = codec.encode_key(key)
            tx.merge_encoded(encoded, partial)
            self.encoded.append(encoded)

    def changed(self, changes: dict) -> pa.Table:
        from spark_jobs.steps.merge_task import unbatched_rows

        if self._built is None:
            self._built = unbatched_rows(self.table, self.aggregator, {}, changes)
        return self._built


def merge_pairs(ctx: TaskContext, mirror_dir: str | None, group) -> pa.Table:
    """One state partition's batch (the module's step 3)."""
    import pyarrow.compute as pc

    from spark_jobs.delta.mirror import write_change_rows
    from spark_jobs.steps.merge_task import change_records

    started = time.monotonic()
    partition = group.column("_sp")[0].as_py()
    join = ctx.table.stream_join
    window = Window(join.lower_ms, join.upper_ms, join.kind)
    new = _records(arrow_rows.exchanged(group.filter(pc.equal(group.column("_kind"), "partial"))))
    stage_table, stage, _ = open_stage(rows_spec(ctx.table, ctx.namespace), ctx, partition)
    marks = [("", started), ("records", time.monotonic())]    # each step's end: the task's profile
    try:
        done = stage.meta.applied_batch >= ctx.batch_id
        outcome, waiting_count = None, 0
        if not done:
            waiting: dict[tuple, list[Waiting]] = {}
            for side, key in sorted({("b" if r.side == "a" else "a", r.key) for r in new}, key=repr):
                waiting[(side, key)] = [Waiting.of(k, v) for k, v in stage.items(prefix=(WAITING, side, key))]
            leaving = []
            if ctx.join_watermark is not None:
                keys = [(WAITING, side, key, position) for (_, _, side, key, position), _
                        in stage.items_between((EXPIRY,), (EXPIRY, ctx.join_watermark))]
                raw = stage.get_raw_many([codec.encode_key(k) for k in keys])
                leaving = [Waiting.of(k, codec.decode_value(v)) for k, v in zip(keys, raw) if v is not None]
            marks.append(("waiting", time.monotonic()))
            outcome = step(window, new, waiting, leaving, ctx.join_watermark)
            marks.append(("pairing", time.monotonic()))
        spec = state_spec(ctx.table, ctx.namespace)
        table, part, hydrated = open_stage(replace(spec, changelog=ctx.changelog or spec.changelog), ctx, partition)
        try:
            tx = part.begin(ctx.batch_id)
            written = (Folded if ctx.table.aggregates else Written)(ctx.table)
            written.take(tx, [] if outcome is None else outcome.pairs + [
                (r, None) if r.side == "a" else (None, r) for r in outcome.unmatched])
            marks.append(("shaping", time.monotonic()))
            topic = ctx.table.output_topic
            result = tx.commit(None if topic is None else
                               lambda changes: change_records(topic, written.changed(changes)) if changes else [])
            marks.append(("state_commit", time.monotonic()))
            if partition == 0:
                faults.point("batch.mid_merge")
            if mirror_dir is not None and not done:
                if result.noop:     # an earlier attempt committed the table: its rows as stored
                    changed = written.stored(part)
                else:
                    changed = written.changed(result.changes)
                write_change_rows(mirror_dir, ctx.batch_id, partition, changed)
            marks.append(("mirror", time.monotonic()))
            rows_changed = 0
            if outcome is not None:
                rows_tx = stage.begin(ctx.batch_id)
                for record in outcome.drops:
                    rows_tx.delete(record.state_key())
                    rows_tx.delete(record.expiry_key(window))
                for record in outcome.puts:
                    rows_tx.put(record.state_key(), record.state_value())
                    rows_tx.put(record.expiry_key(window), ())
                rows_changed = rows_tx.commit().keys_changed
                if partition == 0:
                    faults.point("rows.after_commit")
            waiting_count = stage.meta.key_count // 2
            marks.append(("rows_commit", time.monotonic()))
            ms = {"join": round((time.monotonic() - started) * 1000),
                  **{name: round((t - before) * 1000) for (_, before), (name, t) in zip(marks, marks[1:])}}
            return summary(partition, part, result, ms, hydrated, delta_keys=len(new), rows_changed=rows_changed,
                           pairs=0 if outcome is None else len(outcome.pairs),
                           unmatched=0 if outcome is None else len(outcome.unmatched),
                           left_state=0 if outcome is None else len(outcome.drops), waiting=waiting_count)
        finally:
            table.close()
    finally:
        stage_table.close()


def _judged(classified, source: TableDefinition, time_column: str, until_column: str, watermark: int | None,
            now_ms: int, max_window_ms: int):
    """The stream's records with the event-time reasons (a windowed join's own) and `_t`, the
    event time of an accepted record."""
    from pyspark.sql import functions as F

    kinds = dict(source.schema)

    def ms(name: str):
        column = F.col(f"_parsed.`{name}`")
        return F.unix_millis(column) if kinds[name] == "TIMESTAMP" else column.cast("long")

    t, until = ms(time_column), ms(until_column)
    reason = (F.when(F.col("reason").isNotNull(), F.col("reason"))
              .when(t.isNull() | until.isNull(), F.lit("missing_event_time"))
              .when(t > F.lit(now_ms + source.event_time_skew_ms), F.lit("future_event_time"))
              .when(until - t > F.lit(max_window_ms), F.lit("window_too_long")))
    if watermark is not None:
        reason = reason.when(t < F.lit(watermark), F.lit("late"))
    return classified.withColumn("reason", reason).withColumn("_t", F.when(F.col("reason").isNull(), t))


def _side_rows(rows, source: TableDefinition, side: str, key: str, time_column: str, until_column: str,
               used: set[str]):
    """A side's accepted records (latest_rows' shape, read by Spark SQL) as the tasks take them:
    `_k0` the join key, `_k1` the position, `_t`/`_u` the event time and window end in ms, `_a`
    or `_b` the fields (those not `used` NULL). The Arrow read gives the same columns
    (arrow_rows.side_table)."""
    from pyspark.sql import functions as F

    index = {c: i for i, c in enumerate(source.value_columns)}

    def field(c: str):
        column = f"_v{index[c]}"
        return (F.col(column) if c in used else F.lit(None).cast(rows.schema[column].dataType)).alias(c)

    return rows.select(F.col(f"_v{index[key]}").alias("_k0"),
                       F.col("_k0").alias("_k1"), F.lit(side).alias("_side"),
                       F.col(f"_v{index[time_column]}").cast("long").alias("_t"),
                       F.col(f"_v{index[until_column]}").cast("long").alias("_u"),
                       F.struct(*[field(c) for c in source.value_columns[1:]]).alias(f"_{side}"))


def run(table_run, plan, started: float) -> BatchStep:
    """One batch (passes.stream_join): read and judge both streams, dead letters, then the tasks."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.delta import mirror
    from spark_jobs.engine.partition_tasks import per_state_partition
    from spark_jobs.frames import parse
    from spark_jobs.steps import sinks
    from spark_jobs.steps.offsets import OffsetRange, spark_reader

    table, rt, spark = table_run.table, table_run.rt, table_run.spark
    join = table.stream_join
    left, right = stream_join_sides(table)
    b_topic, _, b_ranges = second_ranges(plan.joins)
    clock = StepClock(table_run, plan.batch_id, started)
    now_ms = int(plan.created_at * 1000)
    sides = (("a", left, OffsetRange(plan.topic, plan.ranges), join.left_key, join.left_time, join.left_until),
             ("b", right, OffsetRange(b_topic or join.topic, b_ranges), join.right_key, join.right_time, join.right_time))
    used = PairShape(table).used
    with clock.step("read"):
        judged, reasons, newest = [], {}, {}
        for side, source, offsets, key, time_column, until_column in sides:
            if not offsets.record_count:
                continue
            if arrow_rows.unsupported(source) is None and os.environ.get("STATETABLE_ENGINE") != "spark":
                spec = arrow_rows.RowsSpec(source, table.partitions, plan.batch_id, now_ms, join_key=key,
                                           window=arrow_rows.WindowRule(time_column, until_column, plan.watermark_ms,
                                                                        join.max_window_ms),
                                           keep=frozenset(used[side] | {key, time_column, until_column}),
                                           exchange=arrow_rows.SideExchange(side, key, time_column, until_column,
                                                                            frozenset(used[side])))
                began = time.monotonic()
                out, stats = arrow_rows_pass(table_run, offsets, spec)
                seconds = time.monotonic() - began
                log.info("%s batch %d: read %d records of %s in %.1fs (%.0f records/s)", table.name, plan.batch_id,
                         stats.get("read", 0), offsets.topic, seconds, stats.get("read", 0) / max(seconds, 1e-6))
                for reason, n in arrow_rows.reasons_of(stats).items():
                    reasons[reason] = reasons.get(reason, 0) + n
                newest.update((f"{side}:{name[7:]}", t) for name, t in stats.items() if name.startswith("newest_"))
                judged.append((side, source, key, time_column, until_column, out,
                               parse.pass_dead_letters(out, offsets.topic),
                               out.where(F.col("_kind") == arrow_rows.BLOB).select("_sp", F.col("value").alias("_blob"))))
                continue
            raw = spark_reader(spark, rt.bootstrap, offsets, table_run.reader_group)
            classified = _judged(parse.classify(raw, source, [key], rows=True), source, time_column, until_column,
                                 plan.watermark_ms, now_ms, join.max_window_ms).persist(StorageLevel.MEMORY_AND_DISK)
            for r in classified.groupBy("reason", "_partition").agg(F.count("*").alias("n"),
                                                                   F.max("_t").alias("t")).collect():
                reasons[r["reason"]] = reasons.get(r["reason"], 0) + r["n"]
                if r["reason"] is None and r["t"] is not None:
                    newest[f"{side}:{r['_partition']}"] = r["t"]
            judged.append((side, source, key, time_column, until_column, classified,
                           parse.dead_letters(classified, offsets.topic), latest_rows(classified, source)))
    read_count = sum(reasons.values())
    last = table_run.log.last_commit()
    frontiers = advanced((last.event_times if last is not None else None) or {}, newest)
    watermark = watermark_after(plan.watermark_ms, frontiers, set((plan.joins or {}).get("behind") or ()), join.grace_ms)
    with clock.step("dead_letters", "batch.after_dead_letters", "batch.after_bronze"):
        dead = None
        for *_, frame, _ in judged:
            dead = frame if dead is None else dead.unionByName(frame)
        dead_count = 0 if dead is None else sinks.write_dead_letters(
            table_run, dead, plan.batch_id, sum(n for r, n in reasons.items() if r))
    ctx = TaskContext.of(rt, table, plan.batch_id, changelog=table_run.spec.changelog, join_watermark=watermark)
    mirror_dir = mirror.changes_path(rt, table.name)
    with clock.step("join", "batch.after_rows", "batch.after_merge"):
        rows = None
        for side, source, key, time_column, until_column, _, _, latest in judged:
            if "_blob" in latest.columns:       # the Arrow read's: its rows already as the tasks take them
                frame = latest
            else:
                frame = table_run.frames.partitioned(_side_rows(latest, source, side, key, time_column, until_column,
                                                                used[side]))
            rows = frame if rows is None else rows.unionByName(frame, allowMissingColumns=True)
        if rows is not None:
            rows = rows.withColumn("_kind", F.lit("partial"))
        summaries = PartitionSummary.all_of(per_state_partition(
            spark, rows, table.partitions, lambda group: merge_pairs(ctx, mirror_dir, group),
            f"{table.name} batch {plan.batch_id}: join"))
        for *_, persisted, _, _ in judged:
            persisted.unpersist()
    counts = {name: sum(s.counts.get(name, 0) for s in summaries.values())
              for name in ("pairs", "unmatched", "left_state", "waiting")}
    log.info("%s batch %d: read %d records of two streams (%d dead letters), watermark %s; %d pairs and %d unmatched "
             "rows written, %d records left the state, %d wait, in %.1fs; the slowest task's ms: %s", table.name,
             plan.batch_id, read_count, dead_count, watermark, counts["pairs"], counts["unmatched"],
             counts["left_state"], counts["waiting"], sum(clock.seconds.values()),
             max(summaries.values(), key=lambda s: s.ms.get("join", 0)).ms if summaries else {})
    return BatchStep(reasons=reasons, read=read_count, dead=dead_count, summaries=summaries,
                     delta_keys=sum(s.delta_keys for s in summaries.values()), steps=clock.seconds, watermark=watermark,
                     extra={f"join_{name}": n for name, n in counts.items()}, event_times=frontiers)


def replayed(frames, rt, last) -> tuple[dict, list[Waiting]]:
    """The table and its waiting records as the batches up to `last` left them, from both
    streams' history (verify, rebuild): each commit's records, judged late against the watermark
    that batch started with, replayed through state.interval_join.step. A late record's fate
    depends on its batch, so the history is replayed batch by batch, in the driver: what it costs
    grows with the history, as any recomputation's. Returns ({(key, pair): row}, waiting)."""
    import bisect
    import heapq

    from catalog.batch_log import BatchLog
    from spark_jobs.frames import parse
    from spark_jobs.steps.offsets import OffsetRange, spark_reader

    table, spark = frames.table, frames.spark
    join = table.stream_join
    window, shape = Window(join.lower_ms, join.upper_ms, join.kind), PairShape(table)
    commits = [c for c in BatchLog(rt.batch_dir(table.name)).commits() if c.batch_id <= last.batch_id]
    left, right = stream_join_sides(table)
    b_topic, _, b_ranges = second_ranges(last.joins)
    records: dict[tuple, tuple[list, list]] = {}        # (side, partition) -> (offsets, Waiting records)
    for side, source, offsets, key, time_column, until_column in (
            ("a", left, OffsetRange(table.topic, {p: (0, end) for p, (_, end) in last.ranges.items()}),
             join.left_key, join.left_time, join.left_until),
            ("b", right, OffsetRange(b_topic or join.topic, {p: (0, end) for p, (_, end) in b_ranges.items()}),
             join.right_key, join.right_time, join.right_time)):
        if not offsets.record_count:
            continue
        classified = _judged(parse.classify(spark_reader(spark, rt.bootstrap, offsets), source, [key], rows=True),
                             source, time_column, until_column, None, 1 << 62, join.max_window_ms)
        frame = _side_rows(latest_rows(classified, source), source, side, key, time_column, until_column,
                           shape.used[side]).toArrow()
        for record in _records(frame):
            partition, offset = _partition_offset(record)
            found = records.setdefault((side, partition), ([], []))
            found[0].append(offset)
            found[1].append(record)
    rows, waiting, leaving_at, watermark, frontiers = {}, {}, [], None, {}
    for commit in commits:
        new, newest = [], {}
        for side, ranges in (("a", commit.ranges), ("b", second_ranges(commit.joins)[2])):
            for partition, (start, end) in ranges.items():
                offsets, found = records.get((side, partition), ([], []))
                for record in found[bisect.bisect_left(offsets, start):bisect.bisect_left(offsets, end)]:
                    if (watermark is None or record.time >= watermark) \
                            and record.time <= commit.committed_at * 1000 + table.event_time_skew_ms:
                        new.append(record)
                        newest[f"{side}:{partition}"] = max(newest.get(f"{side}:{partition}", record.time), record.time)
        frontiers = advanced(frontiers, newest)
        after = watermark_after(watermark, frontiers, set((commit.joins or {}).get("behind") or ()), join.grace_ms)
        partners = {(s, r.key): list(waiting.get((s, r.key), {}).values())      # those leaving now too
                    for r in new for s in ("b" if r.side == "a" else "a",)}
        leaving = []
        while leaving_at and after is not None and leaving_at[0][0] < after:
            _, side, key, position = heapq.heappop(leaving_at)
            record = waiting.get((side, key), {}).pop(position, None)
            if record is not None:
                leaving.append(record)
        outcome = step(window, new, partners, leaving, after)
        for a, b in outcome.pairs + [(r, None) if r.side == "a" else (None, r) for r in outcome.unmatched]:
            row = shape.row(a, b)
            if row is not None:
                rows[((a or b).key, pair_position(a, b))] = row
        for record in outcome.puts:
            kept = waiting.setdefault((record.side, record.key), {})
            if record.position not in kept:
                heapq.heappush(leaving_at, (window.leaves_at(record), record.side, record.key, record.position))
            kept[record.position] = record
        watermark = after
    return rows, [r for kept in waiting.values() for r in kept.values()]


def recomputed(frames, rt, last):
    """Every joined row (or, for an aggregate over the join, every group) as the batches up to
    `last` wrote it (verify, rebuild): `_k0`.., `_state`, `_sp`."""
    from state.table import partition_of

    rows, _ = replayed(frames, rt, last)
    table = frames.table
    if table.aggregates:        # an aggregate over the join: its groups, folded from the replayed rows
        rows = PairGroups(table).fold(rows.values(), state_spec(table).aggregator.merge)
    frame = pa.table({**{f"_k{i}": [k[i] for k in rows] for i in range(len(table.key_columns))},
                      "_state": pa.array([codec.encode_value(v) for v in rows.values()], pa.binary()),
                      "_sp": pa.array([partition_of(codec.encode_key((k[0],)), table.partitions) for k in rows],
                                      pa.int32())})
    return frames.spark.createDataFrame(frame) if frame.num_rows else None


def rebuild_rows(frames, rt, last, batch_id: int) -> int:
    """A rebuild's rows stage: every partition replaced by the records waiting after the replay
    (`replayed`), committed as the rebuild's batch. Returns the records written."""
    from pyspark.sql import functions as F

    from spark_jobs.engine.partition_tasks import per_state_partition
    from state.table import partition_of

    table = frames.table
    join = table.stream_join
    window = Window(join.lower_ms, join.upper_ms, join.kind)
    _, waiting = replayed(frames, rt, last)
    entries = [(r.state_key(), r.state_value()) for r in waiting] + [(r.expiry_key(window), ()) for r in waiting]
    frame = pa.table({"_key": pa.array([codec.encode_key(k) for k, _ in entries], pa.binary()),
                      "_value": pa.array([codec.encode_value(v) for _, v in entries], pa.binary()),
                      "_sp": pa.array([partition_of(codec.encode_key((k[2] if k[0] == WAITING else k[3],)),
                                                    table.partitions) for k, _ in entries], pa.int32())})
    rows = frames.spark.createDataFrame(frame).withColumn("_kind", F.lit("partial")) if frame.num_rows else None
    ctx = TaskContext.of(rt, table, batch_id, replica_roots=())
    per_state_partition(frames.spark, rows, table.partitions, lambda group: _rebuild_partition(ctx, group),
                        f"rebuild {table.name}: waiting records")
    return len(waiting)


def _rebuild_partition(ctx: TaskContext, group) -> pa.Table:
    import pyarrow.compute as pc

    partition = group.column("_sp")[0].as_py()
    partials = group.filter(pc.equal(group.column("_kind"), "partial"))
    wanted = dict(zip(partials.column("_key").to_pylist(), partials.column("_value").to_pylist())) \
        if partials.num_rows else {}
    stage_table, stage, hydrated = open_stage(rows_spec(ctx.table, ctx.namespace), ctx, partition)
    try:
        tx = stage.begin(ctx.batch_id)
        for key, _ in stage.raw_items():
            if key not in wanted:
                tx.delete_encoded(key)
        for key, value in wanted.items():
            tx.put_encoded(key, codec.decode_value(value))
        result = tx.commit()
        return summary(partition, stage, result, {"rows": 0}, hydrated)
    finally:
        stage_table.close()
