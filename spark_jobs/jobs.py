"""Table jobs as functions: run, restore, query, verify, rebuild.

The CLI, spark-submit entry points (`spark_jobs/submit.py`) and
Airflow tasks all call these, so each behaviour exists once.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from state import faults
from state.table import StateTable
from spark_jobs.compile import state_spec
from spark_jobs.definitions import DefinitionError, TableDefinition, load_all
from spark_jobs.runtime import Runtime

log = logging.getLogger("statetable.jobs")


def load_table(name: str, rt: Runtime) -> tuple[TableDefinition, dict[str, TableDefinition]]:
    """A table and the tables it may join; another table's broken definition does not stop this one."""
    broken: dict[str, str] = {}
    tables = load_all(rt.tables_dir, broken=broken)
    if name in broken:
        raise DefinitionError(broken[name])
    if name not in tables:
        raise DefinitionError(f"no table {name!r} in {rt.tables_dir}; defined tables: {sorted(tables)}")
    return tables[name], tables


def spec_of(table: TableDefinition, rt: Runtime):
    """The table's state spec, on the changelog its batch log names: a rebuild that adopted a
    changed definition moved the state to a changelog topic of its own."""
    from dataclasses import replace

    from spark_jobs.batch_log import BatchLog

    spec = state_spec(table, rt.namespace)
    changelog = None
    for commit in reversed(BatchLog(rt.batch_dir(table.name)).commits()):
        if commit.changelog:
            changelog = commit.changelog
            break
        if commit.definition and commit.definition.get("fingerprint") != spec.fingerprint:
            break
    return replace(spec, changelog=changelog) if changelog else spec


def state_table(table: TableDefinition, rt: Runtime) -> StateTable:
    spec = spec_of(table, rt)
    drop_stale_cache(spec, rt)
    return StateTable(spec, rt.state_dir, bootstrap=rt.bootstrap, snapshot_uri=rt.snapshot_uri)


def drop_stale_cache(spec, rt: Runtime) -> None:
    """A local store of an older definition, where the batch log says a rebuild already committed
    this one (a crash between the rebuild's commit and its folder swap, or another machine's
    rebuild): it is a stale cache, dropped so that opening a partition restores the new state."""
    import json
    import shutil

    from spark_jobs.batch_log import BatchLog

    path = rt.state_dir / spec.name / "table.json"
    try:
        recorded = json.loads(path.read_text()).get("fingerprint")
    except (FileNotFoundError, ValueError):
        return
    last = BatchLog(rt.batch_dir(spec.name)).last_commit()
    committed = (last.definition or {}).get("fingerprint") if last else None
    if recorded and committed == spec.fingerprint and recorded != committed:
        log.warning("%s: the local store is of definition %s but batch %d committed %s; dropping it to restore",
                    spec.name, recorded, last.batch_id, committed)
        shutil.rmtree(rt.state_dir / spec.name)


_held: dict[Path, list[int]] = {}     # lock path -> [descriptor, depth] held by this process
_held_guard = threading.Lock()


@contextlib.contextmanager
def table_lock(name: str, rt: Runtime):
    """One writer per table across processes: micro-batches, rebuilds, restores and verifies.

    Airflow may start an incremental run, a backfill of rebuilds and a
    restore-verify of one table at the same time; each would be correct alone
    but not interleaved (a verify must not see a half-finished batch). A
    blocking flock serialises them, is released by the kernel when a killed
    job dies, and is re-entrant within a process.
    """
    path = rt.data_dir / "locks" / f"{name}.lock"
    with _held_guard:
        entry = _held.get(path)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: another job holds the table lock %s; waiting", name, path)
            waited = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log.info("%s: got the table lock after %.1fs", name, time.monotonic() - waited)
        with _held_guard:
            entry = _held[path] = [fd, 1]
    try:
        yield
    finally:
        with _held_guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[path]
                os.close(entry[0])   # closing the descriptor releases the flock


