"""One table's micro-batches, exactly once.

Steps of batch b, each followed by its fault point (state.faults):

  plan         fix input offsets, write the plan        batch.after_plan
  read+parse   Spark's Kafka source, one Arrow pass
               (or from_json on the Spark-SQL pass)     batch.after_read
  dead letters Kafka DLQ topic + Delta DLQ table        batch.after_dead_letters
  bronze       the workers' files committed to Delta    batch.after_bronze
  merge        partials grouped by state partition,
               one merge task per partition             batch.mid_merge, batch.after_merge
  commit       the batch log's commit entry             batch.after_commit
  mirror       commit the merge tasks' change files,    mirror.after_changes
               fold them every mirror_every batches     mirror.after_merge
  snapshot     when due                                 batch.after_snapshot
  offsets      consumer-group offsets for lag tools     batch.after_offsets

Everything before the commit entry is idempotent (state commits skip an
applied batch id, Delta writes carry txnAppId/txnVersion, the mirror is an
upsert of final values, DLQ records are keyed by source coordinates), so a
batch interrupted anywhere is finished by running it again from its plan.
Everything after the commit entry is repeated for the last committed batch
at start-up.
"""
from __future__ import annotations

import json
import logging
import os
import time

from state import faults, kafka_config
from state.changelog import ensure_changelog
from state.kafka_admin import ensure_topic
from state.table import DefinitionChanged
from spark_jobs import delta_files, parse
from catalog.batch_log import BatchCommit, BatchLog, BatchLogLost, BatchPlan
from catalog.definitions import EVENT_MS, TableDefinition
from spark_jobs import mirror
from spark_jobs.merge_task import MergeContext
from spark_jobs.partition_tasks import per_state_partition, task_faults  # noqa: F401 (batch.py takes them from here)
from spark_jobs.offsets import OffsetRange, next_starts, spark_reader, topic_id, watermarks
from catalog.registry import ensure_output_topic
from catalog.runtime import Runtime, local_replica_roots, spark_path, task_state_dir

log = logging.getLogger("statetable.microbatch")


def _q(table: TableDefinition, name: str) -> str:
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
    """Spark SQL over the event's fields as a column of the flattened event frame (`_q` names)."""
    import sqlglot
    from pyspark.sql import functions as F
    from sqlglot import exp

    def rename(node):
        if isinstance(node, exp.Column):
            name = f"{node.table}.{node.name}" if node.table else node.name
            return exp.column(_q(table, name), quoted=True)
        return node

    return F.expr(sqlglot.parse_one(sql, dialect="spark").transform(rename).sql(dialect="spark"))


def check_definition(batch_log: BatchLog, name: str, definition: dict) -> None:
    """The batch log speaks for the durable state (changelog and snapshots), also where no local
    store exists: a batch, finished or pending, under another definition stops every writer."""
    for entry, what in ((batch_log.pending_plan(), "pending batch"), (batch_log.last_commit(), "last batch")):
        recorded = getattr(entry, "definition", None)
        if recorded and recorded.get("fingerprint") != definition["fingerprint"]:
            raise DefinitionChanged(name, recorded.get("meaning"), definition["meaning"],
                                    where=f"its {what} ({entry.batch_id})")


