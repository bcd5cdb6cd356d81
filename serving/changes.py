"""Push queries: a table's committed changes, one batch at a time, for `/tables/{table}/changes`.

A batch's changes are read back from the table's changelog, between the offsets the batch log
recorded for the previous commit and for this one, with read_committed. So a follower sees
exactly what each committed batch changed, in batch order, and never a batch the log has not
committed: what the rows API serves, as a stream. It works for every table, with or without an
`output_topic`, and it costs the writer nothing: followers only read Kafka and the batch log.

The changelog is compacted after a day (changelog.ensure_changelog): a follower that resumes
from a batch older than that sees, for each such batch, only the changes no later batch
superseded; from the newest day on, every change.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from state import codec
from state.changelog import is_marker, marker_batch, partition_bounds, replay
from catalog.batch_log import BatchCommit, BatchLog
from catalog.definitions import TableDefinition
from catalog.mapping import key_names, row_of, shown, state_spec, time_columns
from catalog.runtime import Runtime
from state.table import DefinitionChanged
from serving.errors import DefinitionMismatch
from serving.presenters import with_times


def built_with(table: TableDefinition, commit: BatchCommit | None) -> None:
    """Raise DefinitionMismatch when `commit` applied another definition than `table`."""
    recorded = getattr(commit, "definition", None) or {}
    if recorded.get("fingerprint") and table.fingerprint and recorded["fingerprint"] != table.fingerprint:
        raise DefinitionMismatch(f"{DefinitionChanged(table.name, recorded.get('meaning'), table.meaning(), where=f'its batch {commit.batch_id}')} "
                                 f"Its changes are not streamed under the new definition's names.")


def check_definition(table: TableDefinition, rt: Runtime) -> None:
    """Before a follower starts: the newest commit must have applied `table`'s definition."""
    built_with(table, BatchLog(rt.batch_dir(table.name)).last_commit())


CHANGES_PER_PIECE = 1000      # a follower holds at most this many of a batch's changes at once


def next_batch(table: TableDefinition, rt: Runtime, after_batch: int,
               times: str = "iso") -> tuple[int, Iterator[str]] | None:
    """(batch id, the pieces of its server-sent event) for the first committed batch past
    `after_batch`, or None yet. The event is read from the changelog as it is sent, a piece of
    CHANGES_PER_PIECE changes at a time: a batch that changed millions of keys costs a follower
    one piece of memory, not the batch. Raises DefinitionMismatch for a batch built under
    another definition than `table`. `times`: TIMESTAMP and DATE columns as the rows API shows them."""
    spec = state_spec(table, rt.namespace)
    batch_log = BatchLog(rt.batch_dir(table.name))
    commit = batch_log.commit(max(after_batch, -1) + 1)       # two reads a step, however old the table
    if commit is None:
        return None
    built_with(table, commit)
    topic = batch_log.changelog_of(commit, spec.changelog)
    before = batch_log.commit(commit.batch_id - 1) if commit.batch_id > 0 else None
    # A rebuild that moved the state to a new topic starts its offsets afresh.
    previous = before.changelog_offsets if before is not None \
        and batch_log.changelog_of(before, spec.changelog) == topic else {}
    return commit.batch_id, _event(table, commit, changes(table, rt, spec.aggregator, topic, previous, commit,
                                                          times))


def changes(table: TableDefinition, rt: Runtime, aggregator, topic: str, previous: dict[int, int],
            commit: BatchCommit, times: str = "iso") -> Iterator[dict]:
    """The batch's changed rows, one {"key", "row"} at a time, read back from its changelog."""
    names, timed = key_names(table), time_columns(table)
    for partition, end in sorted(commit.changelog_offsets.items()):
        start = previous.get(partition)
        if start is None:
            bounds = partition_bounds(rt.bootstrap, topic, partition)
            start = _batch_start(rt, topic, partition, 0 if bounds is None else bounds[0], end, commit.batch_id)
        for records in replay(rt.bootstrap, topic, partition, start, end):
            for record in records:
                # A batch's records carry no batch of their own (its marker, last, names it), and
                # [start, end) is the batch's; a record of an older build names its batch.
                if is_marker(record.key) or record.batch_id not in (-1, commit.batch_id):
                    continue
                key = codec.decode_key(record.key)
                value = None if record.value is None else codec.decode_value(record.value)
                yield {"key": dict(zip(names, key)),
                       "row": None if value is None else with_times(shown(table, row_of(table, key, value, aggregator)),
                                                                    timed, times)}


def _batch_start(rt: Runtime, topic: str, partition: int, start: int, end: int, batch_id: int) -> int:
    """Where `batch_id`'s records begin in [start, end) when no earlier commit of this topic says
    so (a table's first batch, or its first on a topic a rebuild moved it to): after the last
    marker of another batch. The range is read twice then, never held."""
    for records in replay(rt.bootstrap, topic, partition, start, end):
        for record in records:
            if is_marker(record.key) and marker_batch(record.key) != batch_id:
                start = record.offset + 1
    return start


def _event(table: TableDefinition, commit: BatchCommit, rows: Iterator[dict]) -> Iterator[str]:
    """One server-sent event (what `sse` writes for the whole body, byte for byte) in pieces:
    the batch id is the event id, so a client resumes with Last-Event-ID."""
    head = json.dumps({"table": table.name, "batch": commit.batch_id, "committed_at": commit.committed_at,
                       "changes": []}, default=str)
    piece, first = [f"id: {commit.batch_id}\nevent: batch\ndata: {head[:-2]}"], True
    for row in rows:
        piece.append(("" if first else ", ") + json.dumps(row, default=str))
        first = False
        if len(piece) >= CHANGES_PER_PIECE:
            yield "".join(piece)
            piece = []
    piece.append("]}\n\n")
    yield "".join(piece)
