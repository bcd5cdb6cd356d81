"""What every table kind answers (see spark_jobs/passes/__init__.py for the kinds)."""
from __future__ import annotations

from catalog.definitions import TableDefinition

__all__ = ["Pass"]


class Pass:
    """A table kind's part in a batch and in a recomputation. The facts below are what the steps
    around a pass need to know of the kind; the methods are the kind's own work."""

    name = "?"
    rows = False                # its state holds rows, replaced or deleted by key (not partials folded)
    pins_since = False          # its plan records since which pinned batch of each joined table it diffs
    rows_stage = False          # it keeps a rows stage of its input table (`<table>.rows`, its own changelog)

    def __init__(self, table: TableDefinition) -> None:
        self.table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.name!r})"

    @property
    def engine(self) -> str:
        """The pass that computes its batches: "arrow", "spark" or "tables" (tables of tables)."""
        return "tables"

    def run(self, table_run, plan, started: float, begun_at: float):
        """One batch: read, dead letters, bronze and merge; a spark_jobs.steps.batch_step.BatchStep."""
        raise NotImplementedError

    def recompute(self, frames, last, spark, rt) -> tuple:
        """(partials, purge watermark): every key's final state from the history behind `last` (the
        last commit; None: no history), as the batches applied it (see spark_jobs.recompute.history.recomputed)."""
        raise NotImplementedError

    def rebuild_stages(self, spark, tables: dict, rt, last, batch_id: int) -> None:
        """A rebuild's stages before its state is written (a table of tables: its rows stage)."""

    def after_commit(self, rt, batch_id: int) -> None:
        """What the kind does once a batch is committed, before the mirror folds."""

    def chains_verify(self) -> bool:
        """Whether a verify goes on from the last verified checkpoint (spark_jobs.delta.verify_chain)."""
        return False

    def second_stream(self, rt, last) -> tuple | None:
        """A second stream the kind reads beside its topic (a windowed join of streams): (topic,
        topic id, {partition: (next start, high watermark)}); None for one topic."""
        return None

    def moved_without_records(self, rt, last) -> bool:
        """Whether it has work without new records of its own (a joined table committed since)."""
        return False
