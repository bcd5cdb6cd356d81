"""The Delta mirror of a table's state, off the hot path: an append-only changes table, folded
into a compacted copy every `mirror_every` batches.

- `<table>_mirror_changes`: the merge tasks write each batch's changed rows (key, row as the API
  shows it, batch_id, deleted), one Parquet file per state partition, into this table's folder.
  After the batch commits, the driver adds them in one Delta transaction (app id
  `<table>.mirror_changes`, version = the batch): no Spark job, no row through the driver.
- `<table>_mirror`: every `mirror_every` batches one MERGE folds the changes in (app id
  `<table>.mirror`, so a re-run folds nothing twice), then the folded files leave the changes
  table (a file-level remove, nothing rewritten). The MERGE is delta-rs's on the driver while the
  changes to fold are at most `STATETABLE_MIRROR_DRIVER_FOLD_ROWS` rows (default 1,000,000): its
  memory is the changes', and a small fold costs ~0.3 CPU s there against ~10 in Spark's MERGE
  (planning, a dozen jobs), which was a third of a small batch's CPU. Larger folds go to Spark.

What a reader sees: `<table>_mirror` alone is the state as of its last fold, at most
`mirror_every - 1` batches old. `frame()` (or VIEW_SQL in any Delta reader) is the mirror
overlaid with the newer changes, newest per key, deletes dropped: the state as of the last
committed batch, so after a run's last batch it equals the state. A fold cut short by a crash
leaves changes that are already in the mirror; the overlay gives them the same answer.
"""
from __future__ import annotations

import json
import logging
import os
import time

import pyarrow as pa
import pyarrow.compute as pc

from state import faults
from state.aggregates import Aggregate, LatestByOffset
from spark_jobs.delta import delta_files, delta_frames
from catalog.mapping import computed_columns, finite_value, key_names, row_of, shown, state_spec
from catalog.definitions import TableDefinition
from catalog.runtime import Runtime
from spark_jobs.errors import MirrorUnstable

log = logging.getLogger("statetable.mirror")

VIEW_SQL = """-- the state as of the last committed batch: the mirror overlaid with newer changes
SELECT key, row, batch_id FROM (
  SELECT *, row_number() OVER (PARTITION BY key ORDER BY batch_id DESC) AS rn FROM (
    SELECT key, row, batch_id, false AS deleted FROM delta.`{mirror}`
    UNION ALL SELECT key, row, batch_id, deleted FROM delta.`{changes}`))
WHERE rn = 1 AND NOT deleted"""


def mirror_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "mirror")


def changes_path(rt: Runtime, table: str) -> str:
    return rt.delta_path(table, "mirror_changes")


def change_file(batch_id: int, partition: int) -> str:
    """One name per (batch, state partition): a retried or re-run merge task replaces its file."""
    return f"b{batch_id:012d}-p{partition:05d}.parquet"


CHANGE_DDL = "key STRING, row STRING, batch_id BIGINT, deleted BOOLEAN"


def change_batch(name: str) -> int:
    """The batch of a change file (`change_file`'s name, or a path ending in one)."""
    return int(name.rsplit("/", 1)[-1][1:13])


def change_schema():
    return pa.schema([("key", pa.string()), ("row", pa.string()), ("batch_id", pa.int64()), ("deleted", pa.bool_())])


def write_changes(folder: str, table: TableDefinition, batch_id: int, partition: int, keys: list, values: list,
                  aggregator=None) -> None:
    """A partition's changed rows of a batch (value None: the key is gone), written atomically under
    their fixed name; `aggregator` as for compile.row_of. Keys are tuples."""
    write_change_rows(folder, batch_id, partition, change_rows(table, keys, values, aggregator))


def change_rows(table: TableDefinition, keys: list[tuple], values: list, aggregator=None) -> pa.Table:
    """change_columns of keys given as tuples (decoded from state, not held as columns)."""
    columns = [list(c) for c in zip(*keys)] if keys else [[] for _ in key_names(table)]
    return change_columns(table, columns, values, aggregator)


