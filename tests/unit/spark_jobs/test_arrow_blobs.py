"""arrow_blobs: rows cut into IPC blobs by state partition, and read back whole."""
import pyarrow as pa
import pytest

from spark_jobs.frames import arrow_blobs


def _rows(n: int) -> pa.Table:
    return pa.table({"_k0": pa.array([f"key-{i}" for i in range(n)]), "_a0": pa.array(range(n), pa.int64()),
                     "_a1": pa.array([("x" * (i % 50)) if i % 7 else None for i in range(n)])})


@pytest.mark.parametrize("limit", [1, 600, 1 << 20])
def test_each_partition_s_rows_come_back_whole_in_order_and_no_blob_is_much_over_its_limit(limit):
    rows = _rows(300)
    partitions = pa.array([(i * 7) % 4 if i % 11 else 2 for i in range(300)], pa.int32())
    blobs = list(arrow_blobs.split(rows, partitions, limit=limit))
    assert [sp for sp, _ in blobs] == sorted(sp for sp, _ in blobs), "in partition order"
    for sp in range(4):
        mine = [b for p, b in blobs if p == sp]
        back = pa.concat_tables(arrow_blobs.opened(mine))
        assert back.schema == rows.schema
        assert back.to_pylist() == [r for r, p in zip(rows.to_pylist(), partitions.to_pylist()) if p == sp]
        if limit == 1:      # every row wider than the limit: one row a blob
            assert len(mine) == back.num_rows
        elif limit == 600:  # a few rows a blob, each near its limit (an IPC stream's schema is extra)
            assert len(mine) > 1
            assert max(t.nbytes for t in arrow_blobs.opened(mine)) <= 2 * limit
        else:
            assert len(mine) == 1


def test_no_rows_no_blobs():
    assert list(arrow_blobs.split(_rows(0), pa.array([], pa.int32()))) == []


def test_a_merge_task_s_rows_are_its_blobs_rows_never_the_rows_that_carried_them():
    """table_join tags every row it hands on `partial`, blob rows too: rows_of opens the blobs and
    leaves out the rows that carried them (they would be rows of null keys), and the markers."""
    from spark_jobs.frames.arrow_blobs import rows_of

    rows = pa.table({"_k0": ["0:1", "0:2", "1:7"], "_del": [False] * 3, "_v0": pa.array([5, 6, 7], pa.int64())})
    blobs = [b for _, b in arrow_blobs.split(rows, pa.array([3, 3, 3], pa.int32()), limit=1)]
    group = pa.table({"_kind": ["partial"] * len(blobs) + ["marker"], "_sp": pa.array([3] * (len(blobs) + 1), pa.int32()),
                      "_blob": pa.array(blobs + [None], pa.binary())})
    assert rows_of(group).to_pylist() == rows.to_pylist()
    assert rows_of(group.slice(len(blobs))).num_rows == 0


def test_a_partition_the_batch_gave_no_partials_gets_an_empty_table_of_the_partial_columns(tmp_path):
    """A merge task with only its marker still commits (purges, TTL): its partials are an empty
    table with the key and aggregate columns, whose change rows are built from them."""
    from catalog.definitions import parse
    from spark_jobs.frames.arrow_pass import partials_of

    path = tmp_path / "t.sql"
    path.write_text("-- topic: t\n-- schema: k STRING, v BIGINT\nCREATE TABLE t AS SELECT k, SUM(v) AS s, "
                    "LATEST_BY_OFFSET(v) AS l FROM t_events GROUP BY k;")
    table = parse(path)
    group = pa.table({"_kind": ["marker"], "_sp": pa.array([0], pa.int32()), "_blob": pa.array([None], pa.binary())})
    empty = partials_of(group, table)
    assert empty.num_rows == 0 and empty.column_names == ["_k0", "_a0", "_a1"]
