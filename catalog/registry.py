"""The table catalog: a table's definition, its state spec and local store, and the lock that
keeps one writer per table. No Spark here; the jobs, the batch path, the query service and
the status page all start from these.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from state.table import StateTable
from catalog.mapping import state_spec
from catalog.definitions import DefinitionError, TableDefinition, load_all
from catalog.runtime import Runtime
from catalog.errors import LockTimeout
from catalog.errors import UserError

log = logging.getLogger("statetable.catalog")


def load_table(name: str, rt: Runtime) -> tuple[TableDefinition, dict[str, TableDefinition]]:
    """A table and the tables it may join; another table's broken definition does not stop this one."""
    import copy

    tables, broken = loaded_definitions(rt.tables_dir)
    if name in broken:
        raise DefinitionError(broken[name])
    if name not in tables:
        raise DefinitionError(f"no table {name!r} in {rt.tables_dir}; defined tables: {sorted(tables)}")
    tables[name] = copy.deepcopy(tables[name])      # the caller's own: a run may set a field of it (a batch cap)
    return tables[name], tables


_LOADED: dict[str, tuple] = {}


def loaded_definitions(folder: Path) -> tuple[dict[str, TableDefinition], dict[str, str]]:
    """Every definition in `folder` (and the broken ones' reasons), parsed again only when a file
    there changed. A run asks for its table's definition four or five times (lag, plan, batches,
    snapshots, lag left), and each parse read every table's file: 0.1 CPU s a time at 100 tables,
    a cost that grew with the tables on the stack, not with the run's own work. A long-lived
    process (the batch service, the query server) now parses once per change. The definitions
    are shared: read them, never set a field (load_table hands its table out as the caller's own)."""
    signature = _folder_signature(Path(folder))
    held = _LOADED.get(str(folder))
    if held is None or held[0] != signature:
        broken: dict[str, str] = {}
        held = (signature, load_all(folder, broken=broken), broken)
        _LOADED[str(folder)] = held
    return dict(held[1]), dict(held[2])


def _folder_signature(folder: Path) -> tuple:
    """Each file under `folder` (definitions and the schema files beside them) by name, size and
    modification time: an edit, a new file or a removed one changes it."""
    try:
        return tuple(sorted((str(p.relative_to(folder)), st.st_mtime_ns, st.st_size)
                            for p in folder.rglob("*") if (st := p.stat()) and not p.is_dir()))
    except OSError:             # a file removed while listing: no signature, parse again
        return (time.monotonic(),)


def spec_of(table: TableDefinition, rt: Runtime):
    """The table's state spec, on the changelog its batch log names: a rebuild that adopted a
    changed definition moved the state to a changelog topic of its own."""
    from dataclasses import replace

    from catalog.batch_log import BatchLog

    spec = state_spec(table, rt.namespace)
    batch_log = BatchLog(rt.batch_dir(table.name))
    changelog = None
    # Newest first, and one step: every commit records the changelog it wrote (a log written
    # before they did is walked back to the rebuild that named one, or to its start).
    batch_id = batch_log.last_commit_id()
    while batch_id is not None and batch_id >= 0 and (commit := batch_log.commit(batch_id)) is not None:
        if commit.changelog:
            changelog = commit.changelog
            break
        if commit.definition and commit.definition.get("fingerprint") != spec.fingerprint:
            break
        batch_id -= 1
    return replace(spec, changelog=changelog) if changelog else spec


def state_table(table: TableDefinition, rt: Runtime) -> StateTable:
    spec = spec_of(table, rt)
    drop_stale_cache(spec, rt)
    return StateTable(spec, rt.state_dir, bootstrap=rt.bootstrap, snapshot_uri=rt.snapshot_uri)


def stage_tables(table: TableDefinition, rt: Runtime) -> list[StateTable]:
    """Every state table a table keeps: its own, and for a table of tables its rows stage too
    (catalog.mapping.rows_spec), which restores, snapshots and the wipe drill treat alike."""
    tables = [state_table(table, rt)]
    if table.input_table or table.table_join or table.stream_join is not None:
        from catalog.mapping import rows_spec

        tables.append(StateTable(rows_spec(table, rt.namespace), rt.state_dir, bootstrap=rt.bootstrap,
                                 snapshot_uri=rt.snapshot_uri))
    return tables


def drop_stale_cache(spec, rt: Runtime) -> None:
    """A local store of an older definition, where the batch log says a rebuild already committed
    this one (a crash between the rebuild's commit and its folder swap, or another machine's
    rebuild): it is a stale cache, dropped so that opening a partition restores the new state."""
    import json
    import shutil

    from catalog.batch_log import BatchLog

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


LOCK_PATIENCE_ENV = "STATETABLE_LOCK_WAIT_SECONDS"


