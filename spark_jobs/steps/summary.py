"""What a merge task reports for its state partition: one frozen, typed record, the same for
every kind's tasks (a stream's merge, the rows, groups and join stages, a rebuild's write). It
travels from the task to the driver as JSON (the task's one-row Arrow table); the commit, the
merge report and /metrics read its fields by name, so a misspelt count fails where it is read,
not as a silent 0. A kind's own counts (a groups stage's groups touched, a join's rows
rewritten) go in `counts`."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pyarrow as pa

__all__ = ["PartitionSummary"]


@dataclass(frozen=True)
class PartitionSummary:
    partition: int
    changelog_offset: int | None        # the partition's changelog position after the commit
    digest: str                         # its state digest, hex
    key_count: int
    keys_changed: int = 0
    noop: bool = False                  # the batch was applied before (a re-run): nothing written
    applied_batch: int | None = None
    delta_keys: int = 0                 # keys the task merged
    purged: int = 0                     # windows purged behind the watermark
    expired: int = 0                    # keys expired by the TTL
    rejected: tuple = ()                # (key as a list, reason): keys the state refused
    ms: dict = field(default_factory=dict)     # milliseconds per step of the task
    worker: str = ""                    # the host (or test worker) that ran the task
    hydrated: bool = False              # the worker had no copy: restored from snapshots and the changelog
    seeded: bool = False                # copied from a local query replica first
    daemon_started: float = 0.0         # when the task's Python daemon began (a cold engine's is recent)
    cold: bool | None = None            # set on the driver (merge_step): the daemon began during the batch
    counts: dict = field(default_factory=dict)  # the kind's own counts

    def to_table(self) -> pa.Table:
        """The task's report, as per_state_partition collects it."""
        return pa.table({"summary": [json.dumps(dataclasses.asdict(self), default=str)]})

    @classmethod
    def of(cls, partition: int, reported: dict) -> "PartitionSummary":
        """A report as per_state_partition returns it (its partition taken out): the fields by
        name, anything else the task reported into `counts`."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in reported.items() if k in names and k != "counts"}
        counts = {**reported.get("counts", {}), **{k: v for k, v in reported.items() if k not in names}}
        known["rejected"] = tuple(tuple(r) for r in known.get("rejected", ()))
        return cls(partition=partition, **known, counts=counts)

    @classmethod
    def all_of(cls, reports: dict[int, dict]) -> dict[int, "PartitionSummary"]:
        return {p: cls.of(p, r) for p, r in reports.items()}
