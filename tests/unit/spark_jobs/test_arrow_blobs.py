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
