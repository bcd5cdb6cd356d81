"""Pure logic of state/: encodings, aggregates, digest, windows, memory store, views."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from state import codec, digest
from state.aggregates import (Avg, Count, CountDistinct, LatestByOffset, Max, Min, RowAggregator, Sum, TopN)
from state.backends import MemoryBackend
from state.partition import StatePartition
from state.table import StateTable, TableSpec
from state.views import TableView
from state.windows import WindowSpec, fetch, purge
from tests.tamper import corrupt_value

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
)


@given(st.lists(st.tuples(st.text(max_size=6), st.integers(-1000, 1000)), min_size=2, max_size=30))
def test_key_order_equals_tuple_order(keys):
    encoded = sorted(codec.encode_key(k) for k in keys)
    assert [codec.decode_key(e) for e in encoded] == sorted(keys)


def _reference_bytes(item) -> bytes:
    """The codec's layout written out plainly (tag, body; strings 0x00-terminated with 0x00 escaped
    as 0x00 0xFF): what its fast paths must reproduce byte for byte."""
    import decimal
    import struct

    def escaped(raw: bytes) -> bytes:
        return raw.replace(b"\x00", b"\x00\xff") + b"\x00"
    if item is None:
        return b"\x01"
    if isinstance(item, bool):
        return b"\x03" if item else b"\x02"
    if isinstance(item, int):
        return b"\x10" + struct.pack(">Q", item + (1 << 63))
    if isinstance(item, float):
        bits = struct.unpack(">Q", struct.pack(">d", item))[0]
        return b"\x20" + struct.pack(">Q", bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63))
    if isinstance(item, str):
        return b"\x30" + escaped(item.encode())
    if isinstance(item, decimal.Decimal):
        return b"\x28" + escaped(str(item).encode())
    if isinstance(item, bytes):
        return b"\x40" + escaped(item)
    return b"\x50" + b"".join(_reference_bytes(i) for i in item) + b"\x00"


values = st.recursive(
    st.one_of(scalars, st.text(alphabet="a\x00\xff\u00ff", max_size=5),
              st.decimals(allow_nan=False, allow_infinity=False, places=2)),
    lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12)


@settings(max_examples=300)
@given(st.lists(values, min_size=1, max_size=5).map(tuple))
def test_values_encode_to_the_reference_bytes_and_decode_back(value):
    """The codec's type-first fast paths (ints, strings, tuples) and the decoder's inline ints and
    strings give the layout's own bytes and values, 0x00 inside strings and nesting included."""
    encoded = codec.encode_value(value)
    assert encoded == bytes([codec.FORMAT_VERSION]) + _reference_bytes(value)
    assert codec.decode_value(encoded) == value
    assert codec.decode_key(codec.encode_key(value)) == value


@given(st.lists(st.floats(allow_nan=False, allow_infinity=True), min_size=2, max_size=30))
def test_float_order(values):
    encoded = sorted(codec.encode_key((v,)) for v in values)
    assert [codec.decode_key(e)[0] for e in encoded] == sorted(values)


@given(st.tuples(st.text(max_size=6), st.integers(-50, 50)), st.integers(-50, 50))
def test_tuple_prefix_is_byte_prefix(key, window_start):
    prefix = codec.encode_key(key)
    full = codec.encode_key((*key, window_start))
    assert full.startswith(prefix)
    assert prefix <= full < codec.prefix_upper_bound(prefix)


@given(st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12))
def test_value_roundtrip(value):
    assert codec.decode_value(codec.encode_value(value)) == value


def test_value_format_version_is_checked():
    data = bytearray(codec.encode_value((1, 2)))
    data[0] = 99
    with pytest.raises(codec.CodecError, match="format version 99"):
        codec.decode_value(bytes(data))


AGGREGATES = [Count(), Sum(), Min(), Max(), Avg(), LatestByOffset(), CountDistinct(), TopN(3), TopN(2, distinct_by=0)]


@pytest.mark.parametrize("agg", AGGREGATES, ids=lambda a: a.name + str(getattr(a, "n", "")))
@given(data=st.data())
@settings(max_examples=60)
def test_merge_is_independent_of_grouping(agg, data):
    """Any split of events into partials, folded in any order, gives the same state."""
    values = data.draw(st.lists(st.integers(-20, 20) | st.none(), min_size=1, max_size=25))
    if isinstance(agg, TopN):
        events = [((v, (f"p{abs(v or 0) % 4}", v)) if v is not None else (None, None), i) for i, v in enumerate(values)]
    else:
        events = [(v, i) for i, v in enumerate(values)]
    sequential = None
    for value, order in events:
        sequential = agg.merge(sequential, agg.lift(value, order))
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    groups: dict[int, object] = {}
    for value, order in events:
        g = rng.randrange(3)
        groups[g] = agg.merge(groups.get(g), agg.lift(value, order))
    partials = list(groups.values())
    rng.shuffle(partials)
    grouped = None
    for partial in partials:
        grouped = agg.merge(grouped, partial)
    if isinstance(agg, (Sum, Avg)) or isinstance(agg, Count):
        assert agg.result(grouped) == agg.result(sequential)
    else:
        assert grouped == sequential


