"""Named errors of the jobs (batches, restores, the engine): each says which table, what is wrong and the fix."""
from __future__ import annotations

from state.errors import StatetableError, UserFixable

__all__ = ["ArrowUnsupported", "EngineUnavailable", "GroupTooLarge", "HistoryTrimmed", "JobError", "MirrorCorrupt",
           "MirrorUnstable", "OffsetDiscontinuity", "RollbackRefused", "TaskReportMismatch", "TopicMissing", "WarmupFailed"]


class JobError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class OffsetDiscontinuity(JobError, ValueError):
    """The topic no longer continues where the table stopped reading: it was recreated,
    truncated or replaced, or retention deleted records nobody read."""


class EngineUnavailable(JobError, RuntimeError):
    """The Spark Connect server a job was pointed at does not answer."""


class ArrowUnsupported(JobError, ValueError):
    """A definition the Arrow pass does not cover (the Spark-SQL pass runs it)."""


class RollbackRefused(JobError, UserFixable, ValueError):
    """A restore to an earlier batch than the batch log's last commit, not forced."""


class HistoryTrimmed(JobError, UserFixable, ValueError):
    """A recomputation that needs history a retention option deleted."""


class TopicMissing(JobError, UserFixable, LookupError):
    """The table's input topic does not exist (the message names the command that makes it)."""


class GroupTooLarge(JobError, RuntimeError):
    """Groups whose state value would outgrow what one value may hold."""


class MirrorUnstable(JobError, RuntimeError):
    """The mirror kept folding while a table's state was read from it."""


class MirrorCorrupt(JobError, ValueError):
    """Mirror rows that do not parse as the table's schema."""


class WarmupFailed(JobError, RuntimeError):
    """The engine's warm-up could not produce its records."""


class TaskReportMismatch(JobError, RuntimeError):
    """Partition tasks reported other partitions than the batch planned."""


class RegistryUnreachable(JobError, UserFixable, RuntimeError):
    """The schema registry did not answer or refused us: the batch stops, and runs again when it does."""


class MalformedFraming(JobError, ValueError):
    """A record's wire-format framing cannot be read (a dead letter, never raised past its format)."""
