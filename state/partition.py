"""One state partition: its backend, its changelog writer, its transactions.

Commit protocol of batch B on partition p (the order is the guarantee):

  1. If B <= applied_batch: no-op (the batch is already in the state).
  2. Read the old value of every touched key, compute new values, the digest
     change and the key count.                        [commit.before_changelog]
  3. Publish the changes plus a marker (B, digest, count) to changelog
     partition p in ONE Kafka transaction.            [commit.mid_changelog]
                                                      [commit.after_changelog]
  4. Write data + meta (applied_batch=B, changelog_offset, digest) in ONE
     synced RocksDB WriteBatch.                       [commit.after_state]

Why no crash loses or corrupts state:
  - before 3 commits, nothing is visible anywhere: the state is "before B";
    an open transaction is aborted by the next writer's init_transactions.
  - between 3 and 4, the changelog holds all of B and RocksDB none of it.
    Opening the partition replays the changelog from meta.changelog_offset,
    which applies exactly B: the state is "after B", and re-running B is a
    no-op by step 1.
  - after 4 both agree.
The reverse order (RocksDB first) would be unsafe: a crash in between leaves
a local state the changelog does not have, and a restore elsewhere would
silently miss B.
"""
from __future__ import annotations

import enum
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from state import codec, digest as digests, faults
from state.aggregates import RowAggregator
from state.backends import Backend, PartitionMeta, ReadableBackend
from state.changelog import VALUE_LIMIT, ChangelogRecord, ChangelogWriter, Marker, is_marker, is_refusal
from state.codec import CodecError
from state.errors import RestoreMismatch, TransactionClosed

__all__ = ["CommitResult", "ReplayStats", "StatePartition", "Transaction", "TxStatus"]

log = logging.getLogger(__name__)

# _RAW: a put of a value already in the codec's bytes; _MERGE_RAW: a merge of a partial in them
_PUT, _DELETE, _MERGE, _RAW, _MERGE_RAW = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class CommitResult:
    batch_id: int
    noop: bool
    keys_changed: int
    changelog_offset: int
    digest: int
    key_count: int
    seconds: float = 0.0
    rejected: tuple = ()     # ((encoded key, reason), ...): kept at their old value, see Transaction.commit
    changes: dict = field(default_factory=dict, repr=False, compare=False)   # encoded key -> new bytes (None: deleted)
    # encoded key -> the new value as Python, for the changed keys the commit folded itself (not
    # the additive fast path's): what a mirror or change-topic row would otherwise decode again.
    values: dict = field(default_factory=dict, repr=False, compare=False)


