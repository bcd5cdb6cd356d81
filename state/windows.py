"""State that ages in event time: windows with retention, and keys with a TTL.

The window start is the last key component, so all windows of a key are one
prefix scan and a time range is one range scan. A window is purged when the
watermark has passed its end plus grace plus retention; a TTL table's key is
expired when the watermark has passed its newest event time plus the TTL.
Both are ordinary deletes, so they reach the changelog and a restore repeats
them.
"""
from __future__ import annotations

from dataclasses import dataclass

from state import codec
from state.partition import StatePartition, Transaction
from state.errors import BadSetting

__all__ = ["WindowSpec", "closing", "expire_idle", "fetch", "merge_sessions", "purge", "window_key"]


@dataclass(frozen=True)
class WindowSpec:
    size_ms: int
    advance_ms: int | None = None   # None: tumbling (advance = size)
    grace_ms: int = 0
    retention_ms: int = 0
    session: bool = False           # SESSION: size_ms is the inactivity gap; a session's start is its
                                    # first event, its end the last event plus the gap (see merge_sessions)

    def __post_init__(self) -> None:
        advance = self.advance_ms or self.size_ms
        if self.size_ms <= 0 or advance <= 0 or advance > self.size_ms:
            raise BadSetting(f"window SIZE {self.size_ms} ms and ADVANCE {self.advance_ms} ms: "
                             f"both must be positive and ADVANCE <= SIZE")
        if self.grace_ms < 0 or self.retention_ms < 0:
            raise BadSetting("window GRACE and retention must not be negative")

    @property
    def advance(self) -> int:
        return self.advance_ms or self.size_ms

    def starts_for(self, ts: int) -> list[int]:
        """Starts of every window that contains event time `ts` (ms). As in Kafka Streams, no
        window starts before the epoch, unless the event itself is before it."""
        starts, start = [], ts - ts % self.advance
        while start > ts - self.size_ms and (start >= 0 or ts < 0):
            starts.append(start)
            start -= self.advance
        return starts[::-1]

    def is_late(self, ts: int, watermark: int) -> bool:
        """True when every window of `ts` closed (end + grace <= watermark) before it arrived. A
        session event is late when it is more than grace behind the watermark: an older one could
        reach back into a session that has closed."""
        if self.session:
            return ts + self.grace_ms < watermark
        return all(start + self.size_ms + self.grace_ms <= watermark for start in self.starts_for(ts))

    def anchor(self, full_key: tuple, value, last_index: int | None) -> int:
        """The time a window's end counts from: its start, or a session's last event (aggregate
        `last_index` of its value)."""
        return value[last_index] if self.session else full_key[-1]

    def expiry_horizon(self, watermark: int) -> int:
        """The newest anchor that is past retention at `watermark`."""
        return watermark - self.size_ms - self.grace_ms - self.retention_ms

    def expired(self, anchor: int, watermark: int) -> bool:
        return anchor <= self.expiry_horizon(watermark)

    def closes_at(self, full_key: tuple, value, last_index: int | None) -> int:
        """The watermark at which a window (or session) closes: its end plus grace. A session's
        end is inclusive (an event exactly a gap after the last joins it, and is not late until
        the watermark passes end plus grace), so it closes one millisecond later."""
        return self.anchor(full_key, value, last_index) + self.size_ms + self.grace_ms + (1 if self.session else 0)


def window_key(key: tuple, start: int) -> tuple:
    return (*key, start)


def fetch(partition: StatePartition, key: tuple, time_from: int | None = None,
          time_to: int | None = None) -> list[tuple[int, object]]:
    """Windows of `key` whose start is in [time_from, time_to]."""
    out = []
    for full_key, value in partition.items(prefix=key):
        if len(full_key) != len(key) + 1:
            continue
        start = full_key[-1]
        if (time_from is None or start >= time_from) and (time_to is None or start <= time_to):
            out.append((start, value))
    return out


def purge(partition: StatePartition, tx: Transaction, spec: WindowSpec, watermark: int) -> int:
    """Delete, within `tx`, every window expired at `watermark`; returns how many. (Sessions
    expire by their last event, judged on the merged values: see expire_idle.)"""
    expired = 0
    for full_key, _ in partition.items():
        if spec.expired(full_key[-1], watermark):
            tx.delete(full_key)
            expired += 1
    return expired


