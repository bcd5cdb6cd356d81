"""Named errors of the jobs (batches, restores, the engine): each says which table, what is wrong and the fix."""
from __future__ import annotations

from catalog.errors import UserError

__all__ = ["ArrowUnsupported", "EngineUnavailable", "HistoryTrimmed", "JobError", "OffsetDiscontinuity", "RollbackRefused"]


class JobError(Exception):
    """Every named error of this layer is one: catch it to handle them all."""


class OffsetDiscontinuity(JobError, ValueError):
    """The topic no longer continues where the table stopped reading: it was recreated,
    truncated or replaced, or retention deleted records nobody read."""


class EngineUnavailable(JobError, RuntimeError):
    """The Spark Connect server a job was pointed at does not answer."""


class ArrowUnsupported(JobError, ValueError):
    """A definition the Arrow pass does not cover (the Spark-SQL pass runs it)."""


class RollbackRefused(JobError, UserError):
    """A restore to an earlier batch than the batch log's last commit, not forced."""


class HistoryTrimmed(JobError, UserError):
    """A recomputation that needs history a retention option deleted."""
