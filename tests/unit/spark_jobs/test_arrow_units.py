"""Column-wise encoders against the row-by-row code they replace: the same bytes, the same JSON.

The merge tasks encode keys and build mirror rows a column at a time (a million-key batch made
the per-row versions the slowest step). These pure-logic tests hold them to the per-row results,
on the awkward values too: escapes, non-ASCII, nulls, NaN, big and negative integers."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from state import codec
from spark_jobs.delta import mirror
from catalog import definitions
from spark_jobs.frames.arrow_keys import encoded_keys
from catalog.mapping import row_of, state_spec


def _table(tmp_path, sql: str):
    path = tmp_path / "t.sql"
    path.write_text(sql)
    return definitions.parse(path)


@pytest.mark.parametrize("columns", [
    {"_k0": pa.array(["a", "b\x00c", "é", "", "\"\\"])},
    {"_k0": pa.array(["a", "b", "c"]), "_k1": pa.array([1, -2, 2 ** 30], pa.int32())},
    {"_k0": pa.array([-2 ** 63, 2 ** 63 - 1, 0])},
    {"_k0": pa.array(["a", None])},                      # nulls: the per-row codec
    {"_k0": pa.array([True, False])},                    # another type: the per-row codec
])
def test_encoded_keys_are_the_codecs_bytes(columns):
    table = pa.table({**columns, "_a0": pa.array(range(len(next(iter(columns.values())))))})
    rows = zip(*[table.column(c).to_pylist() for c in columns])
    assert encoded_keys(table) == [codec.encode_key(key) for key in rows]


AGGREGATE = """-- topic: t1
-- schema: k STRING, j BIGINT, v DOUBLE, w BIGINT
-- partitions: 2
CREATE TABLE t AS SELECT k, j, COUNT(v) AS n, SUM(w) AS s, AVG(v) AS a, MAX(v) AS m FROM events GROUP BY k, j;
"""
COMPUTED = """-- topic: t3
-- schema: k STRING, w BIGINT, v DOUBLE
-- partitions: 2
CREATE TABLE c AS SELECT k, COUNT(*) AS n, CAST(SUM(w) / COUNT(*) AS BIGINT) AS avg_w, MAX(v) * 2 AS m2,
CONCAT(k, '!') AS tag FROM events GROUP BY k;
"""
LATEST = """-- topic: t4
-- schema: k BIGINT, s STRING, v DOUBLE
-- partitions: 2
CREATE TABLE l AS SELECT k, LATEST_BY_OFFSET(s) AS s, LATEST_BY_OFFSET(v, false) AS v FROM events GROUP BY k;
"""
SOURCE = """-- topic: t2
-- schema: id BIGINT, name STRING, score DOUBLE
-- partitions: 2
CREATE TABLE p (id BIGINT PRIMARY KEY, name STRING, score DOUBLE);
"""


@pytest.mark.parametrize("sql, keys, values", [
    (AGGREGATE, [("a", 1), ('b"x', 2), ("é", -3), ("", 0)],
     [(1, 5, (2.5, 1), 2.5), (2, None, (float("nan"), 2), float("inf")), (3, 2 ** 62, (0, 0), None), None]),
    (AGGREGATE, [("a", 1)], [None]),
    (AGGREGATE, [], []),
    # computed columns over hidden aggregates (SUM, MAX) and the key; NaN, None and big values
    (COMPUTED, [("a",), ('b"é',), ("c",), ("d",), ("e",)],
     [(3, 10, 1.5), (1, None, float("nan")), None, (2, 2 ** 62, None), (4, -7, float("-inf"))]),
    (COMPUTED, [("a",)], [None]),
    # LATEST_BY_OFFSET's (order, value) states: a value, a NULL value kept, no state yet, a gone key
    (LATEST, [(1,), (2,), (3,), (4,)], [((5, "x\n"), (6, 1.5)), ((7, "é"), (8, None)), (None, (9, float("nan"))), None]),
    (SOURCE, [(1,), (2,), (3,)], [(1, "Ann", 1.5), None, (3, "Bo\\b\n", None)]),
    (SOURCE, [(1,), (2,)], [(1, "Ann", 1), (2, "x", 2.0)]),
])
def test_mirror_change_rows_are_the_json_of_row_of(tmp_path, sql, keys, values):
    table = _table(tmp_path, sql)
    mirror.write_changes(str(tmp_path), table, 3, 0, keys, values, state_spec(table).aggregator)
    got = pq.read_table(tmp_path / mirror.change_file(3, 0)).to_pylist()
    assert got == [{"key": json.dumps(list(k), default=str), "row": json.dumps(row_of(table, k, v), default=str),
                    "batch_id": 3, "deleted": v is None} for k, v in zip(keys, values)]


def _kafka_batch(values: list, start: int) -> pa.RecordBatch:
    """Records shaped as Spark's Kafka source hands them to mapInArrow."""
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(start, start + n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([json.dumps(v).encode() for v in values], pa.binary())})