def expire_idle(partition: StatePartition, tx: Transaction, index: int, horizon: int,
                touched: dict[bytes, int | None]) -> int:
    """TTL: delete, within `tx`, every key whose newest event time is at or before `horizon` (the
    watermark minus the TTL, or a session's retention horizon); returns how many, new keys that
    go at once included. A value's aggregate `index` holds that time, and `touched` gives it for
    the keys this transaction writes, so a key the batch refreshed is judged on its merged value.
    A full scan of the partition: the price of exact expiry without an index by time."""
    expired, seen = 0, set()
    for key, raw in partition.raw_items():
        newest = codec.decode_value(raw)[index]
        if key in touched:
            seen.add(key)
            fresh = touched[key]
            newest = fresh if newest is None else newest if fresh is None else max(newest, fresh)
        if newest is not None and newest <= horizon:
            tx.delete_encoded(key)
            expired += 1
    for key, fresh in touched.items():
        if key not in seen and fresh is not None and fresh <= horizon:
            tx.delete_encoded(key)          # never stored: the delete cancels the merge, no change
            expired += 1
    return expired


def merge_sessions(partition: StatePartition, tx: Transaction, gap_ms: int, last_index: int, merge,
                   partials: list[tuple[tuple, object]]) -> tuple[dict[bytes, int], set[bytes]]:
    """Fold a batch's partial sessions ((key..., start), value) into the stored ones, within `tx`.

    Sessions of a key, stored and new, are taken by start; one that starts at or before the
    previous one's last event plus the gap joins it (Kafka Streams' and ksqlDB's inclusive gap), so an event that bridges two stored sessions merges
    them. A merged session is stored under its first start with the aggregates merged (they are
    associative, see state.aggregates); the keys of the sessions it swallowed are deleted. A
    stored session that nothing reached is left as it is. Returns the sessions put (encoded key ->
    last event time: what a purge in the same commit judges, see expire_idle) and the keys of the
    sessions swallowed."""
    put, swallowed = {}, set()
    by_key: dict[tuple, list] = {}
    for full, value in partials:
        by_key.setdefault(full[:-1], []).append((full[-1], value, False))
    for key, spans in by_key.items():
        spans += [(full[-1], value, True) for full, value in partition.items(prefix=key) if len(full) == len(key) + 1]
        spans.sort(key=lambda span: (span[0], not span[2]))
        groups: list[list] = []          # [start, last event, members]
        for start, value, stored in spans:
            if groups and start <= groups[-1][1] + gap_ms:     # the gap is inclusive, as in Kafka Streams
                groups[-1][1] = max(groups[-1][1], value[last_index])
                groups[-1][2].append((start, value, stored))
            else:
                groups.append([start, value[last_index], [(start, value, stored)]])
        for start, _, members in groups:
            if len(members) == 1 and members[0][2]:
                continue
            merged = None
            for _, value, _ in members:
                merged = merge(merged, value)
            for member_start, _, stored in members:
                if stored and member_start != start:
                    tx.delete(key + (member_start,))
                    swallowed.add(codec.encode_key(key + (member_start,)))
            tx.put(key + (start,), merged)
            put[codec.encode_key(key + (start,))] = merged[last_index]
    return put, swallowed


def closing(partition: StatePartition, spec: WindowSpec, changes: dict, after: int | None,
            until: int, last_index: int | None = None, swallowed: frozenset = frozenset()) -> list[tuple[tuple, object]]:
    """(window key, value) of every window that closes in (after, until]: its end plus grace
    (a session's: its last event plus gap plus grace) passed in that range of the watermark, so no
    later event can change it (a later one is late). Values are as a commit's `changes`
    (encoded key -> new bytes, None: deleted) leave them; a window the same commit purges keeps
    its last value, and a session it merged into another (`swallowed`) is no longer one. A full
    scan: windowed state is bounded by retention."""
    def closes(full: tuple, raw: bytes) -> bool:
        end = spec.closes_at(full, codec.decode_value(raw) if spec.session else None, last_index)
        return (after is None or end > after) and end <= until

    found: dict[bytes, tuple[tuple, bytes]] = {}
    for key, stored in partition.raw_items():
        if key in swallowed:
            continue
        new = changes.get(key, stored)
        value = stored if new is None else new
        full = codec.decode_key(key)
        if closes(full, value):
            found[key] = (full, value)
    for key, new in changes.items():
        if key not in found and new is not None:
            full = codec.decode_key(key)
            if closes(full, new):
                found[key] = (full, new)
    return [(full, codec.decode_value(raw)) for full, raw in found.values()]
