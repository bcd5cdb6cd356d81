"""State tables: P partitions, a changelog, snapshots, restore and verify.

The local state folder is only a cache. The durable truth is the snapshot
store plus the changelog topic, so any process on any machine can hydrate a
partition (`open` restores it when the folder has none), which is how state
follows Spark tasks around a cluster.

Usage (a store builder in the manner of Kafka Streams' Stores):

    table = StateTable(TableSpec("tickets", 4, RowAggregator({"n": Count()})),
                       state_dir, bootstrap="127.0.0.1:19092", snapshot_uri="/snapshots")
    part = table.open(table.partition_of(key))     # ensure(): the changelog topic, the descriptor
    with part.begin(batch_id) as tx:
        tx.merge(key, (1,))
    table.snapshot(part.partition)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from state import changelog, codec
from state.aggregates import RowAggregator
from state.backends import MemoryBackend, RocksBackend
from state.changelog import ChangelogWriter
from state.partition import StatePartition
from state.restore import RestoreReport, replay_tail, restore_partition
from state.snapshots import Manifest, SnapshotStore
from state.errors import BadSetting, DefinitionChanged, NoSuchPartition, meaning_changes

__all__ = ["DefinitionChanged", "StateTable", "TableSpec", "definition_fingerprint", "freeze_meaning",
           "meaning_changes", "partition_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableSpec:
    name: str
    partitions: int
    aggregator: RowAggregator | None = None   # None: a latest-value (source) table
    snapshot_keep: int = 3
    changelog: str | None = None              # topic; default "<name>-changelog"
    meaning: tuple | None = None              # the definition's normalised meaning, as sorted (field, json) pairs
    routing_width: int | None = None          # leading key parts that pick the partition (None: all); a session
                                              # table routes by its key without the start, so a key's sessions meet
    batch_headers: bool = True                # the records for other topics (a change topic) carry a batch header

    def route(self, key: tuple) -> int:
        """The partition of a key tuple."""
        return partition_of(codec.encode_key(key[:self.routing_width] if self.routing_width else key), self.partitions)

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise BadSetting(f"table name {self.name!r}: use letters, digits, '.', '_' or '-'")
        if not 1 <= self.partitions <= 1024:
            raise BadSetting(f"table {self.name!r}: partitions={self.partitions}; use 1..1024")

    @property
    def changelog_topic(self) -> str:
        return self.changelog or changelog.topic_name(self.name)

    @property
    def fingerprint(self) -> str | None:
        return None if self.meaning is None else definition_fingerprint(self.meaning_dict())

    def meaning_dict(self) -> dict | None:
        return None if self.meaning is None else {k: json.loads(v) for k, v in self.meaning}

    def descriptor(self) -> dict:
        return {
            "name": self.name, "partitions": self.partitions, "format_version": codec.FORMAT_VERSION,
            "aggregator": None if self.aggregator is None else repr(self.aggregator.spec()),
            "fingerprint": self.fingerprint, "meaning": self.meaning_dict(),
        }


def freeze_meaning(meaning: dict) -> tuple:
    """A meaning in a hashable form (TableSpec is frozen)."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in meaning.items()))


def definition_fingerprint(meaning: dict) -> str:
    return hashlib.sha256(json.dumps(meaning, sort_keys=True).encode()).hexdigest()[:16]


def partition_of(key: bytes, partitions: int) -> int:
    """The state partition of an encoded key (crc32, which Spark SQL also computes natively)."""
    return zlib.crc32(key) % partitions


