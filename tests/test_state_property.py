"""Property test: random operations on >= 3 partitions with random snapshots,
restored to a random batch, equal a plain-dict replay (contents and digests)."""
from __future__ import annotations

import os
import uuid

from hypothesis import HealthCheck, given, settings, strategies as st

from state import codec, digest
from state.aggregates import Count, RowAggregator, Sum
from state.table import StateTable, TableSpec

PARTITIONS = 3
KEYS = [f"k{i}" for i in range(12)]

ops = st.one_of(
    st.tuples(st.just("merge"), st.sampled_from(KEYS), st.integers(-100, 100)),
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(-100, 100)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.just(0)),
)
batches = st.lists(st.lists(ops, max_size=12), min_size=1, max_size=7)


def reference_at(all_batches, upto: int) -> dict:
    """The table after batches 0..upto, computed with a plain dict."""
    table: dict[str, tuple[int, int]] = {}
    for batch in all_batches[: upto + 1]:
        for op, key, value in batch:
            if op == "merge":
                n, s = table.get(key, (0, 0))
                table[key] = (n + 1, s + value)
            elif op == "put":
                table[key] = (1, value)
            else:
                table.pop(key, None)
    return {(k,): v for k, v in table.items()}


@settings(max_examples=int(os.environ.get("STATETABLE_PROPERTY_EXAMPLES", "12")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(all_batches=batches, snapshot_at=st.sets(st.integers(0, 6)), data=st.data())
def test_restore_to_random_batch_equals_dict_replay(kafka, tmp_path_factory, all_batches, snapshot_at, data):
    root = tmp_path_factory.mktemp("prop")
    spec = TableSpec(f"prop-{uuid.uuid4().hex[:8]}", PARTITIONS, RowAggregator({"n": Count(), "s": Sum()}))
    table = StateTable(spec, root / "state", bootstrap=kafka, snapshot_uri=str(root / "snapshots"))
    for batch_id, batch in enumerate(all_batches):
        txs = {p: table.open(p).begin(batch_id) for p in range(PARTITIONS)}
        for op, key, value in batch:
            tx = txs[table.partition_of((key,))]
            if op == "merge":
                tx.merge((key,), (1, value))
            elif op == "put":
                tx.put((key,), (1, value))
            else:
                tx.delete((key,))
        for tx in txs.values():
            tx.commit()
        if batch_id in snapshot_at:
            for p in range(PARTITIONS):
                table.snapshot(p)

    assert {k: v for p in range(PARTITIONS) for k, v in table.open(p).items()} == reference_at(all_batches, len(all_batches) - 1)

    target = data.draw(st.integers(0, len(all_batches) - 1), label="restore target")
    table.wipe_local()
    for p in range(PARTITIONS):
        report = table.restore(p, target)
        assert report.applied_batch == target
    expected = reference_at(all_batches, target)
    parts = [table.open_readonly(p) for p in range(PARTITIONS)]
    restored = {k: v for part in parts for k, v in part.items()}
    assert restored == expected
    for p, part in enumerate(parts):
        mine = {k: v for k, v in expected.items() if table.partition_of(k) == p}
        ref_digest, ref_count = digest.of_items((codec.encode_key(k), codec.encode_value(v)) for k, v in mine.items())
        assert (part.meta.digest, part.meta.key_count) == (ref_digest, ref_count)
        assert part.verify()[0]
        part.close()
    table.close()
