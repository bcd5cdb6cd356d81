"""Read-only views of committed state, for queries.

A view reads a RocksDB *secondary instance* of each partition. The secondary
holds still between explicit `refresh()` calls (try_catch_up_with_primary),
so everything read between two refreshes comes from one committed version,
and it never takes the primary's lock: readers do not block the writer, and
they can live in another process (the query API). Commits are single
WriteBatches, so a refresh lands on a whole batch, never half of one.

(rocksdict's Snapshot honours point gets but not iteration in 0.3.29, so it
cannot give consistent scans; a checkpoint per read would cost a copy of the
file list. The secondary instance gives both for the price of a WAL tail.)
"""
from __future__ import annotations

import heapq
import threading
from pathlib import Path

from state import codec
from state.backends import MemoryBackend, PartitionMeta, RocksBackend
from state.table import TableSpec

__all__ = ["PartitionView", "TableView"]


class PartitionView:
    def __init__(self, backend) -> None:
        self.backend = backend
        self.lock = threading.Lock()

    @classmethod
    def secondary(cls, primary_dir: Path, secondary_dir: Path) -> "PartitionView":
        Path(secondary_dir).parent.mkdir(parents=True, exist_ok=True)
        return cls(RocksBackend(secondary_dir, secondary_of=primary_dir))

    def refresh(self) -> PartitionMeta:
        if isinstance(self.backend, RocksBackend):
            self.backend.catch_up()
        return self.backend.read_meta()

    @property
    def meta(self) -> PartitionMeta:
        return self.backend.read_meta()

    def get(self, key: tuple):
        raw = self.backend.get(codec.encode_key(key))
        return None if raw is None else codec.decode_value(raw)

    def scan(self, prefix: tuple | bytes = (), start: tuple | None = None, end: tuple | None = None,
             limit: int | None = None) -> list[tuple[tuple, object]]:
        """Entries with the key prefix, from `start` (inclusive) to `end` (exclusive), in key order.
        `prefix`: leading key parts (a tuple), or encoded bytes (codec.text_prefix)."""
        lo = prefix if isinstance(prefix, bytes) else codec.encode_key(prefix) if prefix else b""
        hi = codec.prefix_upper_bound(lo) if lo else None
        if start is not None:
            lo = max(lo, codec.encode_key(start))
        if end is not None:
            enc_end = codec.encode_key(end)
            hi = enc_end if hi is None else min(hi, enc_end)
        out = []
        for key, value in self.backend.scan(lo or None, hi):
            out.append((codec.decode_key(key), codec.decode_value(value)))
            if limit is not None and len(out) >= limit:
                break
        return out

    def close(self) -> None:
        self.backend.close()


class TableView:
    """All partitions of a table, read-only."""

    def __init__(self, spec: TableSpec, partitions: list[PartitionView]) -> None:
        self.spec = spec
        self.partitions = partitions

    @classmethod
    def open(cls, spec: TableSpec, state_dir: Path, secondary_root: Path) -> "TableView":
        views = [
            PartitionView.secondary(Path(state_dir) / spec.name / f"p{p:04d}",
                                    Path(secondary_root) / spec.name / f"p{p:04d}")
            for p in range(spec.partitions)
        ]
        return cls(spec, views)

    @classmethod
    def over_memory(cls, spec: TableSpec, backends: list[MemoryBackend]) -> "TableView":
        return cls(spec, [PartitionView(b) for b in backends])

    def refresh(self) -> dict[int, int]:
        """Catch every partition up; returns the applied batch of each."""
        return {p: view.refresh().applied_batch for p, view in enumerate(self.partitions)}

    def get(self, key: tuple):
        return self.partitions[self.spec.route(key)].get(key)

    def scan(self, prefix: tuple | bytes = (), start: tuple | None = None, end: tuple | None = None,
             limit: int | None = None) -> list[tuple[tuple, object]]:
        """A merged, key-ordered scan over all partitions."""
        merged = heapq.merge(*(view.scan(prefix, start, end, limit) for view in self.partitions),
                             key=lambda kv: codec.encode_key(kv[0]))
        out = []
        for item in merged:
            out.append(item)
            if limit is not None and len(out) >= limit:
                break
        return out

    def top_n(self, n: int, score) -> list[tuple[tuple, object]]:
        """The n entries with the highest score(key, value)."""
        return heapq.nlargest(n, (kv for view in self.partitions for kv in view.scan()),
                              key=lambda kv: score(*kv))

    def close(self) -> None:
        for view in self.partitions:
            view.close()
