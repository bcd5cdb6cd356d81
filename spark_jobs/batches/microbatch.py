"""One table's micro-batches, exactly once.

Steps of batch b, the module that does each, and the fault point after it (state.faults); the
steps of a pass are timed and fault-pointed by one step clock (steps/clock.py):

  plan         fix input offsets, write the plan        batches/planning      batch.after_plan
  read+parse   Spark's Kafka source, one Arrow pass     steps/arrow_step
               (or from_json on the Spark-SQL pass)     (steps/sql_step)      batch.after_read
  dead letters Kafka DLQ topic + Delta DLQ table        steps/sinks           batch.after_dead_letters
  bronze       the workers' files committed to Delta    steps/sinks           batch.after_bronze
  merge        partials grouped by state partition,     steps/merge_step,
               one merge task per partition             steps/merge_task      batch.mid_merge, batch.after_merge
  commit       the batch log's commit entry             (here)                batch.after_commit
  mirror       commit the merge tasks' change files,    batches/after_commit  mirror.after_changes
               fold them every mirror_every batches                           mirror.after_merge
  snapshot     when due                                 batches/after_commit  batch.after_snapshot
  offsets      consumer-group offsets for lag tools     batches/after_commit  batch.after_offsets

Which steps run read..merge is the table kind's Pass (spark_jobs/passes/: a source table and an
aggregate over a stream use arrow_step or sql_step; a table of tables runs its own stages,
steps/table_aggregate or steps/table_join); `pass_for` is the one place that asks a table's kind.
The Spark-SQL relational algebra of a table is frames/table_frames.TableFrames, shared with the
recomputation (recompute/: verify, rebuild); what the steps share is a steps/table_run.TableRun.
The map of every wing is spark_jobs/__init__.py.

Everything before the commit entry is idempotent (state commits skip an
applied batch id, Delta writes carry txnAppId/txnVersion, the mirror is an
upsert of final values, DLQ records are keyed by source coordinates), so a
batch interrupted anywhere is finished by running it again from its plan.
Everything after the commit entry is repeated for the last committed batch
at start-up.
"""
from __future__ import annotations

import logging
import time

from catalog.batch_log import BatchCommit, BatchPlan
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime
from spark_jobs.batches import after_commit, planning
from spark_jobs.steps import merge_step
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.passes import pass_for
from spark_jobs.steps.table_run import TableRun
from state import faults

__all__ = ["MicroBatchRunner", "engine_of"]

log = logging.getLogger("statetable.microbatch")


class MicroBatchRunner:
    """The sequence of a table's batches: plan → read → pass → merge → commit → publish, the
    commit entry, the work after it, and the retries a lost broker calls for. The steps live in
    their own modules (planning, sql_step/arrow_step or a table-of-tables stage, sinks,
    merge_step, after_commit); this class only orders them."""

    def __init__(self, spark, table: TableDefinition, tables: dict[str, TableDefinition], runtime: Runtime,
                 snapshots: bool = True) -> None:
        """No I/O here: `prepare` (called by `run`) makes the checks and topics a writer needs.
        `snapshots=False` leaves snapshots to the caller (the Airflow DAG has a task of its own)."""
        self.table_run = TableRun(spark, table, tables, runtime)
        self.table, self.rt, self.snapshots = table, runtime, snapshots
        self.table_pass = pass_for(table)
        self.engine = self.table_pass.engine
        self.prepared = False

    def prepare(self) -> None:
        if not self.prepared:
            planning.prepare(self.table_run)
            self.prepared = True

    def lag(self) -> int:
        return planning.lag(self.table.name, self.rt, self.table.topic, self.table)

    def run(self, max_batches: int | None = None, until_caught_up: bool = False) -> list[BatchCommit]:
        self.prepare()
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

    def run_one(self) -> BatchCommit | None:
        self.prepare()
        plan = planning.next_plan(self.table_run)
        if plan is None:
            return None
        faults.point("batch.after_plan")
        started, begun_at = time.monotonic(), time.time()
        return self._commit(plan, started, self._pass(plan, started, begun_at))

    def _pass(self, plan: BatchPlan, started: float, begun_at: float) -> BatchStep:
        """Read, dead letters, bronze and merge, by the pass of the table's kind (spark_jobs.passes)."""
        return self.table_pass.run(self.table_run, plan, started, begun_at)

    def _commit(self, plan: BatchPlan, started: float, step: BatchStep) -> BatchCommit:
        """The batch's commit entry (the commit point: before it the batch is re-run from its
        plan, after it the batch is done), then the work that follows it."""
        commit = BatchCommit(
            batch_id=plan.batch_id, topic=plan.topic, ranges=plan.ranges,
            changelog_offsets={p: s.changelog_offset for p, s in step.summaries.items()},
            digests={p: s.digest for p, s in step.summaries.items()},
            key_counts={p: s.key_count for p, s in step.summaries.items()},
            counts=self._counts(plan, step), watermark_ms=step.watermark, seconds=round(time.monotonic() - started, 3),
            topic_id=plan.topic_id, accepted=plan.accepted, definition=self.table_run.definition,
            refused=[[list(k), reason] for k, reason in sorted(step.refused.items(), key=repr)] or None,
            changelog=self.table_run.spec.changelog,
            joins=plan.joins if self.table_pass.pins_since else None, event_times=step.event_times,
        )
        self.table_run.log.write_commit(commit, self.table.name)
        faults.point("batch.after_commit")
        for frame in step.release:
            frame.unpersist()
        after_commit.finish(self.table_run, commit, self.snapshots)
        elapsed = time.monotonic() - started
        log.info("%s batch %d committed: read %d, parsed %d, dead-lettered %d, late %d, merged %d keys "
                 "(%d changed) into %d partitions in %.1fs; %.0f events/s", self.table.name, plan.batch_id,
                 step.read, commit.counts["parsed"], step.dead, step.late, step.delta_keys,
                 commit.counts["keys_changed"], len(step.summaries), elapsed, step.read / max(elapsed, 1e-6))
        return commit

    def _counts(self, plan: BatchPlan, step: BatchStep) -> dict:
        """What the batch log records of the batch: /metrics, `statetable tables` and the
        dead-letter report read these."""
        summaries, table = step.summaries.values(), self.table
        purge_at = merge_step.purge_at(table, plan.batch_id, step.watermark)
        return {
            "read": step.read, "parsed": step.reasons.get(None, 0) - step.late, "late": step.late,
            "dead_lettered": step.dead + sum(step.refused_counts.values()),
            "keys_changed": step.total("keys_changed"), "delta_keys": step.delta_keys,
            "purged_windows": step.total("purged"),
            **({"cold_workers": sum(bool(s.cold) for s in summaries)} if any(s.cold is not None for s in summaries) else {}),
            **({"expired_keys": step.total("expired")} if table.ttl_ms else {}),
            **({"purge_watermark_ms": purge_at} if purge_at else {}),
            **{f"dead_{reason}": n for reason, n in step.reasons.items() if reason},
            **{f"dead_{reason}": n for reason, n in step.refused_counts.items()},
            **{f"ms_{name}": round(seconds * 1000) for name, seconds in step.steps.items()},
            **step.extra,
        }

    def _finish_last_commit(self) -> None:
        last = self.table_run.log.last_commit()
        if last is not None:
            after_commit.finish(self.table_run, last, self.snapshots)


def engine_of(table: TableDefinition) -> str:
    """"arrow", "spark" or "tables": the pass that computes the table's batches (Pass.engine)."""
    return pass_for(table).engine
