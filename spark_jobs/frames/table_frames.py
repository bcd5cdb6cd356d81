"""A table's relational algebra in Spark SQL: the enrichment by joined tables, WHERE, keys,
windows and sessions, and the partial aggregates the merge tasks fold. One public home, so the
live Spark-SQL pass, the batch path (verify, rebuild) and the tables-of-tables stages compute a
table alike.

It reads no storage itself: what a table's frames read (a joined table's rows as a batch pinned
them or as committed now, the watermark each batch started from) comes in as `inputs`, a
`StoredInputs` (spark_jobs/steps/inputs.py) in the product and anything with its two methods in
a test. A layout test holds frames/ to importing no storage module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from catalog.definitions import EVENT_MS, TableDefinition
from spark_jobs.frames import parse
from spark_jobs.errors import MirrorCorrupt

__all__ = ["Inputs", "TableFrames", "column", "where_condition", "spark_expression", "event_order", "state_columns",
           "topk_score", "typed_rows", "reference_frame", "latest_rows"]


def column(table: TableDefinition, name: str) -> str:
    """Column name of `alias.col` (or a bare stream column) in the flattened event frame."""
    alias, _, col = name.rpartition(".")
    return f"{alias or table.stream_alias or table.name}__{col}"


def where_condition(table: TableDefinition):
    """The table's WHERE as a Spark column over the flattened event frame, or None.

    SQL semantics: an event passes only when the predicate is true, not when it is null."""
    if not table.where:
        return None
    from pyspark.sql import functions as F

    return F.coalesce(spark_expression(table, table.where), F.lit(False))


def spark_expression(table: TableDefinition, sql: str):
    """Spark SQL over the event's fields as a column of the flattened event frame (`column` names)."""
    import sqlglot
    from pyspark.sql import functions as F
    from sqlglot import exp

    def rename(node):
        if isinstance(node, exp.Column):
            name = f"{node.table}.{node.name}" if node.table else node.name
            return exp.column(column(table, name), quoted=True)
        return node

    return F.expr(sqlglot.parse_one(sql, dialect="spark").transform(rename).sql(dialect="spark"))


class Inputs(Protocol):
    """What a table's frames read, handed in (spark_jobs/steps/inputs.py reads it from storage)."""

    def reference(self, other: TableDefinition, pins: dict | None):
        """A joined table's rows as a DataFrame: the file the batch's plan pinned, or (no pin) as committed now."""

    def batch_watermarks(self) -> list[tuple[int, int | None]]:
        """(batch id, the watermark it started from) of every committed batch, oldest first."""