def run(name: str, max_batches: int | None = None, until_caught_up: bool = False, spark=None,
        rt: Runtime | None = None, max_records_per_batch: int | None = None, snapshots: bool = True,
        finish_pending_only: bool = False):
    """Run micro-batches; `finish_pending_only` completes an interrupted batch and starts none."""
    from spark_jobs import session
    from spark_jobs.microbatch import MicroBatchRunner

    faults.validate(os.environ.get(faults.ENV))
    rt = rt or Runtime.from_env()
    table, tables = load_table(name, rt)
    if max_records_per_batch:
        table.max_records_per_batch = max_records_per_batch
    with table_lock(name, rt):
        from spark_jobs.batch_log import BatchLog

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
    from spark_jobs import session
    from spark_jobs.microbatch import MicroBatchRunner

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


def restore(name: str, batch: int | None = None, rt: Runtime | None = None, missing_only: bool = False) -> list:
    """Restore partitions from snapshots plus changelog; `missing_only` skips partitions that have local state."""
    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    with table_lock(name, rt):
        st = state_table(table, rt)
        try:
            return [st.restore(p, batch) for p in range(table.partitions)
                    if not (missing_only and st.has_local_state(p))]
        finally:
            st.close()


def accept_offsets(name: str, rt: Runtime | None = None, note: str = "") -> dict:
    """An operator's explicit acceptance of a topic discontinuity (see offsets.next_starts): the next
    batch starts at the earliest offsets the topic holds now, and the batch log keeps the entry
    (problem, old and new positions, time, note) beside the last commit, and in the next batch."""
    import getpass

    from spark_jobs.batch_log import BatchLog
    from spark_jobs.offsets import OffsetDiscontinuity, next_starts, topic_id, watermarks

    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    with table_lock(name, rt):
        batch_log = BatchLog(rt.batch_dir(name))
        if batch_log.pending_plan() is not None:
            raise ValueError(f"table {name!r} has an unfinished batch; `statetable run {name}` finishes it first")
        position = batch_log.read_position()
        if position is None:
            raise ValueError(f"table {name!r} has no committed batch: its first batch starts at the topic's "
                             f"earliest offsets anyway")
        marks = watermarks(rt.bootstrap, table.topic)
        incarnation = topic_id(rt.bootstrap, table.topic)
        try:
            next_starts(name, table.topic, marks, incarnation, *position[:3])
        except OffsetDiscontinuity as exc:
            problem = str(exc)
        else:
            raise ValueError(f"table {name!r}: topic {table.topic!r} continues where the table stopped reading; "
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


def due_snapshots(table: TableDefinition, rt: Runtime, batch_id: int) -> list[int]:
    """Partitions whose newest snapshot is `snapshot_every` or more batches behind `batch_id`."""
    from state.snapshots import SnapshotStore

    store = SnapshotStore(rt.snapshot_uri)
    due = []
    for p in range(table.partitions):
        manifests = store.list(table.name, p)
        if not manifests or batch_id - manifests[0].batch_id >= table.snapshot_every:
            due.append(p)
    return due


def snapshot_if_due(name: str, rt: Runtime | None = None) -> dict:
    """Snapshot the partitions that are due, in this process (no Spark needed)."""
    from spark_jobs.batch_log import BatchLog

    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    with table_lock(name, rt):
        last = BatchLog(rt.batch_dir(name)).last_commit()
        if last is None:
            return {"batch": None, "partitions": [], "seconds": 0.0}
        due = due_snapshots(table, rt, last.batch_id)
        started = time.monotonic()
        st = state_table(table, rt)
        try:
            for p in due:
                manifest = st.snapshot(p)
                log.info("%s[%d]: snapshot at batch %d, %d files", name, p, manifest.batch_id, len(manifest.files))
        finally:
            st.close()
        return {"batch": last.batch_id, "partitions": due, "seconds": round(time.monotonic() - started, 3)}


def readonly_partitions(table: TableDefinition, rt: Runtime):
    """Each local partition of `table` that has state, opened read-only (no writer, no catch-up)."""
    st = state_table(table, rt)
    try:
        for p in range(table.partitions):
            if st.has_local_state(p):
                part = st.open_readonly(p)
                try:
                    yield part
                finally:
                    part.close()
    finally:
        st.close()


def state_rows(name: str, rt: Runtime | None = None) -> dict[tuple, object]:
    """Every key's committed state value."""
    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    return {key: value for part in readonly_partitions(table, rt) for key, value in part.items()}


def query(name: str, key: tuple, rt: Runtime | None = None) -> dict | None:
    """One row of committed state, through the query API's read path (never the writer's lock)."""
    from spark_jobs.query import query_once

    raw = str(key[0]) if len(key) == 1 else json.dumps(list(key))
    return query_once(name, raw, rt)[1]


_INT_RANGES = {"BIGINT": 64, "LONG": 64, "INT": 32}


def coerce_key(table: TableDefinition, key: tuple) -> tuple:
    """CLI/HTTP keys arrive as strings; give each component its declared type, or raise
    ValueError (never a codec error) for a value no key of that type can have."""
    types = dict(table.schema)
    out = []
    for name, value in zip(table.key_columns, key):
        dtype = types.get(name.split(".")[-1], "STRING")
        if isinstance(value, str) and dtype in _INT_RANGES:
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"table {table.name}: key {name} is {dtype}, not {value[:40]!r}") from None
        elif isinstance(value, str) and dtype in ("DOUBLE", "FLOAT"):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"table {table.name}: key {name} is {dtype}, not {value[:40]!r}") from None
        bits = _INT_RANGES.get(dtype, 64)
        if type(value) is int and not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise ValueError(f"table {table.name}: key {name} is {dtype}; {value} is outside its range")
        out.append(value)
    rest = tuple(key[len(out):])
    if any(type(v) is int and not -(1 << 63) <= v < 1 << 63 for v in rest):
        raise ValueError(f"table {table.name}: a key part is outside the 64-bit integer range")
    return tuple(out) + rest