def write_change_rows(folder: str, batch_id: int, partition: int, built: pa.Table) -> None:
    """A partition's change file of a batch from change_columns' rows (the merge task builds them
    once, for its change topic and for this file)."""
    from spark_jobs.delta.delta_files import write_parquet_atomically

    rows = pa.table({"key": built.column("key"), "row": built.column("row"),
                     "batch_id": pa.array([batch_id] * built.num_rows, pa.int64()),
                     "deleted": built.column("deleted")}, schema=change_schema())
    write_parquet_atomically(rows, folder, change_file(batch_id, partition))


def change_columns(table: TableDefinition, keys: list, values: list, aggregator=None,
                   results: list | None = None) -> pa.Table:
    """Changed rows as JSON text, column by column: `key` (the key's values as a JSON array, what
    the mirror MERGEs on), `key_object` (the key as a JSON object, the change topic's record key),
    `row` (the row as the API shows it) and `deleted`.

    The JSON is what `json.dumps(row_of(...), default=str)` gives, byte for byte, but built
    column-wise: integer and plain-ASCII string columns in Arrow, other values one by one. A
    million-key batch has a million rows here. A row HAVING hides is a delete here.

    `results`: the shown value of each aggregate (table.aggregates' order), or of a table of rows
    each value column, as Arrow columns, for rows none of which is deleted (a batch's new keys of a
    LATEST_BY_OFFSET table, a batch's bids joined column by column); `values` then only counts the
    rows. Not with HAVING, which judges Python rows."""
    rows = None
    if table.having is not None:
        # The row as row_of shows it, one by one: HAVING judges it (its computed columns too).
        aggregator = aggregator or state_spec(table).aggregator
        rows = [None if v is None else shown(table, row_of(table, k, v, aggregator))
                for k, v in zip(zip(*_as_lists(keys)), values)]
        values = [None if r is None else v for r, v in zip(rows, values)]
    deleted = [v is None for v in values]
    key_parts = dict(zip(key_names(table), [_json_fragments(c) for c in keys]))
    key_json = _joined("[", _separated(key_parts.values()), "]")
    key_row = _joined("{", _separated(key_parts.values(), list(key_parts)), "}")
    if rows is not None and table.computed:
        row_json = pc.if_else(pa.array(deleted, pa.bool_()), key_row,
                              pa.array([json.dumps(r, default=str) if r else "" for r in rows], pa.string()))
    else:
        if results is not None:     # an aggregate's shown values, or a table of rows' columns
            names = [a.name for a in table.aggregates] if table.aggregates else list(table.value_columns)
            columns = list(results)
        else:
            names, columns = _value_columns(table, values, aggregator, hidden=bool(table.computed))
        hidden = {a.name for a in table.aggregates if a.hidden}
        value_names = [n for n in names if n not in hidden]
        value_columns = [c for n, c in zip(names, columns) if n not in hidden]
        if table.computed:      # computed from every aggregate, hidden ones too, shown after them
            value_names += list(table.computed)
            value_columns += computed_columns(table, key_names(table) + names, _as_lists(keys) + columns, values)
        # A dict's order: a value column named like a key column (a source table's key) takes the
        # key's place, as row_of's dict.update does.
        row_parts = {**key_parts, **dict(zip(value_names, [_json_fragments(c, finite=True) for c in value_columns]))}
        row_json = key_row if not value_columns or all(deleted) else pc.if_else(
            pa.array(deleted, pa.bool_()), key_row, _joined("{", _separated(row_parts.values(), list(row_parts)), "}"))
    return pa.table({"key": key_json, "key_object": key_row, "row": row_json,
                     "deleted": pa.array(deleted, pa.bool_())})


def _as_lists(columns: list) -> list[list]:
    """Key columns (Arrow arrays or Python sequences) as Python lists."""
    return [c.to_pylist() if isinstance(c, (pa.Array, pa.ChunkedArray)) else list(c) for c in columns]


