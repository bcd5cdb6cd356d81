"""Query replicas: a serving host's own copy of a table, kept warm from the changelog.

A table's writer may be a Spark worker on another machine, so the query path cannot rely on
the writer's local folders. As Kafka Streams keeps standby replicas, each serving data dir
keeps a copy of every partition (`<data dir>/replicas/<table>/pNNNN`): restored once from the
newest verified snapshot in the store, then following the changelog with a read_committed
consumer (state.table.StateTable.follow), which writes only at batch markers. The query
readers open RocksDB secondaries of these copies exactly as they would of a local writer's, so
every answer still comes from one committed batch, names it, and never mixes two.

One process per data dir follows (an flock on the table's replica folder): the `serve`
process, the Airflow-mounted API or a CLI query, whichever holds it; any number read. The
writer never waits for a replica. A replica that cannot follow (a changelog gap it cannot
restore past, a changed definition, the store unreachable) is unavailable with the cause and
the fix, never a silently old batch. How far a replica trails is the batch log's last commit
less the batch it serves (`lag`).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from catalog.registry import spec_of
from catalog.runtime import Runtime
from state.errors import BadSetting, ChangelogGap
from state.table import DefinitionChanged, StateTable
from serving.errors import ReplicaUnavailable

log = logging.getLogger("statetable.replica")

SOURCE_ENV = "STATETABLE_QUERY_FROM"     # "replica" or "writer"; default: replica when the store is shared
LOG_CACHE_SECONDS = 0.5                  # how long the batch log's last commit is taken as current


def source(rt: Runtime) -> str:
    """Where queries read: `writer` (secondaries of this host's writer folders: no second copy,
    fresh within the refresh interval) is only right where the writer runs on this host; a
    deployment with a shared store (a cluster) has its writers elsewhere, so it reads replicas."""
    chosen = os.environ.get(SOURCE_ENV, "").strip().lower() or ("replica" if rt.store_uri else "writer")
    if chosen not in ("replica", "writer"):
        raise BadSetting(f"{SOURCE_ENV}={chosen!r}: use 'replica' (a copy that follows the changelog) or "
                         f"'writer' (this host's writer folders)")
    return chosen


def replica_root(rt: Runtime) -> Path:
    return rt.data_dir / "replicas"


class LastCommits:
    """The batch log's last commit per table, read at most every LOG_CACHE_SECONDS: lag checks
    on every request must not each list an object store."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seen: dict[str, tuple[float, object]] = {}
        self.guard = threading.Lock()

    def get(self, table: str):
        with self.guard:
            cached = self.seen.get(table)
        if cached is not None and time.monotonic() - cached[0] < LOG_CACHE_SECONDS:
            return cached[1]
        commit = BatchLog(self.rt.batch_dir(table)).last_commit()
        with self.guard:
            self.seen[table] = (time.monotonic(), commit)
        return commit

    def batch(self, table: str) -> int | None:
        commit = self.get(table)
        return None if commit is None else commit.batch_id