def lock_patience() -> float:
    """How long a job waits for a table's lock: a rebuild of a large table holds it for minutes,
    so the default is an hour; a wait is never without end."""
    raw = os.environ.get(LOCK_PATIENCE_ENV, "3600")
    try:
        return float(raw)
    except ValueError:
        raise UserError(f"{LOCK_PATIENCE_ENV}={raw!r} is not a number of seconds") from None


def _holder(fd: int) -> str:
    """Who holds a lock, from what its holder wrote into the file (pid, host, command, since)."""
    try:
        facts = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return "an unknown process"
    if not facts:
        return "an unknown process"
    return (f"pid {facts.get('pid')} on {facts.get('host')} (`{facts.get('command')}`, since "
            f"{time.strftime('%H:%M:%S', time.localtime(facts.get('since', 0)))})")


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
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # 0600 in a 0700 folder: no other local user can open the file, so none can take the
        # lock and stall the table's writer.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            log.info("%s: the table lock %s is held by %s; waiting", name, path, holder)
            waited = time.monotonic()
            patience = lock_patience()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - waited > patience:
                        holder = _holder(fd)
                        os.close(fd)
                        raise LockTimeout(f"table {name!r}: the table lock {path} is still held by {holder} "
                                          f"after {patience:.0f}s ({LOCK_PATIENCE_ENV}); that job is still running "
                                          f"or stuck: stop it, and this one can go on") from None
                    time.sleep(0.2)
            log.info("%s: got the table lock after %.1fs", name, time.monotonic() - waited)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time(), 3),
                                  "command": " ".join(sys.argv[:4])[:200]}).encode(), 0)
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


def snapshot_phase(table: TableDefinition) -> int:
    """The batch, modulo `snapshot_every`, at which the table's partitions snapshot. Tables
    started together have the same batch ids; with one phase for all, every partition of a
    hundred tables snapshotted in the same wave (bench/tables_per_stack: the batch service's CPU
    12.5 -> 19.8 s in that wave). A stable hash of the name spreads the tables; a table's
    partitions stay together, one snapshot job a run rather than one per partition.
    `snapshot_phase: N` pins it."""
    import zlib

    if table.snapshot_phase is not None:      # 0 .. snapshot_every - 1, checked when the table loads
        return table.snapshot_phase
    return zlib.crc32(table.name.encode()) % table.snapshot_every


def due_snapshots(table: TableDefinition, rt: Runtime, batch_id: int) -> list[int]:
    """Partitions with no snapshot yet, at their phase's batch, or `snapshot_every` or more
    batches behind `batch_id` (a run that skipped its phase's batch): a restore replays at most
    `snapshot_every` batches of changelog, as before the phases."""
    from state.snapshots import SnapshotStore

    store = SnapshotStore(rt.snapshot_uri)
    every, phase = table.snapshot_every, snapshot_phase(table)
    due = []
    for p in range(table.partitions):
        manifests = store.list(table.name, p)
        behind = batch_id - manifests[0].batch_id if manifests else None
        if behind is None or behind >= every or behind > 0 and batch_id % every == phase:
            due.append(p)
    return due


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


_INT_RANGES = {"BIGINT": 64, "LONG": 64, "INT": 32}


def coerce_key(table: TableDefinition, key: tuple) -> tuple:
    """CLI/HTTP keys arrive as strings; give each component its declared type, or raise
    ValueError (never a codec error) for a value no key of that type can have."""
    types = {**dict(table.schema), **table.key_types}
    out = []
    for name, value in zip(table.key_columns, key):
        dtype = types.get(name.split(".")[-1], "STRING")
        if isinstance(value, str) and dtype in _INT_RANGES:
            try:
                value = int(value)
            except ValueError:
                raise UserError(f"table {table.name}: key {name} is {dtype}, not {value[:40]!r}") from None
        elif isinstance(value, str) and dtype in ("DOUBLE", "FLOAT"):
            try:
                value = float(value)
            except ValueError:
                raise UserError(f"table {table.name}: key {name} is {dtype}, not {value[:40]!r}") from None
        bits = _INT_RANGES.get(dtype, 64)
        if type(value) is int and not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise UserError(f"table {table.name}: key {name} is {dtype}; {value} is outside its range")
        out.append(value)
    rest = tuple(key[len(out):])
    if any(type(v) is int and not -(1 << 63) <= v < 1 << 63 for v in rest):
        raise UserError(f"table {table.name}: a key part is outside the 64-bit integer range")
    return tuple(out) + rest


def ensure_output_topic(bootstrap: str, table: TableDefinition) -> None:
    """The table's change topic (`-- output_topic`), compacted like an upsert topic, with a
    partition per state partition. One that exists with another partition count is an error: its
    readers would have seen keys placed by another count."""
    from state.kafka_admin import ensure_topic

    try:
        ensure_topic(bootstrap, table.output_topic, table.partitions,
                     {"cleanup.policy": "compact", "min.compaction.lag.ms": "86400000"})
    except ValueError as exc:
        raise DefinitionError(f"{table.path}: table {table.name!r}, option output_topic: {exc}") from None
