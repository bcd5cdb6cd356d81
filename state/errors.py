"""Named errors of the state library: each says what is wrong and what to do."""

__all__ = ["BadSetting", "ChangelogGap", "CodecError", "DefinitionChanged", "KafkaAccessError", "RestoreMismatch", "SnapshotCorrupt",
           "StateError", "StateFenced", "TransactionClosed", "meaning_changes"]


def meaning_changes(old: dict | None, new: dict | None) -> list[str]:
    """Human-readable differences between two meanings (what DefinitionChanged names)."""
    old, new = old or {}, new or {}
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]


class StateError(Exception):
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


class BadSetting(StateError, ValueError):
    """A setting a user gave (an environment variable, an option) is wrong: the message names it
    and the fix, and the CLI exits 2 with it, as for any mistake of the request."""


class CodecError(StateError, ValueError):
    """Bytes that are not a valid encoding, or a value that cannot be encoded."""


class KafkaAccessError(StateError, RuntimeError):
    """Kafka refused statetable's client: the message is the one line to show."""


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