class TableReplica:
    """One table's replica in one data dir; `sync` brings it to the changelog's end."""

    def __init__(self, table: TableDefinition, rt: Runtime, commits: LastCommits | None = None) -> None:
        self.table = table
        self.rt = rt
        self.folder = replica_root(rt) / table.name
        self.commits = commits or LastCommits(rt)
        self.state: StateTable | None = None
        self.lock_fd: int | None = None
        self.error: str | None = None
        self.applied: dict[int, int] = {}
        self.published: dict | None = None      # the status last written for other readers

    # -- who follows ------------------------------------------------------------------
    def follower(self) -> bool:
        """Whether this process follows the table (it holds the folder's lock, taken at most once)."""
        if self.lock_fd is not None:
            return True
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder.with_name(f".{self.table.name}.follow.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.lock_fd = fd
        return True

    # -- following ----------------------------------------------------------------------
    def sync(self, progress=None) -> int | None:
        """Apply what the changelog holds past the copy; the batch it stands at (None: the table
        never committed, so there is nothing to copy). Raises ReplicaUnavailable with the cause
        and the fix. `progress(partition, report_text)`: called as partitions are restored."""
        last = self._last_commit()
        if last is None:
            return None
        if (last.definition or {}).get("fingerprint") not in (None, self.table.fingerprint):
            raise ReplicaUnavailable(
                f"table {self.table.name!r}: its definition changed since batch {last.batch_id} committed; "
                f"serve it again after `statetable rebuild {self.table.name}` (or restore the old .sql)")
        state = self._state()
        try:
            for p in range(self.table.partitions):
                self._follow(state, p, progress)
        except ReplicaUnavailable:
            raise
        except ChangelogGap as exc:
            raise ReplicaUnavailable(f"table {self.table.name!r}: the query replica cannot follow: {exc}; "
                                     f"`statetable restore {self.table.name}` then a new batch writes a snapshot "
                                     f"past the gap") from None
        except Exception as exc:     # noqa: BLE001 - a broker or store failure is a cause to name
            raise ReplicaUnavailable(f"table {self.table.name!r}: the query replica cannot follow: "
                                     f"{type(exc).__name__}: {exc}; check the broker {self.rt.bootstrap} and the "
                                     f"snapshot store {self.rt.snapshot_uri}") from None
        batches = set(self.applied.values())
        return max(batches) if batches else None

    def _last_commit(self):
        try:
            return self.commits.get(self.table.name)
        except Exception as exc:     # noqa: BLE001 - an unreachable store is a cause to name, not a traceback
            raise ReplicaUnavailable(f"table {self.table.name!r}: its batch log ({self.rt.batch_dir(self.table.name)}) "
                                     f"cannot be read: {type(exc).__name__}: {exc}; check the store") from None

    def _follow(self, state: StateTable, partition: int, progress) -> None:
        fresh = not state.has_local_state(partition)
        started = time.monotonic()
        try:
            part, _ = state.follow(partition)
        except ChangelogGap:
            if fresh:
                raise
            # A copy stopped past the changelog's retention: once, from the newest snapshot instead.
            log.warning("%s[%d]: the replica's changelog tail is gone; restoring it afresh", self.table.name,
                        partition)
            state.wipe_local(partition)
            fresh, started = True, time.monotonic()
            part, _ = state.follow(partition)
        self.applied[partition] = part.meta.applied_batch
        if fresh and progress is not None:
            progress(partition, f"restored to batch {part.meta.applied_batch} ({part.meta.key_count} keys) in "
                                f"{time.monotonic() - started:.1f}s")

    def _state(self) -> StateTable:
        if self.state is None:
            spec = spec_of(self.table, self.rt)
            for attempt in range(2):
                try:
                    self.state = StateTable(spec, replica_root(self.rt), bootstrap=self.rt.bootstrap,
                                            snapshot_uri=self.rt.snapshot_uri, create_topics=False).ensure()
                    break
                except DefinitionChanged:
                    if attempt:
                        raise
                    # A copy of an older definition that a rebuild has since replaced: start over.
                    log.info("%s: the replica is of an older definition; restoring it afresh", self.table.name)
                    shutil.rmtree(self.folder, ignore_errors=True)
        return self.state

    def partition_dirs(self) -> list[Path]:
        return [self.folder / f"p{p:04d}" for p in range(self.table.partitions)]

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def batches_behind(logged: int | None, served: int | None) -> int:
    """How many committed batches an answer from `served` trails the batch log's `logged` by
    (None: nothing committed / nothing served yet)."""
    return 0 if logged is None else max(0, logged - (-1 if served is None else served))


def write_status(folder: Path, status: dict) -> None:
    """The follower's view (batch, error), for readers in other processes of the same data dir."""
    tmp = folder / f".status.{os.getpid()}"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, folder / "status.json")


def read_status(folder: Path) -> dict:
    try:
        return json.loads((folder / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


class Follower:
    """Keeps every table's replica in a data dir following, in a thread of the serving process,
    for readers in other processes (`serve --readers N`) that only open secondaries of it."""

    def __init__(self, rt: Runtime, tables: dict[str, TableDefinition], interval: float) -> None:
        self.commits = LastCommits(rt)
        self.replicas = {name: TableReplica(table, rt, self.commits) for name, table in tables.items()}
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="statetable-replica-follower", daemon=True)

    def start(self) -> "Follower":
        self.sync_all()      # restore before the readers open anything: they find whole copies
        self.thread.start()
        return self

    def sync_all(self) -> None:
        for replica in self.replicas.values():
            if replica.follower():
                follow_once(replica)

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.sync_all()
            except Exception:   # noqa: BLE001 - the follower must outlive any one failure, or reads go stale
                log.exception("replica follower: a sync failed")

    def close(self) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        for replica in self.replicas.values():
            replica.close()


def follow_once(replica: TableReplica, progress=None) -> str | None:
    """One sync of a replica this process follows, its outcome published for the data dir's
    other readers; the cause when it cannot follow, else None."""
    try:
        batch = replica.sync(progress)
        replica.error = None
    except ReplicaUnavailable as exc:
        batch, replica.error = None, str(exc)
        log.warning("%s", exc)
    status = {"batch": batch, "error": replica.error, "pid": os.getpid()}
    if status != replica.published:
        replica.folder.mkdir(parents=True, exist_ok=True)
        write_status(replica.folder, status)
        replica.published = status
    return replica.error
