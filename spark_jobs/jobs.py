"""Table jobs as functions: run, restore, query, verify, rebuild.

The CLI, spark-submit entry points (`spark_jobs/submit.py`) and
Airflow tasks all call these, so each behaviour exists once.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from state import faults
from state.errors import UserFixable
from catalog.registry import (coerce_key, drop_stale_cache, due_snapshots, load_table,  # noqa: F401 (API)
                                 readonly_partitions, spec_of, stage_tables, state_rows, state_table, table_lock)
from catalog.runtime import Runtime
from spark_jobs.errors import RollbackRefused
from catalog.errors import UserError

log = logging.getLogger("statetable.jobs")


def run(name: str, max_batches: int | None = None, until_caught_up: bool = False, spark=None,
        rt: Runtime | None = None, max_records_per_batch: int | None = None, snapshots: bool = True,
        finish_pending_only: bool = False):
    """Run micro-batches; `finish_pending_only` completes an interrupted batch and starts none."""
    from spark_jobs.engine import session
    from spark_jobs.batches.microbatch import MicroBatchRunner

    faults.validate(os.environ.get(faults.ENV))
    rt = rt or Runtime.from_env()
    table, tables = load_table(name, rt)
    if max_records_per_batch:
        table.max_records_per_batch = max_records_per_batch
    with table_lock(name, rt):
        from catalog.batch_log import BatchLog

        if finish_pending_only and BatchLog(rt.batch_dir(name)).pending_plan() is None:
            return []
        spark = spark or session.get_or_create(f"statetable-{name}")
        runner = MicroBatchRunner(spark, table, tables, rt, snapshots=snapshots)
        started = time.monotonic()
        commits = runner.run(max_batches=1 if finish_pending_only else max_batches,
                             until_caught_up=until_caught_up and not finish_pending_only)
    read = sum(c.counts["read"] for c in commits)
    elapsed = time.monotonic() - started
    log.info("%s: %d batches, %d records in %.1fs (%.0f records/s), lag now %d", name, len(commits), read,
             elapsed, read / max(elapsed, 1e-6), runner.lag())
    return commits


def follow(name: str, poll_seconds: float = 0.5, spark=None, rt: Runtime | None = None,
           stop: threading.Event | None = None, on_commit=None) -> int:
    """Keep one warm Spark session and run a batch as soon as the topic has anything new.

    The scheduled DAG pays a process and Spark start per run; a follower pays
    them once, so freshness is one small batch plus the poll interval. It holds
    the table lock for as long as it runs: the DAG's batches wait (or time out)
    rather than interleave with it. Returns the number of batches committed.
    """
    from spark_jobs.engine import session
    from spark_jobs.batches.microbatch import MicroBatchRunner

    rt = rt or Runtime.from_env()
    table, tables = load_table(name, rt)
    stop = stop or threading.Event()
    committed = 0
    with table_lock(name, rt):
        spark = spark or session.get_or_create(f"statetable-{name}-follow")
        runner = MicroBatchRunner(spark, table, tables, rt)
        log.info("%s: following %s, polling every %.2fs", name, table.topic, poll_seconds)
        while not stop.is_set():
            commits = runner.run(until_caught_up=True)
            for commit in commits:
                committed += 1
                log.info("%s: batch %d, %d records in %.2fs", name, commit.batch_id, commit.counts["read"],
                         commit.seconds)
                if on_commit:
                    on_commit(commit)
            if not commits:
                stop.wait(poll_seconds)
    return committed


def restore(name: str, batch: int | None = None, rt: Runtime | None = None, missing_only: bool = False,
            force: bool = False) -> list:
    """Restore partitions from snapshots plus changelog; `missing_only` skips partitions that have local state.

    A `batch` before the last committed one rolls the live store back while the batch log stays
    ahead: readers are served the old batch and verify fails until the next batch brings the
    store forward again. That is refused unless `force`."""
    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    if batch is not None and not force:
        from catalog.batch_log import BatchLog

        last = BatchLog(rt.batch_dir(name)).last_commit()
        if last is not None and batch < last.batch_id:
            raise RollbackRefused(
                f"table {name!r}: batch {batch} is older than its last committed batch {last.batch_id}; restoring "
                f"it rolls the live store back while the batch log stays at {last.batch_id}, so queries would "
                f"serve batch {batch} and verify would fail until the next batch. Restore without --batch, or pass "
                f"--force to roll back anyway")
    with table_lock(name, rt):
        tables = stage_tables(table, rt)          # a table of tables' rows stage too, to the same batch
        try:
            return [st.restore(p, batch) for st in tables for p in range(table.partitions)
                    if not (missing_only and st.has_local_state(p))]
        finally:
            for st in tables:
                st.close()


def accept_offsets(name: str, rt: Runtime | None = None, note: str = "") -> dict:
    """An operator's explicit acceptance of a topic discontinuity (see offsets.next_starts): the next
    batch starts at the earliest offsets the topic holds now, and the batch log keeps the entry
    (problem, old and new positions, time, note) beside the last commit, and in the next batch."""
    import getpass

    from catalog.batch_log import BatchLog
    from spark_jobs.steps.offsets import OffsetDiscontinuity, next_starts, topic_id, watermarks

    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    with table_lock(name, rt):
        batch_log = BatchLog(rt.batch_dir(name))
        if batch_log.pending_plan() is not None:
            raise UserError(f"table {name!r} has an unfinished batch; `statetable run {name}` finishes it first")
        position = batch_log.read_position()
        if position is None:
            raise UserError(f"table {name!r} has no committed batch: its first batch starts at the topic's "
                            f"earliest offsets anyway")
        marks = watermarks(rt.bootstrap, table.topic)
        incarnation = topic_id(rt.bootstrap, table.topic)
        try:
            next_starts(name, table.topic, marks, incarnation, *position[:3])
        except OffsetDiscontinuity as exc:
            problem = str(exc)
        else:
            raise UserError(f"table {name!r}: topic {table.topic!r} continues where the table stopped reading; "
                            f"there is nothing to accept")
        entry = {
            "problem": problem, "topic": table.topic, "topic_id": incarnation,
            "starts": {str(p): low for p, (low, _) in marks.items()},
            "previous": {"topic": position[0], "topic_id": position[1],
                         "ends": {str(p): end for p, end in position[2].items()}},
            "accepted_at": time.time(), "by": getpass.getuser(), "note": note,
        }
        last = batch_log.last_commit()
        batch_log.write_acceptance(last.batch_id, entry)
        log.warning("%s: accepted after batch %d: %s", name, last.batch_id, problem)
        return entry


def snapshot_if_due(name: str, rt: Runtime | None = None) -> dict:
    """Snapshot the partitions that are due, in this process (no Spark needed)."""
    from catalog.batch_log import BatchLog

    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    with table_lock(name, rt):
        last = BatchLog(rt.batch_dir(name)).last_commit()
        if last is None:
            return {"batch": None, "partitions": [], "seconds": 0.0}
        due = due_snapshots(table, rt, last.batch_id)
        started = time.monotonic()
        tables = stage_tables(table, rt)          # a table of tables' rows stage with its own state
        try:
            for st in tables:
                for p in due:
                    manifest = st.snapshot(p)
                    log.info("%s[%d]: snapshot at batch %d, %d files", st.spec.name, p, manifest.batch_id,
                             len(manifest.files))
        finally:
            for st in tables:
                st.close()
        return {"batch": last.batch_id, "partitions": due, "seconds": round(time.monotonic() - started, 3)}


def _write_result(path: str | None, result: dict) -> None:
    """The job's outcome for the Airflow task after it (spark-submit has no XCom)."""
    print("STATETABLE_RESULT " + json.dumps(result, default=str), flush=True)
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(result, default=str, indent=1))
        os.replace(tmp, target)


