"""LATEST_BY_OFFSET partials encoded column by column (arrow_keys.encoded_latest) are the per-row
codec's bytes, and a merge task's change rows read from their columns are the rows decoded."""
from types import SimpleNamespace

import pyarrow as pa

from state import codec
from state.backends import MemoryBackend
from state.partition import StatePartition
from spark_jobs.frames.arrow_keys import encoded_latest
from spark_jobs.steps.merge_task import _changed_rows, partial_values

LATEST = pa.struct([("o", pa.int64()), ("v", pa.string())])
LATEST_INT = pa.struct([("o", pa.int64()), ("v", pa.int64())])


def _table(tmp_path, aggregates: str):
    from catalog.definitions import parse

    path = tmp_path / "t.sql"
    path.write_text(f"-- topic: t\n-- schema: k STRING, s STRING, n BIGINT, d DOUBLE\nCREATE TABLE t AS SELECT k, "
                    f"{aggregates} FROM t_events GROUP BY k;")
    return parse(path)


def _partials(keys, strings, ints) -> pa.Table:
    return pa.table({"_k0": pa.array(keys), "_a0": pa.array(strings, LATEST), "_a1": pa.array(ints, LATEST_INT)})


PARTIALS = _partials(["a", "b", "c", "d", "e"],
                     [{"o": 1, "v": "x\x00y"}, {"o": None, "v": None}, None, {"o": 5, "v": None}, {"o": -3, "v": ""}],
                     [{"o": 1, "v": 7}, {"o": 2, "v": None}, {"o": 3, "v": -9}, None, {"o": 4, "v": 2 ** 62}])


def test_latest_partials_encoded_by_column_are_the_codec_s_bytes_nulls_and_nul_bytes_included(tmp_path):
    table = _table(tmp_path, "LATEST_BY_OFFSET(s, false) AS s, LATEST_BY_OFFSET(n) AS n")
    functions = [a.function for a in table.aggregates]
    assert encoded_latest(PARTIALS, functions) == [codec.encode_value(v) for v in partial_values(table, PARTIALS)]


def test_another_aggregate_or_a_value_type_the_columns_do_not_encode_leaves_the_per_row_codec(tmp_path):
    assert encoded_latest(PARTIALS, ["latest_by_offset", "sum"]) is None
    doubles = pa.table({"_k0": ["a"], "_a0": pa.array([{"o": 1, "v": 1.5}], pa.struct([("o", pa.int64()),
                                                                                        ("v", pa.float64())]))})
    assert encoded_latest(doubles, ["latest_by_offset"]) is None
    assert encoded_latest(PARTIALS.slice(0, 0), ["latest_by_offset"] * 2) is None


def test_change_rows_read_from_the_partials_columns_equal_the_rows_decoded(tmp_path):
    """Batch 0: every key new, so the rows come from the Arrow columns; they must equal the rows
    built from the decoded states. Batch 1: keys held, so the merged values are decoded as ever."""
    from catalog.mapping import state_spec
    from spark_jobs.frames.arrow_keys import encoded_keys

    table = _table(tmp_path, "LATEST_BY_OFFSET(s, false) AS s, LATEST_BY_OFFSET(n) AS n")
    ctx, aggregator = SimpleNamespace(table=table), state_spec(table).aggregator
    part = StatePartition("t", 0, MemoryBackend(), aggregator=aggregator)
    later = _partials(["a", "f"], [{"o": 9, "v": "new"}, {"o": 1, "v": "f"}], [{"o": 0, "v": 1}, {"o": 2, "v": 3}])
    for batch_id, partials in enumerate((PARTIALS, later)):
        keys = encoded_keys(partials)
        tx = part.begin(batch_id)
        for key, raw in zip(keys, encoded_latest(partials, [a.function for a in table.aggregates])):
            tx.merge_raw(key, raw)
        result = tx.commit()
        last = {key: row for row, key in enumerate(keys)}
        fast = _changed_rows(ctx, aggregator, part, partials, last, result.changes, result.values, raw=True)
        decoded = {k: codec.decode_value(v) for k, v in result.changes.items() if v is not None}
        slow = _changed_rows(ctx, aggregator, part, partials, last, result.changes, decoded)
        assert fast.to_pylist() == slow.to_pylist()
        assert fast.num_rows == len(result.changes) == (5 if batch_id == 0 else 2)
    rows = {r["key"]: r["row"] for r in fast.to_pylist()}
    assert rows['["a"]'] == '{"k": "a", "s": "new", "n": 7}', "a's n stays the one of the higher order"


