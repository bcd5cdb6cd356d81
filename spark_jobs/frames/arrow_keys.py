"""Generic Arrow helpers every stage uses: a partial's key columns and their state-codec bytes,
the state partition of each row, and Parquet files written whole or not at all."""
from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import codec
from state.table import partition_of

def key_columns(partials: pa.Table) -> list[str]:
    """The key columns of partials, in order (_k0, _k1, ...; the window start last)."""
    return sorted((c for c in partials.column_names if c[:2] == "_k" and c[2:].isdigit()), key=lambda c: int(c[2:]))


_STR_TAG = codec.encode_key(("",))[:1]      # the codec's tags, taken from the codec itself
_INT_TAG = codec.encode_key((0,))[:1]
_NO_SEPARATOR = pa.scalar(b"")


def _encoded_column(column) -> pa.Array | None:
    """One key column in the codec's bytes, or None when it needs the per-row codec (nulls, or a
    type other than string and integer)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        return None
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        body = pc.replace_substring(column.cast(pa.binary()), b"\x00", b"\x00\xff")
        return pc.binary_join_element_wise(pa.scalar(_STR_TAG), body, pa.scalar(b"\x00"), _NO_SEPARATOR)
    if pa.types.is_integer(kind) and kind != pa.uint64():
        # the tag and the biased big-endian int as one 9-byte record a row, laid out in numpy
        biased = (column.cast(pa.int64()).to_numpy().view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
        records = np.empty((len(column), 9), np.uint8)
        records[:, 0] = _INT_TAG[0]
        records[:, 1:] = biased.view(np.uint8).reshape(-1, 8)
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(9), len(column),
                                                    [None, pa.py_buffer(records.tobytes())]).cast(pa.binary())
    return None


_VALUE_HEAD = pa.scalar(codec.encode_value(("",))[:2])     # the format version and the tuple's tag
_VALUE_END = pa.scalar(codec.encode_value(())[-1:])
_NONE = pa.scalar(codec.encode_value((None,))[2:-1])
_TRUE, _FALSE = (pa.scalar(codec.encode_value((b,))[2:-1]) for b in (True, False))


def _encoded_element(column) -> pa.Array | None:
    """A value column's elements in the codec's bytes, NULL as its None (None: a type the
    per-row codec takes)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_boolean(column.type):
        body = pc.if_else(column, _TRUE, _FALSE)
    elif pa.types.is_null(column.type):
        return pa.repeat(_NONE, len(column))
    else:
        body = _encoded_column(pc.fill_null(column, "" if pa.types.is_string(column.type) or
                                            pa.types.is_large_string(column.type) else 0)) \
            if column.null_count else _encoded_column(column)
    if body is None:
        return None
    return pc.if_else(pc.is_valid(column), body, _NONE) if column.null_count else body


def encoded_values(rows: pa.Table) -> list[bytes] | None:
    """`codec.encode_value` of each row as a tuple of its columns, built column by column in
    Arrow for strings, integers, booleans and NULLs (the same bytes; a join of tables stores a
    stream's 460,000 rows a task, 2 us a row one by one); None when a column is of another type."""
    parts = [_encoded_element(rows.column(c)) for c in rows.column_names]
    if any(part is None for part in parts):
        return None
    return pc.binary_join_element_wise(_VALUE_HEAD, *parts, _VALUE_END, _NO_SEPARATOR).to_pylist()


def encoded_keys(partials: pa.Table) -> list[bytes]:
    """`codec.encode_key` of every row's key. String and integer key columns are encoded column by
    column in Arrow: a merge task of a million-key batch encodes each key twice, and one Python
    encode per key cost seconds. Other key types take the codec row by row; the bytes are the same."""
    if not partials.num_rows:
        return []
    names = key_columns(partials)
    parts = [_encoded_column(partials.column(c)) for c in names]
    if any(part is None for part in parts):
        return [codec.encode_key(key) for key in zip(*[partials.column(c).to_pylist() for c in names])]
    return pc.binary_join_element_wise(*parts, _NO_SEPARATOR).to_pylist()


def state_partitions(partials: pa.Table, partitions: int, width: int | None = None) -> pa.Array:
    """Each partial's state partition: crc32 of its encoded key, or of its first `width` key parts
    (the state library's rule, TableSpec.route)."""
    if width:
        partials = partials.select(key_columns(partials)[:width])
    return pa.array([partition_of(key, partitions) for key in encoded_keys(partials)], pa.int32())


def with_state_partition(partitions: int, batches, width: int | None = None):
    """mapInArrow body for the Spark-SQL pass's partials: each row with its state partition `_sp`."""
    for batch in batches:
        table = pa.Table.from_batches([batch])
        yield from table.append_column("_sp", state_partitions(table, partitions, width)).to_batches()


_TUPLE_TAG = pa.scalar(codec.encode_value(((),))[2:3])      # a nested tuple's opening tag
LATEST = ("latest_by_offset", "latest_keeping_nulls")


def encoded_latest(partials: pa.Table, functions: list[str]) -> list[bytes] | None:
    """`codec.encode_value` of each row's partials when every aggregate keeps the latest value
    (LATEST_BY_OFFSET: a struct of order `o` and value `v`; the partial is (o, v), None without an
    order), built column by column in Arrow: the same bytes as the per-row codec, which cost a
    merge task of Nexmark q18 (five of them a key) seconds. None when an aggregate is of another
    kind or a value of a type the column-wise codec does not take."""
    if not partials.num_rows or not functions or any(f not in LATEST for f in functions):
        return None
    parts = []
    for order, value in _latest_fields(partials, len(functions)):
        if not pa.types.is_integer(order.type):
            return None
        encoded = [_encoded_element(order), _encoded_element(value)]
        if encoded[1] is None:
            return None
        if order.null_count:
            pair = pc.binary_join_element_wise(_TUPLE_TAG, *encoded, _VALUE_END, _NO_SEPARATOR)
            parts.append(pc.if_else(pc.is_valid(order), pair, _NONE))
        else:       # one join of every piece below: a join a pair cost as much as the pieces
            parts += [_TUPLE_TAG, *encoded, _VALUE_END]
    return pc.binary_join_element_wise(_VALUE_HEAD, *parts, _VALUE_END, _NO_SEPARATOR).to_pylist()


def latest_results(partials: pa.Table, functions: list[str]) -> list[pa.Array]:
    """The value each LATEST_BY_OFFSET partial shows (its `v`, NULL without an order), column by
    column: a key's row when the partial is its whole state."""
    return [pc.if_else(pc.is_valid(order), value, pa.scalar(None, value.type)) if order.null_count else value
            for order, value in _latest_fields(partials, len(functions))]


def _latest_fields(partials: pa.Table, count: int):
    """Each LATEST_BY_OFFSET partial column's order and value arrays (_a0.., one chunk each)."""
    for i in range(count):
        column = partials.column(f"_a{i}")
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        yield pc.struct_field(column, "o"), pc.struct_field(column, "v")
