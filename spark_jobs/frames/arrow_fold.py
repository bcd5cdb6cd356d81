"""A table's partials of one key folded into one row in Arrow, where its aggregates fold that way
(COUNT, SUM, MIN, MAX, AVG): a pass task folds its Arrow batches' partials, and a merge task the
partials of several pass tasks, so the state sees one row a key."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import TableDefinition
from spark_jobs.frames.arrow_keys import key_columns

__all__ = ["FOLDABLE", "combine_partials", "foldable", "folded"]

FOLDABLE = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "avg": "sum"}   # partial -> how partials fold


def foldable(table: TableDefinition) -> bool:
    """Whether partials of one key fold into one in Arrow: a table of plain aggregates (a table
    of rows has none)."""
    return bool(table.aggregates) and all(a.function in FOLDABLE for a in table.aggregates)


def combine_partials(partials: pa.Table, table: TableDefinition) -> pa.Table:
    """Partials of one key from several Arrow batches or tasks, folded into one row per key, so the
    shuffle and the state see one row per key, not one per Arrow batch. Other tables' partials
    (top-n, latest, distinct counts, sources) are returned as they are."""
    if not foldable(table) or not partials.num_rows:
        return partials
    keys = key_columns(partials)
    flat, aggs = {k: partials.column(k) for k in keys}, []
    for i, agg in enumerate(table.aggregates):
        col, how = partials.column(f"_a{i}"), FOLDABLE[agg.function]
        if agg.function == "avg":
            flat[f"_a{i}s"], flat[f"_a{i}n"] = pc.struct_field(col, "s"), pc.struct_field(col, "n")
            aggs += [(f"_a{i}s", "sum"), (f"_a{i}n", "sum")]
        else:
            flat[f"_a{i}"] = col        # a SUM of only nulls stays null (min_count=1)
            aggs.append((f"_a{i}", how, pc.ScalarAggregateOptions(min_count=1)))
    grouped = pa.table(flat).group_by(keys, use_threads=False).aggregate(aggs)
    out = {k: grouped.column(k) for k in keys}
    for i, agg in enumerate(table.aggregates):
        if agg.function == "avg":
            out[f"_a{i}"] = pa.StructArray.from_arrays(
                [grouped.column(f"_a{i}s_sum").combine_chunks(), grouped.column(f"_a{i}n_sum").combine_chunks()],
                names=["s", "n"])
        else:
            out[f"_a{i}"] = grouped.column(f"_a{i}_{FOLDABLE[agg.function]}")
    return pa.table(out)


def folded(held: list[pa.Table], table: TableDefinition) -> pa.Table:
    """`held` partials as one table, folded (combine_partials) when there are several."""
    return held[0] if len(held) == 1 else combine_partials(pa.concat_tables(held, promote_options="permissive"), table)
