"""What a task beside a state partition is handed: one frozen record, pickled from the driver
into each task, for every kind of task (a stream's merge, the tables-of-tables stages, a
rebuild's write, a snapshot). The fields every task reads come first; each kind's own follow,
defaulted, so a task reads nothing it was not given and a new kind adds a field, not a type."""
from __future__ import annotations

from dataclasses import dataclass

from catalog.definitions import TableDefinition
from catalog.runtime import Runtime, local_replica_roots

__all__ = ["TaskContext"]


@dataclass(frozen=True)
class TaskContext:
    table: TableDefinition
    batch_id: int
    state_dir: str
    bootstrap: str
    snapshot_uri: str
    namespace: str = ""
    changelog: str | None = None        # the state version's changelog topic (registry.spec_of)
    replica_roots: tuple = ()           # query replicas' folders on the driver's host (catalog.runtime)
    spec: object = None                 # the state spec to open, when the driver fixed it (rebuild, snapshot)
    # a stream's merge
    purge_watermark: int | None = None  # windows wholly behind it are purged (a rebuild: behind the last purge)
    closing: tuple | None = None        # emit: final: (previous watermark, this batch's): windows closing between
    expire_before: int | None = None    # ttl: keys whose newest event time is at or before this go
    join_watermark: int | None = None   # a windowed join of streams: records waiting past it leave
    # the tables-of-tables stages
    source: TableDefinition | None = None   # the input table
    retractions: str = ""               # this batch's folder of retraction files
    # a rebuild
    from_batch: int | None = None       # the last commit: a worker's copy is brought to it first
    window_range: tuple[int, int] | None = None    # [from, to) of the windows rebuilt; None: all
    mirror_dir: str | None = None       # where the task writes its mirror change file
    armed: tuple = ()                   # the fault points armed in the tasks (state.faults)

    @classmethod
    def of(cls, rt: Runtime, table: TableDefinition, batch_id: int, **kind) -> "TaskContext":
        """The context of `table`'s tasks for `batch_id` on the stack `rt` names; `kind`: the task kind's fields."""
        kind.setdefault("replica_roots", local_replica_roots(rt))
        return cls(table, batch_id, str(rt.state_dir), rt.bootstrap, rt.snapshot_uri, rt.namespace, **kind)

    def in_scope(self, key: tuple) -> bool:
        """A rebuild's key it may replace: one whose window starts in `window_range` (all without one)."""
        return self.window_range is None or self.window_range[0] <= key[-1] < self.window_range[1]
