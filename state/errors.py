"""Named errors of the state library: each says what is wrong and what to do.

The root of every error statetable raises on purpose lives here, in the lowest layer, so every
layer can root its own errors in it without importing upward:

    StatetableError                 except StatetableError: everything statetable raises on purpose
    ├── UserFixable                 a marker: the user can fix it (a setting, a definition, a
    │                               request); the CLI exits 2, the query API answers 4xx
    ├── StateError (state)  CatalogError (catalog)  JobError (spark_jobs)  OpsError (ops)
    └── ServingError (serving)  ProviderError (plugins)  DeployError (deploy)

A layer's error subclasses its layer's root, UserFixable where the user can fix it, and the
builtin it replaces (ValueError, TimeoutError...) so older `except` clauses still hold; never
another layer's class (tests/unit/test_errors.py walks them all).
"""
from __future__ import annotations

__all__ = ["BadSetting", "ChangelogCorrupt", "ChangelogGap", "ChangelogStalled", "ChangelogUndelivered", "CodecError",
           "BrokerUnreachable", "DefinitionChanged", "KafkaAccessError", "NoSuchPartition", "RestoreMismatch", "SnapshotCorrupt", "StateError",
           "StateFenced", "StateMissing", "StatetableError", "TopicMismatch", "TopicNotReady", "TransactionClosed",
           "UserFixable", "meaning_changes"]


def meaning_changes(old: dict | None, new: dict | None) -> list[str]:
    """Human-readable differences between two meanings (what DefinitionChanged names)."""
    old, new = old or {}, new or {}
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]


class StatetableError(Exception):
    """Every error statetable raises on purpose is one (see the tree above)."""


class UserFixable(StatetableError):
    """The user can fix this: the message names the table, the field and the fix. The CLI exits
    2 for these and 1 for every other failure."""


class StateError(StatetableError):
    """Every named error of the state library is one: catch it to handle them all."""


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


class BadSetting(StateError, UserFixable, ValueError):
    """A setting a user gave (an environment variable, an option) is wrong: the message names it
    and the fix, and the CLI exits 2 with it, as for any mistake of the request."""


class CodecError(StateError, ValueError):
    """Bytes that are not a valid encoding, or a value that cannot be encoded."""


class KafkaAccessError(StateError, RuntimeError):
    """Kafka refused statetable's client: the message is the one line to show."""


class BrokerUnreachable(KafkaAccessError):
    """No broker answered a client. In a batch that already ran that is a broker lost or
    restarting, which the batch, run again from its plan, survives; a client of the wrong
    security.protocol hears the same, but before any batch runs (the runner's prepare step)."""


class DefinitionChanged(StateError, ValueError):
    """The table's definition no longer means what its state was built with."""

    def __init__(self, table: str, old: dict | None, new: dict | None, where: str = "its state",
                 history_from: int | None = None) -> None:
        changes = meaning_changes(old, new) or ["(the recorded definition is unknown)"]
        if history_from is None:
            fix = (f"`statetable rebuild {table}` (or the {table}__rebuild DAG) builds the new definition's state "
                   f"from history and cuts over when it is committed; until then the old state keeps serving. "
                   f"Or put the old definition back.")
        else:
            # A rebuild would recompute from the beginning, which bronze no longer holds: offering
            # it would leave the table stopped for good.
            fix = (f"Its history starts at batch {history_from} (`-- bronze_retention` trimmed the older "
                   f"batches), so the new definition cannot be computed from it: put the old definition "
                   f"back (the table runs on), or declare the new one as a table of another name.")
        super().__init__(f"table {table!r}: the definition changed since {where} was built: "
                         f"{'; '.join(changes)}. {fix}")
        self.changes = changes


class NoSuchPartition(StateError, UserFixable, ValueError):
    """A partition number outside the table's 0..partitions-1."""


class TopicMismatch(StateError, UserFixable, ValueError):
    """A topic exists with another partition count than the table needs."""


class TopicNotReady(StateError, TimeoutError):
    """A topic was created, but its partitions have no leader yet."""


class ChangelogCorrupt(StateError, ValueError):
    """A changelog batch's records do not match its marker."""


class ChangelogUndelivered(StateError, RuntimeError):
    """The broker did not confirm a batch's changelog records."""


class ChangelogStalled(StateError, TimeoutError):
    """A changelog read made no progress before the offset it must reach."""


class StateMissing(StateError, FileNotFoundError):
    """No state database where one must be."""
