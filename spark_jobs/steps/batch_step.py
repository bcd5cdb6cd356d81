"""What one pass over a batch hands to the commit: every pass (the Spark-SQL pass, the Arrow
pass, the tables-of-tables stages) returns the same frozen record, so the commit reads one shape
and a new pass cannot forget a count the batch log, /metrics or the dead-letter report needs."""
from __future__ import annotations

from dataclasses import dataclass, field

from spark_jobs.steps.summary import PartitionSummary

__all__ = ["BatchStep"]


@dataclass(frozen=True)
class BatchStep:
    reasons: dict                 # records read by parse outcome: None (parsed) or a dead-letter reason
    read: int                     # records read from the plan's ranges
    summaries: dict[int, PartitionSummary]    # state partition -> its merge task's report
    delta_keys: int               # keys the batch merged
    steps: dict[str, float]       # seconds per named step, in order
    dead: int = 0                 # records dead-lettered by the pass (refused keys' events are in refused_counts)
    late: int = 0                 # records behind the watermark (dead-lettered as "late")
    watermark: int | None = None  # the table's event-time watermark after the batch
    refused: dict = field(default_factory=dict)          # key -> why the state refused it
    refused_counts: dict = field(default_factory=dict)   # reason -> events dead-lettered for refused keys
    extra: dict = field(default_factory=dict)            # pass-specific counts, kept in the commit's counts
    release: tuple = ()           # persisted frames to drop once the commit is written
    event_times: dict | None = None   # a windowed join: each input partition's newest accepted event time

    def total(self, name: str) -> int:
        """A field of the partitions' reports (PartitionSummary), summed."""
        return sum(getattr(s, name) for s in self.summaries.values())
