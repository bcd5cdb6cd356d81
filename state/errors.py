"""Named errors of the state library: each says what is wrong and what to do."""

__all__ = ["ChangelogGap", "RestoreMismatch", "SnapshotCorrupt", "StateError", "StateFenced", "TransactionClosed"]


class StateError(Exception):
    pass


class SnapshotCorrupt(StateError):
    """A snapshot file does not match its manifest checksum (or is missing)."""


class ChangelogGap(StateError):
    """The changelog no longer holds offsets a restore needs."""


class RestoreMismatch(StateError):
    """After a restore, the contents' digest differs from the digest the writer recorded."""


class StateFenced(StateError):
    """Another writer took over this partition; this one must stop."""


class TransactionClosed(StateError):
    """A write to, or a second commit of, a transaction that is no longer open."""
