"""table_join._stream_rows_put: a stream's rows and index entries, built column by column, are the
bytes the per-row codec writes (so a stage written either way has the same entries and digest)."""
import pyarrow as pa

from state import codec
from spark_jobs.steps.table_join import _stream_rows_put
from spark_jobs.steps.table_stages import INDEX


class _Puts:
    def __init__(self):
        self.entries = {}

    def put_raw(self, key: bytes, raw: bytes) -> None:
        self.entries[key] = raw


class _Shape:
    fk = 1


def _partials(**columns) -> pa.Table:
    n = len(next(iter(columns.values())))
    return pa.table({"_k0": [f"{i % 3}:{i}" for i in range(n)], "_del": [False] * n, **columns})


def _per_row(partials: pa.Table) -> dict:
    """What the per-row path of merge_join puts for the same rows."""
    out = {}
    values = [c for c in partials.column_names if c.startswith("_v")]
    for row in partials.to_pylist():
        a_key, value = row["_k0"], tuple(row[c] for c in values)
        if value[_Shape.fk] is not None:
            out[codec.encode_key((INDEX, value[_Shape.fk], a_key))] = codec.encode_value(())
        out[codec.encode_key((a_key,))] = codec.encode_value(value)
    return out


def test_rows_of_strings_ints_booleans_and_nulls_are_the_codec_s_bytes():
    partials = _partials(_v0=pa.array([7, None, -3, 2 ** 62], pa.int64()), _v1=pa.array([10, 11, None, 10], pa.int64()),
                         _v2=pa.array(["https://x/y?z=1", None, "a\x00b", ""]), _v3=pa.array([True, None, False, True]),
                         _v4=pa.array([1, 2, 3, None], pa.int32()))
    keys = [codec.encode_key((k,)) for k in partials.column("_k0").to_pylist()]
    tx = _Puts()
    assert _stream_rows_put(tx, partials, keys, _Shape())
    assert tx.entries == _per_row(partials)
    assert sum(k.startswith(codec.encode_key((INDEX,))) for k in tx.entries) == 3, "no index entry for a NULL fk"


def test_a_column_the_arrow_encoding_does_not_cover_leaves_the_rows_to_the_per_row_path():
    partials = _partials(_v0=pa.array([1.5, 2.5]), _v1=pa.array([1, 2], pa.int64()))
    tx = _Puts()
    assert not _stream_rows_put(tx, partials, [codec.encode_key((k,)) for k in partials.column("_k0").to_pylist()],
                                _Shape())
    assert tx.entries == {}
