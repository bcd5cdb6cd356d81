"""Restore a partition to a batch from snapshots plus the changelog.

1. Take the newest snapshot at or before the target whose checksums verify;
   a corrupt one is logged as SnapshotCorrupt and the next older one is tried.
   With none usable, start empty and replay the whole changelog.
2. Replay the changelog from the snapshot's offset up to the target batch.
3. Check the digest against the writer's batch marker (RestoreMismatch).

The result is built in a side folder and swapped in only when complete, so
a crash mid-restore never leaves a half-restored partition in place.
Anything the changelog no longer holds fails as ChangelogGap, naming the
missing range, instead of restoring a silently older table.
"""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from state import changelog
from state.aggregates import RowAggregator
from state.backends import RocksBackend
from state.errors import ChangelogGap, SnapshotCorrupt
from state.partition import StatePartition
from state.snapshots import SnapshotStore

__all__ = ["RestoreReport", "copy_live_partition", "replay_tail", "restore_partition"]

log = logging.getLogger(__name__)


@dataclass
class RestoreReport:
    table: str
    partition: int
    target_batch: int | None
    snapshot_batch: int | None = None
    snapshot_path: str | None = None
    corrupt_snapshots: list[str] = field(default_factory=list)
    replayed_records: int = 0
    applied_batch: int = -1
    key_count: int = 0
    digest: int = 0
    seconds: float = 0.0
    seeded_from: str | None = None       # a local query replica's folder the partition was copied from


def restore_partition(table: str, partition: int, target_dir: Path, *, aggregator: RowAggregator | None,
                      store: SnapshotStore | None, bootstrap: str | None,
                      target_batch: int | None = None, changelog_topic: str | None = None,
                      definition: str | None = None, seed: Path | None = None) -> RestoreReport:
    """`definition`: the fingerprint the restored state must answer for; snapshots of another
    definition (state from before a rebuild adopted a changed one) are skipped. `seed`: a local
    query replica's copy of this partition (same definition), tried before the snapshots."""
    started = time.monotonic()
    report = RestoreReport(table, partition, target_batch)
    work = target_dir.with_name(target_dir.name + ".restoring")
    if work.exists():
        shutil.rmtree(work)
    if seed is not None and target_batch is None and _seed_from_replica(
            table, partition, seed, work, aggregator, bootstrap, changelog_topic or changelog.topic_name(table),
            report):
        return _finish(report, work, target_dir, started)

    for manifest in store.list(table, partition) if store else []:
        if target_batch is not None and manifest.batch_id > target_batch:
            continue
        if definition and manifest.definition and manifest.definition != definition:
            log.info("%s[%d]: snapshot %s is of definition %s, not %s; skipped", table, partition, manifest.path,
                     manifest.definition, definition)
            continue
        try:
            store.download(manifest, work)
        except SnapshotCorrupt as exc:
            log.error("SnapshotCorrupt: %s; falling back to an older snapshot", exc)
            report.corrupt_snapshots.append(str(exc))
            continue
        report.snapshot_batch, report.snapshot_path = manifest.batch_id, manifest.path
        break
    else:
        if work.exists():
            shutil.rmtree(work)
        log.info("%s[%d]: no usable snapshot; replaying the whole changelog", table, partition)

    backend = RocksBackend(work)
    try:
        part = StatePartition(table, partition, backend, aggregator)
        meta = backend.read_meta()
        if target_batch is None or target_batch > meta.applied_batch:
            _replay(part, bootstrap, changelog_topic or changelog.topic_name(table), target_batch, report)
        meta = backend.read_meta()
        report.applied_batch, report.key_count, report.digest = meta.applied_batch, meta.key_count, meta.digest
    finally:
        backend.close()
    return _finish(report, work, target_dir, started)


def _finish(report: RestoreReport, work: Path, target_dir: Path, started: float) -> RestoreReport:
    """Put the restored folder in place whole (a crash before this leaves no partition)."""
    if target_dir.exists():
        shutil.rmtree(target_dir)
    work.rename(target_dir)
    report.seconds = time.monotonic() - started
    log.info("%s[%d] restored to batch %d (%d keys): %s batch %s + %d changelog records in %.2fs",
             report.table, report.partition, report.applied_batch, report.key_count,
             f"local replica {report.seeded_from}" if report.seeded_from else "snapshot", report.snapshot_batch,
             report.replayed_records, report.seconds)
    return report


