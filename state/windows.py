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


@dataclass(frozen=True)
class WindowSpec:
    size_ms: int
    advance_ms: int | None = None   # None: tumbling (advance = size)
    grace_ms: int = 0
    retention_ms: int = 0

    def __post_init__(self) -> None:
        advance = self.advance_ms or self.size_ms
        if self.size_ms <= 0 or advance <= 0 or advance > self.size_ms:
            raise ValueError(f"window SIZE {self.size_ms} ms and ADVANCE {self.advance_ms} ms: "
                             f"both must be positive and ADVANCE <= SIZE")
        if self.grace_ms < 0 or self.retention_ms < 0:
            raise ValueError("window GRACE and retention must not be negative")

    @property
    def advance(self) -> int:
        return self.advance_ms or self.size_ms

    def starts_for(self, ts: int) -> list[int]:
        """Starts of every window that contains event time `ts` (ms)."""
        starts, start = [], ts - ts % self.advance
        while start > ts - self.size_ms:
            starts.append(start)
            start -= self.advance
        return starts[::-1]

    def is_late(self, ts: int, watermark: int) -> bool:
        """True when every window of `ts` closed (end + grace <= watermark) before it arrived."""
        return all(start + self.size_ms + self.grace_ms <= watermark for start in self.starts_for(ts))

    def expired(self, start: int, watermark: int) -> bool:
        return start + self.size_ms + self.grace_ms + self.retention_ms <= watermark


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
    """Delete, within `tx`, every window expired at `watermark`; returns how many."""
    expired = 0
    for full_key, _ in partition.items():
        if spec.expired(full_key[-1], watermark):
            tx.delete(full_key)
            expired += 1
    return expired


def expire_idle(partition: StatePartition, tx: Transaction, index: int, horizon: int,
                touched: dict[bytes, int | None]) -> int:
    """TTL: delete, within `tx`, every key whose newest event time is at or before `horizon` (the
    watermark minus the TTL); returns how many, counting new keys that go at once. A value's aggregate `index` holds that time, and
    `touched` gives it for the keys this transaction merges (their partials' newest), so a key the
    batch refreshed is judged on its merged value, and a new key as old as the horizon goes at once.
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


def closing(partition: StatePartition, spec: WindowSpec, changes: dict, after: int | None,
            until: int) -> list[tuple[tuple, object]]:
    """(window key, value) of every window that closes in (after, until]: its end plus grace
    passed in that range of the watermark, so no later event can change it (a later one is late).
    Values are as a commit's `changes` (encoded key -> new bytes, None: deleted) leave them; a
    window the same commit purges keeps its last value. A full scan: windowed state is bounded
    by retention."""
    def closes(start: int) -> bool:
        end = start + spec.size_ms + spec.grace_ms
        return (after is None or end > after) and end <= until

    found: dict[bytes, tuple[tuple, bytes]] = {}
    for key, stored in partition.raw_items():
        full = codec.decode_key(key)
        if closes(full[-1]):
            new = changes.get(key, stored)
            found[key] = (full, stored if new is None else new)
    for key, new in changes.items():
        if key not in found and new is not None:
            full = codec.decode_key(key)
            if closes(full[-1]):
                found[key] = (full, new)
    return [(full, codec.decode_value(raw)) for full, raw in found.values()]
