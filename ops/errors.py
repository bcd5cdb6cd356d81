"""Named errors of operations (topics, drills): each says which table, what is wrong and the fix."""
from __future__ import annotations

from state.errors import StatetableError, UserFixable

__all__ = ["DrillFailed", "NothingToInject", "OpsError", "ProduceIncomplete"]


class OpsError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class ProduceIncomplete(OpsError, RuntimeError):
    """Kafka did not confirm every record handed to it (the message counts them)."""


class DrillFailed(OpsError, RuntimeError):
    """A drill could not inject its failure as meant, or a deployment command it ran failed."""


class NothingToInject(OpsError, UserFixable):
    """The failure needs something the table does not have now (e.g. unread input to kill a batch over)."""
