"""An order-independent digest of a partition's contents.

digest = sum over entries of a 64-bit hash of (key, value), modulo 2**64.
Insertion order does not matter, and a single put changes it by
hash(new) - hash(old), so commits maintain it incrementally while `verify`
recomputes it from a full scan; any silently changed byte shows up.
"""
from __future__ import annotations

from xxhash import xxh3_64_intdigest

__all__ = ["MASK", "apply_change", "entry_hash", "from_signed", "of_items", "to_signed"]

MASK = (1 << 64) - 1


def entry_hash(key: bytes, value: bytes) -> int:
    """xxh3-64 of key+value, seeded with the key length so the boundary counts."""
    return xxh3_64_intdigest(key + value, seed=len(key))


def apply_change(digest: int, key: bytes, old: bytes | None, new: bytes | None) -> int:
    if old is not None:
        digest -= entry_hash(key, old)
    if new is not None:
        digest += entry_hash(key, new)
    return digest & MASK


def of_items(items) -> tuple[int, int]:
    """(digest, count) of (key, value) pairs."""
    digest, count = 0, 0
    for key, value in items:
        digest += entry_hash(key, value)
        count += 1
    return digest & MASK, count


def to_signed(digest: int) -> int:
    """The digest as a signed 64-bit integer, the codec's integer range."""
    return digest - (1 << 64) if digest >= 1 << 63 else digest


def from_signed(value: int) -> int:
    return value & MASK
