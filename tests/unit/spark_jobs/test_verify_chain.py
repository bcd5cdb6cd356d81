"""verify_chain.advance: the expected state at N from the checkpoint at M and the partials of
the batches since, kept encoded (pure logic; the chained verify itself runs in
tests/test_chained_verify.py on a real stack)."""
from __future__ import annotations

import pyarrow as pa

from spark_jobs.delta import verify_chain
from state import codec


def _table(rows: dict) -> pa.Table:
    keys = sorted(rows, key=codec.encode_key)
    return pa.table({"key": pa.array([codec.encode_key(k) for k in keys], pa.binary()),
                     "value": pa.array([codec.encode_value(rows[k]) for k in keys], pa.binary())})


def _decoded(table: pa.Table) -> dict:
    return {codec.decode_key(k): codec.decode_value(v)
            for k, v in zip(table.column("key").to_pylist(), table.column("value").to_pylist())}


def test_advance_merges_changed_keys_adds_new_ones_and_keeps_the_rest_byte_for_byte():
    checkpoint = _table({("a",): (2, 10.5), ("b",): (1, 3.0), ("c",): (4, 1.0)})

    def merge(stored, partial):
        return partial if stored is None else (stored[0] + partial[0], stored[1] + partial[1])

    advanced = verify_chain.advance(checkpoint, [("b",), ("d",)], [(2, 1.5), (1, 7.0)], merge)
    assert _decoded(advanced) == {("a",): (2, 10.5), ("b",): (3, 4.5), ("c",): (4, 1.0), ("d",): (1, 7.0)}
    keys = advanced.column("key").to_pylist()
    assert len(keys) == len(set(keys)) == 4
    untouched = {k: v for k, v in zip(checkpoint.column("key").to_pylist(), checkpoint.column("value").to_pylist())}
    for key, value in zip(keys, advanced.column("value").to_pylist()):
        if codec.decode_key(key) in (("a",), ("c",)):
            assert value == untouched[key]


def test_advance_with_nothing_changed_is_the_checkpoint_and_a_merge_to_none_removes_the_key():
    checkpoint = _table({("a",): 1, ("b",): 2})
    assert _decoded(verify_chain.advance(checkpoint, [], [], lambda s, p: p)) == {("a",): 1, ("b",): 2}
    assert _decoded(verify_chain.advance(checkpoint, [("a",)], [None], lambda s, p: p)) == {("b",): 2}
