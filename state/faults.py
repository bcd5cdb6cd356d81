"""Named fault-injection points.

A process dies at a point when STATETABLE_FAULT names it (or when a test calls
`arm`). Dying is `os._exit`, not an exception: no finally block, flush or
atexit runs, exactly as with a kill -9 or a lost machine. With
STATETABLE_FAULT_SCOPE=group every process of the session is SIGKILLed
instead, so a fault inside a Spark task takes down the driver, its JVM and
the PySpark daemon too (they share a session; the daemon's workers do not
share a process group). A task on a Spark Connect server shares the server's
session, not the client's: there `group` kills the task alone (its failed job
fails the client's run).

Scope `worker` kills the session of a cluster worker's task (the worker's JVM,
executor and Python workers) and passes anywhere else. A scope may end in
`@PATH` (`worker@/tmp/once`): then only the first process to create PATH dies
there, and every other one passes (one worker lost in a batch, not all).

Scope `stall` does not kill: the process stops at the point, alive, until the
file STATETABLE_FAULT_RELEASE exists (a driver paused by GC or a slow disk,
while another driver comes for the same batch). Scope `hold` stops there until
something else kills it (a drill that SIGKILLs the engine while a task is mid-merge,
wherever that task runs); it never goes on: it exits when its parent dies, or after
HOLD_LIMIT seconds.
"""
from __future__ import annotations

import os
import signal
from state.errors import BadSetting

__all__ = ["BATCH_LOG_POINTS", "BATCH_POINTS", "ENV", "EXIT_CODE", "HOLD_LIMIT", "POINTS", "REBUILD_POINTS", "RELEASE_ENV",
           "RETENTION_POINTS", "SCOPE_ENV", "STATE_POINTS", "TABLE_AGGREGATE_POINTS", "WORKER_ENV", "arm", "armed", "kill_session",
           "point", "session_pids", "validate"]

ENV = "STATETABLE_FAULT"
SCOPE_ENV = "STATETABLE_FAULT_SCOPE"
RELEASE_ENV = "STATETABLE_FAULT_RELEASE"
WORKER_ENV = "STATETABLE_WORKER_NAME"      # set by a cluster worker (deploy/spark_cluster.py)
EXIT_CODE = 137
HOLD_LIMIT = 600.0

STATE_POINTS = {
    "commit.before_changelog": "changes computed, nothing published",
    "commit.mid_changelog": "half of the batch's changelog records sent, transaction open",
    "commit.after_changelog": "changelog transaction committed, RocksDB not yet written",
    "commit.after_state": "RocksDB batch written, before the caller hears of it",
    "snapshot.mid_upload": "some snapshot files copied, manifest not written",
    "restore.mid_replay": "part of the changelog replayed into a restored partition",
}
BATCH_POINTS = {
    "batch.after_plan": "plan written, nothing read",
    "batch.after_read": "records read and classified",
    "batch.after_dead_letters": "dead letters published",
    "batch.after_bronze": "bronze Delta append done",
    "batch.mid_merge": "partition 0 committed, other partitions maybe not",
    "batch.after_merge": "every partition committed, no mirror or commit entry",
    "batch.after_commit": "commit entry written, no mirror changes, snapshot or group offsets",
    "mirror.after_changes": "the batch's mirror change files committed to Delta, the fold not yet due-checked",
    "batch.after_snapshot": "snapshot taken when due, group offsets not committed",
    "batch.after_offsets": "group offsets committed",
    "mirror.after_merge": "changes folded into the Delta mirror, their files not yet removed",
}
REBUILD_POINTS = {
    "rebuild.before_cutover": "a changed definition's state built beside the old one, not committed",
    "rebuild.after_cutover": "the adopting rebuild committed, local folders not yet swapped",
}
TABLE_AGGREGATE_POINTS = {      # an aggregate over a table's rows (two state stages a batch)
    "rows.after_commit": "partition 0's rows stage committed (its retractions written), other partitions maybe not",
    "batch.after_rows": "every rows-stage partition committed, no group merged",
}
RETENTION_POINTS = {            # snapshot retention (state/snapshots.py), crash-tested in tests/unit/state
    "snapshot.retain_after_manifest": "an old snapshot's manifest deleted, its folder not yet",
    "snapshot.retain_before_shared": "old snapshots deleted, no shared SST swept yet",
    "snapshot.retain_mid_shared": "one unnamed shared SST deleted, others maybe not",
}
BATCH_LOG_POINTS = {            # batch log compaction (catalog/batch_log.py), crash-tested in tests/test_batch_log.py
    "batch_log.after_checkpoint": "old commits folded into a checkpoint file, the head not yet moved to it",
    "batch_log.after_head": "the head names the new checkpoint, nothing folded removed yet",
    "batch_log.mid_sweep": "some folded entries removed, others not",
}
POINTS = {**STATE_POINTS, **BATCH_POINTS, **REBUILD_POINTS, **TABLE_AGGREGATE_POINTS, **RETENTION_POINTS,
          **BATCH_LOG_POINTS}

_armed: str | None = None
_armed_scope: str | None = None


def validate(name: str | None) -> None:
    if name and name not in POINTS:
        known = ", ".join(sorted(POINTS))
        raise BadSetting(f"{ENV}={name!r} is not a fault point; use one of: {known}")


def arm(name: str | None, scope: str | None = None) -> None:
    validate(name)
    global _armed, _armed_scope
    _armed, _armed_scope = name, scope


def armed() -> tuple[str | None, str | None]:
    """The point and scope this process would die at, for a task that runs elsewhere: a Spark
    Connect server's workers do not inherit the client's environment, so the job hands them
    this and they `arm` it."""
    return _armed or os.environ.get(ENV), _armed_scope or os.environ.get(SCOPE_ENV)


def point(name: str) -> None:
    """Die here if this point is armed."""
    if name == _armed or name == os.environ.get(ENV):
        scope = _armed_scope or os.environ.get(SCOPE_ENV)
        if scope and scope.startswith("worker") and not os.environ.get(WORKER_ENV):
            return                      # not a cluster worker's task: nothing here to lose
        if scope and "@" in scope:
            scope, _, once = scope.partition("@")
            try:
                fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, os.environ.get(WORKER_ENV, str(os.getpid())).encode())
            os.close(fd)
        if scope == "stall":
            _stall(name)
            return
        if scope == "hold":
            _hold()
        if scope in ("group", "worker"):
            kill_session(os.getsid(0))
        os._exit(EXIT_CODE)


def _stall(name: str, limit: float = 300.0) -> None:
    import time

    release = os.environ.get(RELEASE_ENV)
    if not release:
        raise BadSetting(f"{SCOPE_ENV}=stall at {name} needs {RELEASE_ENV}: the file whose creation releases it")
    ends = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < ends:
        time.sleep(0.1)


def _hold() -> None:
    import time

    parent, ends = os.getppid(), time.monotonic() + HOLD_LIMIT
    while os.getppid() == parent and time.monotonic() < ends:
        time.sleep(0.1)


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid`, the caller last."""
    me = os.getpid()
    for pid in session_pids(sid):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if os.getsid(0) == sid:
        os.kill(me, signal.SIGKILL)