@pytest.mark.parametrize("fold_rows", [4, 1 << 19])
def test_a_pass_task_folds_its_partials_to_one_row_per_key(tmp_path, monkeypatch, fold_rows):
    """Partials of several Arrow batches leave a task folded (one row per key, whether the task
    folds once at its end or several times on the way), and equal pandas over the same events."""
    import pandas as pd
    from spark_jobs.frames import arrow_pass

    monkeypatch.setattr(arrow_pass, "FOLD_ROWS", fold_rows)
    table = _table(tmp_path, AGGREGATE)
    events = [{"k": f"k{i % 3}", "j": i % 2, "v": float(i) if i % 5 else None, "w": i * 10} for i in range(60)]
    batches = [_kafka_batch(events[i:i + 7], i) for i in range(0, len(events), 7)]
    spec = arrow_pass.PassSpec(table, 0, now_ms=1_800_000_000_000, watermark_ms=None, bronze=None)
    out = pa.Table.from_batches(list(arrow_pass.run(spec, iter(batches))))
    blobs = out.filter(pa.compute.equal(out.column("_kind"), "blob"))
    assert blobs.num_rows and not pa.compute.any(pa.compute.equal(out.column("_kind"), "partial")).as_py()
    partials = arrow_pass.partials_of(blobs.select(["_kind", "value"]).rename_columns(["_kind", "_blob"]), table)
    got = {(r["_k0"], r["_k1"]): (r["_a0"], r["_a1"], r["_a2"]["s"], r["_a2"]["n"], r["_a3"])
           for r in partials.to_pylist()}
    if fold_rows > len(events):
        assert partials.num_rows == len(got) == 6, "one row per key when the task folds once"
    frame = pd.DataFrame(events)
    expected = {(k, j): (int(g.v.count()), int(g.w.sum()), float(g.v.sum()), int(g.v.count()), float(g.v.max()))
                for (k, j), g in frame.groupby(["k", "j"])}
    from spark_jobs.frames.arrow_fold import combine_partials

    folded = combine_partials(partials.select([c for c in partials.column_names if c[:2] in ("_k", "_a")]),
                                         table)
    refolded = {(r["_k0"], r["_k1"]): (r["_a0"], r["_a1"], r["_a2"]["s"], r["_a2"]["n"], r["_a3"])
                for r in folded.to_pylist()}
    assert {k: (n, int(s), a_s, a_n, m) for k, (n, s, a_s, a_n, m) in refolded.items()} == expected


def _looks_like_object_per_value(raw: bytes | None) -> bool:
    return raw is not None and raw[:1] == b"{" and raw[-1:] == b"}" and b"\n" not in raw


@pytest.mark.parametrize("seed", range(40))
def test_which_values_the_block_reader_may_take_is_read_off_the_buffers_as_per_value(seed):
    """arrow_values.looks_like_object reads the array's offsets and bytes with numpy: the same
    answer as a per-value check, on slices (an offset into the buffers), large_binary, nulls and
    empty values."""
    import random

    from spark_jobs.frames.arrow_values import looks_like_object

    rng = random.Random(seed)
    pieces = [b"{", b"}", b"\n", b"a", b"\"", b"\xc3\xa9", b""]
    values = [None if rng.random() < 0.1 else b"".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
              for _ in range(rng.randrange(60))]
    for kind in (pa.binary(), pa.large_binary()):
        whole = pa.array(values, kind)
        for part, raw in ((whole, values), (whole.slice(3, 40), values[3:43])):
            assert looks_like_object(part).to_pylist() == [_looks_like_object_per_value(v) for v in raw]


def test_only_values_nested_past_the_limit_are_rejected_and_short_ones_are_not_counted():
    from spark_jobs.frames.arrow_values import MAX_JSON_DEPTH, nesting_rejects

    deep = b"{" + b'"a":[' * (MAX_JSON_DEPTH + 1) + b"1" + b"]" * (MAX_JSON_DEPTH + 1) + b"}"
    at_limit = b'{"a":' + b"[" * (MAX_JSON_DEPTH - 1) + b"1" + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    in_a_string = b'{"s":"' + b"[" * (MAX_JSON_DEPTH + 5) + b'"}'
    values = pa.array([b'{"a":1}', deep, None, at_limit, in_a_string, b"[" * (MAX_JSON_DEPTH + 1)], pa.binary())
    assert nesting_rejects(values) == [1, 5]
    assert nesting_rejects(values.slice(1)) == [0, 4]


@pytest.mark.parametrize("pattern", ["yyyy-MM-dd", "yyyyMMdd", "dd.MM/yyyy", "yyyy", "MM", "yyyy-MM"])
def test_a_date_only_date_format_is_cut_from_the_day_as_strftime_writes_it(pattern):
    """A DATE_FORMAT of date fields takes the day's text, not strftime: the same strings for
    times before 1970, in year 1 and past year 9999 (the slices count from the end)."""
    import numpy as np
    import pyarrow.acero as acero
    import pyarrow.compute as pc

    from spark_jobs.frames.arrow_where import value_expression

    seconds = np.concatenate([[253402300800, 253402300799, -62135596800, 400000000000, -1, 0],
                              np.random.default_rng(5).integers(-62_000_000_000, 300_000_000_000, 5000)])
    micros = seconds * 1_000_000 + np.random.default_rng(6).integers(0, 1_000_000, len(seconds))
    times = pa.table({"t": pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
    expression = value_expression(f"DATE_FORMAT(t, '{pattern}')", {"t": "TIMESTAMP"})
    assert "strftime" not in str(expression)
    ours = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(times)),
        acero.Declaration("project", acero.ProjectNodeOptions([expression], ["v"]))]).to_table(use_threads=False)
    codes = pattern.replace("yyyy", "%Y").replace("MM", "%m").replace("dd", "%d")
    whole = pa.array(seconds, pa.int64()).cast(pa.timestamp("s", tz="UTC"))
    assert ours.column("v").to_pylist() == pc.strftime(whole, codes).to_pylist()
