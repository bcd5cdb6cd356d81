"""A batch's first step: fix its input before reading a record. The plan (offsets per input
partition, the starting watermark, the pinned joined tables, the definition) is written to the
batch log ahead of any work, so a batch interrupted anywhere is finished from it, reading the
same records and joining the same rows. Also the checks a writer makes before its first plan."""
from __future__ import annotations

import logging
from dataclasses import replace

from catalog.batch_log import BatchLog, BatchLogLost, BatchPlan
from catalog.registry import ensure_output_topic
from catalog.runtime import Runtime
from spark_jobs.delta import delta_files, mirror
from spark_jobs.steps.offsets import next_starts, topic_id, watermarks
from spark_jobs.passes import pass_for
from spark_jobs.frames.table_frames import typed_rows
from spark_jobs.steps.table_run import TableRun
from state.changelog import ensure_changelog
from state.kafka_admin import ensure_topic
from state.table import DefinitionChanged

__all__ = ["prepare", "check_definition", "lag", "next_plan", "pin_joins"]

log = logging.getLogger("statetable.microbatch")


def prepare(run: TableRun) -> None:
    """A writer's checks and topics before its first plan: a stale local cache dropped, the batch
    log's definition matching this one, the dead-letter, changelog and output topics made, and a
    changelog that holds state only when the batch log explains it."""
    from catalog.registry import drop_stale_cache

    table, rt = run.table, run.rt
    drop_stale_cache(run.spec, rt)
    check_definition(run.log, table.name, run.definition, run.rt)
    ensure_topic(rt.bootstrap, run.dead_letter_topic, 1, {"cleanup.policy": "compact"})
    ensure_changelog(rt.bootstrap, run.spec.changelog_topic, table.partitions)
    if pass_for(table).rows_stage:
        from catalog.mapping import rows_spec

        ensure_changelog(rt.bootstrap, rows_spec(table, rt.namespace).changelog_topic, table.partitions)
    if table.output_topic:
        ensure_output_topic(rt.bootstrap, table)
    _check_log_matches_changelog(run)


def check_definition(batch_log: BatchLog, name: str, definition: dict, rt=None) -> None:
    """The batch log speaks for the durable state (changelog and snapshots), also where no local
    store exists: a batch, finished or pending, under another definition stops every writer."""
    for entry, what in ((batch_log.pending_plan(), "pending batch"), (batch_log.last_commit(), "last batch")):
        recorded = getattr(entry, "definition", None)
        if recorded and recorded.get("fingerprint") != definition["fingerprint"]:
            from spark_jobs.delta.verify_chain import bronze_from_batch

            raise DefinitionChanged(name, recorded.get("meaning"), definition["meaning"],
                                    where=f"its {what} ({entry.batch_id})",
                                    history_from=None if rt is None else bronze_from_batch(rt, name))


def _check_log_matches_changelog(run: TableRun) -> None:
    """A first batch starts from empty state: if the changelog already holds state, the batch
    log that explains it is missing (BatchLogLost), and nothing is guessed."""
    if run.log.last_commit() is not None or run.log.pending_plan() is not None:
        return
    written = sum(high for _, high in watermarks(run.rt.bootstrap, run.spec.changelog_topic).values())
    if written:
        raise BatchLogLost(run.table.name, run.log.location, run.spec.changelog_topic, written, run.rt.namespace)


def next_plan(run: TableRun) -> BatchPlan | None:
    """The pending plan (taken over), or a new one over what the topic holds past the last batch,
    within max_records_per_batch; None when there is nothing to read and no joined table moved."""
    table, rt, batch_log = run.table, run.rt, run.log
    pending = batch_log.pending_plan()
    if pending is not None:
        batch_log.take_over(pending, table.name)
        log.info("%s: finishing batch %d from its plan (%d records)", table.name, pending.batch_id,
                 pending.record_count)
        return replace(pending, resumed=True)
    last = batch_log.last_commit()
    marks = watermarks(rt.bootstrap, table.topic)
    incarnation = topic_id(rt.bootstrap, table.topic)
    read_topic, read_id, read_ends, accepted = batch_log.read_position() or (None, None, None, None)
    starts = next_starts(table.name, table.topic, marks, incarnation, read_topic, read_id, read_ends)
    available = {p: high - starts[p] for p, (_, high) in marks.items()}
    table_pass = pass_for(table)
    second = table_pass.second_stream(rt, last)     # a windowed join's other stream, read beside the topic
    more = {} if second is None else {p: high - start for p, (start, high) in second[2].items()}
    if sum(available.values()) + sum(more.values()) == 0 and not table_pass.moved_without_records(rt, last):
        return None
    # The budget is shared by both streams in proportion to what each holds, so that their event
    # times move on together and neither makes the other's records late.
    budget, total = table.max_records_per_batch, sum(available.values()) + sum(more.values())

    def share(n: int) -> int:
        return n if total <= budget else n * budget // total

    ranges = {p: (starts[p], starts[p] + share(available[p])) for p in marks}
    joins = pin_joins(run, last) if second is None else {"stream": {
        "topic": second[0], "topic_id": second[1],
        "ranges": {str(p): [start, start + share(more[p])] for p, (start, _) in second[2].items()}},
        # the partitions this batch leaves records in: they hold the join's watermark back
        "behind": [f"a:{p}" for p in marks if share(available[p]) < available[p]]
                  + [f"b:{p}" for p in more if share(more[p]) < more[p]]}
    plan = BatchPlan(
        batch_id=(last.batch_id + 1) if last else 0, topic=table.topic, ranges=ranges,
        watermark_ms=last.watermark_ms if last else None, topic_id=incarnation, accepted=accepted,
        definition=run.definition, joins=joins,
    )
    if accepted:
        log.warning("%s batch %d starts where an operator accepted a discontinuity: %s", table.name,
                    plan.batch_id, accepted.get("problem"))
    batch_log.write_plan(plan, table.name)
    return plan