def test_change_rows_of_keys_new_held_and_twice_in_the_partials_decode_nothing(tmp_path, monkeypatch):
    """One batch with a held key, a new key twice (its partials merged in the transaction) and new
    keys once: the new ones' rows come from the Arrow columns, the merged ones' from the commit's
    values; none is decoded, and the rows equal the rows decoded."""
    from catalog.mapping import state_spec
    from spark_jobs.frames.arrow_keys import encoded_keys

    table = _table(tmp_path, "LATEST_BY_OFFSET(s, false) AS s, LATEST_BY_OFFSET(n) AS n")
    ctx, aggregator = SimpleNamespace(table=table), state_spec(table).aggregator
    part = StatePartition("t", 0, MemoryBackend(), aggregator=aggregator)
    functions = [a.function for a in table.aggregates]
    held = _partials(["a"], [{"o": 1, "v": "x"}], [{"o": 1, "v": 1}])
    tx = part.begin(0)
    tx.merge_raw_many(encoded_keys(held), encoded_latest(held, functions))
    tx.commit()
    partials = _partials(["a", "g", "h", "g", "i"],
                         [{"o": 5, "v": "a2"}, {"o": 2, "v": "g1"}, {"o": 3, "v": "h"}, {"o": 8, "v": "g2"}, None],
                         [{"o": 5, "v": 5}, {"o": 9, "v": 9}, {"o": 3, "v": None}, {"o": 8, "v": 8}, {"o": 1, "v": 0}])
    keys = encoded_keys(partials)
    tx = part.begin(1)
    tx.merge_raw_many(keys, encoded_latest(partials, functions))
    result = tx.commit()
    assert set(result.values) == {codec.encode_key(("a",)), codec.encode_key(("g",))}
    last = {key: row for row, key in enumerate(keys)}
    decoded = {k: codec.decode_value(v) for k, v in result.changes.items() if v is not None}
    slow = _changed_rows(ctx, aggregator, part, partials, last, result.changes, decoded)

    def refused(_raw):
        raise AssertionError("a change row was decoded")
    monkeypatch.setattr(codec, "decode_value", refused)
    fast = _changed_rows(ctx, aggregator, part, partials, last, result.changes, result.values, raw=True)
    assert fast.to_pylist() == slow.to_pylist(), "the same rows, in the partials' order"
    rows = {r["key"]: r["row"] for r in fast.to_pylist()}
    assert rows['["g"]'] == '{"k": "g", "s": "g2", "n": 9}' and rows['["i"]'] == '{"k": "i", "s": null, "n": 0}'
    assert len(rows) == 4


def test_a_source_table_s_batch_of_deletes_only_is_deletes_in_its_change_rows(tmp_path):
    """A table of rows keeps no Python value of a delete (CommitResult.values is empty for a batch of
    deletes only): its change rows are deletes, never rows read from the partials' columns."""
    from catalog.definitions import parse
    from spark_jobs.frames.arrow_keys import encoded_keys

    path = tmp_path / "c.sql"
    path.write_text("CREATE TABLE c (id BIGINT PRIMARY KEY, tier STRING) WITH (topic='c');")
    table = parse(path)
    part = StatePartition("c", 0, MemoryBackend())
    tx = part.begin(0)
    tx.put((1,), ("gold",))
    tx.commit()
    partials = pa.table({"_k0": pa.array([1], pa.int64()), "_del": [True], "_v0": pa.array([None], pa.string())})
    keys = encoded_keys(partials)
    tx = part.begin(1)
    tx.delete_encoded(keys[0])
    result = tx.commit()
    assert result.values == {}
    for raw in (False, True):
        rows = _changed_rows(SimpleNamespace(table=table), None, part, partials, {keys[0]: 0}, result.changes,
                             result.values, raw=raw)
        assert rows.column("deleted").to_pylist() == [True]
