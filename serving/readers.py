"""The query service spread over reader processes, so a catch-up never stalls an answer.

rocksdict holds the GIL for the whole of a secondary instance's catch-up with
the writer (tens of milliseconds after a large batch), and in one process that
stalls every request in flight. Here each reader process holds its own
`QueryService` (its own secondaries) and catches up only when told to. The
readers take turns: one is drained of requests and refreshed while the others
answer, so some reader is always free. A reader is drained only when the state
files changed since its last catch-up (state_signature), so an idle table keeps
every reader serving, and after one reader lands on a new batch the next is
caught up at once: until then that reader serves the table alone.

Reads stay monotonic: a request goes to a serving reader whose batch for the
table is the newest known, so a client never sees a batch older than one it
has already been shown. Within a reader, every answer still comes from one
committed batch (see serving.query).

The routing runs on the server's event loop: a call awaits its reader's pipe
instead of blocking on it, so the loop parses the next requests while readers
answer, each reader on whatever core is free, and one slow answer holds up
only its own request.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import multiprocessing
import os
import time
from pathlib import Path

from serving import replica
from state.backends import primary_files
from serving.query import UNAVAILABLE, BadQuery, NoSuchTable, QueryService, StateUnavailable
from catalog.definitions import load_all
from catalog.runtime import Runtime
from state.errors import BadSetting
from serving.errors import ReaderDied

log = logging.getLogger("statetable.query")

FLOOR_PATIENCE_SECONDS = 2.0   # how long a read waits for a reader at the newest batch before accepting an older one
MAX_SKIPS = 10   # turns a reader may skip for being the only one at the newest batch; then reads wait for it
_ERRORS = {cls.__name__: cls for cls in (BadQuery, NoSuchTable)}


def state_signature(state_dir: Path, tables) -> tuple:
    """Everything a secondary's catch-up could read, as cheap metadata: each table folder's
    entries (a restore swaps a partition folder), and in each partition the size and time of
    its WAL and MANIFEST files. Every commit appends to a WAL and every flush writes a
    MANIFEST, so while this is unchanged a catch-up would find nothing new, and draining a
    reader for one only takes it from the requests."""
    signature = []
    for table in sorted(tables):
        try:
            partitions = sorted(os.scandir(state_dir / table), key=lambda e: e.name)
        except FileNotFoundError:
            signature.append((table, None))
            continue
        for partition in partitions:
            try:
                signature.append((table, partition.name, partition.inode(), primary_files(partition.path)))
            except (FileNotFoundError, NotADirectoryError):
                signature.append((table, partition.name, None))
    return tuple(signature)


def _idle_priority(work):
    """Run `work` at SCHED_IDLE: a catch-up is CPU-heavy, and on a small machine it would
    otherwise take the cores from the reader that is answering and from the writer.
    (Switching back to SCHED_OTHER needs no privilege.)"""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return work()
    try:
        return work()
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _reader_main(env: dict, conn) -> None:
    """A reader process: answer calls from the pipe until it closes."""
    os.environ.update(env)
    service = QueryService(Runtime.from_env(), background=False, follow=False)   # the server process follows
    try:
        while True:
            try:
                method, args = conn.recv()
            except (EOFError, OSError):
                return      # the server closed the pipe: it is shutting down
            try:
                if method == "refresh":
                    conn.send(("ok", _idle_priority(lambda: service.refresh_all(*args))))
                elif method == "open_all":
                    opened = service.refresh_all(sorted(service.definitions))
                    gc.freeze()    # what a reader holds from here on is long-lived: keep it out of collections
                    conn.send(("ok", opened))
                else:
                    conn.send(("ok", getattr(service, method)(*args)))
            except StateUnavailable as exc:
                conn.send(("unavailable", (str(exc), exc.retry_after)))
            except (BadQuery, NoSuchTable) as exc:
                conn.send(("error", (type(exc).__name__, str(exc))))
            except (BrokenPipeError, EOFError):
                return      # the server closed the pipe mid-call (shutting down): nobody waits for the answer
            except Exception as exc:   # noqa: BLE001 - reported to the caller, the reader lives on
                log.exception("query reader: %s failed", method)
                conn.send(("error", ("RuntimeError", f"{type(exc).__name__}: {exc}")))
    finally:
        service.close()


class _Reader:
    def __init__(self, index: int, env: dict) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.index = index
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_reader_main, args=(env, child), name=f"statetable-query-reader-{index}",
                                   daemon=True)
        self.process.start()
        child.close()
        self.batches: dict[str, int | None] = {}
        self.in_flight = 0
        self.draining = False
        self.refreshes = 0
        self.refreshed_at: tuple | None = None    # the state_signature its last catch-up started from

    def batch_of(self, table: str) -> int:
        """The batch this reader answers `table` from; -1 before it has opened the table."""
        batch = self.batches.get(table)
        return batch if isinstance(batch, int) else -1

    async def call(self, method: str, args: tuple):
        """Send one call and await its answer without holding the event loop."""
        self.conn.send((method, args))
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = self.conn.fileno()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        return self.receive()

    def receive(self):
        """The answer to the call sent last, or its error raised here."""
        status, payload = self.conn.recv()
        if status == "ok":
            return payload
        if status == "unavailable":
            message, retry_after = payload
            raise StateUnavailable(message, retry_after=retry_after)
        name, message = payload
        raise _ERRORS.get(name, RuntimeError)(message)

    def close(self) -> None:
        self.conn.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


class ProcessQueryService:
    """The `QueryService` interface (get, scan, windows, tables) answered by reader processes,
    as coroutines of the event loop that serves the requests."""

    def __init__(self, rt: Runtime | None = None, readers: int = 2, refresh_interval: float | None = None) -> None:
        if readers < 2:
            raise BadSetting(f"ProcessQueryService needs at least 2 readers to take turns, not {readers}")
        self.rt = rt or Runtime.from_env()
        self.refresh_interval = refresh_interval if refresh_interval is not None else \
            float(os.environ.get("STATETABLE_QUERY_REFRESH_SECONDS", "0.1"))
        env = {**{k: v for k, v in os.environ.items() if k.startswith("STATETABLE_")}, **self.rt.as_env()}
        self.follower = None
        self.watched = self.rt.state_dir      # the folders whose changes call for a catch-up
        if replica.source(self.rt) == "replica":
            # This process keeps the replicas following; the readers open secondaries of them.
            self.watched = replica.replica_root(self.rt)
            self.follower = replica.Follower(self.rt, load_all(self.rt.tables_dir), self.refresh_interval).start()
        self.readers = [_Reader(i, env) for i in range(readers)]
        self._open_every_table()
        self.floor: dict[str, int] = {}
        self.turn = itertools.count()
        self.changed: asyncio.Condition | None = None     # made on the serving loop, at the first call
        self.refresher: asyncio.Task | None = None

    def _open_every_table(self) -> None:
        """Open every table in every reader, all readers at once, before the first request: opening
        replays the writer's WAL into each secondary (seconds for a large table), and done lazily it
        would fall on the first requests, then on every reader's first turn under load."""
        for reader in self.readers:
            reader.conn.send(("open_all", ()))
        for reader in self.readers:
            try:
                reader.batches = reader.receive()   # its first turn still catches up, then records what it saw
            except EOFError:
                raise ReaderDied(f"query reader {reader.index} died while opening the tables") from None
            except (StateUnavailable, RuntimeError, LookupError, ValueError) as exc:
                log.warning("query reader %d: opening the tables: %s", reader.index, exc)

    def _start(self) -> asyncio.Condition:
        """Bind to the running loop: the refresh task runs beside the requests it must not stall."""
        if self.changed is None:
            self.changed = asyncio.Condition()
            self.refresher = asyncio.get_running_loop().create_task(self._refresh_loop(),
                                                                    name="statetable-query-refresh")
        return self.changed

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- routing -------------------------------------------------------------------
    async def _acquire(self, table: str | None, deadline: float) -> _Reader:
        """A free, serving reader at or past the table's floor (the newest batch any answer named)."""
        changed = self._start()
        while True:
            if table is not None and time.monotonic() > deadline:
                self.floor.pop(table, None)     # the table really went back (a restore to an older batch)
            if table is not None and self._unavailable(table):
                self.floor.pop(table, None)
            floor = self.floor.get(table, -1) if table is not None else -1
            serving = [r for r in self.readers if not r.draining and not r.in_flight
                       and (table is None or r.batch_of(table) >= floor or table not in r.batches)]
            if table is not None and self._unavailable(table):
                # Being restored or missing: only a reader that has seen it so may answer (it
                # re-checks, and answers 503 or, once the state is back, from the restored batch).
                # Another still holds the old files open and would serve rows the restore replaces.
                serving = [r for r in serving if r.batches.get(table) == UNAVAILABLE]
            if serving:
                break
            async with changed:
                try:
                    await asyncio.wait_for(changed.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
        if table is not None and not self._unavailable(table):
            newest = max(r.batch_of(table) for r in serving)
            serving = [r for r in serving if r.batch_of(table) == newest]
        reader = serving[next(self.turn) % len(serving)]
        reader.in_flight += 1
        return reader

    def _unavailable(self, table: str) -> bool:
        return any(r.batches.get(table) == UNAVAILABLE for r in self.readers)

    async def _ask(self, reader: _Reader, method: str, args: tuple):
        """One call on an acquired reader, released when its answer is in, even if the request
        that asked has gone: the answer must leave the pipe before the reader's next call."""
        try:
            return await reader.call(method, args)
        finally:
            reader.in_flight -= 1
            await self._notify()

    async def _call(self, table: str | None, method: str, *args):
        """Answer from one reader; an answer older than one already given is never returned (monotonic
        reads): it tells the router where that reader really stands, and the call goes elsewhere."""
        deadline = time.monotonic() + FLOOR_PATIENCE_SECONDS
        while True:
            reader = await self._acquire(table, deadline)
            try:
                result = await asyncio.shield(self._ask(reader, method, args))
            except StateUnavailable as exc:
                if exc.retry_after > 1 or table is None or time.monotonic() > deadline:
                    raise
                reader.batches[table] = None    # it opened the table mid-commit: ask another reader, or this one later
                await asyncio.sleep(0.01)
                continue
            batch = result[0] if method == "get" else getattr(result, "batch", None)
            if table is None or batch is None:
                return result
            reader.batches[table] = batch
            if batch >= self.floor.get(table, -1) or time.monotonic() > deadline:
                self.floor[table] = batch
                return result
            await self._notify()

    # -- refresh -------------------------------------------------------------------
    def _sole_newest(self, reader: _Reader) -> bool:
        """Whether `reader` alone answers some table from its newest batch (a catch-up of another
        reader can stop short when it lands mid-commit, leaving it a batch behind)."""
        for table, batch in reader.batches.items():
            if self._unavailable(table):
                continue     # every reader must get to see that, so none may be skipped for it
            if isinstance(batch, int) and all(r.batch_of(table) < batch for r in self.readers if r is not reader):
                return True
        return False

    def _up_to_date(self, reader: _Reader, tables: list[str], signature: tuple) -> bool:
        """Nothing a catch-up could bring it: no write since its last one started, and it has
        every table some reader has opened, none of them being restored."""
        return (reader.refreshed_at == signature and set(tables) <= set(reader.batches)
                and not any(self._unavailable(t) for t in tables))

    async def _refresh_loop(self) -> None:
        skipped = [0] * len(self.readers)
        hurry = False
        for index in itertools.cycle(range(len(self.readers))):
            await asyncio.sleep(0 if hurry else self.refresh_interval / len(self.readers))
            try:
                hurry = await self._refresh_turn(self.readers[index], index, skipped)
            except Exception:    # noqa: BLE001 - the refresher must outlive any one failure, or reads go stale
                log.exception("query reader %d: refresh turn failed", index)
                hurry = False

    async def _refresh_turn(self, reader: _Reader, index: int, skipped: list[int]) -> bool:
        """Catch `reader` up if anything changed; True when the next reader should follow at once."""
        tables = sorted({t for r in self.readers for t in r.batches})
        # A scandir and a stat per file: off the loop, which is answering meanwhile.
        signature = await asyncio.get_running_loop().run_in_executor(
            None, state_signature, self.watched, tables)
        if self._up_to_date(reader, tables, signature):
            return False
        if self._sole_newest(reader) and skipped[index] < MAX_SKIPS:
            skipped[index] += 1
            return False       # draining it would send readers back in time; refresh the others first
        skipped[index] = 0
        reader.draining = True
        try:
            async with self.changed:
                await self.changed.wait_for(lambda: not reader.in_flight)
            reader.in_flight += 1          # the refresh owns the pipe now
            try:
                reader.batches = await reader.call("refresh", (tables,))
            except Exception:    # noqa: BLE001 - a broken table must not stop the others' refreshes
                log.exception("query reader %d: refresh failed", reader.index)
                return False
            finally:
                reader.in_flight -= 1
            reader.refreshes += 1
            # The catch-up read the files after this was taken, so it saw all of it; a batch it
            # found half-committed will change the files again when the rest commits.
            reader.refreshed_at = signature
            # Alone at a newer batch, it now serves that table by itself: catch the next
            # reader up at once instead of after the usual pause.
            return self._sole_newest(reader)
        finally:
            reader.draining = False
            await self._notify()

    # -- the QueryService interface, as coroutines ---------------------------------------
    async def get(self, name: str, raw_key: str, times: str = "epoch_ms"):
        return await self._call(name, "get", name, raw_key, times)

    async def scan(self, name: str, prefix=None, start=None, end=None, limit=None, cursor=None, times="epoch_ms"):
        return await self._call(name, "scan", name, prefix, start, end, limit, cursor, times)

    async def windows(self, name: str, raw_key: str, start_ms=None, end_ms=None, limit=None, times="epoch_ms"):
        return await self._call(name, "windows", name, raw_key, start_ms, end_ms, limit, times)

    async def tables(self) -> list[dict]:
        return await self._call(None, "tables")

    async def broken_tables(self) -> dict[str, str]:
        return await self._call(None, "broken_tables")

    async def log_batch(self, name: str) -> int | None:
        return await self._call(None, "log_batch", name)

    def close(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
        if self.follower is not None:
            self.follower.close()
        for reader in self.readers:
            reader.close()