@dataclass(frozen=True)
class TableFrames:
    """The frames of one table over a Spark session: a live batch's events (`for_batch`), or
    bronze's history."""
    spark: object
    table: TableDefinition
    tables: dict[str, TableDefinition]
    inputs: Inputs
    live: bool = False
    window_floor: int | None = None

    def for_batch(self, watermark_ms: int | None) -> "TableFrames":
        """The frames of one live batch, whose events all start from the plan's watermark: no
        batch's watermark is asked for the windows they may still join."""
        return dataclasses.replace(self, live=True, window_floor=watermark_ms)

    def split_late(self, events, watermark_ms):
        from pyspark.sql import functions as F

        window = self.table.window
        ts = F.unix_millis(F.col(self.table.event_time))
        last_start = ts - F.pmod(ts, F.lit(window.advance))
        is_late = F.lit(False) if watermark_ms is None else (ts + window.grace_ms < F.lit(watermark_ms)) \
            if window.session else (last_start + window.size_ms + window.grace_ms <= F.lit(watermark_ms))
        flagged = events.withColumn("_late", is_late)
        batch_max = flagged.where(~F.col("_late")).agg(F.max(ts)).first()[0]
        return flagged.where(~F.col("_late")).drop("_late"), flagged.where(F.col("_late")).drop("_late"), batch_max

    def enrich(self, events, pins: dict | None):
        """`events` plus each joined table's columns (`<alias>__<col>`) as pinned in the batch's
        plan (`pins`; None: as committed now), and `_enriched`.

        A batch enriches its events once and keeps the result in bronze, so the recomputation
        joins exactly what each batch joined (a player renamed later stays as he was)."""
        from pyspark.sql import functions as F

        frame = events
        for join in self.table.joins:
            other = self.tables[join.table]
            snapshot = self.inputs.reference(other, pins).select(
                *[F.col(n).alias(f"{join.alias}__{n}") for n, _ in other.schema])
            cond = F.col(join.stream_column.split(".")[-1]) == F.col(f"{join.alias}__{join.table_column}")
            frame = frame.join(F.broadcast(snapshot), cond, "left")
        return frame.withColumn("_enriched", F.lit(True))

    def joined(self, events, counts: dict | None = None):
        """Stream columns as `<alias>__<col>`, with each joined table's values as the batch saw them
        (see `enrich`; bronze written before enrichment was kept is joined with today's data).

        Every join is evaluated as a left join; an inner join then drops the
        events its table has no row for, and `counts["join_unmatched"]` says
        how many, so nothing disappears without a trace.
        """
        from pyspark.sql import functions as F

        joins = self.table.joins
        joined_cols = [f"{j.alias}__{n}" for j in joins for n, _ in self.tables[j.table].schema]
        if joins and "_enriched" not in events.columns:
            events = self.enrich(events, None)
        elif joins:
            legacy = events.where(F.col("_enriched").isNull()).drop(*joined_cols, "_enriched")
            events = events.where(F.col("_enriched").isNotNull()).unionByName(self.enrich(legacy, None))
        alias = self.table.stream_alias or self.table.name
        frame = events.select(*[F.col(n).alias(f"{alias}__{n}") for n, _ in self.table.schema],
                              event_order(events), "source_partition", "source_offset",
                              *(["batch_id"] if "batch_id" in events.columns else []),   # bronze has it
                              *joined_cols)
        matched = F.lit(True)
        for join in joins:
            if join.kind == "inner":
                matched = matched & F.col(f"{join.alias}__{join.table_column}").isNotNull()
        if any(join.kind == "inner" for join in joins):
            frame = frame.withColumn("_matched", matched)
            if counts is not None:
                counts["join_unmatched"] = frame.where(~F.col("_matched")).count()
            frame = frame.where(F.col("_matched")).drop("_matched")
        return frame

    def batch_partials(self, events, classified, counts: dict, rows: bool = False):
        """This batch's partials with their state partitions (see `partials`), or with `rows` (a
        table of rows, Pass.rows) its rows (`latest_rows`)."""
        if rows:
            return self.partitioned(latest_rows(classified, self.table))
        return self.partitioned(self.partials(self.selected(self.joined(events, counts), counts)))

    def selected(self, frame, counts: dict | None = None):
        """The events the table's WHERE keeps; `counts["filtered"]` says how many it did not."""
        from pyspark.sql import functions as F

        for name, sql in self.table.derived.items():          # aggregate arguments that are expressions
            frame = frame.withColumn(column(self.table, name), spark_expression(self.table, sql))
        if self.table.event_ms:                               # a TTL's or a session's MAX reads it
            frame = frame.withColumn(column(self.table, EVENT_MS), F.unix_millis(F.col(column(self.table, self.table.event_time))))
        condition = where_condition(self.table)
        if condition is None:
            return frame
        frame = frame.withColumn("_selected", condition)
        if counts is not None:
            counts["filtered"] = frame.where(~F.col("_selected")).count()
        return frame.where(F.col("_selected")).drop("_selected")

    def keyed(self, frame):
        """The frame with its state key as columns _k0.. (a hopping window repeats an event per window)."""
        from pyspark.sql import functions as F

        table = self.table
        group_cols = [F.col(column(table, k)).alias(f"_k{i}") for i, k in enumerate(table.key_columns)]
        if table.window is not None and table.window.session:
            frame = self.sessioned(frame)
            group_cols.append(F.col("_wstart").alias(f"_k{len(table.key_columns)}"))
        elif table.window is not None:
            window = table.window
            ts_col = column(table, table.event_time)
            w = F.window(F.col(ts_col), f"{window.size_ms} milliseconds", f"{window.advance} milliseconds")
            frame = frame.withColumn("_w", w).withColumn("_wstart", F.unix_millis(F.col("_w.start")))
            # Kafka Streams starts no window before the epoch; an event before it keeps all of its own.
            frame = frame.where((F.col("_wstart") >= 0) | (F.unix_millis(F.col(ts_col)) < 0))
            frame = self.open_windows(frame)
            group_cols.append(F.col("_wstart").alias(f"_k{len(table.key_columns)}"))
        key_aliases = [f"_k{i}" for i in range(len(group_cols))]
        return frame.select(*group_cols, *[F.col(c) for c in frame.columns if c not in ("_w",)]), key_aliases

    def open_windows(self, frame):
        """A HOP event's windows that were still open when its batch started: one whose end plus
        grace is at or before the batch's starting watermark has closed (and, with `emit: final`,
        been published), so the event joins only its newer windows, as in Kafka Streams and
        ksqlDB. Live (`for_batch`), the batch's plan gives the watermark; over bronze, each event's
        batch does, from the batch log."""
        from pyspark.sql import functions as F

        window = self.table.window
        if window.advance >= window.size_ms:          # TUMBLE: one window, judged by _split_late
            return frame
        closes = F.col("_wstart") + F.lit(window.size_ms + window.grace_ms)
        if self.live or "batch_id" not in frame.columns:
            floor = self.window_floor
            return frame if floor is None else frame.where(closes > F.lit(floor))
        marks, high = [], None
        for batch_id, watermark_ms in self.inputs.batch_watermarks():     # the watermark each batch began from
            marks.append((batch_id, high))
            if watermark_ms is not None:
                high = watermark_ms if high is None else max(high, watermark_ms)
        if not any(mark is not None for _, mark in marks):
            return frame
        floors = self.spark.createDataFrame(marks, "batch_id BIGINT, _floor BIGINT")
        return (frame.join(F.broadcast(floors), "batch_id", "left")
                .where(F.col("_floor").isNull() | (closes > F.col("_floor"))).drop("_floor"))

    def sessioned(self, frame):
        """Each event with the start of its session (`_wstart`) among the frame's events: by key
        and event time, a gap of more than the session gap starts a new one (as arrow_pass does;
        state.windows.merge_sessions joins them with the stored ones). Over bronze, these are the
        table's whole sessions."""
        from pyspark.sql import Window, functions as F

        table = self.table
        ts = F.col(column(table, EVENT_MS))
        keys = [F.col(column(table, k)) for k in table.key_columns]
        by_time = Window.partitionBy(*keys).orderBy(ts)
        starts = F.coalesce(ts - F.lag(ts).over(by_time) > F.lit(table.window.size_ms), F.lit(True))
        return (frame.withColumn("_session", F.sum(starts.cast("int")).over(by_time.rowsBetween(Window.unboundedPreceding, 0)))
                .withColumn("_wstart", F.min(ts).over(Window.partitionBy(*keys, "_session"))).drop("_session"))

    def refused_events(self, events, refused: dict[tuple, str]):
        """(source_partition, source_offset, reason) of this batch's events for keys the state refused."""
        from pyspark.sql import functions as F

        keyed, key_aliases = self.keyed(self.selected(self.joined(events)))
        reasons = self.spark.createDataFrame([tuple(k) + (r,) for k, r in refused.items()], key_aliases + ["reason"])
        return (keyed.join(reasons, key_aliases, "inner")
                .groupBy("source_partition", "source_offset")
                .agg(F.first("reason").alias("reason")))

    def partials(self, frame, exclude: list[tuple[int, tuple]] | None = None):
        """The events' partial aggregates per key, shaped as the Arrow pass's (_k0.., _a0..; see
        merge_task.partial_rows). `exclude`: (batch id, key) pairs whose events the state refused (see Transaction.commit);
        a recomputation from bronze leaves them out as the batches did."""
        from pyspark.sql import Window, functions as F

        table = self.table
        frame, key_aliases = self.keyed(frame)
        if exclude:
            refused = self.spark.createDataFrame([tuple(k) + (b,) for b, k in exclude], key_aliases + ["batch_id"])
            frame = frame.join(refused, key_aliases + ["batch_id"], "left_anti")
        plain, topks = [], []
        stored = state_columns(frame)
        integral = {f.name for f in frame.schema.fields if f.dataType.typeName() in ("long", "integer", "short", "byte")}

        def summed(name: str, column):
            # Integer sums as DECIMAL(38,0), as the Arrow pass sums them: a SUM past 64 bits reaches
            # the state, which refuses that key (sum_overflow) and goes on, where Spark's own
            # BIGINT sum would fail the batch on every re-run.
            return F.sum(column.cast("decimal(38,0)") if name in integral else column)

        for i, agg in enumerate(table.aggregates):
            args = [stored(column(table, a)) for a in agg.args]
            if agg.function == "count":
                plain.append(F.count(args[0] if args else F.lit(1)).alias(f"_a{i}"))
            elif agg.function == "sum":
                plain.append(summed(column(table, agg.args[0]), args[0]).alias(f"_a{i}"))
            elif agg.function in ("min", "max"):
                plain.append(getattr(F, agg.function)(args[0]).alias(f"_a{i}"))
            elif agg.function == "avg":
                plain.append(F.struct(F.coalesce(summed(column(table, agg.args[0]), args[0]), F.lit(0)).alias("s"),
                                      F.count(args[0]).alias("n")).alias(f"_a{i}"))
            elif agg.function == "count_distinct":
                plain.append(F.array_sort(F.collect_set(args[0])).alias(f"_a{i}"))
            elif agg.function in ("latest_by_offset", "latest_keeping_nulls"):
                # nulls are skipped, as ksqlDB's LATEST_BY_OFFSET(x) does, or kept with (x, false)
                order = F.when(args[0].isNotNull(), F.col("_order")) if agg.function == "latest_by_offset" \
                    else F.col("_order")
                plain.append(F.struct(F.max(order).alias("o"), F.max_by(args[0], order).alias("v"))
                             .alias(f"_a{i}"))
            else:
                topks.append((i, agg, args))
        grouped = frame.groupBy(*key_aliases).agg(*plain) if plain else frame.select(*key_aliases).distinct()
        for i, agg, args in topks:
            score, rest = args[0], args[1:]
            rank = Window.partitionBy(*key_aliases).orderBy(score.desc(), F.col("_order").asc())
            ranked_by = topk_score(score, stored.types.get(column(table, agg.args[0])))
            top = (frame.where(score.isNotNull()).withColumn("_rn", F.row_number().over(rank))
                   .where(F.col("_rn") <= agg.n)
                   .groupBy(*key_aliases)
                   .agg(F.collect_list(F.struct(ranked_by.alias("score"), F.col("_order").alias("o"),
                                                F.struct(*rest).alias("typed"))).alias(f"_a{i}")))
            grouped = grouped.join(top, key_aliases, "left")
        return grouped

    def partitioned(self, partials):
        """Partials with their state partition `_sp` (the state library's rule, in Python: mapInArrow)."""
        from pyspark.sql.types import IntegerType, StructField, StructType

        from spark_jobs.frames.arrow_keys import with_state_partition

        parts, width = self.table.partitions, self.table.routing_width
        schema = StructType(partials.schema.fields + [StructField("_sp", IntegerType())])
        return partials.mapInArrow(lambda batches: with_state_partition(parts, batches, width), schema)


