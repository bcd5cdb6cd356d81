"""Named errors of operations (topics, drills): each says which table, what is wrong and the fix."""
from __future__ import annotations

from catalog.errors import UserError

__all__ = ["NothingToInject", "OpsError", "TopicMissing"]


class OpsError(Exception):
    """Every named error of this layer is one: catch it to handle them all."""


class TopicMissing(OpsError, UserError, LookupError):
    """The table's input topic does not exist (the message names the command that makes it)."""


class NothingToInject(OpsError):
    """The failure needs something the table does not have now (e.g. unread input to kill a batch over)."""
