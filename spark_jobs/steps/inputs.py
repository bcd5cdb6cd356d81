"""What a table's frames read from storage, read here so spark_jobs/frames/ never does: a joined
table's rows as a batch's plan pinned them (the Parquet file under the batch log's joins/) or
as committed now (the Delta mirror), and the watermark each committed batch started from (the
batch log). The frames get it as their `inputs` (frames.table_frames.Inputs)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime, spark_path
from spark_jobs.delta import mirror
from spark_jobs.frames.table_frames import TableFrames, reference_frame

__all__ = ["StoredInputs", "frames_of"]


@dataclass(frozen=True)
class StoredInputs:
    spark: object
    rt: Runtime
    table: str

    @cached_property
    def log(self) -> BatchLog:
        return BatchLog(self.rt.batch_dir(self.table))

    @property
    def pinned_folder(self) -> str:
        """Where the batches' pinned reference files are (a plan's `joins` names one per table)."""
        return f"{self.log.location}/joins"

    def reference(self, other: TableDefinition, pins: dict | None):
        if pins is not None:
            return self.spark.read.parquet(spark_path(f"{self.pinned_folder}/{pins[other.name]['file']}"))
        return reference_frame(self.spark, other, mirror.committed_rows(self.rt, other.name)[1])

    def batch_watermarks(self) -> list[tuple[int, int | None]]:
        return [(commit.batch_id, commit.watermark_ms) for commit in self.log.commits()]


def frames_of(spark, table: TableDefinition, tables: dict[str, TableDefinition], rt: Runtime) -> TableFrames:
    """A table's frames reading the stack's storage: what the batch, verify and rebuild use."""
    return TableFrames(spark, table, tables, StoredInputs(spark, rt, table.name))
