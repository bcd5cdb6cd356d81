"""Named errors of serving (queries, replicas, change streams); the REST layer maps each to its HTTP status."""
from __future__ import annotations

from state.errors import StatetableError, UserFixable

__all__ = ["BadQuery", "DefinitionMismatch", "NoSuchTable", "ReaderDied", "ReplicaUnavailable", "ServingError",
           "StateUnavailable"]


class ServingError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class NoSuchTable(ServingError, UserFixable, LookupError):
    """No table of that name is defined (HTTP 404)."""


class ReaderDied(ServingError, RuntimeError):
    """A query reader process died (the service restarts it)."""


class BadQuery(ServingError, UserFixable, ValueError):
    """A malformed key, range, limit or cursor (HTTP 422)."""


class StateUnavailable(ServingError, RuntimeError):
    """The table's local state is missing or being restored (HTTP 503)."""

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DefinitionMismatch(ServingError, RuntimeError):
    """The table's state was built under another definition than its .sql file now holds: its
    changes decoded with the file's would put one aggregate's values under another's name."""


class ReplicaUnavailable(ServingError, RuntimeError):
    """A replica that cannot follow; the message names the cause and the fix."""
