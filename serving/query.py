"""Interactive queries over committed state: point, scan, windows, tables.

The REST API and `statetable query` both answer through `QueryService`.

Consistency: each table is read through two sets of RocksDB secondary
instances (one per partition). Readers use the *current* set; a refresher
catches the *standby* set up to the writer and makes it current only when
all its partitions stand at the same batch. So every answer comes from one
committed batch, names it, and never mixes two; readers never take the
writer's lock, and a catch-up never runs under a reader's feet.

A table whose local state is missing or being restored answers
`StateUnavailable` (503 with Retry-After over HTTP) rather than stale or
partial rows.
"""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from state import codec
from state.views import TableView
from catalog import registry
from catalog.batch_log import BatchLog, start_ticks
from catalog.mapping import key_names, row_of, shown, shown_columns, state_spec, time_columns
from catalog.definitions import TableDefinition, load_all
from catalog.definitions import parse as parse_definition
from state.table import DefinitionChanged
from catalog.runtime import Runtime
from serving.errors import NoSuchTable
from serving.errors import BadQuery
from serving.errors import StateUnavailable
from serving.presenters import TIMES, with_times

log = logging.getLogger("statetable.query")

UNAVAILABLE = "unavailable"   # refresh_all's word for a table being restored or missing
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
RELOAD_SECONDS = 2.0     # how often a server looks for added, edited or removed table files
PATIENCE_SECONDS = 10.0   # how long a read waits for a first consistent catch-up before answering 503


