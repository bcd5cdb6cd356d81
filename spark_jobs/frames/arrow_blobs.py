"""Rows handed from a pass task to the merge tasks as Arrow IPC blobs, one a state partition.

A pass task's rows that only a merge task reads (an aggregate's partials, a windowed join's side)
cross Spark whole: Spark caches and shuffles a blob as the bytes it is, where rows are converted
field by field into the JVM's rows and back into Arrow (Nexmark q18's 1.05M partials of five
(offset, value) pairs with the bid's url and extra: the cache, the shuffle and the conversions
were seconds of its merge; q4's bids read in 8.4 s as rows against 4.2 s for the same parse
without them). The rows stay in the pass's Arrow types, so the merge task reads what the pass
wrote.
"""
from __future__ import annotations

from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BLOB", "BLOB_BYTES", "handed_on", "opened", "rows_of", "split"]

BLOB = "blob"       # the `_kind` of a pass's output row that holds a blob (in `value`), with its `_sp`

# A blob's rows are cut in parts of at most this many bytes: Spark holds a blob as one binary
# value (a JVM array, under 2 GiB, and one row of its cache and shuffle), and a pass task's
# partials of wide values (TOPK of long strings) may pass that.
BLOB_BYTES = 64 << 20


def split(rows: pa.Table, partitions: pa.Array, limit: int = BLOB_BYTES) -> Iterator[tuple[int, bytes]]:
    """(state partition, IPC stream of its rows), in partition order, each at most about `limit`
    bytes (a row wider than `limit` goes alone)."""
    for sp in sorted(pc.unique(partitions).to_pylist()):
        part = rows.filter(pc.equal(partitions, sp))
        pieces = max(1, -(-part.nbytes // limit))
        step = -(-part.num_rows // pieces)
        for start in range(0, part.num_rows, step):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part.slice(start, step))
            yield sp, sink.getvalue().to_pybytes()


def opened(blobs: list[bytes]) -> list[pa.Table]:
    """The tables of `split`'s blobs (zero-copy reads over the bytes)."""
    return [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]


def handed_on(rows: pa.Table, partitions: pa.Array) -> Iterator[pa.Table]:
    """A pass's output rows for `rows`: one a blob (`split`), `_kind` BLOB, its `_sp` and `value`."""
    for sp, blob in split(rows, partitions):
        yield pa.table({"_kind": [BLOB], "_sp": pa.array([sp], pa.int32()), "value": pa.array([blob], pa.binary())})


def rows_of(group: pa.Table, empty: Callable[[], pa.Schema] | None = None) -> pa.Table:
    """A merge task's rows: the `_kind` "partial" rows Spark handed on (as they are, when it
    handed on no blobs), and the blobs (`_blob`) opened; a row that carried a blob is none of
    them (a step may tag every row it hands on "partial"), and neither is a marker. `empty`: the
    columns of what a task given blobs but none for it returns (asked only then)."""
    rows = group.filter(pc.equal(group.column("_kind"), "partial"))
    if "_blob" not in group.column_names:
        return rows
    is_blob = pc.is_valid(group.column("_blob"))
    tables = opened(group.column("_blob").filter(is_blob).to_pylist())
    rows = group.filter(pc.and_(pc.equal(group.column("_kind"), "partial"), pc.invert(is_blob)))
    rows = rows.drop_columns([c for c in ("_kind", "_sp", "_blob") if c in rows.column_names])
    if rows.num_rows or not tables:
        tables.append(empty().empty_table() if empty is not None and not rows.num_rows else rows)
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