def _write_result(path: str | None, result: dict) -> None:
    """The job's outcome for the Airflow task after it (spark-submit has no XCom)."""
    print("STATETABLE_RESULT " + json.dumps(result, default=str), flush=True)
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(result, default=str, indent=1))
        os.replace(tmp, target)


def _commit_summary(commit) -> dict:
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
    parser.add_argument("--window", default="", help="rebuild: FROM_MS:TO_MS, windows starting in [from, to); "
                                                     "empty rebuilds in full")
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
                "table": args.table, "batches": [_commit_summary(c) for c in commits],
                "read": sum(c.counts["read"] for c in commits), "seconds": round(time.monotonic() - started, 3)})
            return 0
        if args.action == "rebuild":
            from spark_jobs import batch

            window = None
            if args.window:
                try:
                    window = tuple(int(part) for part in args.window.split(":"))
                    assert len(window) == 2
                except (ValueError, AssertionError):
                    raise ValueError(f"table {args.table!r}: --window {args.window!r} must be FROM_MS:TO_MS") from None
            commit = batch.rebuild(args.table, rt=rt, window_range=window)
            _write_result(args.result_file, _commit_summary(commit))
            return 0
        from spark_jobs import batch, session

        spark = session.get_or_create(f"statetable-verify-{args.table}")
        finished = run(args.table, rt=rt, spark=spark, snapshots=False, finish_pending_only=True) \
            if args.finish_pending else []
        result = batch.verify(args.table, spark=spark, rt=rt)
        print(result.summary(), flush=True)
        _write_result(args.result_file, {**result.__dict__, "ok": result.ok,
                                         "finished_batches": [c.batch_id for c in finished]})
        return 0 if result.ok else 1
    except (DefinitionError, ValueError) as exc:
        print(f"statetable: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