def test_aggregate_results():
    assert Avg().result(Avg().merge((10, 2), (5, 1))) == 5
    assert Avg().result((0, 0)) is None
    assert LatestByOffset().result(LatestByOffset().merge((5, "new"), (3, "old"))) == "new"
    assert CountDistinct().result(CountDistinct().merge(("a", "b"), ("b", "c"))) == 3
    board = TopN(3, distinct_by=0)
    state = None
    for i, (player, score) in enumerate([("ann", 10), ("bob", 30), ("ann", 50), ("cy", 20), ("dee", 40)]):
        state = board.merge(state, board.lift((score, (player,)), i))
    assert board.result(state) == [(50, "ann"), (40, "dee"), (30, "bob")]


def test_digest_is_order_independent_and_incremental():
    items = [(codec.encode_key((f"k{i}",)), codec.encode_value(i)) for i in range(100)]
    d1, n1 = digest.of_items(items)
    d2, _ = digest.of_items(reversed(items))
    assert d1 == d2 and n1 == 100
    changed = digest.apply_change(d1, items[5][0], items[5][1], codec.encode_value(-1))
    assert changed == digest.of_items(items[:5] + [(items[5][0], codec.encode_value(-1))] + items[6:])[0]
    assert digest.from_signed(digest.to_signed(d1)) == d1


def _memory_partition():
    return StatePartition("mem", 0, MemoryBackend(), RowAggregator({"n": Count(), "s": Sum()}))


def test_memory_transactions_commit_abort_and_replay_noop():
    part = _memory_partition()
    with part.begin(0) as tx:
        tx.merge(("a",), (1, 5))
        tx.merge(("a",), (2, 10))
        tx.put(("b",), (7, 7))
        assert tx.get(("a",)) == (3, 15)   # reads see the transaction's own writes
    assert part.get(("a",)) == (3, 15)
    tx = part.begin(1)
    tx.merge(("a",), (1, 1))
    tx.abort()
    assert part.get(("a",)) == (3, 15) and part.meta.applied_batch == 0
    with part.begin(1) as tx:
        tx.delete(("b",))
        tx.merge(("c",), (1, 1))
    again = part.begin(1)
    again.merge(("a",), (100, 100))
    result = again.commit()
    assert result.noop and part.get(("a",)) == (3, 15)
    assert dict(part.items()) == {("a",): (3, 15), ("c",): (1, 1)}
    assert part.verify()[0]


def test_verify_catches_a_value_changed_behind_its_back():
    part = _memory_partition()
    with part.begin(0) as tx:
        for i in range(10):
            tx.merge((f"k{i}",), (1, i))
    corrupt_value(part.backend, codec.encode_key(("k3",)), codec.encode_value((1, 999)))
    ok, recorded, recomputed = part.verify()
    assert not ok and recorded != recomputed

    # A batch that writes the right value back moves the recorded digest by its change, from the
    # damaged value: still a mismatch. A rebuild's commit recounts from what the partition holds.
    with part.begin(1) as tx:
        tx.put(("k3",), (1, 3))
    assert not part.verify()[0]
    corrupt_value(part.backend, codec.encode_key(("k3",)), codec.encode_value((1, 999)))
    tx = part.begin(2)
    tx.put(("k3",), (1, 3))
    result = tx.commit(recount=True)
    assert part.verify()[0] and (result.digest, result.key_count) == (part.meta.digest, 10)


def test_windows_tumbling_hopping_late_and_purge():
    hopping = WindowSpec(size_ms=10, advance_ms=5, grace_ms=2, retention_ms=5)
    assert hopping.starts_for(12) == [5, 10]
    assert WindowSpec(10).starts_for(-3) == [-10]
    assert hopping.starts_for(3) == [0] and hopping.starts_for(-3) == [-10, -5]   # none before the epoch
    assert not hopping.is_late(12, watermark=16) and hopping.is_late(12, watermark=22)
    part = _memory_partition()
    with part.begin(0) as tx:
        for ts in (1, 6, 12, 31):
            for start in hopping.starts_for(ts):
                tx.merge(("k", start), (1, ts))
    assert [s for s, _ in fetch(part, ("k",))] == [0, 5, 10, 25, 30]
    assert [s for s, _ in fetch(part, ("k",), 0, 10)] == [0, 5, 10]
    with part.begin(1) as tx:
        assert purge(part, tx, hopping, watermark=30) == 3   # starts 0..10: start + 10 + 2 + 5 <= 30
    assert [s for s, _ in fetch(part, ("k",))] == [25, 30]


