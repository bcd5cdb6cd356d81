"""A windowed join of two streams: both streams' records wait in a rows stage for their partners
until the watermark closes their window (spark_jobs/steps/stream_join.py has the steps,
state/interval_join.py the rules)."""
from __future__ import annotations

from spark_jobs.passes.base import Pass

__all__ = ["StreamJoinPass"]


class StreamJoinPass(Pass):
    name = "windowed join of streams"
    rows = True
    rows_stage = True
    pins_since = True           # its commits keep the plan's `joins`: where b's reading stopped

    def run(self, table_run, plan, started: float, begun_at: float):
        from spark_jobs.steps import stream_join

        return stream_join.run(table_run, plan, started)

    def second_stream(self, rt, last) -> tuple[str, str | None, dict[int, tuple[int, int]]]:
        """(topic, topic id, {partition: (start, high)}) of b: where its next batch starts (after
        the last commit's b ranges; a reset or gap raises OffsetDiscontinuity, as for a's topic)."""
        from spark_jobs.steps.offsets import next_starts, topic_id, watermarks
        from spark_jobs.steps.stream_join import second_ranges

        topic = self.table.stream_join.topic
        read_topic, read_id, ranges = second_ranges(None if last is None else last.joins)
        try:
            marks = watermarks(rt.bootstrap, topic)
        except LookupError:
            if read_topic is None:
                return topic, None, {}      # not produced to yet: nothing of b to read
            raise
        incarnation = topic_id(rt.bootstrap, topic)
        starts = next_starts(self.table.name, topic, marks, incarnation, read_topic, read_id,
                             {p: end for p, (_, end) in ranges.items()} if read_topic else None)
        return topic, incarnation, {p: (starts[p], high) for p, (_, high) in marks.items()}

    def recompute(self, frames, last, spark, rt) -> tuple:
        from spark_jobs.steps import stream_join

        return (None if last is None else stream_join.recomputed(frames, rt, last)), None

    def rebuild_stages(self, spark, tables: dict, rt, last, batch_id: int) -> None:
        from spark_jobs.steps import stream_join
        from spark_jobs.steps.inputs import frames_of

        stream_join.rebuild_rows(frames_of(spark, self.table, tables, rt), rt, last, batch_id)