_COMMA = pa.scalar(", ")
_PLAIN = r"^[ !#-\[\]-~]*$"      # printable ASCII but '"' and '\': json.dumps only adds the quotes


def _separated(parts, names: list[str] | None = None) -> list:
    """Fragments with ", " between them, each after its `"name": ` when names are given."""
    out = []
    for i, part in enumerate(parts):
        out += [_COMMA] if i else []
        out += [pa.scalar(json.dumps(names[i]) + ": ")] if names else []
        out.append(part)
    return out


def _joined(opening: str, parts: list, closing: str):
    return pc.binary_join_element_wise(pa.scalar(opening), *parts, pa.scalar(closing), pa.scalar(""))


def _value_columns(table: TableDefinition, values: list, aggregator, hidden: bool = False) -> tuple[list[str], list[list]]:
    """The row's value columns as the API shows them, column by column (None for a deleted row);
    `hidden`: the aggregates kept only for computed columns, HAVING or the TTL too."""
    aggregator = aggregator or state_spec(table).aggregator
    if aggregator is None:                  # a table of rows (catalog.mapping.state_spec)
        names = list(table.value_columns)
        return names, [[None if v is None else v[i] for v in values] for i in range(len(names))]
    names, columns = [], []
    aggs = list(aggregator.columns.values())
    skip = len(aggs) - len(table.aggregates)        # a RetractingAggregator's row count comes first
    for i, (column, agg) in enumerate(zip(table.aggregates, aggs[skip:]), start=skip):
        if column.hidden and not hidden:
            continue
        if type(agg).result is LatestByOffset.result:      # (order, value): its value, without a call
            states = [None if v is None or v[i] is None else v[i][1] for v in values]
        elif type(agg).result is not Aggregate.result:
            states = [None if v is None else agg.result(v[i]) for v in values]
        else:
            states = [None if v is None else v[i] for v in values]
        names.append(column.name)
        columns.append(states)
    return names, columns