def latest_rows(classified, table: TableDefinition):
    """Latest record per key in the batch (_k0, _del for a tombstone, _v0.. the values) of a
    source table: a table's own rows, or the input rows of an aggregate or a join over a table."""
    from pyspark.sql import Window, functions as F

    pk, pk_type = table.key_columns[0], dict(table.schema)[table.key_columns[0]]
    key_expr = F.when(F.col("reason") == "null_value", parse.kafka_key_text(table).try_cast(pk_type)) \
        .otherwise(F.col(f"_parsed.`{pk}`"))
    if table.stream:            # each record its own row, named by its position; none is ever deleted
        key_expr = F.concat_ws(":", F.col("_partition").cast("string"), F.col("_offset").cast("string"))
    kinds = dict(table.schema)

    def stored(name: str):
        """A value as the state keeps it (state_columns' rule): a TIMESTAMP or a DATE as a number,
        which the codec holds; a date object it cannot, and the row was refused."""
        col = F.col(f"_parsed.`{name}`")
        if table.stream and name == pk:
            return key_expr
        return F.unix_millis(col) if kinds.get(name) == "TIMESTAMP" else \
            F.unix_date(col) if kinds.get(name) == "DATE" else col

    deletes = F.lit(False) if table.stream else F.col("reason") == "null_value"
    frame = classified.where(F.col("reason").isNull() | deletes).select(
        key_expr.alias("_k0"), deletes.alias("_del"), F.col("_offset"),
        F.col("_partition"), *[stored(c).alias(f"_v{i}") for i, c in enumerate(table.value_columns)])
    if table.stream:            # positions are unique: nothing to pick
        return frame.drop("_offset", "_partition")
    latest = Window.partitionBy("_k0").orderBy(F.desc("_partition"), F.desc("_offset"))
    return (frame.where(F.col("_k0").isNotNull()).withColumn("_rn", F.row_number().over(latest))
            .where("_rn = 1").drop("_rn", "_offset", "_partition"))