class StateTable:
    def __init__(self, spec: TableSpec, state_dir: Path | str | None, *, bootstrap: str | None = None,
                 snapshot_uri: str | None = None, memory: bool = False, create_topics: bool = True,
                 seed_dirs: tuple = ()) -> None:
        """`seed_dirs`: folders where query replicas on this host keep their copies of tables
        (`<data dir>/replicas`); a partition missing here is copied from one of them, when it is
        of this definition, before the snapshots are tried."""
        self.spec = spec
        self.seed_dirs = tuple(Path(d) for d in seed_dirs)
        self.restored: dict[int, RestoreReport] = {}
        self.memory = memory
        self.bootstrap = bootstrap
        self.dir = None if memory else Path(state_dir) / spec.name
        self.snapshots = SnapshotStore(snapshot_uri) if snapshot_uri else None
        self._open: dict[int, StatePartition] = {}
        self._create_topics = create_topics
        self._ensured = False

    def ensure(self) -> "StateTable":
        """The table's I/O before its first partition opens, kept out of the constructor (Kafka
        Streams' store builders touch nothing either): the changelog topic made when missing, and
        the folder's descriptor checked against this definition (DefinitionChanged names what
        differs) or written. Idempotent; `open`, `open_readonly`, `follow` and `restore` call it."""
        if self._ensured:
            return self
        if self.bootstrap and self._create_topics:
            changelog.ensure_changelog(self.bootstrap, self.spec.changelog_topic, self.spec.partitions)
        if self.dir is not None:
            self._check_descriptor()
        self._ensured = True
        return self

    def _check_descriptor(self) -> None:
        """The state answers for one definition: a table reopened under another (its meaning, P,
        aggregates or format) fails, naming what changed and how to adopt it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "table.json"
        wanted = self.spec.descriptor()
        if not path.exists():
            self._publish(path, wanted)
            return
        recorded = json.loads(path.read_text())
        if recorded.get("fingerprint") and wanted["fingerprint"] and recorded["fingerprint"] != wanted["fingerprint"]:
            raise DefinitionChanged(self.spec.name, recorded.get("meaning"), wanted["meaning"])
        for field in ("partitions", "aggregator", "format_version"):
            if recorded.get(field) != wanted[field]:
                raise DefinitionChanged(self.spec.name, {field: recorded.get(field)}, {field: wanted[field]})
        if wanted["fingerprint"] and not recorded.get("fingerprint"):
            self._publish(path, wanted)   # state from before fingerprints: same P and aggregates, so adopt

    def _publish(self, path: Path, descriptor: dict) -> None:
        """Several tasks may create the table at once: publish the file whole or not at all."""
        tmp = path.with_name(f".table.json.{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "w") as out:
            out.write(json.dumps(descriptor, indent=1))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        folder = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(folder)          # the rename is durable only once the folder's entry is
        finally:
            os.close(folder)

    def partition_of(self, key: tuple) -> int:
        return self.spec.route(key)

    def partition_dir(self, partition: int) -> Path:
        return self.dir / f"p{partition:04d}"

    def has_local_state(self, partition: int) -> bool:
        """Whether this machine holds a RocksDB database for the partition (the cache may be gone)."""
        return (self.partition_dir(partition) / "CURRENT").exists()

    # -- lifecycle -------------------------------------------------------------
    def open(self, partition: int) -> StatePartition:
        """Open partition p for writing: hydrate it if absent, then catch up its changelog tail.

        An open partition is always at the latest committed batch; to look at
        a point-in-time restore, use `open_readonly`.
        """
        if partition in self._open:
            return self._open[partition]
        self.ensure()
        if not 0 <= partition < self.spec.partitions:
            raise NoSuchPartition(f"table {self.spec.name!r} has partitions 0..{self.spec.partitions - 1}, not {partition}")
        writer = ChangelogWriter(self.bootstrap, self.spec.changelog_topic, partition,
                                 batch_headers=self.spec.batch_headers) if self.bootstrap else None
        if self.memory:
            backend = MemoryBackend()
        else:
            path = self.partition_dir(partition)
            if not self.has_local_state(partition):
                # Fencing came first (the writer above), so no zombie transaction can stall the replay.
                self.restore(partition)
            backend = RocksBackend(path)
        part = StatePartition(self.spec.name, partition, backend, self.spec.aggregator, writer)
        if self.bootstrap and not self.memory:
            self._catch_up(part)
        self._open[partition] = part
        return part

    def open_readonly(self, partition: int) -> StatePartition:
        """The local partition exactly as it is (e.g. after a point-in-time restore):
        read-only, with no changelog writer and no catch-up to the latest batch."""
        self.ensure()
        self.close(partition)
        return StatePartition(self.spec.name, partition, RocksBackend(self.partition_dir(partition), read_only=True),
                              self.spec.aggregator)

    def follow(self, partition: int) -> tuple[StatePartition, int]:
        """A copy of partition p that follows the changelog and never writes it (a query replica,
        Kafka Streams' standby): restored when absent, then brought to the changelog's end; the
        records applied. It has no changelog writer, so opening it fences no writer. A gap in
        what the changelog still holds raises ChangelogGap; the caller may restore afresh."""
        part = self._open.get(partition)
        if part is None:
            self.ensure()
            if not self.has_local_state(partition):
                self.restore(partition)
            part = StatePartition(self.spec.name, partition, RocksBackend(self.partition_dir(partition)),
                                  self.spec.aggregator)
            self._open[partition] = part
        return part, replay_tail(part, self.bootstrap, self.spec.changelog_topic, skip_if_current=True)

    def _catch_up(self, part: StatePartition) -> None:
        """Apply batches the changelog has and the local store lacks (a crash after
        the changelog commit and before the RocksDB commit)."""
        bounds = changelog.partition_bounds(self.bootstrap, self.spec.changelog_topic, part.partition)
        if bounds is None:
            return
        start = part.meta.changelog_offset
        # The offset after the local store's last batch marker is that transaction's commit
        # marker, never delivered: an end one past it means nothing newer was written. Any later
        # batch adds at least its marker record and its own commit marker.
        if bounds[1] - start > 1:
            stats = part.apply_changelog(changelog.replay(self.bootstrap, self.spec.changelog_topic, part.partition,
                                                          start, bounds[1]))
            if stats.records:
                log.info("%s[%d]: caught up %d changelog records to batch %d", self.spec.name, part.partition,
                         stats.records, part.meta.applied_batch)

    def close(self, partition: int | None = None) -> None:
        targets = list(self._open) if partition is None else [partition]
        for p in targets:
            part = self._open.pop(p, None)
            if part is not None:
                part.close()

    # -- durability ------------------------------------------------------------
    def snapshot(self, partition: int) -> Manifest:
        if self.snapshots is None:
            raise BadSetting(f"table {self.spec.name!r} has no snapshot store; pass snapshot_uri")
        part = self.open(partition)
        manifest = self.snapshots.save(self.spec.name, partition, part.backend, definition=self.spec.fingerprint)
        self.snapshots.retain(self.spec.name, partition, self.spec.snapshot_keep)
        return manifest

    def restore(self, partition: int, target_batch: int | None = None) -> RestoreReport:
        """Rebuild the local partition from snapshots plus changelog (see state.restore)."""
        if self.memory:
            raise BadSetting("a memory table has nothing to restore from")
        self.ensure()
        self.close(partition)
        report = restore_partition(
            self.spec.name, partition, self.partition_dir(partition), aggregator=self.spec.aggregator,
            store=self.snapshots, bootstrap=self.bootstrap, target_batch=target_batch,
            changelog_topic=self.spec.changelog_topic, definition=self.spec.fingerprint,
            seed=self._replica_copy(partition),
        )
        self.restored[partition] = report
        return report

    def _replica_copy(self, partition: int) -> Path | None:
        """A local replica's folder of this partition, if one is of this table's definition."""
        wanted = self.spec.descriptor()
        for root in self.seed_dirs:
            folder = root / self.spec.name
            try:
                recorded = json.loads((folder / "table.json").read_text())
            except (OSError, ValueError):
                continue
            same = all(recorded.get(f) == wanted[f] for f in ("fingerprint", "partitions", "aggregator",
                                                               "format_version"))
            copy = folder / f"p{partition:04d}"
            if same and (copy / "CURRENT").exists() and copy.resolve() != self.partition_dir(partition).resolve():
                return copy
        return None

    def wipe_local(self, partition: int | None = None) -> None:
        """Delete the local cache of one or all partitions (a lost disk)."""
        for p in range(self.spec.partitions) if partition is None else [partition]:
            self.close(p)
            shutil.rmtree(self.partition_dir(p), ignore_errors=True)
