"""A stream joined with a table (table_join), its column-by-column paths against the per-row ones:
the rows stage's entries (_stream_rows_put: one entry a record, its row in its index entry), the
joined rows (_own_rows_joined against JoinShape.row), and the index read back from a stage that
holds either layout (indexed). The bytes are the codec's, so a stage or a table written either way
has the same entries and digest."""
import random

import pyarrow as pa
import pytest

from state import codec
from state.backends import MemoryBackend
from state.partition import StatePartition
from spark_jobs.steps.table_join import JoinShape, _batch_side, _own_rows_joined, _stream_rows_put, indexed
from spark_jobs.steps.table_stages import INDEX, ROWS_BY_FK


class _Puts:
    """What a transaction is given: key -> bytes, or None for a delete."""

    def __init__(self):
        self.entries = {}

    def put_raw(self, key: bytes, raw: bytes) -> None:
        self.entries[key] = raw

    def put_raw_many(self, keys: list, raws: list) -> None:
        self.entries.update(zip(keys, raws))

    def delete_encoded(self, key: bytes) -> None:
        self.entries[key] = None


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
            out[codec.encode_key((ROWS_BY_FK, value[_Shape.fk], a_key))] = codec.encode_value(value)
    return out


def test_a_stream_s_rows_are_one_entry_each_in_the_codec_s_bytes():
    partials = _partials(_v0=pa.array([7, None, -3, 2 ** 62], pa.int64()), _v1=pa.array([10, 11, None, 10], pa.int64()),
                         _v2=pa.array(["https://x/y?z=1", None, "a\x00b", ""]), _v3=pa.array([True, None, False, True]),
                         _v4=pa.array([1, 2, 3, None], pa.int32()))
    tx = _Puts()
    assert _stream_rows_put(tx, partials, _Shape())
    assert tx.entries == _per_row(partials)
    assert len(tx.entries) == 3, "a row whose fk is NULL joins nothing and is not kept"
    assert not any(k.startswith(codec.encode_key((INDEX,))) for k in tx.entries)


def test_a_column_the_arrow_encoding_does_not_cover_leaves_the_rows_to_the_per_row_path():
    partials = _partials(_v0=pa.array([1.5, 2.5]), _v1=pa.array([1, 2], pa.int64()))
    tx = _Puts()
    assert not _stream_rows_put(tx, partials, _Shape())
    assert tx.entries == {}


def _tables(tmp_path, select: str) -> dict:
    from catalog.definitions import load_all

    (tmp_path / "auction.sql").write_text("CREATE TABLE auction (id BIGINT PRIMARY KEY, category BIGINT, "
                                          "name STRING) WITH (topic='auction');")
    (tmp_path / "j.sql").write_text("-- topic: bid\n-- schema: auction BIGINT, price BIGINT, url STRING\n"
                                    f"CREATE TABLE j AS {select};")
    return load_all(tmp_path)


@pytest.mark.parametrize("select", [
    "SELECT b.auction, b.price, a.category, a.name FROM bid b JOIN auction a ON b.auction = a.id WHERE a.category = 10",
    "SELECT b.price, b.url, a.name FROM bid b LEFT JOIN auction a ON b.auction = a.id",
    "SELECT b.price, a.category FROM bid b LEFT JOIN auction a ON b.auction = a.id "
    "WHERE a.category IS NULL OR a.name = 'x'",
    "SELECT b.auction, a.name FROM bid b JOIN auction a ON b.auction = a.id",
])
def test_a_batch_s_own_rows_joined_column_by_column_are_the_per_row_join_s(tmp_path, select):
    """Bids with auctions found, missing, failing the WHERE and NULL foreign keys, for inner and
    left joins: the same puts and deletes, byte for byte, as JoinShape.row row by row."""
    tables = _tables(tmp_path, select)
    from catalog.definitions import input_definition

    source, right = input_definition(tables["j"], tables), tables["auction"]
    shape = JoinShape(tables["j"], source, right)
    rng = random.Random(7)
    b_rows = {k: (k, rng.choice([10, 11, None]), rng.choice(["x", "y", None])) for k in [*range(0, 40, 2), *range(100, 110)]}
    n = 300
    positions = [f"0:{i}" for i in range(n)]        # a stream's key, its position, is its first column
    partials = pa.table({"_k0": positions, "_del": [False] * n, "_v0": positions,
                         "_v1": pa.array([rng.choice([None, *range(45)]) for _ in range(n)], pa.int64()),
                         "_v2": pa.array([rng.randrange(1000) for _ in range(n)], pa.int64()),
                         "_v3": pa.array([rng.choice(["u", None, "w\"x"]) for _ in range(n)])})
    keys = [codec.encode_key((k,)) for k in partials.column("_k0").to_pylist()]
    tx = _Puts()
    side = _batch_side(partials.column("_v1"), shape, b_rows, len(right.value_columns))
    assert len(side["keys"]) < len(b_rows), "only the b rows the batch points at"
    joined = _own_rows_joined(tx, partials, keys, shape, side)
    assert joined is not None
    want = {}
    for key, row in zip(keys, zip(*[partials.column(f"_v{i}").to_pylist() for i in range(4)])):
        one = shape.row(row, b_rows)
        want[key] = None if one is None else codec.encode_value(one)
    assert tx.entries == want
    assert any(v is not None for v in want.values())
    assert any(v is None for v in want.values()) == ("LEFT" not in select or "WHERE" in select)
    # their change rows from the columns: those decoded from the commit's changes, plus a change
    # of another key (a bid an auction's change found), and none for a row the commit left as it was
    from spark_jobs.steps.merge_task import unbatched_rows

    changes = {k: v for k, v in want.items() if v is not None}
    unchanged = next(iter(changes))
    del changes[unchanged]
    changes[codec.encode_key(("9:9",))] = None
    got = joined.change_rows(tables["j"], changes).to_pylist()
    assert sorted(got, key=str) == sorted(unbatched_rows(tables["j"], None, {}, changes).to_pylist(), key=str)
    assert len(got) == len(changes)


def test_a_where_over_both_sides_is_left_to_the_per_row_join(tmp_path):
    tables = _tables(tmp_path, "SELECT b.price FROM bid b JOIN auction a ON b.auction = a.id WHERE b.price > a.category")
    from catalog.definitions import input_definition

    shape = JoinShape(tables["j"], input_definition(tables["j"], tables), tables["auction"])
    assert _batch_side(pa.array([1, 2]), shape, {1: (1, 10, "x")}, 3) is None


def test_the_index_finds_rows_of_either_layout():
    """A stage written before one entry a record (INDEX entries, rows by position) and after
    (ROWS_BY_FK): both are found for b's changed keys, by seeks and by one pass."""
    part = StatePartition("t.rows", 0, MemoryBackend())
    tx = part.begin(1)
    tx.put(("0:1",), (5, 100))
    tx.put((INDEX, 5, "0:1"), ())
    tx.put((ROWS_BY_FK, 5, "0:2"), (5, 200))
    tx.put((ROWS_BY_FK, 6, "0:3"), (6, 300))
    tx.put((ROWS_BY_FK, 50, "0:4"), (50, 400))
    tx.commit()
    assert indexed(part, [5]) == {"0:1": None, "0:2": (5, 200)}
    assert indexed(part, [5, 6, 7, 8, 9]) == {"0:1": None, "0:2": (5, 200), "0:3": (6, 300)}   # one pass