def test_views_scan_prefix_range_and_top_n_over_memory_store():
    spec = TableSpec("views", 3, RowAggregator({"n": Count()}))
    table = StateTable(spec, None, memory=True)
    for p in range(3):
        part = table.open(p)
        with part.begin(0) as tx:
            for i in range(30):
                key = (f"user{i % 5}", i)
                if table.partition_of(key) == p:
                    tx.put(key, (i,))
    view = TableView.over_memory(spec, [table.open(p).backend for p in range(3)])
    assert view.get(("user1", 6)) == (6,)
    assert [k for k, _ in view.scan(prefix=("user1",))] == [("user1", i) for i in range(1, 30, 5)]
    assert [k for k, _ in view.scan(prefix=("user1",), start=("user1", 10), end=("user1", 21))] == [
        ("user1", 11), ("user1", 16)]
    assert len(view.scan(limit=7)) == 7
    assert [k for k, _ in view.top_n(2, lambda k, v: v[0])] == [("user4", 29), ("user3", 28)]


def test_bad_table_definitions_fail_with_the_fix():
    with pytest.raises(ValueError, match="partitions=0"):
        TableSpec("t", 0)
    with pytest.raises(ValueError, match="table name"):
        TableSpec("bad name", 1)
    with pytest.raises(ValueError, match="ADVANCE"):
        WindowSpec(size_ms=10, advance_ms=20)


_int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_edge = st.one_of(_int64, st.sampled_from([-(1 << 63), (1 << 63) - 1, 0, -1, 1]))


@given(st.integers(1, 2).flatmap(lambda n: st.tuples(
    st.tuples(*[st.one_of(_edge, st.none())] * n), st.tuples(*[st.one_of(_edge, st.none(), st.floats(-1e9, 1e9))] * n))))
@settings(max_examples=400, deadline=None)
def test_add_ints_on_bytes_equals_decode_merge_encode(pair):
    """The additive fast path of a commit gives the generic path's bytes, or steps aside."""
    stored, partial = pair
    agg = RowAggregator({f"c{i}": Sum() for i in range(len(stored))})
    assert agg.additive
    fast = codec.add_ints(codec.encode_value(stored), partial)
    merged = agg.merge(stored, partial)
    all_ints = all(type(v) is int for v in (*stored, *partial))
    if all_ints and all(-(1 << 63) <= v < (1 << 63) for v in merged):
        assert fast == codec.encode_value(merged)
    else:
        assert fast is None         # None, floats or a 64-bit overflow: the generic path decides


def test_commit_takes_the_additive_path_only_for_count_and_sum():
    assert RowAggregator({"n": Count(), "s": Sum()}).additive
    assert not RowAggregator({"n": Count(), "m": Max()}).additive
    assert not RowAggregator({"a": Avg()}).additive
    part = StatePartition("t", 0, MemoryBackend(), RowAggregator({"n": Count(), "s": Sum()}))
    with part.begin(0) as tx:
        tx.merge(("a",), (1, 5))
        tx.merge(("b",), (1, None))
    with part.begin(1) as tx:
        tx.merge(("a",), (2, 7))
        tx.merge(("b",), (1, 3))
        tx.merge(("c",), (1, 2.5))
    assert part.get(("a",)) == (3, 12)
    assert part.get(("b",)) == (2, 3)
    assert part.get(("c",)) == (1, 2.5)


def test_a_reader_of_a_missing_partition_leaves_no_folder_that_blocks_a_restore(tmp_path):
    """rocksdict writes its config into the primary's folder even for a secondary open; a reader
    that races a restore's folder swap must not leave that folder behind (the swap would fail)."""
    from state.backends import RocksBackend
    primary = tmp_path / "t" / "p0000"
    with pytest.raises(OSError):
        RocksBackend(tmp_path / "secondary", secondary_of=primary)
    with pytest.raises(OSError):
        RocksBackend(primary, read_only=True)
    assert not primary.exists()
    writer = RocksBackend(primary)
    writer.close()
    reader = RocksBackend(tmp_path / "secondary", secondary_of=primary)
    assert reader.read_meta().applied_batch == -1
    reader.close()