class MicroBatchRunner:
    def __init__(self, spark, table: TableDefinition, tables: dict[str, TableDefinition], runtime: Runtime,
                 snapshots: bool = True, writer: bool = True) -> None:
        """`snapshots=False` leaves snapshots to the caller (the Airflow DAG has a task of its own for them).
        `writer=False`: only the transformations, for a recomputation (no topics, no definition checks)."""
        self.spark = spark
        self.snapshots = snapshots
        self.table = table
        self.tables = tables
        self.rt = runtime
        self.log = BatchLog(runtime.batch_dir(table.name))
        from catalog.registry import drop_stale_cache, spec_of

        self.spec = spec_of(table, runtime)
        self.dead_letter_topic = runtime.dead_letter_topic(table.name)
        self.definition = {"fingerprint": self.spec.fingerprint, "meaning": self.spec.meaning_dict()}
        self.engine = engine_of(table)
        self._begun_at = 0.0          # wall clock of the running batch's start (run_one)
        # Every group and transactional id statetable uses starts "statetable.", then the namespace:
        # one prefixed ACL grants a deployment its own (README, "Running against a managed Kafka").
        self.reader_group = f"statetable.{runtime.namespace}{table.name}.reader"
        self.window_floor: int | None = None     # the running batch's starting watermark (_open_windows)
        if writer:
            drop_stale_cache(self.spec, runtime)
            check_definition(self.log, table.name, self.definition)
            ensure_topic(runtime.bootstrap, self.dead_letter_topic, 1, {"cleanup.policy": "compact"})
            ensure_changelog(runtime.bootstrap, self.spec.changelog_topic, table.partitions)
            if table.input_table:
                from catalog.mapping import rows_spec

                ensure_changelog(runtime.bootstrap, rows_spec(table, runtime.namespace).changelog_topic,
                                 table.partitions)
            if table.output_topic:
                ensure_output_topic(runtime.bootstrap, table)
            self._check_log_matches_changelog()

    def _check_log_matches_changelog(self) -> None:
        """A first batch starts from empty state: if the changelog already holds state, the batch
        log that explains it is missing (BatchLogLost), and nothing is guessed."""
        if self.log.last_commit() is not None or self.log.pending_plan() is not None:
            return
        written = sum(high for _, high in watermarks(self.rt.bootstrap, self.spec.changelog_topic).values())
        if written:
            raise BatchLogLost(self.table.name, self.log.location, self.spec.changelog_topic, written,
                               self.rt.namespace)

    # ------------------------------------------------------------------ plan
    def _next_plan(self) -> BatchPlan | None:
        pending = self.log.pending_plan()
        if pending is not None:
            self.log.take_over(pending, self.table.name)
            log.info("%s: finishing batch %d from its plan (%d records)", self.table.name, pending.batch_id,
                     pending.record_count)
            return pending
        last = self.log.last_commit()
        marks = watermarks(self.rt.bootstrap, self.table.topic)
        incarnation = topic_id(self.rt.bootstrap, self.table.topic)
        position = self.log.read_position()
        read_topic, read_id, read_ends, accepted = position or (None, None, None, None)
        starts = next_starts(self.table.name, self.table.topic, marks, incarnation, read_topic, read_id, read_ends)
        available = {p: high - starts[p] for p, (_, high) in marks.items()}
        if sum(available.values()) == 0 and not mirror.joined_tables_moved(self.rt, self.table, last):
            return None
        budget = self.table.max_records_per_batch
        ranges, total = {}, sum(available.values())
        for p, (_, high) in marks.items():
            share = available[p] if total <= budget else available[p] * budget // total
            ranges[p] = (starts[p], starts[p] + share)
        plan = BatchPlan(
            batch_id=(last.batch_id + 1) if last else 0, topic=self.table.topic, ranges=ranges,
            watermark_ms=last.watermark_ms if last else None, topic_id=incarnation, accepted=accepted,
            definition=self.definition, joins=self._pin_joins(),
        )
        if accepted:
            log.warning("%s batch %d starts where an operator accepted a discontinuity: %s", self.table.name,
                        plan.batch_id, accepted.get("problem"))
        self.log.write_plan(plan, self.table.name)
        return plan

    def _pin_joins(self) -> dict | None:
        """Each joined table's committed state as of its newest batch, fixed for this batch in a
        Parquet file in this table's batch folder: a re-run after a crash joins the same rows,
        whatever the joined table did since. Written once per (joined table, batch) and read
        from the joined table's Delta mirror (mirror.committed_rows), not from its topic."""
        if not self.table.joins:
            return None
        from spark_jobs.arrow_pass import write_parquet_atomically

        import pyarrow.fs as pafs

        from catalog.runtime import arrow_filesystem

        folder = f"{self.log.location}/joins"
        fs, root = arrow_filesystem(folder)
        pins = {}
        last = self.log.last_commit()
        before = (last.joins or {}) if last is not None and self.table.table_join else {}
        for name in sorted({join.table for join in self.table.joins}):
            def file_of(batch: int | None) -> str:
                return f"{name}.b{-1 if batch is None else batch}.parquet"

            batch = delta_files.committed_version(mirror.changes_path(self.rt, name), f"{name}.mirror_changes")
            file = file_of(batch)
            if fs.get_file_info(f"{root}/{file}").type == pafs.FileType.NotFound:
                batch, rows = mirror.committed_rows(self.rt, name)
                file = file_of(batch)
                write_parquet_atomically(_typed_rows(self.tables[name], rows), folder, file)
                keep = {file, (before.get(name) or {}).get("file")}    # a join of tables diffs against its last pin
                for old in fs.get_file_info(pafs.FileSelector(root)):  # no pending plan names them (we plan)
                    if old.base_name.startswith(f"{name}.b") and old.base_name not in keep:
                        fs.delete_file(old.path)
            pins[name] = {"batch": batch, "file": file}
            if self.table.table_join:
                pins[name].update(since=(before.get(name) or {}).get("batch"),
                                  since_file=(before.get(name) or {}).get("file"))
            if batch is None:
                log.warning("%s joins %s, which has no committed batch yet: its events find no match (run %s "
                            "first)", self.table.name, name, name)
        return pins

    def lag(self) -> int:
        from spark_jobs.offsets import lag

        return lag(self.table.name, self.rt, self.table.topic, self.table)

    # ------------------------------------------------------------------ run
    def run(self, max_batches: int | None = None, until_caught_up: bool = False) -> list[BatchCommit]:
        self._finish_last_commit()
        done: list[BatchCommit] = []
        while max_batches is None or len(done) < max_batches:
            commit = self._run_one_through_broker_loss()
            if commit is None:
                break
            done.append(commit)
            if not until_caught_up and max_batches is None:
                break
        return done

    def _run_one_through_broker_loss(self, attempts: int = 4) -> BatchCommit | None:
        """A batch that met a broker dying (a partition leader or a transaction coordinator lost
        mid-batch) runs again from its recorded plan, as a new run would after a crash: the
        commit protocol makes that exact. Any other error, or the last attempt's, is raised."""
        from state.kafka_errors import broker_lost

        for attempt in range(1, attempts + 1):
            try:
                return self.run_one()
            except Exception as exc:        # noqa: BLE001 - only a lost broker's errors are retried
                name = broker_lost(exc)
                if name is None or attempt == attempts:
                    raise
                log.warning("%s: a batch met Kafka error %s (a broker lost or leadership moving); running it again "
                            "from its plan in %d s (attempt %d of %d)", self.table.name, name, 2 * attempt,
                            attempt + 1, attempts)
                time.sleep(2 * attempt)
                self._finish_last_commit()
        return None

    def _describe(self, batch_id: int, step: str) -> None:
        """Name the Spark jobs of each step, so the Spark UI and event log say which step a stage served."""
        context = getattr(self.spark, "_sc", None)      # a Spark Connect session has none
        if context is not None:
            context.setJobDescription(f"{self.table.name} batch {batch_id}: {step}")

    def run_one(self) -> BatchCommit | None:
        plan = self._next_plan()
        if plan is None:
            return None
        faults.point("batch.after_plan")
        started = time.monotonic()
        self._begun_at = time.time()
        if self.table.over_table:
            from spark_jobs import table_aggregate

            step = table_aggregate.run_batch(self, plan, started)
        elif self.table.table_join:
            from spark_jobs import table_join

            step = table_join.run_batch(self, plan, started)
        else:
            step = self._arrow_batch(plan, started) if self.engine == "arrow" else self._spark_batch(plan, started)
        return self._commit_batch(plan, started, step)

    def _spark_batch(self, plan: BatchPlan, started: float) -> dict:
        """The Spark-SQL pass (from_json, groupBy): source tables, joins, and what the Arrow pass
        does not cover (see arrow_pass.check_supported)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        self._describe(plan.batch_id, "read")
        raw = spark_reader(self.spark, self.rt.bootstrap, OffsetRange(plan.topic, plan.ranges), self.reader_group)
        key_fields = self.table.stream_key_fields if self.table.kind == "aggregate" \
            else self.table.key_columns
        # The plan's creation time is the batch's clock: a re-run judges future event times alike.
        classified = parse.classify(raw, self.table, key_fields, now_ms=int(plan.created_at * 1000)) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        events = parse.good_events(classified, self.table)
        late_count, batch_max = 0, None
        watermark = plan.watermark_ms
        if self.table.window is not None:
            events, late, batch_max = self._split_late(events, plan.watermark_ms)
            events = events.persist(StorageLevel.MEMORY_AND_DISK)
            late = late.persist(StorageLevel.MEMORY_AND_DISK)
            late_count = late.count()
        elif self.table.timed:
            batch_max = events.agg(F.max(F.unix_millis(F.col(self.table.event_time)))).first()[0]
        if batch_max is not None:
            watermark = max(watermark or batch_max, batch_max)
        reasons = {r["reason"]: r["count"] for r in classified.groupBy("reason").count().collect()}
        read_count = sum(reasons.values())
        steps = {"read": time.monotonic() - started}
        faults.point("batch.after_read")
        log.info("%s batch %d: read %d records in %.1fs (%.0f records/s)", self.table.name, plan.batch_id,
                 read_count, time.monotonic() - started, read_count / max(time.monotonic() - started, 1e-6))

        self._describe(plan.batch_id, "dead_letters")
        dead = parse.dead_letters(classified, plan.topic)
        if self.table.window is not None and late_count:
            dead = dead.unionByName(self._late_dead_letters(late, plan.topic))
        if self.table.kind == "source":
            dead = dead.where(F.col("reason") != "null_value")   # tombstones delete, they are not errors
        dead_count = self._write_dead_letters(dead, plan.batch_id)
        steps["dead_letters"] = time.monotonic() - started - sum(steps.values())
        faults.point("batch.after_dead_letters")

        unenriched = events
        if self.table.joins:
            events = self._enrich(events, plan.joins).persist(StorageLevel.MEMORY_AND_DISK)   # bronze keeps it
        self._describe(plan.batch_id, "bronze")
        if self.table.bronze:
            self._write_bronze(events, plan.batch_id)
        steps["bronze"] = time.monotonic() - started - sum(steps.values())
        faults.point("batch.after_bronze")

        self._describe(plan.batch_id, "aggregate_merge")
        join_counts: dict = {}
        self.window_floor = plan.watermark_ms
        events = events.withColumn("batch_id", F.lit(plan.batch_id).cast("bigint"))    # as bronze has it
        partials = self._batch_partials(events, classified, join_counts)
        summaries = self._merge_arrow(partials.withColumn("_kind", F.lit("partial")), plan.batch_id, watermark,
                                      plan.watermark_ms)
        steps["aggregate_merge"] = time.monotonic() - started - sum(steps.values())
        refused = {tuple(k): reason for s in summaries.values() for k, reason in s.get("rejected", [])}
        refused_counts = self._dead_letter_refused(events, classified, refused, plan) \
            if refused and self.table.kind == "aggregate" else {}
        faults.point("batch.after_merge")
        return {"reasons": reasons, "read": read_count, "late": late_count, "dead": dead_count,
                "refused": refused, "refused_counts": refused_counts, "summaries": summaries,
                "delta_keys": sum(s["delta_keys"] for s in summaries.values()), "watermark": watermark,
                "steps": steps, "extra": join_counts,
                "release": (classified, events, unenriched)}

    def _arrow_batch(self, plan: BatchPlan, started: float) -> dict:
        """The Arrow pass, in the session whose Arrow batches fit this table's records
        (session.arrow_session): every job of the pass's step runs there."""
        from spark_jobs import arrow_batches, session

        records, why = arrow_batches.records_for(self.log.last_commit(), self.rt.bootstrap, plan.topic, plan.ranges)
        log.info("%s batch %d: Arrow batches of %s", self.table.name, plan.batch_id, why)
        shared, self.spark = self.spark, session.arrow_session(self.spark, records)
        try:
            return self._arrow_pass(plan, started, records)
        finally:
            self.spark = shared

    def _arrow_pass(self, plan: BatchPlan, started: float, records: int | None) -> dict:
        """One Arrow pass over the batch (arrow_pass.run): parse, classify, filter, window and
        pre-aggregate per input partition; bronze Parquet from the workers; the partials go by
        state partition to one merge task each (per_state_partition). Nothing re-reads the batch."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from spark_jobs import arrow_batches, arrow_pass

        table = self.table
        bronze = self._bronze_target(plan.batch_id)
        spec = arrow_pass.PassSpec(table, plan.batch_id, now_ms=int(plan.created_at * 1000),
                                   watermark_ms=plan.watermark_ms, bronze=bronze)
        self._describe(plan.batch_id, "read")
        raw = spark_reader(self.spark, self.rt.bootstrap, OffsetRange(plan.topic, plan.ranges), self.reader_group) \
            .select("partition", "offset", "timestamp", "value")     # what the pass reads (arrow_batches: with
        # Spark's per-row byte check off, the positions add little to the JVM-to-Python transfer)
        out = raw.mapInArrow(lambda batches: arrow_pass.run(spec, batches), arrow_pass.output_ddl(table)) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        stats: dict[str, int] = {}
        files: dict[str, dict[str, int]] = {}
        from spark_jobs.session import is_connect

        # A Connect batch runs in its cap's own session (arrow_session); a local one is sized here.
        with arrow_batches.sized(self.spark, None if is_connect(self.spark) else records):
            applied = arrow_batches.applied(self.spark)
            stat_rows = out.where(F.col("_kind").isin("stat", "file")) \
                .select("_kind", "file", "stat", "stat_value").collect()
        for row in stat_rows:
            name, value = row["stat"], row["stat_value"]
            if row["_kind"] == "file":          # a retried task reports its file again: same name
                files.setdefault(row["file"], {})[name] = value
            else:
                stats[name] = max(stats.get(name, value), value) if name == "max_event_ms" \
                    else stats.get(name, 0) + value
        read_count, late_count = stats.get("read", 0), stats.get("late", 0)
        reasons = {name[5:]: n for name, n in stats.items() if name.startswith("dead_")}
        reasons[None] = read_count - sum(reasons.values())
        watermark = plan.watermark_ms
        if "max_event_ms" in stats:
            watermark = max(watermark or stats["max_event_ms"], stats["max_event_ms"])
        steps = {"read": time.monotonic() - started}
        faults.point("batch.after_read")
        log.info("%s batch %d: read and parsed %d records in %.1fs (%.0f records/s)", table.name, plan.batch_id,
                 read_count, steps["read"], read_count / max(steps["read"], 1e-6))

        self._describe(plan.batch_id, "dead_letters")
        dead_count = 0
        if sum(n for r, n in reasons.items() if r) + late_count:
            dead = out.where(F.col("_kind") == "dead")
            dead_count = self._write_dead_letters(parse.dead_letter_records(
                dead, plan.topic, F.col("value"), F.col("reason"), F.col("source_partition"), F.col("source_offset"),
                F.col("size")), plan.batch_id)
        steps["dead_letters"] = time.monotonic() - started - sum(steps.values())
        faults.point("batch.after_dead_letters")

        self._describe(plan.batch_id, "bronze")
        if bronze is not None:
            self._commit_bronze(files, plan.batch_id)
        steps["bronze"] = time.monotonic() - started - sum(steps.values())
        faults.point("batch.after_bronze")

        self._describe(plan.batch_id, "aggregate_merge")
        partials = out.where(F.col("_kind") == "partial").select(
            "_kind", "_sp", *[c for c in out.columns if c.startswith(("_k", "_a")) and c != "_kind"])
        summaries = self._merge_arrow(partials, plan.batch_id, watermark, plan.watermark_ms)
        out.unpersist()
        steps["aggregate_merge"] = time.monotonic() - started - sum(steps.values())
        refused = {tuple(k): reason for s in summaries.values() for k, reason in s.get("rejected", [])}
        refused_counts = self._dead_letter_refused(*self._refusal_inputs(plan), refused, plan) if refused else {}
        faults.point("batch.after_merge")
        return {"reasons": reasons, "read": read_count, "late": late_count, "dead": dead_count,
                "refused": refused, "refused_counts": refused_counts, "summaries": summaries,
                "delta_keys": sum(s["delta_keys"] for s in summaries.values()), "watermark": watermark,
                "steps": steps, "release": (),
                "extra": {**{k: v for k, v in stats.items() if k in ("filtered", "read_bytes")},
                          "arrow_records": records or 0, "arrow_records_applied": applied or 0}}

    def _commit_batch(self, plan: BatchPlan, started: float, step: dict) -> BatchCommit:
        reasons, read_count, late_count, dead_count = step["reasons"], step["read"], step["late"], step["dead"]
        refused, refused_counts, summaries = step["refused"], step["refused_counts"], step["summaries"]
        watermark, steps, join_counts = step["watermark"], step["steps"], step["extra"]

        counts = {
            "read": read_count, "parsed": reasons.get(None, 0) - late_count, "late": late_count,
            "dead_lettered": dead_count + sum(refused_counts.values()),
            "keys_changed": sum(s["keys_changed"] for s in summaries.values()),
            "delta_keys": step["delta_keys"], "purged_windows": sum(s["purged"] for s in summaries.values()),
            **({"cold_workers": sum(s["cold"] for s in summaries.values())}
               if any("cold" in s for s in summaries.values()) else {}),
            **({"expired_keys": sum(s["expired"] for s in summaries.values())} if self.table.ttl_ms else {}),
            **({"purge_watermark_ms": purge_at} if (purge_at := self._purge_at(plan.batch_id, watermark)) else {}),
            **{f"dead_{reason}": n for reason, n in reasons.items() if reason},
            **{f"dead_{reason}": n for reason, n in refused_counts.items()},
            **{f"ms_{step}": round(seconds * 1000) for step, seconds in steps.items()},
            **join_counts,
        }
        commit = BatchCommit(
            batch_id=plan.batch_id, topic=plan.topic, ranges=plan.ranges,
            changelog_offsets={p: s["changelog_offset"] for p, s in summaries.items()},
            digests={p: s["digest"] for p, s in summaries.items()},
            key_counts={p: s["key_count"] for p, s in summaries.items()},
            counts=counts, watermark_ms=watermark, seconds=round(time.monotonic() - started, 3),
            topic_id=plan.topic_id, accepted=plan.accepted, definition=self.definition,
            refused=[[list(k), reason] for k, reason in sorted(refused.items(), key=repr)] or None,
            joins=plan.joins if self.table.table_join else None,
        )
        self.log.write_commit(commit, self.table.name)
        faults.point("batch.after_commit")
        for frame in step["release"]:
            frame.unpersist()
        self._after_commit(commit)
        elapsed = time.monotonic() - started
        log.info("%s batch %d committed: read %d, parsed %d, dead-lettered %d, late %d, merged %d keys "
                 "(%d changed) into %d partitions in %.1fs; %.0f events/s", self.table.name, plan.batch_id,
                 read_count, counts["parsed"], dead_count, late_count, step["delta_keys"], counts["keys_changed"],
                 len(summaries), elapsed, read_count / max(elapsed, 1e-6))
        return commit

    # ------------------------------------------------------------ windows
    def _split_late(self, events, watermark_ms):
        from pyspark.sql import functions as F

        window = self.table.window
        ts = F.unix_millis(F.col(self.table.event_time))
        last_start = ts - F.pmod(ts, F.lit(window.advance))
        is_late = F.lit(False) if watermark_ms is None else (ts + window.grace_ms < F.lit(watermark_ms)) \
            if window.session else (last_start + window.size_ms + window.grace_ms <= F.lit(watermark_ms))
        flagged = events.withColumn("_late", is_late)
        batch_max = flagged.where(~F.col("_late")).agg(F.max(ts)).first()[0]
        return flagged.where(~F.col("_late")).drop("_late"), flagged.where(F.col("_late")).drop("_late"), batch_max

    def _late_dead_letters(self, late, topic):
        from pyspark.sql import functions as F

        payload = F.to_json(F.struct(*[F.col(n) for n, _ in self.table.schema]))
        return parse.dead_letter_records(late, topic, payload, F.lit("late"), F.col("source_partition"),
                                         F.col("source_offset"), F.length(payload))

    def _dead_letter_refused(self, events, classified, refused: dict[tuple, str], plan: BatchPlan) -> dict[str, int]:
        """The batch's events for keys the state refused (a SUM past 64 bits, a value past the
        changelog's record limit) go to the dead letters with that reason; the dead letters are
        keyed by source offset and the Delta append is per batch, so a re-run writes them again
        harmlessly. Counts by reason."""
        from pyspark.sql import functions as F

        coords = self._refused_events(events, refused)
        raw = classified.select(F.col("_partition").alias("source_partition"), F.col("_offset").alias("source_offset"),
                                "_value", "_size")
        dead = parse.dead_letter_records(coords.join(raw, ["source_partition", "source_offset"]), plan.topic,
                                         F.col("_value"), F.col("reason"), F.col("source_partition"),
                                         F.col("source_offset"), F.col("_size")).persist()
        counts = {r["reason"]: r["count"] for r in dead.groupBy("reason").count().collect()}
        if counts:
            self._send_dead_letters(dead)
            (dead.select("reason", "source_partition", "source_offset",
                         F.col("value").cast("string").alias("value"), F.lit(plan.batch_id).alias("batch_id"))
             .write.format("delta").mode("append")
             .option("txnAppId", f"{self.table.name}.dlq-refused").option("txnVersion", plan.batch_id)
             .save(self.rt.delta_path(self.table.name, "dlq")))
        dead.unpersist()
        log.warning("%s batch %d: %d keys refused by the state (%s); their %d events dead-lettered", self.table.name,
                    plan.batch_id, len(refused), sorted(set(refused.values())), sum(counts.values()))
        return counts

    # ------------------------------------------------------------ sinks
    def _send_dead_letters(self, dead) -> None:
        """To the dead-letter topic by Spark's Kafka sink (append: the V2 sink takes no other mode)."""
        (dead.select("key", "value", "headers").write.format("kafka").mode("append")
         .options(**kafka_config.spark_options(self.rt.bootstrap)).option("topic", self.dead_letter_topic).save())

    def _write_dead_letters(self, dead, batch_id: int) -> int:
        from pyspark.sql import functions as F

        dead = dead.persist()
        count = dead.count()
        if not count:
            dead.unpersist()
            return 0
        self._send_dead_letters(dead)
        (dead.select("reason", "source_partition", "source_offset",
                     F.col("value").cast("string").alias("value"), F.lit(batch_id).alias("batch_id"))
         .write.format("delta").mode("append")
         .option("txnAppId", f"{self.table.name}.dlq").option("txnVersion", batch_id)
         .save(self.rt.delta_path(self.table.name, "dlq")))
        dead.unpersist()
        return count

    def _write_bronze(self, events, batch_id: int) -> None:
        from pyspark.sql import functions as F

        (events.withColumn("batch_id", F.lit(batch_id)).write.format("delta").mode("append")
         .option("txnAppId", f"{self.table.name}.bronze").option("txnVersion", batch_id)
         .option("mergeSchema", "true")
         .save(self.rt.delta_path(self.table.name, "bronze")))

    # ------------------------------------------------------------ the Arrow pass's sinks
    def _bronze_target(self, batch_id: int) -> str | None:
        """Where the pass writes bronze files: the bronze table's folder; None when the batch's
        bronze is already committed, or the table keeps none (`-- bronze: off`). Nothing is
        removed before the pass: on a shared Spark Connect session, a re-run of a batch whose
        client died can reuse that attempt's cached pass output, files and all, so its files must
        still be there (see `_commit_bronze`)."""
        if not self.table.bronze:
            return None
        path = self.rt.delta_path(self.table.name, "bronze")
        done = delta_files.committed_version(path, f"{self.table.name}.bronze")
        if done is not None and done >= batch_id:
            return None
        return path

    def _commit_bronze(self, files: dict[str, dict[str, int]], batch_id: int) -> None:
        """The workers' Parquet files of the batch, added to bronze in one Delta transaction
        (app id and version: a re-run after a crash adds nothing twice). Only the files this
        run's pass reported are committed; what an earlier attempt left with other names (cut at
        other boundaries) is removed afterwards, never read."""
        from spark_jobs import arrow_pass

        path = self.rt.delta_path(self.table.name, "bronze")
        if files:
            delta_files.commit_files(
                path, [delta_files.DataFile(name, f["bytes"], f["rows"]) for name, f in sorted(files.items())],
                arrow_pass.bronze_schema(self.table), f"{self.table.name}.bronze", batch_id)
        for name, _ in delta_files.listed(path, arrow_pass.bronze_file_prefix(batch_id)):
            if name not in files:
                delta_files.delete_file(path, name)

    def _merge_arrow(self, partials, batch_id: int, watermark: int | None,
                     previous_watermark: int | None = None) -> dict[int, dict]:
        """The partials (`_kind` = "partial", `_sp`, keys and values), grouped by state partition (a
        shuffle of one row per key and input batch), and one merge task per partition; a marker
        row per partition makes every partition commit."""
        from spark_jobs.merge_task import merge_arrow

        table = self.table
        ctx = MergeContext(table, batch_id, str(self.rt.state_dir), self.rt.bootstrap, self.rt.snapshot_uri,
                           self._purge_at(batch_id, watermark), self.rt.namespace, self.spec.changelog,
                           closing=(previous_watermark, watermark) if table.emit == "final" else None,
                           expire_before=watermark - table.ttl_ms if table.ttl_ms and watermark is not None else None,
                           replica_roots=local_replica_roots(self.rt))
        mirror_dir = mirror.changes_path(self.rt, table.name)
        summaries = per_state_partition(self.spark, partials, table.partitions,
                                        lambda group: merge_arrow(ctx, mirror_dir, group),
                                        f"{table.name} batch {batch_id}: merge")
        slowest = max(summaries.values(), key=lambda s: sum(s["ms"].values()))
        served: dict[str, list[int]] = {}
        for p, s in sorted(summaries.items()):
            served.setdefault(s.get("worker", "?"), []).append(p)
        for s in summaries.values():      # forked by a daemon that began during this batch: a cold engine
            s["cold"] = not 0 < s.get("daemon_started", 0) < self._begun_at
        cold = [p for p, s in sorted(summaries.items()) if s["cold"]]
        if cold:
            log.info("%s batch %d: partitions %s were merged by Python workers that started cold (their daemon "
                     "began during this batch, imports and all): the engine was not warm", table.name, batch_id, cold)
        seeded = [p for p, s in sorted(summaries.items()) if s.get("seeded")]
        hydrated = [p for p, s in sorted(summaries.items()) if s.get("hydrated") and p not in seeded]
        log.info("%s batch %d: merged %d keys into %d partitions; the slowest task's ms: %s; partitions served by "
                 "%s%s%s", table.name, batch_id, sum(s["delta_keys"] for s in summaries.values()), len(summaries),
                 slowest["ms"], json.dumps(served, sort_keys=True),
                 f"; restored from snapshots and the changelog (no local copy): {hydrated}" if hydrated else "",
                 f"; copied from a local query replica, then the changelog: {seeded}" if seeded else "")
        return summaries

    def _refusal_inputs(self, plan: BatchPlan):
        """(events, raw records) of a batch whose keys the state refused: bronze holds the batch's
        events (without bronze, Spark SQL parses the batch again), and the refused ones' bytes are
        read again (only on this rare path)."""
        from pyspark.sql import functions as F

        records = spark_reader(self.spark, self.rt.bootstrap, OffsetRange(plan.topic, plan.ranges), self.reader_group)
        if self.table.bronze:
            events = self.spark.read.format("delta").load(self.rt.delta_path(self.table.name, "bronze")) \
                .where(F.col("batch_id") == plan.batch_id)
        else:
            key_fields = self.table.stream_key_fields
            classified = parse.classify(records, self.table, key_fields, now_ms=int(plan.created_at * 1000))
            events = parse.good_events(classified, self.table)
            if self.table.window is not None:
                events = self._split_late(events, plan.watermark_ms)[0]
        raw = records.select(F.col("partition").alias("_partition"), F.col("offset").alias("_offset"),
                             F.col("value").alias("_value"), F.length("value").alias("_size"))
        return events, raw

    # ------------------------------------------------------------ deltas
    def _enrich(self, events, pins: dict | None):
        """`events` plus each joined table's columns (`<alias>__<col>`) as pinned in the batch's
        plan (`pins`; None: as committed now), and `_enriched`.

        A batch enriches its events once and keeps the result in bronze, so the recomputation
        joins exactly what each batch joined (a player renamed later stays as he was)."""
        from pyspark.sql import functions as F

        frame = events
        for join in self.table.joins:
            other = self.tables[join.table]
            snapshot = self._reference(other, pins).select(
                *[F.col(n).alias(f"{join.alias}__{n}") for n, _ in other.schema])
            cond = F.col(join.stream_column.split(".")[-1]) == F.col(f"{join.alias}__{join.table_column}")
            frame = frame.join(F.broadcast(snapshot), cond, "left")
        return frame.withColumn("_enriched", F.lit(True))

    def _reference(self, other: TableDefinition, pins: dict | None):
        """A joined table's rows: the batch's pinned file, or (no pin) its committed state now."""
        if pins is not None:
            return self.spark.read.parquet(spark_path(f"{self.log.location}/joins/{pins[other.name]['file']}"))
        # The declared schema, not one inferred: a table with no rows yet (never run, or all
        # deleted) is an ordinary reference and must join as an empty one.
        from spark_jobs.arrow_pass import SPARK_TYPE

        ddl = ", ".join(f"`{n}` {SPARK_TYPE.get(t, t)}" for n, t in other.schema)
        return self.spark.createDataFrame(_typed_rows(other, mirror.committed_rows(self.rt, other.name)[1]), ddl)

    def _joined(self, events, counts: dict | None = None):
        """Stream columns as `<alias>__<col>`, with each joined table's values as the batch saw them
        (see `_enrich`; bronze written before enrichment was kept is joined with today's data).

        Every join is evaluated as a left join; an inner join then drops the
        events its table has no row for, and `counts["join_unmatched"]` says
        how many, so nothing disappears without a trace.
        """
        from pyspark.sql import functions as F

        joins = self.table.joins
        joined_cols = [f"{j.alias}__{n}" for j in joins for n, _ in self.tables[j.table].schema]
        if joins and "_enriched" not in events.columns:
            events = self._enrich(events, None)
        elif joins:
            legacy = events.where(F.col("_enriched").isNull()).drop(*joined_cols, "_enriched")
            events = events.where(F.col("_enriched").isNotNull()).unionByName(self._enrich(legacy, None))
        alias = self.table.stream_alias or self.table.name
        frame = events.select(*[F.col(n).alias(f"{alias}__{n}") for n, _ in self.table.schema],
                              _event_order(events), "source_partition", "source_offset",
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

    def _batch_partials(self, events, classified, counts: dict):
        """This batch's partials with their state partitions (see `_partials`, `_source_partials`)."""
        if self.table.kind == "source":
            return self.partitioned(self._source_partials(classified))
        return self.partitioned(self._partials(self._selected(self._joined(events, counts), counts)))

    def _selected(self, frame, counts: dict | None = None):
        """The events the table's WHERE keeps; `counts["filtered"]` says how many it did not."""
        from pyspark.sql import functions as F

        for name, sql in self.table.derived.items():          # aggregate arguments that are expressions
            frame = frame.withColumn(_q(self.table, name), spark_expression(self.table, sql))
        if self.table.event_ms:                               # a TTL's or a session's MAX reads it
            frame = frame.withColumn(_q(self.table, EVENT_MS), F.unix_millis(F.col(_q(self.table, self.table.event_time))))
        condition = where_condition(self.table)
        if condition is None:
            return frame
        frame = frame.withColumn("_selected", condition)
        if counts is not None:
            counts["filtered"] = frame.where(~F.col("_selected")).count()
        return frame.where(F.col("_selected")).drop("_selected")

    def _keyed(self, frame):
        """The frame with its state key as columns _k0.. (a hopping window repeats an event per window)."""
        from pyspark.sql import functions as F

        table = self.table
        group_cols = [F.col(_q(table, k)).alias(f"_k{i}") for i, k in enumerate(table.key_columns)]
        if table.window is not None and table.window.session:
            frame = self._sessioned(frame)
            group_cols.append(F.col("_wstart").alias(f"_k{len(table.key_columns)}"))
        elif table.window is not None:
            window = table.window
            ts_col = _q(table, table.event_time)
            w = F.window(F.col(ts_col), f"{window.size_ms} milliseconds", f"{window.advance} milliseconds")
            frame = frame.withColumn("_w", w).withColumn("_wstart", F.unix_millis(F.col("_w.start")))
            # Kafka Streams starts no window before the epoch; an event before it keeps all of its own.
            frame = frame.where((F.col("_wstart") >= 0) | (F.unix_millis(F.col(ts_col)) < 0))
            frame = self._open_windows(frame)
            group_cols.append(F.col("_wstart").alias(f"_k{len(table.key_columns)}"))
        key_aliases = [f"_k{i}" for i in range(len(group_cols))]
        return frame.select(*group_cols, *[F.col(c) for c in frame.columns if c not in ("_w",)]), key_aliases

    def _open_windows(self, frame):
        """A HOP event's windows that were still open when its batch started: one whose end plus
        grace is at or before the batch's starting watermark has closed (and, with `emit: final`,
        been published), so the event joins only its newer windows, as in Kafka Streams and
        ksqlDB. Live, the batch's plan gives the watermark (`window_floor`); over bronze, each
        event's batch does, from the batch log."""
        from pyspark.sql import functions as F

        window = self.table.window
        if window.advance >= window.size_ms:          # TUMBLE: one window, judged by _split_late
            return frame
        closes = F.col("_wstart") + F.lit(window.size_ms + window.grace_ms)
        if "batch_id" not in frame.columns:
            floor = self.window_floor
            return frame if floor is None else frame.where(closes > F.lit(floor))
        marks, high = [], None
        for commit in self.log.commits():             # the watermark each batch started from
            marks.append((commit.batch_id, high))
            if commit.watermark_ms is not None:
                high = commit.watermark_ms if high is None else max(high, commit.watermark_ms)
        if not any(mark is not None for _, mark in marks):
            return frame
        floors = self.spark.createDataFrame(marks, "batch_id BIGINT, _floor BIGINT")
        return (frame.join(F.broadcast(floors), "batch_id", "left")
                .where(F.col("_floor").isNull() | (closes > F.col("_floor"))).drop("_floor"))

    def _sessioned(self, frame):
        """Each event with the start of its session (`_wstart`) among the frame's events: by key
        and event time, a gap of more than the session gap starts a new one (as arrow_pass does;
        state.windows.merge_sessions joins them with the stored ones). Over bronze, these are the
        table's whole sessions."""
        from pyspark.sql import Window, functions as F

        table = self.table
        ts = F.col(_q(table, EVENT_MS))
        keys = [F.col(_q(table, k)) for k in table.key_columns]
        by_time = Window.partitionBy(*keys).orderBy(ts)
        starts = F.coalesce(ts - F.lag(ts).over(by_time) > F.lit(table.window.size_ms), F.lit(True))
        return (frame.withColumn("_session", F.sum(starts.cast("int")).over(by_time.rowsBetween(Window.unboundedPreceding, 0)))
                .withColumn("_wstart", F.min(ts).over(Window.partitionBy(*keys, "_session"))).drop("_session"))

    def _refused_events(self, events, refused: dict[tuple, str]):
        """(source_partition, source_offset, reason) of this batch's events for keys the state refused."""
        from pyspark.sql import functions as F

        keyed, key_aliases = self._keyed(self._selected(self._joined(events)))
        reasons = self.spark.createDataFrame([tuple(k) + (r,) for k, r in refused.items()], key_aliases + ["reason"])
        return (keyed.join(reasons, key_aliases, "inner")
                .groupBy("source_partition", "source_offset")
                .agg(F.first("reason").alias("reason")))

    def _partials(self, frame, exclude: list[tuple[int, tuple]] | None = None):
        """The events' partial aggregates per key, shaped as the Arrow pass's (_k0.., _a0..; see
        merge_task.partial_rows). `exclude`: (batch id, key) pairs whose events the state refused (see Transaction.commit);
        a recomputation from bronze leaves them out as the batches did."""
        from pyspark.sql import Window, functions as F

        table = self.table
        frame, key_aliases = self._keyed(frame)
        if exclude:
            refused = self.spark.createDataFrame([tuple(k) + (b,) for b, k in exclude], key_aliases + ["batch_id"])
            frame = frame.join(refused, key_aliases + ["batch_id"], "left_anti")
        plain, topks = [], []
        stored = _state_columns(frame)
        integral = {f.name for f in frame.schema.fields if f.dataType.typeName() in ("long", "integer", "short", "byte")}

        def summed(name: str, column):
            # Integer sums as DECIMAL(38,0), as the Arrow pass sums them: a SUM past 64 bits reaches
            # the state, which refuses that key (sum_overflow) and goes on, where Spark's own
            # BIGINT sum would fail the batch on every re-run.
            return F.sum(column.cast("decimal(38,0)") if name in integral else column)

        for i, agg in enumerate(table.aggregates):
            args = [stored(_q(table, a)) for a in agg.args]
            if agg.function == "count":
                plain.append(F.count(args[0] if args else F.lit(1)).alias(f"_a{i}"))
            elif agg.function == "sum":
                plain.append(summed(_q(table, agg.args[0]), args[0]).alias(f"_a{i}"))
            elif agg.function in ("min", "max"):
                plain.append(getattr(F, agg.function)(args[0]).alias(f"_a{i}"))
            elif agg.function == "avg":
                plain.append(F.struct(F.coalesce(summed(_q(table, agg.args[0]), args[0]), F.lit(0)).alias("s"),
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
            ranked_by = _topk_score(score, stored.types.get(_q(table, agg.args[0])))
            top = (frame.where(score.isNotNull()).withColumn("_rn", F.row_number().over(rank))
                   .where(F.col("_rn") <= agg.n)
                   .groupBy(*key_aliases)
                   .agg(F.collect_list(F.struct(ranked_by.alias("score"), F.col("_order").alias("o"),
                                                F.struct(*rest).alias("typed"))).alias(f"_a{i}")))
            grouped = grouped.join(top, key_aliases, "left")
        return grouped

    def _source_partials(self, classified, table: TableDefinition | None = None):
        """Latest record per key in the batch (_k0, _del for a tombstone, _v0.. the values) of this
        source table, or of `table` (the input of an aggregate over a table)."""
        from pyspark.sql import Window, functions as F

        table = table or self.table
        pk, pk_type = table.key_columns[0], dict(table.schema)[table.key_columns[0]]
        key_expr = F.when(F.col("reason") == "null_value", parse.kafka_key_text(table).try_cast(pk_type)) \
            .otherwise(F.col(f"_parsed.`{pk}`"))
        frame = classified.where(F.col("reason").isNull() | (F.col("reason") == "null_value")).select(
            key_expr.alias("_k0"), (F.col("reason") == "null_value").alias("_del"), F.col("_offset"),
            F.col("_partition"), *[F.col(f"_parsed.`{c}`").alias(f"_v{i}") for i, c in enumerate(table.value_columns)])
        latest = Window.partitionBy("_k0").orderBy(F.desc("_partition"), F.desc("_offset"))
        return (frame.where(F.col("_k0").isNotNull()).withColumn("_rn", F.row_number().over(latest))
                .where("_rn = 1").drop("_rn", "_offset", "_partition"))

    def partitioned(self, partials):
        """Partials with their state partition `_sp` (the state library's rule, in Python: mapInArrow)."""
        from pyspark.sql.types import IntegerType, StructField, StructType

        from spark_jobs.arrow_pass import with_state_partition

        parts, width = self.table.partitions, self.table.routing_width
        schema = StructType(partials.schema.fields + [StructField("_sp", IntegerType())])
        return partials.mapInArrow(lambda batches: with_state_partition(parts, batches, width), schema)

    # ------------------------------------------------------------ merge
    def _purge_at(self, batch_id: int, watermark: int | None) -> int | None:
        """The watermark this batch purges expired windows at (every snapshot_every batches), or None."""
        table = self.table
        return watermark if (table.window is not None and batch_id % table.snapshot_every == 0) else None

    # ------------------------------------------------------------ after commit
    def _finish_last_commit(self) -> None:
        last = self.log.last_commit()
        if last is not None:
            self._after_commit(last)

    def _after_commit(self, commit: BatchCommit) -> None:
        mirror.commit_changes(self.rt, self.table.name, commit.batch_id)
        faults.point("mirror.after_changes")
        if self.table.over_table:
            from spark_jobs.table_aggregate import drop_retractions

            drop_retractions(self.rt, self.table.name, commit.batch_id)
        mirror.fold_if_due(self.spark, self.rt, self.table, commit.batch_id)
        if self.snapshots:
            self._snapshot_if_due(commit)
        faults.point("batch.after_snapshot")
        self._commit_group_offsets(commit)
        faults.point("batch.after_offsets")

    def _snapshot_if_due(self, commit: BatchCommit) -> None:
        from catalog.registry import due_snapshots

        table = self.table
        ctx = (self.spec, str(self.rt.state_dir), self.rt.bootstrap, self.rt.snapshot_uri, task_faults(self.spark))
        due = due_snapshots(table, self.rt, commit.batch_id)
        if not due:
            return
        started = time.monotonic()
        self._describe(commit.batch_id, "snapshot")
        from pyspark.sql import functions as F

        # One task per partition from spark.range, not a Python list: the same empty job took
        # 0.36-0.50 s warm (4.5 s cold) from createDataFrame + repartition, and 0.21-0.27 s from range.
        specs = [ctx]
        if table.input_table:           # the rows stage is snapshotted with its groups, at the same batches
            from catalog.mapping import rows_spec

            specs.append((rows_spec(table, self.rt.namespace),) + ctx[1:])
        for each in specs:
            (self.spark.range(0, table.partitions, 1, table.partitions).select(F.col("id").cast("int").alias("p"))
             .where(F.col("p").isin(due)).mapInArrow(lambda batches, c=each: _snapshot_partitions(c, batches), "p INT")
             .collect())
        log.info("%s: snapshot of partitions %s at batch %d in %.2fs", table.name, due, commit.batch_id,
                 time.monotonic() - started)

    def _commit_group_offsets(self, commit: BatchCommit) -> None:
        """The batch's end offsets in a consumer group, for the lag tools users already run. The
        batch log holds the offsets that count, so a refusal here warns (naming the group and the
        ACL that fixes it) and never fails a committed batch."""
        from confluent_kafka import KafkaException, TopicPartition

        from state.kafka_admin import group_committer

        group = f"statetable.{self.rt.namespace}{self.table.name}"
        try:
            group_committer(self.rt.bootstrap, group).commit(
                offsets=[TopicPartition(commit.topic, p, end) for p, (_, end) in commit.ranges.items()],
                asynchronous=False)
        except KafkaException as exc:
            log.warning("%s batch %d is committed, but its offsets were not committed to consumer group %s, so lag "
                        "tools show the group behind (%s); if the broker's ACLs refuse it, grant READ on groups "
                        "prefixed 'statetable.' to statetable's principal", self.table.name, commit.batch_id, group,
                        exc.args[0].str())


def _event_order(events):
    """`_order`: state.aggregates.event_order of each event (batch, then source offset)."""
    from pyspark.sql import functions as F

    from state.aggregates import OFFSET_BITS

    return (F.shiftleft(F.col("batch_id").cast("bigint"), OFFSET_BITS) + F.col("source_offset")).alias("_order")


def _state_columns(frame):
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


def _topk_score(score, kind):
    """TOPK's score as the Arrow pass gives it (a DOUBLE) when it is a number, a time (epoch
    milliseconds) or a date (days); a STRING score ranks by its own order (state.aggregates.ranked)."""
    from pyspark.sql import types as T

    return score if isinstance(kind, (T.StringType, T.BooleanType)) else score.cast("double")


def engine_of(table: TableDefinition) -> str:
    """"arrow" (one Arrow pass) where it covers the definition, else "spark"; STATETABLE_ENGINE
    forces one (the benchmark's before-and-after profile)."""
    from spark_jobs import arrow_pass

    forced = os.environ.get("STATETABLE_ENGINE")
    if forced == "spark":
        return "spark"
    try:
        arrow_pass.check_supported(table)
    except arrow_pass.Unsupported as exc:
        if forced == "arrow":
            raise
        log.debug("%s: the Spark-SQL pass runs it (the Arrow pass does not cover %s)", table.name, exc)
        return "spark"
    return "arrow"


def _typed_rows(table: TableDefinition, rows):
    """A table's mirror rows (JSON, see mirror.committed_rows) as typed columns of its schema."""
    import pyarrow as pa

    from spark_jobs.arrow_pass import parse_values

    typed, _, bad = parse_values(rows.column("row").cast(pa.binary()), table.schema)
    if bad:
        raise ValueError(f"{table.name}: {len(bad)} mirror rows do not parse as its schema, e.g. row {bad[0]}")
    return typed


def _snapshot_partitions(ctx, batches):
    """mapInArrow body: snapshot the partitions named in `batches` on this executor."""
    from state.table import StateTable

    spec, state_dir, bootstrap, snapshot_uri, armed = ctx
    faults.arm(*armed)
    for batch in batches:
        for partition in batch.column("p").to_pylist():
            table = StateTable(spec, task_state_dir(state_dir), bootstrap=bootstrap, snapshot_uri=snapshot_uri)
            try:
                table.snapshot(partition)
            finally:
                table.close()
            yield batch.slice(0, 0)