class StatePartition:
    """A partition of a state table; the only writer of its backend and changelog partition."""

    def __init__(self, table: str, partition: int, backend: ReadableBackend,
                 aggregator: RowAggregator | None = None, changelog: ChangelogWriter | None = None) -> None:
        """`backend`: a read-write `Backend` for a partition that begins transactions, a
        `ReadableBackend` for one that only serves reads (open_readonly, a query replica)."""
        self.table = table
        self.partition = partition
        self.backend = backend
        self.aggregator = aggregator
        self.changelog = changelog

    @property
    def meta(self) -> PartitionMeta:
        return self.backend.read_meta()

    def begin(self, batch_id: int) -> "Transaction":
        return Transaction(self, batch_id)

    # -- reads -------------------------------------------------------------
    def get(self, key: tuple):
        raw = self.backend.get(codec.encode_key(key))
        return None if raw is None else codec.decode_value(raw)

    def get_raw_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Stored bytes of encoded keys, for callers that decode or forward them in bulk."""
        return self.backend.multi_get(keys)

    def items(self, prefix: tuple = ()) -> Iterator[tuple[tuple, object]]:
        for key, value in self.raw_items(prefix):
            yield codec.decode_key(key), codec.decode_value(value)

    def items_between(self, start: tuple, end: tuple) -> Iterator[tuple[tuple, object]]:
        """Keys from `start` up to, not including, `end`, in key order (a range of an ordered
        component, such as the records of a windowed join that leave before a watermark)."""
        for key, value in self.backend.scan(codec.encode_key(start), codec.encode_key(end)):
            yield codec.decode_key(key), codec.decode_value(value)

    def raw_items(self, prefix: tuple = ()) -> Iterator[tuple[bytes, bytes]]:
        """Stored bytes in key order (of the keys under `prefix`), for callers that decode only
        what they keep."""
        if not prefix:
            return self.backend.scan()
        start = codec.encode_key(prefix)
        return self.backend.scan(start, codec.prefix_upper_bound(start))

    # -- integrity ---------------------------------------------------------
    def verify(self, rows=None) -> tuple[bool, int, int]:
        """Recompute the digest from a full scan, or from `rows` (every stored pair, which the
        caller scanned anyway): (matches, recorded, recomputed)."""
        recomputed, count = digests.of_items(self.backend.scan() if rows is None else rows)
        meta = self.meta
        return (recomputed == meta.digest and count == meta.key_count), meta.digest, recomputed

    # -- changelog replay ----------------------------------------------------
    def apply_changelog(self, chunks: Iterable[list[ChangelogRecord]], target_batch: int | None = None,
                        write_every: int = 50000) -> "ReplayStats":
        """Apply committed changelog records, stopping before the first batch past `target_batch`.

        Writes happen only at batch markers, so the stored meta always
        describes whole batches, and the final digest is checked against the
        marker the writer recorded.
        """
        stats = ReplayStats()
        meta = self.meta
        pending: dict[bytes, bytes | None] = {}
        unmarked: dict[bytes, bytes | None] = {}
        last_marker: Marker | None = None
        refusal_parts: list = []
        next_offset = meta.changelog_offset
        started = time.monotonic()
        done = False
        for records in chunks:
            for record in records:
                if target_batch is not None and record.batch_id > target_batch:
                    done = True
                    break
                stats.records += 1
                if is_refusal(record.key):
                    refusal_parts.append(codec.decode_value(record.value))
                elif is_marker(record.key):
                    marker = Marker.decode(record.value)
                    if target_batch is not None and marker.batch_id > target_batch:
                        # the records since the last marker were this later batch's
                        unmarked.clear()
                        done = True
                        break
                    pending.update(unmarked)
                    unmarked.clear()
                    last_marker = marker.joined(refusal_parts)
                    refusal_parts = []
                    next_offset = record.offset + 1
                    if len(pending) >= write_every:
                        meta = self._write_replayed(pending, meta, last_marker, next_offset)
                        stats.writes += 1
                        pending = {}
                        faults.point("restore.mid_replay")
                else:
                    unmarked[record.key] = record.value
            if done:
                break
        if pending or (last_marker and last_marker.batch_id != meta.applied_batch):
            meta = self._write_replayed(pending, meta, last_marker, next_offset)
            stats.writes += 1
            faults.point("restore.mid_replay")
        if unmarked:
            log.warning("%s[%d]: %d changelog records after the last batch marker were not applied",
                        self.table, self.partition, len(unmarked))
        stats.seconds = time.monotonic() - started
        if last_marker is not None and (meta.digest != last_marker.digest or meta.key_count != last_marker.key_count):
            raise RestoreMismatch(
                f"{self.table}[{self.partition}] after replay to batch {last_marker.batch_id}: digest "
                f"{meta.digest:#x}/{meta.key_count} keys, but the writer recorded "
                f"{last_marker.digest:#x}/{last_marker.key_count}"
            )
        return stats

    def _write_replayed(self, pending, meta: PartitionMeta, marker: Marker | None, next_offset: int) -> PartitionMeta:
        keys = list(pending)
        digest, count = meta.digest, meta.key_count
        for key, old in zip(keys, self.backend.multi_get(keys)):
            new = pending[key]
            digest = digests.apply_change(digest, key, old, new)
            count += (new is not None) - (old is not None)
        new_meta = meta.but(
            applied_batch=marker.batch_id if marker else meta.applied_batch,
            changelog_offset=next_offset, digest=digest, key_count=count,
            rejected=marker.rejected if marker else meta.rejected,
        )
        self.backend.write(pending, new_meta, sync=False)
        return new_meta

    def close(self) -> None:
        if self.changelog is not None:
            self.changelog.close()
        self.backend.close()


@dataclass
class ReplayStats:
    records: int = 0
    writes: int = 0
    seconds: float = 0.0


class TxStatus(enum.Enum):
    """Where a transaction is: writes are taken only while STARTED; PREPARED while its changes
    are being published and stored; COMPLETE once stored; FAILED when that raised (the batch is
    not known to be stored: the caller runs it again, which the batch id makes idempotent);
    ABORTED when dropped."""

    STARTED = "started"
    PREPARED = "prepared"
    COMPLETE = "complete"
    FAILED = "failed"
    ABORTED = "aborted"


_STARTED = TxStatus.STARTED
_READABLE = (TxStatus.STARTED, TxStatus.PREPARED)     # PREPARED: the commit's own outputs may read


def _allowed(*statuses: TxStatus):
    """Declares the statuses a Transaction method runs in (Quix Streams'
    validate_transaction_status); in any other it raises TransactionClosed naming the status."""
    def declare(method):
        @functools.wraps(method)
        def checked(self, *args, **kwargs):
            if self.status not in statuses:
                raise self.refused(method.__name__)
            return method(self, *args, **kwargs)
        checked.allowed = statuses
        return checked
    return declare


def _writes(method):
    """Declares a per-key write, which runs only while the transaction is STARTED. It checks that
    itself, in its first line: a wrapper's call per key cost a batch of a million keys ~0.2 s."""
    method.allowed = (TxStatus.STARTED,)
    return method