def _seed_from_replica(table: str, partition: int, seed: Path, work: Path, aggregator: RowAggregator | None,
                       bootstrap: str | None, topic: str, report: RestoreReport) -> bool:
    """Copy a local query replica (Kafka Streams' standby used to cut recovery), then replay what
    the changelog holds past it. The replica is another process's live database, so it is read
    through a RocksDB secondary, whose view is one applied batch (the follower writes whole
    batches). False, with the folder cleared, when the changelog no longer holds what the replica
    lacks or the copy fails: the snapshots are the way then."""
    secondary = work.with_name(work.name + ".secondary")
    try:
        copy_live_partition(seed, secondary, work)
        backend = RocksBackend(work)
        try:
            report.snapshot_batch, report.seeded_from = backend.read_meta().applied_batch, str(seed)
            _replay(StatePartition(table, partition, backend, aggregator), bootstrap, topic, None, report)
            meta = backend.read_meta()
            report.applied_batch, report.key_count, report.digest = meta.applied_batch, meta.key_count, meta.digest
        finally:
            backend.close()
        return True
    except Exception as exc:        # noqa: BLE001 - any failure of the copy falls back to the snapshots, said
        log.warning("%s[%d]: the local replica %s cannot seed the partition (%s); restoring from snapshots",
                    table, partition, seed, exc)
        report.snapshot_batch = report.seeded_from = None
        report.replayed_records = 0
        shutil.rmtree(work, ignore_errors=True)
        return False
    finally:
        shutil.rmtree(secondary, ignore_errors=True)


def copy_live_partition(primary: Path, secondary: Path, target: Path, chunk: int = 200_000) -> int:
    """Every key and the metadata of a partition another process has open, as of one committed
    batch, into a new database at `target`; the keys copied."""
    source = RocksBackend(secondary, secondary_of=primary)
    copy = RocksBackend(target)
    try:
        meta, rows, copied = source.read_meta(), {}, 0
        for key, value in source.scan():
            rows[key] = value
            if len(rows) >= chunk:
                copy.write(rows, meta, sync=False)
                copied += len(rows)
                rows = {}
        copy.write(rows, meta)
        return copied + len(rows)
    finally:
        copy.close()
        source.close()


def _replay(part: StatePartition, bootstrap: str | None, topic: str, target_batch: int | None,
            report: RestoreReport) -> None:
    report.replayed_records = replay_tail(part, bootstrap, topic, target_batch)


def replay_tail(part: StatePartition, bootstrap: str | None, topic: str, target_batch: int | None = None,
                *, skip_if_current: bool = False) -> int:
    """Apply what the changelog holds past the partition's own offset (up to `target_batch`);
    the records read. Anything it no longer holds is a ChangelogGap naming the range, never a
    silently older state. `skip_if_current`: return at once when only the last transaction's
    commit marker lies past the offset (a follower's idle poll costs no consumer)."""
    meta = part.meta
    start = meta.changelog_offset
    wanted = "the latest batch" if target_batch is None else f"batch {target_batch}"
    bounds = changelog.partition_bounds(bootstrap, topic, part.partition) if bootstrap else None
    if bounds is None:
        if meta.applied_batch >= 0 and target_batch is None:
            raise ChangelogGap(
                f"{topic}[{part.partition}] does not exist, so batches after {meta.applied_batch} "
                f"(offsets from {start}) cannot be read; restore with target batch {meta.applied_batch} "
                f"to accept the snapshot's state"
            )
        raise ChangelogGap(f"{topic}[{part.partition}] does not exist; {wanted} needs offsets from {start}")
    low, high = bounds
    if start < low:
        raise ChangelogGap(
            f"{topic}[{part.partition}] offsets {start}..{low - 1} were deleted (log starts at {low}); "
            f"{wanted} needs them after batch {meta.applied_batch}"
        )
    if start > high:
        raise ChangelogGap(
            f"{topic}[{part.partition}] ends at offset {high}, before the snapshot's offset {start}: "
            f"the topic was truncated or recreated"
        )
    if skip_if_current and high - start <= 1:
        return 0
    stats = part.apply_changelog(changelog.replay(bootstrap, topic, part.partition, start, high), target_batch)
    applied = part.meta.applied_batch
    if target_batch is not None and applied < target_batch:
        raise ChangelogGap(
            f"{topic}[{part.partition}] has no batch {target_batch}: offsets {start}..{high - 1} end at "
            f"batch {applied}; batches {applied + 1}..{target_batch} are missing"
        )
    return stats.records