def event_order(events):
    """`_order`: state.aggregates.event_order of each event (batch, then source offset)."""
    from pyspark.sql import functions as F

    from state.aggregates import OFFSET_BITS

    return (F.shiftleft(F.col("batch_id").cast("bigint"), OFFSET_BITS) + F.col("source_offset")).alias("_order")


def state_columns(frame):
    """A function from a column name of `frame` to the column as the state keeps it: TIMESTAMP as
    epoch milliseconds and DATE as days since 1970 (as ksqlDB's JSON shows them), since the state's
    codec holds plain values and both passes must fold alike."""
    from pyspark.sql import functions as F, types as T

    types = {f.name: f.dataType for f in frame.schema.fields}

    def stored(name: str):
        col, kind = F.col(f"`{name}`"), types.get(name)
        if isinstance(kind, (T.TimestampType, T.TimestampNTZType)):
            return F.unix_millis(col)
        if isinstance(kind, T.DateType):
            return F.unix_date(col)
        return col
    stored.types = types
    return stored


def topk_score(score, kind):
    """TOPK's score as the Arrow pass gives it (a DOUBLE) when it is a number, a time (epoch
    milliseconds) or a date (days); a STRING score ranks by its own order (state.aggregates.ranked)."""
    from pyspark.sql import types as T

    return score if isinstance(kind, (T.StringType, T.BooleanType)) else score.cast("double")


