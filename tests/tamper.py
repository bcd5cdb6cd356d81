"""Changing a state store behind statetable's back, as a disk fault or a stray process would:
what `verify` and the restore drills must catch. Test code only: no product interface offers it."""
from __future__ import annotations

from state.backends import MemoryBackend, RocksBackend


def corrupt_value(backend: MemoryBackend | RocksBackend, key: bytes, value: bytes) -> None:
    """Set `key` to `value` without moving the partition's digest or metadata."""
    if isinstance(backend, MemoryBackend):
        backend.data[key] = value
    else:
        backend.db.put(key, value)
