"""Key-value backends of one state partition: RocksDB, or memory for small
tables and unit tests. Both write data and metadata in one atomic step.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from state import codec
from state.digest import from_signed, to_signed
from state.errors import StateMissing

__all__ = ["Backend", "INFO_LOGS", "ReadableBackend", "INFO_LOG_BYTES", "META_KEY", "MemoryBackend", "PartitionMeta", "RocksBackend",
           "primary_files"]

META_KEY = b"partition-meta"


@dataclass(frozen=True)
class PartitionMeta:
    """What a partition has committed, stored atomically with its data."""

    applied_batch: int = -1        # last batch id applied; -1 = none
    changelog_offset: int = 0      # next changelog offset to replay from
    digest: int = 0
    key_count: int = 0
    format_version: int = codec.FORMAT_VERSION
    rejected: tuple = ()           # keys the applied batch refused, ((encoded key, reason), ...)

    def encode(self) -> bytes:
        base = (self.applied_batch, self.changelog_offset, to_signed(self.digest), self.key_count,
                self.format_version)
        return codec.encode_value(base + ((self.rejected,) if self.rejected else ()))

    @classmethod
    def decode(cls, data: bytes | None) -> "PartitionMeta":
        if data is None:
            return cls()
        applied, offset, digest, count, version, *rest = codec.decode_value(data)
        if version != codec.FORMAT_VERSION:
            raise codec.CodecError(f"partition format version {version}; this build reads {codec.FORMAT_VERSION}")
        rejected = tuple(tuple(r) for r in rest[0]) if rest else ()
        return cls(applied, offset, from_signed(digest), count, version, rejected)

    def but(self, **changes) -> "PartitionMeta":
        return replace(self, **changes)


@runtime_checkable
class ReadableBackend(Protocol):
    """What reading a state partition needs of its store: point and bulk reads, an ordered scan
    and the committed metadata. A query replica's read-only or secondary RocksDB has only these
    (Kafka Streams' ReadOnlyKeyValueStore); `StatePartition` reads through them."""

    def get(self, key: bytes) -> bytes | None: ...

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]: ...

    def scan(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...

    def read_meta(self) -> PartitionMeta: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(ReadableBackend, Protocol):
    """The read-write half (Kafka Streams' KeyValueStore): one atomic write of data plus
    metadata, and compaction. `RocksBackend` opened for writing and `MemoryBackend` implement it."""

    def write(self, changes: dict[bytes, bytes | None], meta: PartitionMeta, sync: bool = True) -> None: ...

    def compact(self) -> None: ...


class MemoryBackend:
    """A dict per partition; `clone` stands in for a checkpoint."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.meta = PartitionMeta()

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        get = self.data.get
        return [get(k) for k in keys]

    def scan(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(self.data):
            if start is not None and key < start:
                continue
            if end is not None and key >= end:
                break
            yield key, self.data[key]

    def read_meta(self) -> PartitionMeta:
        return self.meta

    def write(self, changes: dict[bytes, bytes | None], meta: PartitionMeta, sync: bool = True) -> None:
        for key, value in changes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        self.meta = meta

    def compact(self) -> None:
        pass

    def close(self) -> None:
        pass


def _open_existing(rdict, primary: Path, options, cfs, access):
    """Opens a database that must already exist. rocksdict writes its config file into the
    primary's folder even for a read-only or secondary open, so a reader racing a restore's
    folder swap would leave a folder behind that blocks the swap; a failed open removes it."""
    if not (primary / "CURRENT").exists():
        raise StateMissing(f"no RocksDB database at {primary}")
    try:
        return rdict(str(primary), options=options, column_families=cfs, access_type=access)
    except Exception:
        if not (primary / "CURRENT").exists():
            with contextlib.suppress(OSError):
                (primary / "rocksdict-config.json").unlink()
                primary.rmdir()
        raise


LOCK_WAIT_ENV = "STATETABLE_STATE_LOCK_WAIT"


def _open_writer(rdict, path: Path, options, cfs):
    """Open for writing, waiting while another process holds the database's lock: on a shared
    Spark Connect server, the task of a run whose client was killed may still be finishing the
    same batch (a commit of the same batch id, then a no-op for whoever comes next). Waits up to
    STATETABLE_STATE_LOCK_WAIT seconds (default 60), then fails naming the folder."""
    import logging
    import os
    import time

    wait = float(os.environ.get(LOCK_WAIT_ENV, "60"))
    deadline, warned = time.monotonic() + wait, False
    while True:
        try:
            return rdict(str(path), options=options, column_families=cfs)
        except Exception as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            if not warned:
                logging.getLogger("statetable.state").warning(
                    "%s is locked by another process (%s); waiting up to %.0f s", path, exc, wait)
                warned = True
            time.sleep(0.2)


def _manifest_state(primary: Path) -> tuple:
    """Which MANIFEST the primary writes and how far: it moves on every flush, compaction and reopen."""
    try:
        name = (primary / "CURRENT").read_text().strip()
        return name, (primary / name).stat().st_size
    except FileNotFoundError:
        return None, None


INFO_LOGS = 3
LEVEL0_RUNS = 8
INFO_LOG_BYTES = 1 << 20
# RocksBackend.settle: under universal compaction's own bound (200% space amplification keeps the
# base run over a third), so it fires only on a store no compaction has ordered.
SCATTERED_SHARE = 0.25


def sorted_runs(live_files: list[dict]) -> list[int]:
    """The bytes of each sorted run of a RocksDB store, from its live files: a level-0 file is a
    run of its own, a deeper level is one run however many files it is cut into (a 187 MB run
    is three files of at most ~68 MB, and taken file by file it looked unmerged)."""
    levels: dict[int, int] = {}
    runs = []
    for f in live_files:
        if f["level"] == 0:
            runs.append(f["size"])
        else:
            levels[f["level"]] = levels.get(f["level"], 0) + f["size"]
    return runs + list(levels.values())


def primary_files(primary: Path | str) -> tuple:
    """A store's WAL, MANIFEST and CURRENT files with their sizes and times: a commit appends to
    a WAL, a flush or compaction moves the MANIFEST. Equal tuples mean a secondary has nothing
    to catch up with. Raises FileNotFoundError when the folder is gone."""
    found = []
    for entry in os.scandir(primary):
        if entry.name.endswith(".log") or entry.name.startswith(("MANIFEST", "CURRENT")):
            stat = entry.stat()
            found.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


class RocksBackend:
    """One RocksDB database in raw bytes mode: data in `default`, metadata in `meta`.

    A commit is one WriteBatch over both column families with a synced WAL,
    so data and metadata can never disagree after a crash.
    """

    def __init__(self, path: Path, read_only: bool = False, secondary_of: Path | None = None) -> None:
        from rocksdict import WriteOptions

        self.path = Path(path)
        self.primary = Path(secondary_of) if secondary_of is not None else None
        self.read_only = read_only
        self._opened_at: tuple | None = None
        self._caught_up_at: tuple | None = None
        self._open()
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()

    def _open(self) -> None:
        from rocksdict import AccessType, DBCompactionStyle, Options, Rdict

        options = Options(raw_mode=True)
        # Universal (tiered) compaction, because snapshots upload only the SSTs the store lacks:
        # leveled compaction merges every flush into level 1, which random keys overlap
        # entirely, so every few snapshots re-upload the whole partition. bench/snapshot_compaction
        # (500k keys, 1% changed per snapshot, 150 snapshots): leveled uploaded 11.4% of the
        # partition per snapshot on average and 18 snapshots re-uploaded ~all of it; universal
        # 4.3% on average (at most 39%), for 1.94x the rows' bytes on disk against 1.72x and
        # point reads no slower. A database written with leveled compaction opens as is.
        options.set_compaction_style(DBCompactionStyle.universal())
        # Compaction starts at 8 level-0 runs, not RocksDB's 4: each snapshot's flush waits as a
        # small run of its own instead of being merged, re-uploaded, into the next one.
        # bench/snapshot_compaction, 500k keys, 1% changed per snapshot, 150 snapshots: 2.0% of
        # the partition uploaded per snapshot on average against 4.65% at 4 (median 0.72% vs 2.6%),
        # for point reads of 24 us against 14 us at the end, 17.6 vs 19.0 us over 60 snapshots.
        options.set_level_zero_file_num_compaction_trigger(LEVEL0_RUNS)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_max_background_jobs(2)
        options.increase_parallelism(2)
        # RocksDB's info log: every open rotates it (RocksDB keeps 1,000 old ones by default) and
        # a secondary logs each catch-up. Bounded per database to INFO_LOGS files of
        # INFO_LOG_BYTES: a year of batches, or of a query server's catch-ups, stays a few MB.
        options.set_keep_log_file_num(INFO_LOGS)
        options.set_max_log_file_size(INFO_LOG_BYTES)
        if self.primary is not None or self.read_only:
            # A reader's only timed write: RocksDB dumps its statistics to the info log every
            # 10 minutes, also when nothing happens. A query server idle for hours writes nothing.
            options.set_stats_dump_period_sec(0)
            options.set_stats_persist_period_sec(0)
        cfs = {"meta": Options(raw_mode=True)}
        if self.primary is not None:
            self._opened_at = _manifest_state(self.primary)
            self.db = _open_existing(Rdict, self.primary, options, cfs, AccessType.secondary(str(self.path)))
        elif self.read_only:
            self.db = _open_existing(Rdict, self.path, options, cfs, AccessType.read_only())
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self.db = _open_writer(Rdict, self.path, options, cfs)
        self.meta_cf = self.db.get_column_family("meta")
        self._meta_handle = self.db.get_column_family_handle("meta")

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        # One get per key: rocksdict's list form (MultiGet) measured ~2x slower for 100k keys.
        return list(map(self.db.get, keys))

    def scan(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                break
            yield key, it.value()
            it.next()

    def read_meta(self) -> PartitionMeta:
        return PartitionMeta.decode(self.meta_cf.get(META_KEY))

    def write(self, changes: dict[bytes, bytes | None], meta: PartitionMeta, sync: bool = True) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        batch.put(META_KEY, meta.encode(), self._meta_handle)
        self.db.write(batch, self._sync if sync else self._nosync)

    def catch_up(self) -> None:
        """Secondary instances only: move to the primary's latest committed state.

        RocksDB's catch-up replays WAL files reliably, but not a flush or a reopen of the
        primary: measured with rocksdict 0.3.29, a catch-up after a flush of the default
        column family showed the new metadata over the old data (facebook/rocksdb#14444).
        So once the primary's MANIFEST has moved, the secondary is opened afresh instead,
        and a MANIFEST that moves during the step sends it round again."""
        try:
            seen = primary_files(self.primary)
        except FileNotFoundError:
            seen = None
        if seen is not None and seen == self._caught_up_at:
            return          # nothing was written since: no call into RocksDB, no line in its log
        while True:
            before = _manifest_state(self.primary)
            if before != self._opened_at:
                self.close()
                self._open()
            else:
                self.db.try_catch_up_with_primary()
            if _manifest_state(self.primary) == before:
                self._caught_up_at = seen
                return

    def settle(self, share: float = SCATTERED_SHARE) -> bool:
        """Merge the partition into one sorted run when no run holds `share` of its SST bytes: a
        store written in many runs that no batch compacted (a restore replayed from the changelog,
        a store from before Transaction's compaction of large batches). Its next snapshot uploads
        most of it anyway; merged, the snapshots after it upload what changed, not those runs again
        as universal compaction merges them. Under universal's own bound, so a settled table never
        meets it (bench/snapshot_compaction: 150 snapshots, 4.3% mean against 4.1% without, where
        a half share cost 4.9%). True if merged."""
        runs = sorted_runs(self.db.live_files())
        if len(runs) < 2 or max(runs) >= share * sum(runs):
            return False
        self.compact()
        return True

    def compact(self) -> None:
        """Merge the partition into one sorted run (its memtable flushed first). A store that is
        one run once flushed (a load into an empty partition that fit one memtable) stays as it
        is: compact_range would rewrite it whole for nothing (Nexmark q18's first batch: 0.3-0.45 s
        of a 260,000-key merge task)."""
        self.db.flush()
        if len(sorted_runs(self.db.live_files())) > 1:
            self.db.compact_range(None, None)

    def checkpoint(self, target: Path) -> None:
        from rocksdict import Checkpoint

        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        Checkpoint(self.db).create_checkpoint(str(target))

    def close(self) -> None:
        """Release the database; column-family handles share it, so they go too."""
        if self.db is None:
            return
        self.meta_cf = self._meta_handle = None
        self.db.close()
        self.db = None