def reference_frame(spark, table: TableDefinition, rows):
    """A table's mirror rows as a DataFrame of its declared schema, not one inferred: a table with
    no rows yet (never run, or all deleted) is an ordinary reference and must join as an empty one."""
    from spark_jobs.frames.arrow_pass import SPARK_TYPE

    ddl = ", ".join(f"`{n}` {SPARK_TYPE.get(t, t)}" for n, t in table.schema)
    return spark.createDataFrame(typed_rows(table, rows), ddl)


def typed_rows(table: TableDefinition, rows):
    """A table's mirror rows (JSON, see mirror.committed_rows) as typed columns of its schema."""
    import pyarrow as pa

    from spark_jobs.frames.arrow_values import parse_values

    import pyarrow.compute as pc

    # The state keeps a DATE as days since 1970 (latest_rows), and the mirror writes what it keeps.
    read_as = [(name, "BIGINT" if dtype == "DATE" else dtype) for name, dtype in table.schema]
    typed, _, bad = parse_values(rows.column("row").cast(pa.binary()), read_as)
    if bad:
        raise MirrorCorrupt(f"{table.name}: {len(bad)} mirror rows do not parse as its schema, e.g. row {bad[0]}")
    for index, (name, dtype) in enumerate(table.schema):
        if dtype == "DATE":
            typed = typed.set_column(index, name, pc.cast(pc.cast(typed.column(name), pa.int32()), pa.date32()))
    return typed