def test_a_secondary_sees_the_batch_its_metadata_names_after_the_primary_flushes_checkpoints_or_reopens(tmp_path):
    """RocksDB's catch-up alone, after a flush of the primary, showed the new metadata over the
    old data (a torn read the query service would serve as one batch)."""
    from rocksdict import Checkpoint

    from state.backends import PartitionMeta, RocksBackend
    primary_dir = tmp_path / "p0000"
    primary = RocksBackend(primary_dir)
    reader = RocksBackend(tmp_path / "secondary", secondary_of=primary_dir)

    def commit(batch: int, keys: int = 50) -> None:
        primary.write({b"k%03d" % i: b"%d" % batch for i in range(keys)}, PartitionMeta(applied_batch=batch))

    def seen() -> tuple[int, set]:
        reader.catch_up()
        return reader.read_meta().applied_batch, {reader.get(b"k%03d" % i) for i in range(50)}

    commit(1)
    assert seen() == (1, {b"1"})
    commit(2)
    primary.db.flush()
    assert seen() == (2, {b"2"})
    commit(3, keys=10)
    assert seen() == (3, {b"2", b"3"})
    commit(4)
    Checkpoint(primary.db).create_checkpoint(str(tmp_path / "checkpoint"))
    assert seen() == (4, {b"4"})
    primary.close()
    primary = RocksBackend(primary_dir)
    commit(5)
    assert seen() == (5, {b"5"})
    reader.close()
    primary.close()


def test_a_sum_past_64_bits_or_a_value_past_the_record_limit_keeps_the_old_value_and_is_reported():
    from state.changelog import VALUE_LIMIT

    agg = RowAggregator({"total": Sum(), "ids": CountDistinct()})
    part = StatePartition("t", 0, MemoryBackend(), agg)
    big, ok, wide = (("big",), ("ok",), ("wide",))
    with part.begin(0) as tx:
        tx.merge(big, (2**63 - 10, ("a",)))
        tx.merge(ok, (1, ("a",)))
        tx.merge(wide, (1, ("w0",)))
    tx = part.begin(1)
    tx.merge(big, (100, ("b",)))             # past 2^63 - 1
    tx.merge(ok, (1, ("b",)))
    tx.merge(wide, (1, tuple(f"{i:040d}" for i in range(VALUE_LIMIT // 40))))   # past the record limit
    result = tx.commit()
    assert dict(result.rejected) == {codec.encode_key(big): "sum_overflow", codec.encode_key(wide): "state_too_large"}
    assert part.get(big) == agg.merge(None, (2**63 - 10, ("a",)))      # the old value stays
    assert part.get(ok)[0] == 2
    assert part.get(wide) == agg.merge(None, (1, ("w0",)))
    # A re-run of the batch (after a crash) is a no-op that reports the same keys.
    again = part.begin(1)
    again.merge(big, (100, ("b",)))
    assert again.commit().noop and dict(part.begin(1).commit().rejected) == dict(result.rejected)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 60)), max_size=8), min_size=1, max_size=5))
def test_sessions_merged_batch_by_batch_equal_sessions_over_all_events(batches):
    """merge_sessions over batches (each batch's own sessions first, as the passes make them)
    ends with the sessions a sort of every event gives: events apart by at most the gap join (the
    gap is inclusive, as in Kafka Streams)."""
    from state.windows import merge_sessions

    gap = 10
    part = StatePartition("mem", 0, MemoryBackend(), RowAggregator({"n": Count(), "last": Max()}))

    def sessions(events):
        out = {}
        for key in sorted({k for k, _ in events}):
            times = sorted(t for k, t in events if k == key)
            start = prev = times[0]
            n = 0
            for t in times:
                if t - prev > gap:
                    out[(key, start)] = (n, prev)
                    start, n = t, 0
                n, prev = n + 1, t
            out[(key, start)] = (n, prev)
        return out

    for batch_id, events in enumerate(batches):
        tx = part.begin(batch_id)
        merge_sessions(part, tx, gap, 1, part.aggregator.merge, list(sessions(events).items()))
        tx.commit()
    everything = [e for events in batches for e in events]
    assert dict(part.items()) == (sessions(everything) if everything else {})


def test_expire_idle_judges_merged_values_and_deletes_new_keys_past_the_horizon():
    from state.windows import expire_idle

    part = StatePartition("mem", 0, MemoryBackend(), RowAggregator({"n": Count(), "last": Max()}))
    with part.begin(0) as tx:
        tx.put(("old",), (1, 5))
        tx.put(("refreshed",), (1, 5))
        tx.put(("young",), (1, 50))
    tx = part.begin(1)
    tx.merge(("refreshed",), (1, 40))
    tx.merge(("stale_new",), (1, 10))
    touched = {codec.encode_key(("refreshed",)): 40, codec.encode_key(("stale_new",)): 10}
    assert expire_idle(part, tx, 1, 20, touched) == 2        # "old", and "stale_new" at once
    tx.commit()
    assert dict(part.items()) == {("refreshed",): (2, 40), ("young",): (1, 50)}