def _json_fragments(column, finite: bool = False):
    """Each value of a column as json.dumps writes it (`finite`: NaN and infinities as null, as
    row_of does)."""
    array = None
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        array, column = column, None
    else:
        try:
            array = pa.array(column)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
    if array is not None:
        kind = array.type
        text = None
        if pa.types.is_integer(kind) or pa.types.is_null(kind):
            text = array.cast(pa.string())
        elif (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and \
                pc.all(pc.match_substring_regex(array, _PLAIN)).as_py() is not False:
            text = pc.binary_join_element_wise(pa.scalar('"'), array, pa.scalar('"'), pa.scalar(""))
        if text is not None:
            return pc.fill_null(text, "null")
        if column is None:
            column = array.to_pylist()
    if finite:
        return pa.array([json.dumps(finite_value(v), default=str) for v in column], pa.string())
    return pa.array([json.dumps(v, default=str) for v in column], pa.string())


def commit_changes(rt: Runtime, table: str, batch_id: int) -> None:
    """Add a committed batch's change files to the changes table (idempotent per batch)."""
    path = changes_path(rt, table)
    names = delta_files.listed(path, change_file(batch_id, 0)[:13])
    if not names:
        return
    files = [delta_files.DataFile(name, size, delta_files.file_rows(path, name)) for name, size in names]
    delta_files.commit_files(path, files, change_schema(), f"{table}.mirror_changes", batch_id)


def fold_if_due(spark, rt: Runtime, table: TableDefinition, batch_id: int) -> None:
    """After every `mirror_every`-th batch (batch ids N-1, 2N-1, ...): MERGE the changes up to
    `batch_id` into the mirror, then remove their files from the changes table."""
    if (batch_id + 1) % table.mirror_every:
        return
    path, changes = mirror_path(rt, table.name), changes_path(rt, table.name)
    changes_table = delta_files.load(changes)
    if changes_table is None or changes_table.transaction_version(f"{table.name}.mirror_changes") is None:
        return
    started = time.monotonic()
    target = delta_files.load(path)
    folded = None if target is None else target.transaction_version(f"{table.name}.mirror")
    how = "nothing to fold again"
    if folded is None or folded < batch_id:
        if target is None:        # created by delta-rs: no Spark job for an empty table
            delta_files.commit_files(path, [], change_schema(), f"{table.name}.mirror", -1)
            target = delta_files.load(path)
        rows = _rows_to_fold(changes_table, batch_id)
        if rows <= DRIVER_FOLD_ROWS:
            how = f"{rows} change rows by delta-rs on the driver"
            _fold_on_driver(target, changes_table, batch_id, table.name)
        else:
            how = f"{rows} change rows by Spark (over STATETABLE_MIRROR_DRIVER_FOLD_ROWS={DRIVER_FOLD_ROWS})"
            _fold_in_spark(spark, path, changes, batch_id, table.name)
    faults.point("mirror.after_merge")
    removed = delta_files.remove_files(changes, lambda name: change_batch(name) <= batch_id)
    log.info("%s: mirror folded the changes of batches up to %d (%d files; %s) in %.2fs", table.name, batch_id,
             removed, how, time.monotonic() - started)


DRIVER_FOLD_ROWS = int(os.environ.get("STATETABLE_MIRROR_DRIVER_FOLD_ROWS", "1000000"))
_MERGE_ON = "t.key = s.key"


def _rows_to_fold(changes_table, batch_id: int) -> int:
    """The change rows of batches up to `batch_id`, from the files' own row counts (the log's add
    actions): nothing is read to decide where the fold runs."""
    actions = pa.table(changes_table.get_add_actions(flatten=True))
    return sum(int(n or 0) for name, n in zip(actions.column("path").to_pylist(),
                                               actions.column("num_records").to_pylist())
               if change_batch(name) <= batch_id)


def newest_per_key(changes: pa.Table) -> pa.Table:
    """Each key's newest change (highest batch_id): what a fold or a read of the overlay applies."""
    newest = changes.sort_by([("batch_id", "descending")]).group_by("key", use_threads=False).aggregate(
        [("row", "first"), ("batch_id", "first"), ("deleted", "first")])
    return pa.table({"key": newest.column("key"), "row": newest.column("row_first"),
                     "batch_id": newest.column("batch_id_first"), "deleted": newest.column("deleted_first")},
                    schema=change_schema())


def _fold_on_driver(target, changes_table, batch_id: int, table: str) -> None:
    """delta-rs's MERGE, recording the fold (app id `<table>.mirror`) in the same commit."""
    from deltalake.transaction import CommitProperties, Transaction

    source = newest_per_key(changes_table.to_pyarrow_table(filters=[("batch_id", "<=", batch_id)]))
    done = CommitProperties(app_transactions=[Transaction(f"{table}.mirror", batch_id, int(time.time() * 1000))])
    (target.merge(source, predicate=_MERGE_ON, source_alias="s", target_alias="t", commit_properties=done)
     .when_matched_delete(predicate="s.deleted")
     .when_matched_update_all(predicate="NOT s.deleted")
     .when_not_matched_insert_all(predicate="NOT s.deleted")
     .execute())


def _fold_in_spark(spark, path: str, changes: str, batch_id: int, table: str) -> None:
    """Spark's MERGE, then the fold's own commit. The fold is recorded after the MERGE, not by
    txnAppId in the session's conf: every table shares one Spark Connect session, and a conf set
    by one would mark another's MERGE. A crash between the two repeats the MERGE, which is
    idempotent (the newest change per key up to `batch_id`, applied again, gives the same rows)."""
    from pyspark.sql import Window, functions as F

    latest = Window.partitionBy("key").orderBy(F.desc("batch_id"))
    source = (delta_frames.read(spark, changes).where(F.col("batch_id") <= batch_id)
              .withColumn("_rn", F.row_number().over(latest)).where("_rn = 1").drop("_rn"))
    upsert(spark, path, source, table)
    delta_files.commit_files(path, [], change_schema(), f"{table}.mirror", batch_id)


def upsert(spark, path: str, source, table: str) -> None:
    """MERGE change rows (newest per key) into the mirror at `path`: a delete removes the key.
    SQL rather than delta-spark's DeltaTable API, which over Spark Connect needs Delta's own
    Connect plugin on the server; MERGE INTO runs on any session with the Delta extensions."""
    view = f"statetable_mirror_changes_{table}"      # tables share the session: a view each
    source.createOrReplaceTempView(view)
    target = path.replace("`", "``")
    spark.sql(f"MERGE INTO delta.`{target}` t USING {view} s ON {_MERGE_ON} "
              "WHEN MATCHED AND s.deleted THEN DELETE "
              "WHEN MATCHED AND NOT s.deleted THEN UPDATE SET * "
              "WHEN NOT MATCHED AND NOT s.deleted THEN INSERT *")
    spark.catalog.dropTempView(view)


def committed_rows(rt: Runtime, table: str, attempts: int = 5):
    """(batch, rows): the table's rows (`key`, `row` JSON) as of `batch`, the newest batch whose
    changes are committed (None: none yet), read by delta-rs on the driver, no Spark job.

    The mirror is loaded before the changes: a fold that lands in between moves rows out of the
    changes that the loaded mirror lacks, so the mirror's version is checked again afterwards and
    the read repeated (as when a fold deletes a changes file while it is read)."""
    empty = pa.table({"key": pa.array([], pa.string()), "row": pa.array([], pa.string()),
                      "batch_id": pa.array([], pa.int64()), "deleted": pa.array([], pa.bool_())})
    columns = ["key", "row", "batch_id", "deleted"]
    for attempt in range(attempts):
        try:
            folded = delta_files.load(mirror_path(rt, table))
            changes = delta_files.load(changes_path(rt, table))
            batch = changes.transaction_version(f"{table}.mirror_changes") if changes is not None else None
            parts = [empty]
            if folded is not None:
                rows = folded.to_pyarrow_table(columns=columns[:3])
                parts.append(rows.append_column("deleted", pa.array([False] * rows.num_rows, pa.bool_())))
            if changes is not None:
                parts.append(changes.to_pyarrow_table(columns=columns))
            both = pa.concat_tables([p.cast(empty.schema) for p in parts])
            again = delta_files.load(mirror_path(rt, table))
            if (again.version() if again is not None else None) == (folded.version() if folded is not None else None):
                break
        except (OSError, ValueError) as exc:      # a changes file deleted by a fold while read
            if attempt == attempts - 1:
                raise
            log.info("%s: mirror changed while read (%s); reading again", table, exc)
    else:
        raise MirrorUnstable(f"{table}: the mirror folded {attempts} times while its state was read")
    live = newest_per_key(both).filter(pc.invert(pc.field("deleted")))
    return batch, live.select(["key", "row"])


def frame(spark, rt: Runtime, table: str):
    """The mirror as of the last committed batch (VIEW_SQL as a DataFrame)."""
    from pyspark.sql import Window, functions as F

    def load(path):
        if (found := delta_files.load(path)) is not None:
            return delta_frames.read(spark, path, found).select("key", "row", "batch_id", "deleted")
        return spark.createDataFrame([], CHANGE_DDL)

    both = load(mirror_path(rt, table)).withColumn("deleted", F.lit(False)) \
        .unionByName(load(changes_path(rt, table)))
    latest = Window.partitionBy("key").orderBy(F.desc("batch_id"))
    return (both.withColumn("_rn", F.row_number().over(latest))
            .where("_rn = 1 AND NOT deleted").drop("_rn", "deleted"))


def joined_tables_moved(rt: Runtime, table: TableDefinition, last) -> bool:
    """Whether a join of tables has work without new records of its own: a joined table committed
    a batch since the one `last` (its last commit) pinned, and those changes must reach its rows
    (asked by passes.table_join)."""
    pinned = (last.joins or {}) if last is not None else {}
    return any(delta_files.committed_version(changes_path(rt, j.table), f"{j.table}.mirror_changes")
               != (pinned.get(j.table) or {}).get("batch") for j in table.joins)