def pin_joins(run: TableRun, last) -> dict | None:
    """Each joined table's committed state as of its newest batch, fixed for this batch in a
    Parquet file in this table's batch folder: a re-run after a crash joins the same rows,
    whatever the joined table did since. Written once per (joined table, batch) and read
    from the joined table's Delta mirror (mirror.committed_rows), not from its topic."""
    table, rt = run.table, run.rt
    if not table.joins:
        return None
    import pyarrow.fs as pafs

    from catalog.runtime import arrow_filesystem
    from spark_jobs.delta.delta_files import write_parquet_atomically

    folder = f"{run.log.location}/joins"
    fs, root = arrow_filesystem(folder)
    pins = {}
    since = pass_for(table).pins_since       # a join of tables diffs against its last pins
    before = (last.joins or {}) if last is not None and since else {}
    for name in sorted({join.table for join in table.joins}):
        def file_of(batch: int | None) -> str:
            return f"{name}.b{-1 if batch is None else batch}.parquet"

        batch = delta_files.committed_version(mirror.changes_path(rt, name), f"{name}.mirror_changes")
        file = file_of(batch)
        if fs.get_file_info(f"{root}/{file}").type == pafs.FileType.NotFound:
            batch, rows = mirror.committed_rows(rt, name)
            file = file_of(batch)
            write_parquet_atomically(typed_rows(run.tables[name], rows), folder, file)
            keep = {file, (before.get(name) or {}).get("file")}    # a join of tables diffs against its last pin
            for old in fs.get_file_info(pafs.FileSelector(root)):  # no pending plan names them (we plan)
                if old.base_name.startswith(f"{name}.b") and old.base_name not in keep:
                    fs.delete_file(old.path)
        pins[name] = {"batch": batch, "file": file}
        if since:
            pins[name].update(since=(before.get(name) or {}).get("batch"),
                              since_file=(before.get(name) or {}).get("file"))
        if batch is None:
            log.warning("%s joins %s, which has no committed batch yet: its events find no match (run %s "
                        "first)", table.name, name, name)
    return pins


def lag(name: str, rt: Runtime, topic: str | None = None, table=None) -> int:
    """Records in the table's topic after its last committed batch (the pending plan's too).

    Raises OffsetDiscontinuity when the topic does not continue where the table stopped:
    a reset is never shown as "nothing to read"."""
    from catalog import registry

    table = table or registry.load_table(name, rt)[0]     # callers holding the definition pass it
    topic = topic or table.topic
    batch_log = BatchLog(rt.batch_dir(name))
    position = batch_log.read_position()
    # A joined table's new batch is work too for a join of tables (counted as one record); a
    # windowed join's other stream counts its records.
    table_pass, last = pass_for(table), batch_log.last_commit()
    second = table_pass.second_stream(rt, last)
    moved = int(table_pass.moved_without_records(rt, last)) + (
        0 if second is None else sum(high - start for start, high in second[2].values()))
    try:
        marks = watermarks(rt.bootstrap, topic)
    except LookupError:
        if position is None:
            return moved    # not produced to yet
        raise
    read_topic, read_id, read_ends, _ = position or (None, None, None, None)
    starts = next_starts(name, topic, marks, topic_id(rt.bootstrap, topic) if read_id else None, read_topic,
                         read_id, read_ends)
    return sum(high - starts[p] for p, (_, high) in marks.items()) + moved