def commit_summary(commit) -> dict:
    return {"batch": commit.batch_id, **commit.counts, "seconds": commit.seconds}


def main(argv: list[str] | None = None) -> int:
    """Entry point of spark_jobs.submit: {run,verify,rebuild} TABLE [options].

    Exit codes: 0 done, 1 verify found differences, 2 bad arguments or definitions.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="spark_jobs.jobs")
    parser.add_argument("action", choices=["run", "verify", "rebuild"])
    parser.add_argument("table")
    parser.add_argument("--max-batches", type=int, help="run: at most this many batches in this session")
    parser.add_argument("--until-caught-up", action="store_true")
    parser.add_argument("--no-snapshot", action="store_true", help="run: leave snapshots to a later task")
    parser.add_argument("--finish-pending", action="store_true",
                        help="verify: first finish an interrupted batch from its plan")
    parser.add_argument("--full", action="store_true",
                        help="verify: recompute from the beginning, not from the last verified checkpoint")
    parser.add_argument("--window", default="", help="rebuild: FROM_MS:TO_MS, windows starting in [from, to); "
                                                     "empty rebuilds in full; `once`: in full unless the last "
                                                     "commit already is a full rebuild")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (overrides STATETABLE_KAFKA_BOOTSTRAP)")
    parser.add_argument("--result-file", help="write the outcome as JSON here")
    args = parser.parse_args(argv)
    if args.bootstrap:
        os.environ["STATETABLE_KAFKA_BOOTSTRAP"] = args.bootstrap
    rt = Runtime.from_env()
    try:
        if args.action == "run":
            started = time.monotonic()
            commits = run(args.table, args.max_batches, args.until_caught_up, rt=rt,
                          snapshots=not args.no_snapshot)
            _write_result(args.result_file, {
                "table": args.table, "batches": [commit_summary(c) for c in commits],
                "read": sum(c.counts["read"] for c in commits), "seconds": round(time.monotonic() - started, 3)})
            return 0
        if args.action == "rebuild":
            from spark_jobs.recompute.rebuild import rebuild

            window = None
            once = args.window == "once"      # a backfill day of a table without windows
            if args.window and not once:
                try:
                    window = tuple(int(part) for part in args.window.split(":"))
                    assert len(window) == 2
                except (ValueError, AssertionError):
                    raise UserError(f"table {args.table!r}: --window {args.window!r} must be FROM_MS:TO_MS") from None
            commit = rebuild(args.table, rt=rt, window_range=window, unless_repeated=once)
            _write_result(args.result_file, commit_summary(commit))
            return 0
        from spark_jobs.recompute.verify import verify
        from spark_jobs.engine import session

        spark = session.get_or_create(f"statetable-verify-{args.table}")
        finished = run(args.table, rt=rt, spark=spark, snapshots=False, finish_pending_only=True) \
            if args.finish_pending else []
        result = verify(args.table, spark=spark, rt=rt, full=args.full)
        print(result.summary(), flush=True)
        from dataclasses import asdict

        _write_result(args.result_file, {**asdict(result), "ok": result.ok,
                                         "finished_batches": [c.batch_id for c in finished]})
        return 0 if result.ok else 1
    except (UserFixable, ValueError) as exc:
        print(f"statetable: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