REWRITE_MIN_KEYS = 10_000       # smaller batches never compact: their runs are small


class Transaction:
    """The changes of one batch to one partition; nothing is visible until commit.

    Every method declares the statuses it runs in (`_allowed`, `_writes`; as Quix Streams'
    PartitionTransaction does): a write after the commit used to be dropped silently, a read of a
    finished transaction answered from a batch already stored, and a commit that raised
    mid-publish looked like a finished one."""

    def __init__(self, partition: StatePartition, batch_id: int) -> None:
        self.partition = partition
        self.batch_id = batch_id
        self._ops: dict[bytes, tuple[int, object]] = {}
        self.values: dict = {}      # set by the commit: see CommitResult.values
        self.status = TxStatus.STARTED

    def refused(self, method: str) -> TransactionClosed:
        """Why `method` may not run now: the status it is in and the ones it needs."""
        needs = getattr(type(self), method).allowed
        return TransactionClosed(
            f"{self.partition.table}[{self.partition.partition}] batch {self.batch_id}: the transaction is "
            f"{self.status.value}, and {method} needs it {' or '.join(s.value for s in needs)}; "
            f"a new batch needs a new transaction")

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.status is _STARTED:
            if exc_type is None:
                self.commit()
            else:
                self.abort()

    # -- reads see this transaction's own writes ---------------------------
    @_allowed(*_READABLE)
    def get(self, key: tuple):
        return self.get_many.__wrapped__(self, [key])[0]

    @_allowed(*_READABLE)
    def get_many(self, keys: list[tuple]) -> list:
        encoded = [codec.encode_key(k) for k in keys]
        missing = [k for k in encoded if k not in self._ops]
        stored = dict(zip(missing, self.partition.backend.multi_get(missing)))
        out = []
        for key in encoded:
            old = stored.get(key)
            old_value = None if old is None else codec.decode_value(old)
            out.append(self._resolve(key, old_value) if key in self._ops else old_value)
        return out

    # -- writes --------------------------------------------------------------
    @_writes
    def put(self, key: tuple, value) -> None:
        if self.status is not _STARTED:
            raise self.refused("put")
        self._ops[codec.encode_key(key)] = (_PUT, value)

    @_writes
    def delete(self, key: tuple) -> None:
        if self.status is not _STARTED:
            raise self.refused("delete")
        self._ops[codec.encode_key(key)] = (_DELETE, None)

    # Callers that encoded a whole batch's keys at once (see spark_jobs.frames.arrow_pass.encoded_keys).
    @_writes
    def put_encoded(self, key: bytes, value) -> None:
        if self.status is not _STARTED:
            raise self.refused("put_encoded")
        self._ops[key] = (_PUT, value)

    @_writes
    def put_raw(self, key: bytes, raw: bytes) -> None:
        """A put of an encoded key and a value already encoded (codec.encode_value's bytes, built
        for a whole batch at once: arrow_keys.encoded_values)."""
        if self.status is not _STARTED:
            raise self.refused("put_raw")
        self._ops[key] = (_RAW, raw)

    @_writes
    def put_raw_many(self, keys: list[bytes], raws: list[bytes]) -> None:
        """put_raw of many keys at once (a join's 460,000 rows a task: a call each cost more than
        building their bytes)."""
        if self.status is not _STARTED:
            raise self.refused("put_raw_many")
        self._ops.update(zip(keys, zip([_RAW] * len(keys), raws)))

    @_writes
    def merge_raw(self, key: bytes, raw: bytes) -> None:
        """A merge of a partial already encoded (arrow_keys.encoded_latest, a batch's at once):
        a key the partition does not hold takes the bytes as they are (merge(None, p) is p for
        every aggregator), so only a key it holds pays a decode, a merge and an encode."""
        if self.status is not _STARTED:
            raise self.refused("merge_raw")
        if key in self._ops:        # a second partial of the key in one transaction: folded as ever
            self.merge_encoded(key, codec.decode_value(raw))
        else:
            self._ops[key] = (_MERGE_RAW, raw)

    @_writes
    def merge_raw_many(self, keys: list[bytes], raws: list[bytes]) -> None:
        """merge_raw of a batch's keys at once (a merge task's quarter million, a call each cost
        as much as the rest of their fold)."""
        if self.status is not _STARTED:
            raise self.refused("merge_raw_many")
        ops = dict(zip(keys, zip([_MERGE_RAW] * len(keys), raws)))
        if self._ops or len(ops) != len(keys):      # a key twice: folded one by one
            for key, raw in zip(keys, raws):
                self.merge_raw(key, raw)
        else:
            self._ops = ops

    @_writes
    def delete_encoded(self, key: bytes) -> None:
        if self.status is not _STARTED:
            raise self.refused("delete_encoded")
        self._ops[key] = (_DELETE, None)

    @_writes
    def merge(self, key: tuple, partial) -> None:
        if self.status is not _STARTED:
            raise self.refused("merge")
        self.merge_encoded(codec.encode_key(key), partial)

    @_writes
    def merge_encoded(self, key: bytes, partial) -> None:
        """Fold a partial aggregate into the key's value (see state.aggregates)."""
        if self.status is not _STARTED:
            raise self.refused("merge_encoded")
        previous = self._ops.get(key)
        agg = self.partition.aggregator
        if previous is not None and previous[0] == _RAW:
            previous = (_PUT, codec.decode_value(previous[1]))
        elif previous is not None and previous[0] == _MERGE_RAW:
            previous = (_MERGE, codec.decode_value(previous[1]))
        if previous is None:
            self._ops[key] = (_MERGE, partial)
        elif previous[0] == _MERGE:
            self._ops[key] = (_MERGE, agg.merge(previous[1], partial))
        elif previous[0] == _PUT:
            self._ops[key] = (_PUT, agg.merge(previous[1], partial))
        else:
            self._ops[key] = (_PUT, partial)

    def _resolve(self, key: bytes, old_value):
        kind, value = self._ops[key]
        if kind == _PUT:
            return value
        if kind == _RAW:
            return codec.decode_value(value)
        if kind == _MERGE_RAW:
            return self.partition.aggregator.merge(old_value, codec.decode_value(value))
        if kind == _DELETE:
            return None
        return self.partition.aggregator.merge(old_value, value)

    # -- outcome -------------------------------------------------------------
    @_allowed(*TxStatus)
    def abort(self) -> None:
        """Drop the changes; a COMPLETE transaction stays complete (its batch is stored)."""
        if self.status is TxStatus.COMPLETE:
            return
        self._ops.clear()
        if self.status is _STARTED:
            self.status = TxStatus.ABORTED

    @_allowed(_STARTED)
    def commit(self, outputs=None, recount: bool = False) -> CommitResult:
        """`outputs(changes)`, when given, returns records for other topics ((topic, key, value)),
        built from the commit's changes (encoded key -> new bytes, None: deleted); they are
        published in the changelog's transaction, so they exist exactly when the batch does.

        `recount`: the digest and key count start from a full scan of what the partition holds,
        not from the recorded ones. A batch moves the recorded digest by what it changes, so a
        value damaged outside any batch stays a mismatch after a rebuild wrote the right value
        back; a rebuild recounts, and its marker then carries the digest of what it left."""
        self.status = TxStatus.PREPARED
        try:
            result = self._commit(outputs, recount)
        except BaseException:
            self.status = TxStatus.FAILED
            raise
        self.status = TxStatus.COMPLETE
        return result

    def _commit(self, outputs, recount: bool = False) -> CommitResult:
        started = time.monotonic()
        part = self.partition
        meta = part.backend.read_meta()
        if self.batch_id <= meta.applied_batch:
            return CommitResult(self.batch_id, True, 0, meta.changelog_offset, meta.digest, meta.key_count,
                                rejected=meta.rejected if self.batch_id == meta.applied_batch else ())

        keys = list(self._ops)
        olds = part.backend.multi_get(keys)
        changes: dict[bytes, bytes | None] = {}
        digest, count = digests.of_items(part.backend.scan()) if recount else (meta.digest, meta.key_count)
        # The hot loop of every batch: locals only, digest inlined (see state.digest).
        encode, decode, merge = codec.encode_value, codec.decode_value, part.aggregator.merge if part.aggregator else None
        add = codec.add_ints if part.aggregator is not None and part.aggregator.additive else None
        h = digests.xxh3_64_intdigest      # entry_hash, inlined: see state.digest
        rejected = []
        limit = VALUE_LIMIT
        values = {}
        for key, old, (kind, value) in zip(keys, olds, self._ops.values()):
            try:
                if kind == _MERGE:
                    new = add(old, value) if add is not None and old is not None else None
                    if new is None:
                        value = merge(None if old is None else decode(old), value)
                        new = encode(value)
                        values[key] = value
                elif kind == _PUT:
                    new = encode(value)
                    values[key] = value
                elif kind == _RAW:
                    new = value
                elif kind == _MERGE_RAW:
                    if old is None:
                        new = value
                    else:
                        value = merge(decode(old), decode(value))
                        new = encode(value)
                        values[key] = value
                else:
                    new = None
            except CodecError:
                # An integer past 64 bits: the key keeps its old value and the caller dead-letters
                # this batch's events for it, rather than a batch that can never commit.
                rejected.append((key, "sum_overflow"))
                continue
            if new is not None and len(new) > limit:
                rejected.append((key, "state_too_large"))
                continue
            if new == old:
                continue
            changes[key] = new
            if old is not None:
                digest -= h(key + old, seed=len(key))
                count -= 1
            if new is not None:
                digest += h(key + new, seed=len(key))
                count += 1
        digest &= digests.MASK
        self.values = values        # for `outputs`, which builds its records from the changes

        faults.point("commit.before_changelog")
        offset = meta.changelog_offset
        if part.changelog is not None:
            offset = part.changelog.publish(self.batch_id, changes,
                                            Marker(self.batch_id, digest, count, tuple(rejected)),
                                            extra=outputs(changes) if outputs is not None else ())
        faults.point("commit.after_changelog")
        part.backend.write(changes, meta.but(applied_batch=self.batch_id, changelog_offset=offset,
                                             digest=digest, key_count=count, rejected=tuple(rejected)))
        faults.point("commit.after_state")
        if len(changes) >= REWRITE_MIN_KEYS and 2 * len(changes) >= count:
            # A batch that rewrote at least half the partition (a load, a backfill) leaves it in one
            # sorted run: universal compaction would otherwise merge its runs over the next rounds,
            # and each of those snapshots upload them again (bench/aging, 2M keys loaded in two
            # batches: 25% and 74% of the partition in rounds 3 and 4 of 1% changes).
            part.backend.compact()
        self._ops = {}
        if rejected:
            log.warning("%s[%d] batch %d: %d keys refused (%s); they keep their old values", part.table,
                        part.partition, self.batch_id, len(rejected), sorted({r for _, r in rejected}))
        return CommitResult(self.batch_id, False, len(changes), offset, digest, count,
                            time.monotonic() - started, tuple(rejected), changes, values)