def window_start_ms(table: TableDefinition, raw) -> int:
    """A window's start as epoch milliseconds or an ISO time (UTC unless it says otherwise)."""
    from datetime import datetime, timezone

    try:
        return int(raw)
    except (TypeError, ValueError):
        pass
    try:
        moment = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise BadQuery(f"table {table.name!r}: window_start {raw!r} is neither epoch milliseconds nor an ISO time "
                       f"(e.g. 1767225600000 or 2026-01-01T00:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def text_key(table: TableDefinition) -> bool:
    """Whether the table's key is one STRING column (its `prefix=` is then a string prefix)."""
    names = key_names(table)
    return len(names) == 1 and table.window is None and dict(table.schema).get(names[0], "").upper() == "STRING"


OWNER_FILE = "owner"


def sweep_dead_secondaries(path: Path) -> list[Path]:
    """Remove the `query-*` folders whose server process is gone; the ones removed."""
    gone = [folder for folder in path.glob("query-*") if not _owner_alive(folder)]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone


def _owner_alive(folder: Path) -> bool:
    try:
        pid_text, _, started = (folder / OWNER_FILE).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        # No owner file: a server from before owner files, or one still creating it. Swept once
        # it is an hour old.
        try:
            return time.time() - folder.stat().st_mtime < 3600
        except OSError:
            return False
    return started != "" and start_ticks(pid) == started


@dataclass
class Page:
    batch: int | None
    rows: list[dict]
    next_cursor: str | None = None


class _Generation:
    """One secondary instance per partition, and how many readers are inside it."""

    def __init__(self, table: TableDefinition, state_dir: Path, root: Path) -> None:
        self.root = root
        self.view = TableView.open(state_spec(table), state_dir, root)
        self.readers = 0
        self.batch: int | None = None

    def catch_up(self, rounds: int = 4) -> set[int]:
        """Catch up partition by partition, yielding between them: rocksdict holds the GIL
        for a whole catch-up, so one big call would stall every request of the process.

        A pass that straddles a commit leaves some partitions a batch behind; catching up
        just those again usually lands every partition on the same batch, whereas redoing
        every partition straddles the next commit just as likely under a steady stream."""
        applied = {}
        for partition in self.view.partitions:
            applied[partition] = partition.refresh().applied_batch
            time.sleep(0)
        for _ in range(rounds):
            newest = max(applied.values())
            behind = [partition for partition, batch in applied.items() if batch < newest]
            if not behind:
                break
            for partition in behind:
                applied[partition] = partition.refresh().applied_batch
                time.sleep(0)
        return set(applied.values())

    def close(self) -> None:
        self.view.close()
        shutil.rmtree(self.root, ignore_errors=True)


class TableReader:
    """One table's consistent read path (see the module docstring)."""

    def __init__(self, table: TableDefinition, rt: Runtime, secondary_root: Path, replica=None,
                 follow: bool = True, progress=None) -> None:
        """`replica`: a serving.replica.TableReplica to read instead of this host's writer folders;
        `follow`: whether this process may be the one that keeps it following the changelog."""
        self.table = table
        self.rt = rt
        self.replica = replica
        self.follow = follow
        self.progress = progress
        self.root = secondary_root / table.name
        self.aggregator = state_spec(table).aggregator
        self.cond = threading.Condition()
        self.refresh_lock = threading.Lock()
        self.generations: list[_Generation] = []
        self.current: _Generation | None = None
        self.identity: tuple | None = None
        self.unavailable: str | None = None
        self.last_catch_up: list[int] = []

    # -- where the primary is ----------------------------------------------------
    def _partition_dirs(self) -> list[Path]:
        if self.replica is not None:
            return self.replica.partition_dirs()
        base = self.rt.state_dir / self.table.name
        return [base / f"p{p:04d}" for p in range(self.table.partitions)]

    def _identity(self) -> tuple | None:
        """The inode of every partition folder (None if one has no database): a restore
        swaps in a new folder, which needs new secondaries."""
        dirs = self._partition_dirs()
        if not all((d / "CURRENT").exists() for d in dirs):
            return None
        try:
            return tuple(os.stat(d).st_ino for d in dirs)
        except FileNotFoundError:
            return None

    def _restoring(self) -> bool:
        return any(d.with_name(d.name + ".restoring").exists() for d in self._partition_dirs())

    def _close_generations(self) -> None:
        with self.cond:
            while any(g.readers for g in self.generations):
                self.cond.wait(1.0)
            for g in self.generations:
                g.close()
            self.generations, self.current = [], None

    # -- refresh -----------------------------------------------------------------
    def _definition_changed(self) -> str | None:
        """Why the state on disk does not answer for the loaded definition, or None."""
        try:
            recorded = json.loads((self.rt.state_dir / self.table.name / "table.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        if recorded.get("fingerprint") in (None, self.table.fingerprint):
            if recorded.get("partitions", self.table.partitions) == self.table.partitions:
                return None
            return str(DefinitionChanged(self.table.name, {"partitions": recorded.get("partitions")},
                                         {"partitions": self.table.partitions}))
        # A rebuild cut over to the definition now in the .sql file: adopt it, and serve the new state.
        try:
            current = parse_definition(self.rt.tables_dir / f"{self.table.name}.sql")
        except Exception:
            current = None
        if current is not None and current.fingerprint == recorded["fingerprint"]:
            log.info("%s: the state was rebuilt for a changed definition; serving it", self.table.name)
            self._close_generations()
            self.table, self.identity = current, None
            self.aggregator = state_spec(current).aggregator
            return None
        return str(DefinitionChanged(self.table.name, recorded.get("meaning"), self.table.meaning()))

    def _replica_problem(self) -> str | None:
        """Bring the replica to the changelog's end if this process follows it, else read what
        its follower published; the cause when it cannot follow."""
        from serving.replica import follow_once, read_status

        if self.follow and self.replica.follower():
            return follow_once(self.replica, self.progress)
        return read_status(self.replica.folder).get("error")

    def refresh(self) -> None:
        with self.refresh_lock:
            changed = self._replica_problem() if self.replica is not None else self._definition_changed()
            if changed:
                self.unavailable = changed
                self._close_generations()
                self.identity = None
                return
            identity = self._identity()
            if self._restoring() or identity is None:
                commits = self.replica.commits if self.replica is not None else None   # a replica's cached view
                has_history = (commits.get(self.table.name) if commits else
                               BatchLog(self.rt.batch_dir(self.table.name)).last_commit()) is not None
                if identity is None and not has_history and not self._restoring():
                    self.unavailable = None     # never run: an empty table, not a broken one
                elif self.replica is not None:
                    self.unavailable = (f"table {self.table.name!r}: its query replica is being restored from the "
                                        f"snapshot store and the changelog; retry shortly")
                else:
                    self.unavailable = (f"table {self.table.name!r}: local state is being restored or is missing; "
                                        f"`statetable restore {self.table.name}` rebuilds it")
                self._close_generations()
                self.identity = None
                return
            if identity != self.identity:
                self._close_generations()
                run = self.root / uuid.uuid4().hex[:8]
                base = self.replica.folder.parent if self.replica is not None else self.rt.state_dir
                self.generations = [_Generation(self.table, base, run / name) for name in ("a", "b")]
                self.identity = identity
            standby = next(g for g in self.generations if g is not self.current)
            with self.cond:
                while standby.readers:
                    self.cond.wait(1.0)
            batches = standby.catch_up()
            self.last_catch_up = sorted(batches)
            if len(batches) == 1:
                standby.batch = batches.pop()
                with self.cond:
                    self.current = standby
            self.unavailable = None

    @contextlib.contextmanager
    def read(self):
        """Yields (view, batch) of one committed batch; view is None for a table never run.

        Without a current generation (first open, or secondaries rebuilt after a restore,
        possibly by another thread between two of our steps) the caller waits for a catch-up
        that lands on one batch, for up to PATIENCE_SECONDS, rather than failing at once."""
        started, attempts = time.monotonic(), 0
        if self.unavailable:
            self.refresh()          # answer 503 only while it is still true, not until the next tick
        while True:
            if self.unavailable:
                raise StateUnavailable(self.unavailable)
            with self.cond:
                generation = self.current
                if generation is not None:
                    generation.readers += 1
                    break
            if attempts and self.identity is None:
                yield None, None    # a table never run
                return
            if time.monotonic() - started > PATIENCE_SECONDS:
                log.warning("%s: no catch-up landed on one batch in %d attempts over %.1fs (last saw batches %s)",
                            self.table.name, attempts, time.monotonic() - started, self.last_catch_up)
                raise StateUnavailable(f"table {self.table.name!r}: a batch is committing; retry", retry_after=1)
            if attempts:
                time.sleep(0.05)
            self.refresh()
            attempts += 1
        try:
            yield generation.view, generation.batch
        finally:
            with self.cond:
                generation.readers -= 1
                self.cond.notify_all()

    def close(self) -> None:
        self._close_generations()


class QueryService:
    """Every table of a deployment, read-only."""

    def __init__(self, rt: Runtime | None = None, refresh_interval: float | None = None,
                 background: bool = True, follow: bool = True, progress=None) -> None:
        """`refresh_interval`: seconds between catch-ups with the writer, i.e. the most an answer
        trails the last commit (default 0.1, or STATETABLE_QUERY_REFRESH_SECONDS). `follow`:
        whether this process may keep the data dir's replicas following (serving.replica);
        `progress(table, partition, text)` hears of replica restores."""
        from serving.replica import LastCommits, source

        self.rt = rt or Runtime.from_env()
        self.source = source(self.rt)
        self.follow = follow
        self.progress = progress
        self.commits = LastCommits(self.rt)
        self.broken: dict[str, str] = {}        # a bad .sql file costs only its own table: 503 with the reason
        self.tables_seen = self._tables_signature()
        self.tables_checked = time.monotonic()
        self.definitions = load_all(self.rt.tables_dir, broken=self.broken)
        self.secondary_root = Path(tempfile.mkdtemp(prefix="query-", dir=self._secondaries_dir()))
        (self.secondary_root / OWNER_FILE).write_text(f"{os.getpid()} {start_ticks(os.getpid()) or ''}")
        self.readers: dict[str, TableReader] = {}
        self.guard = threading.Lock()
        self.refresh_interval = refresh_interval if refresh_interval is not None else \
            float(os.environ.get("STATETABLE_QUERY_REFRESH_SECONDS", "0.1"))
        self.stopped = threading.Event()
        self.thread = None
        if background and self.source == "replica":
            for name in self.definitions:      # follow every table from the start, not from its first request
                if name not in self.broken:
                    self.reader(name)
        if background:
            self.thread = threading.Thread(target=self._refresh_loop, name="statetable-query-refresh", daemon=True)
            self.thread.start()

    def _secondaries_dir(self) -> Path:
        """Where this process keeps its RocksDB secondaries; the folders of servers that died
        without closing (killed, OOM) are swept first, as they would otherwise stay for good."""
        path = self.rt.data_dir / "query-secondaries"
        path.mkdir(parents=True, exist_ok=True)
        for folder in sweep_dead_secondaries(path):
            log.info("removed %s, left by a query server that is gone", folder)
        return path

    def _tables_signature(self) -> tuple:
        try:
            return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                                for p in Path(self.rt.tables_dir).glob("*.sql")))
        except OSError:
            return ()

    def reload_definitions(self, force: bool = False) -> bool:
        """Loads the tables folder again when a file in it was added, edited or removed (looked at
        no more than every RELOAD_SECONDS): a table a user adds is served, listed and shown on the
        State tables page without restarting the server. A reader already open keeps the
        definition its state was built with (it adopts a rebuilt one by itself)."""
        now = time.monotonic()
        if not force and now - self.tables_checked < RELOAD_SECONDS:
            return False
        self.tables_checked = now
        seen = self._tables_signature()
        if seen == self.tables_seen:
            return False
        broken: dict[str, str] = {}
        definitions = load_all(self.rt.tables_dir, broken=broken)
        with self.guard:
            gone = [name for name in self.readers if name not in definitions]
            closing = [self.readers.pop(name) for name in gone]
            self.definitions, self.broken, self.tables_seen = definitions, broken, seen
        for reader in closing:
            reader.close()
        log.info("tables folder changed: serving %s%s", sorted(definitions),
                 f"; broken: {sorted(broken)}" if broken else "")
        if self.thread is not None and self.source == "replica":
            for name in definitions:
                if name not in broken and name not in self.readers:
                    self.reader(name)
        return True

    def _refresh_loop(self) -> None:
        while not self.stopped.wait(self.refresh_interval):
            try:
                self.reload_definitions()
            except Exception:   # a folder being edited must not stop the refreshes
                log.exception("reloading the table definitions failed")
            for reader in list(self.readers.values()):
                try:
                    reader.refresh()
                except Exception:   # a broken table must not stop the others' refreshes
                    log.exception("refresh of %s failed", reader.table.name)

    def table(self, name: str) -> TableDefinition:
        """The definition the table's state answers for (a reader adopts a rebuilt one)."""
        if name not in self.definitions or name in self.broken:
            self.reload_definitions()
        if name in self.broken:
            raise StateUnavailable(f"table {name!r} cannot be served: its definition is broken: {self.broken[name]}",
                                   retry_after=60)
        if name not in self.definitions:
            raise NoSuchTable(f"no table {name!r}; `statetable tables` (or GET /tables) lists the tables you may read")
        reader = self.readers.get(name)
        return reader.table if reader is not None else self.definitions[name]

    def reader(self, name: str) -> TableReader:
        table = self.table(name)
        with self.guard:
            if name not in self.readers:
                replica = None
                if self.source == "replica":
                    from serving.replica import TableReplica

                    replica = TableReplica(table, self.rt, self.commits)
                progress = None if self.progress is None else \
                    (lambda partition, text, name=name: self.progress(name, partition, text))
                self.readers[name] = TableReader(table, self.rt, self.secondary_root, replica, self.follow, progress)
            return self.readers[name]

    def log_batch(self, name: str) -> int | None:
        """The newest batch the table's batch log has committed (cached for a moment)."""
        self.table(name)
        return self.commits.batch(name)

    # -- key parsing ---------------------------------------------------------------
    def parse_key(self, table: TableDefinition, raw: str, *, full: bool = True) -> tuple:
        """A key from a URL segment: a JSON array for composite keys, else the single value."""
        parts = _json_list(raw, "key") if raw.startswith("[") else [raw]
        for part in parts:
            if isinstance(part, str) and not _is_unicode(part):
                raise BadQuery(f"table {table.name!r}: key {raw[:40]!r} holds a lone UTF-16 surrogate; no stored key "
                               f"does (such records are dead-lettered as invalid_unicode)")
        width = len(key_names(table))
        if full and len(parts) != width:
            raise BadQuery(f"table {table.name!r} has a key of {width} parts {key_names(table)}; got {len(parts)}: "
                           f"{raw!r}. Give composite keys as a JSON array, e.g. {json.dumps(key_names(table))}")
        if len(parts) > width:
            raise BadQuery(f"table {table.name!r}: {raw!r} has more parts than the key {key_names(table)}")
        try:
            key = registry.coerce_key(table, tuple(parts))
        except ValueError as exc:
            raise BadQuery(str(exc)) from None
        if table.window and len(key) == width and not isinstance(key[-1], int):
            key = key[:-1] + (window_start_ms(table, key[-1]),)
        return key

    # -- queries -----------------------------------------------------------------
    def _rows(self, table: TableDefinition, entries, aggregator, times: str) -> list[dict]:
        """The entries' rows as an answer shows them: HAVING applied, times as `times` asks
        (serving.presenters.with_times)."""
        columns = time_columns(table, self.definitions)
        return [with_times(row, columns, times) for key, value in entries
                if value is not None and (row := shown(table, row_of(table, key, value, aggregator)))]

    @staticmethod
    def _check_times(times: str) -> None:
        """Before any read: a query that cannot be answered costs nothing."""
        if times not in TIMES:
            raise BadQuery(f"times={times!r}: give one of {', '.join(TIMES)}")

    def get(self, name: str, raw_key: str, times: str = "epoch_ms") -> tuple[int | None, dict | None]:
        self._check_times(times)
        table = self.table(name)
        key = self.parse_key(table, raw_key)
        reader = self.reader(name)
        with reader.read() as (view, batch):
            value = None if view is None else view.get(key)
            found = self._rows(table, [(key, value)], reader.aggregator, times)
            return batch, found[0] if found else None

    def scan(self, name: str, prefix: str | None = None, start: str | None = None, end: str | None = None,
             limit: int | None = None, cursor: str | None = None, times: str = "epoch_ms") -> Page:
        self._check_times(times)
        table = self.table(name)
        limit = DEFAULT_LIMIT if limit is None else limit
        if limit < 1:
            raise BadQuery(f"limit must be at least 1, not {limit}")
        limit = min(limit, MAX_LIMIT)
        prefix_key = self.parse_key(table, prefix, full=False) if prefix else ()
        if prefix and not prefix.startswith("[") and text_key(table):
            prefix_key = codec.text_prefix(prefix)      # a one-part string key: prefix of the string
        start_key = self.parse_key(table, start, full=False) if start else None
        end_key = self.parse_key(table, end, full=False) if end else None
        after = _decode_cursor(cursor) if cursor else None
        if after is not None:
            start_key = after if start_key is None or codec.encode_key(after) > codec.encode_key(start_key) \
                else start_key
        reader = self.reader(name)
        with reader.read() as (view, batch):
            if view is None:
                return Page(batch, [])
            entries = view.scan(prefix_key, start_key, end_key, limit + 1 + (after is not None))
        if after is not None and entries and entries[0][0] == after:
            entries = entries[1:]
        more = len(entries) > limit
        entries = entries[:limit]
        rows = self._rows(table, entries, reader.aggregator, times)
        return Page(batch, rows, _encode_cursor(entries[-1][0]) if more else None)

    def windows(self, name: str, raw_key: str, start_ms: int | None, end_ms: int | None,
                limit: int | None = None, times: str = "epoch_ms") -> Page:
        self._check_times(times)
        table = self.table(name)
        if table.window is None:
            raise BadQuery(f"table {name!r} has no windows; use /tables/{name}/rows/{{key}}")
        key = self.parse_key(table, raw_key, full=False)
        if len(key) != len(table.key_columns):
            raise BadQuery(f"table {name!r}: give the key without window_start, {key_names(table)[:-1]}")
        if start_ms is not None and end_ms is not None and start_ms >= end_ms:
            raise BadQuery(f"from={start_ms} must be before to={end_ms}")
        limit = min(limit or MAX_LIMIT, MAX_LIMIT)
        reader = self.reader(name)
        with reader.read() as (view, batch):
            if view is None:
                return Page(batch, [])
            entries = view.scan(key, None if start_ms is None else key + (start_ms,),
                                None if end_ms is None else key + (end_ms,), limit)
        return Page(batch, self._rows(table, entries, reader.aggregator, times))

    def refresh_all(self, also: list[str] = ()) -> dict[str, int | None]:
        """Catch every open table, and the tables in `also`, up with the writer now; returns the
        batch each answers from."""
        for name in also:
            if name in self.definitions:
                self.reader(name)
        with self.guard:
            readers = dict(self.readers)
        for reader in readers.values():
            reader.refresh()
        return {name: UNAVAILABLE if reader.unavailable else
                (reader.current.batch if reader.current is not None else None) for name, reader in readers.items()}

    def tables(self) -> list[dict]:
        from ops import status
        from serving.replica import batches_behind

        self.reload_definitions()
        out = []
        for name, table in sorted(self.definitions.items()):
            info = status.table_status(table, self.rt)
            try:
                with self.reader(name).read() as (_, batch):
                    readable = {"readable_batch": batch, "available": True}
            except StateUnavailable as exc:
                readable = {"readable_batch": None, "available": False, "reason": str(exc)}
            logged = (info.get("last_batch") or {}).get("batch_id")
            readable["served_from"] = self.source
            readable["lag_batches"] = None if logged is None else batches_behind(logged, readable["readable_batch"])
            columns = shown_columns(table)
            out.append({**info, "columns": columns, "key": key_names(table), "windowed": table.window is not None,
                        **readable})
        return out

    def broken_tables(self) -> dict[str, str]:
        self.reload_definitions()
        """Tables whose definitions do not load, with the reason (file:line:col and the fix)."""
        return dict(self.broken)

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for reader in self.readers.values():
            reader.close()
            if reader.replica is not None:
                reader.replica.close()
        shutil.rmtree(self.secondary_root, ignore_errors=True)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_list(raw: str, what: str) -> list:
    try:
        parts = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadQuery(f"{what} {raw!r} is not a JSON array ({exc.msg})") from None
    except (RecursionError, ValueError):    # nesting past the parser's stack; integers past int's digit limit
        raise BadQuery(f"{what} {raw[:40]!r}... must be a flat JSON array of strings and numbers") from None
    if not isinstance(parts, list) or not parts or not all(isinstance(p, (str, int, float, bool)) for p in parts):
        raise BadQuery(f"{what} {raw!r} must be a non-empty JSON array of strings and numbers")
    return parts


def _encode_cursor(key: tuple) -> str:
    return base64.urlsafe_b64encode(codec.encode_key(key)).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple:
    try:
        key = codec.decode_key(base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True))
    except Exception:
        key = None
    if not key:
        raise BadQuery(f"cursor {cursor!r} is not one this API returned")
    return key


def query_once(name: str, raw_key: str, rt: Runtime | None = None, progress=None,
               times: str = "epoch_ms") -> tuple[int | None, dict | None]:
    """One point lookup without a long-lived service (the CLI). Where queries read replicas, the
    data dir's replica is brought up to date first (restored on first use: `progress` hears of it)."""
    service = QueryService(rt, background=False, progress=progress)
    try:
        return service.get(name, raw_key, times)
    finally:
        service.close()


def lookup(name: str, key: tuple, rt: Runtime | None = None, progress=None, times: str = "epoch_ms") -> dict | None:
    """One row of committed state by its key columns' values, through the query API's read path
    (never the writer's lock)."""
    raw = str(key[0]) if len(key) == 1 else json.dumps(list(key))
    return query_once(name, raw, rt, progress, times)[1]
