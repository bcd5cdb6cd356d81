"""What every step of one table's batches shares: the Spark session, the definition, its state
spec and batch log, and the names derived from them. Building one does no I/O (the spec, which
reads the batch log, is looked up on first use), so a table's name followed from `jobs.run`
reaches a pass instead of stalling in a constructor."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime
from spark_jobs.frames.table_frames import TableFrames
from spark_jobs.steps.inputs import frames_of

__all__ = ["TableRun"]


@dataclass(frozen=True)
class TableRun:
    spark: object
    table: TableDefinition
    tables: dict[str, TableDefinition]
    rt: Runtime

    @cached_property
    def log(self) -> BatchLog:
        return BatchLog(self.rt.batch_dir(self.table.name))

    @cached_property
    def spec(self):
        """The state spec on the changelog the batch log names (registry.spec_of)."""
        from catalog.registry import spec_of

        return spec_of(self.table, self.rt)

    @cached_property
    def definition(self) -> dict:
        """What each plan and commit records, so a changed definition stops every writer."""
        return {"fingerprint": self.spec.fingerprint, "meaning": self.spec.meaning_dict()}

    @cached_property
    def frames(self) -> TableFrames:
        return frames_of(self.spark, self.table, self.tables, self.rt)

    @property
    def dead_letter_topic(self) -> str:
        return self.rt.dead_letter_topic(self.table.name)

    @property
    def reader_group(self) -> str:
        # Every group and transactional id statetable uses starts "statetable.", then the namespace:
        # one prefixed ACL grants a deployment its own (README, "Running against a managed Kafka").
        return f"statetable.{self.rt.namespace}{self.table.name}.reader"

    def in_session(self, spark) -> "TableRun":
        """The same table's run on another session (the Arrow pass's sized one); the spec and the
        batch log are shared, the frames follow the session."""
        other = dataclasses.replace(self, spark=spark)
        for name in ("log", "spec", "definition"):
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other

    def describe(self, batch_id: int, step: str) -> None:
        """Name the Spark jobs of each step, so the Spark UI and event log say which step a stage served."""
        context = getattr(self.spark, "_sc", None)      # a Spark Connect session has none
        if context is not None:
            context.setJobDescription(f"{self.table.name} batch {batch_id}: {step}")
