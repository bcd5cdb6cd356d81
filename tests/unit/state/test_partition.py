"""state.partition.Transaction's lifecycle: writes only while open, a failed commit says so."""
from __future__ import annotations

import pytest

from state.backends import MemoryBackend
from state.errors import StateError, TransactionClosed
from state.partition import StatePartition, TxStatus


class _BrokenChangelog:
    def publish(self, *args, **kwargs):
        raise ConnectionError("broker gone mid-publish")


def test_a_committed_transaction_refuses_writes_and_a_second_commit():
    part = StatePartition("t", 0, MemoryBackend())
    tx = part.begin(0)
    tx.put(("a",), 1)
    assert tx.status is TxStatus.STARTED
    tx.commit()
    assert tx.status is TxStatus.COMPLETE and part.get(("a",)) == 1
    for write in (lambda: tx.put(("b",), 2), lambda: tx.delete(("a",)), lambda: tx.commit()):
        with pytest.raises(TransactionClosed, match=r"t\[0\] batch 0: the transaction is complete"):
            write()
    assert part.get(("b",)) is None and part.meta.applied_batch == 0
    tx.abort()                     # a stored batch stays stored
    assert tx.status is TxStatus.COMPLETE and part.get(("a",)) == 1


def test_a_commit_that_raises_mid_publish_is_failed_not_finished():
    part = StatePartition("t", 0, MemoryBackend(), changelog=_BrokenChangelog())
    tx = part.begin(0)
    tx.put(("a",), 1)
    with pytest.raises(ConnectionError):
        tx.commit()
    assert tx.status is TxStatus.FAILED and part.meta.applied_batch == -1 and part.get(("a",)) is None
    with pytest.raises(TransactionClosed):
        tx.put(("a",), 2)
    assert issubclass(TransactionClosed, StateError)


def test_an_aborted_transaction_leaves_nothing_and_the_context_manager_aborts_on_error():
    part = StatePartition("t", 0, MemoryBackend())
    with pytest.raises(KeyError):
        with part.begin(0) as tx:
            tx.put(("a",), 1)
            raise KeyError("boom")
    assert tx.status is TxStatus.ABORTED and part.get(("a",)) is None
    with part.begin(0) as again:
        again.put(("a",), 3)
    assert again.status is TxStatus.COMPLETE and part.get(("a",)) == 3


def test_a_batch_that_rewrote_half_the_partition_leaves_one_sorted_run_and_a_small_one_does_not(tmp_path):
    from state.backends import RocksBackend

    backend = RocksBackend(tmp_path / "p0")
    part = StatePartition("t", 0, backend)
    try:
        def runs() -> int:
            return sum(1 for f in backend.db.live_files() if f["num_entries"] > 1)

        def levels() -> set:
            return {f["level"] for f in backend.db.live_files() if f["num_entries"] > 1}

        for batch, keys in enumerate((range(0, 12_000), range(12_000, 24_000))):     # a load in two batches
            tx = part.begin(batch)
            for k in keys:
                tx.put((k,), k)
            tx.commit()
            if batch == 0:      # into an empty partition: one run once flushed, left unrewritten (level 0)
                assert runs() == 1 and levels() == {0}
        assert runs() == 1 and levels() != {0}       # the second rewrote half of what the partition holds
        tx = part.begin(2)
        for k in range(240):                         # 1%: its run stays apart for compaction to merge later
            tx.put((k,), -k)
        tx.commit()
        backend.db.flush()
        assert runs() == 2 and part.get((7,)) == -7 and part.meta.key_count == 24_000
    finally:
        part.close()


CALLS = {"get": lambda tx: tx.get(("a",)), "get_many": lambda tx: tx.get_many([("a",)]),
         "put": lambda tx: tx.put(("a",), 1), "delete": lambda tx: tx.delete(("a",)),
         "put_encoded": lambda tx: tx.put_encoded(b"\x01a", 1), "put_raw": lambda tx: tx.put_raw(b"\x01a", b"\x01\x01"),
         "put_raw_many": lambda tx: tx.put_raw_many([b"\x01a"], [b"\x01\x01"]),
         "delete_encoded": lambda tx: tx.delete_encoded(b"\x01a"), "merge_raw": lambda tx: tx.merge_raw(b"\x01a", b"\x01\x01"),
         "merge_raw_many": lambda tx: tx.merge_raw_many([b"\x01a"], [b"\x01\x01"]),
         "merge": lambda tx: tx.merge(("a",), 1), "merge_encoded": lambda tx: tx.merge_encoded(b"\x01a", 1),
         "commit": lambda tx: tx.commit(), "abort": lambda tx: tx.abort()}


@pytest.mark.parametrize("status", list(TxStatus))
def test_every_method_runs_in_the_statuses_it_declares_and_no_other(status):
    """Reads included: a read of a committed transaction answered from a batch already stored."""
    from state.partition import Transaction

    declared = {name: getattr(Transaction, name).allowed for name in CALLS}
    assert declared["put"] == declared["merge_encoded"] == declared["commit"] == (TxStatus.STARTED,)
    assert declared["get"] == declared["get_many"] == (TxStatus.STARTED, TxStatus.PREPARED)
    assert set(declared["abort"]) == set(TxStatus)
    for name, call in CALLS.items():
        part = StatePartition("t", 0, MemoryBackend())
        tx = part.begin(0)
        tx.status = status
        if status in declared[name]:
            call(tx)
        else:
            with pytest.raises(TransactionClosed, match=f"the transaction is {status.value}, and {name} needs it"):
                call(tx)


def test_a_value_put_as_the_codec_s_bytes_reads_stores_and_merges_as_the_value():
    """put_raw (a batch's values encoded at once) is a put: read back in the transaction, stored
    as given, with the digest a put of the value gives."""
    from state import codec
    from state.aggregates import RowAggregator, Sum

    raw, put = StatePartition("t", 0, MemoryBackend()), StatePartition("t", 0, MemoryBackend())
    for part, write in ((raw, lambda tx, k, v: tx.put_raw(codec.encode_key(k), codec.encode_value(v))),
                        (put, lambda tx, k, v: tx.put(k, v))):
        tx = part.begin(0)
        write(tx, ("a",), (1, "x", None))
        write(tx, ("b",), (2,))
        assert tx.get(("a",)) == (1, "x", None)
        tx.commit()
    assert raw.meta.digest == put.meta.digest and raw.meta.key_count == put.meta.key_count == 2
    assert raw.get(("a",)) == (1, "x", None)
    summed = StatePartition("s", 0, MemoryBackend(), aggregator=RowAggregator({"n": Sum()}))
    tx = summed.begin(0)
    tx.put_raw(codec.encode_key(("a",)), codec.encode_value((5,)))
    tx.merge(("a",), (2,))
    tx.commit()
    assert summed.get(("a",)) == (7,)


def test_a_partial_merged_as_the_codec_s_bytes_is_stored_as_given_when_new_and_merged_when_not():
    """merge_raw (a batch's LATEST_BY_OFFSET partials encoded at once): a new key takes the bytes
    with no decode (CommitResult.values leaves it out, as a caller reads it from its columns); a
    held key, or a second partial of a key in one transaction, folds as merge does; the digest is
    the per-row path's."""
    from state import codec
    from state.aggregates import LatestByOffset, RowAggregator

    def partition():
        return StatePartition("t", 0, MemoryBackend(), aggregator=RowAggregator({"p": LatestByOffset()}))

    raw, merged, many = partition(), partition(), partition()
    batches = [[(("a",), ((5, "x"),)), (("b",), ((1, "y"),))],
               [(("a",), ((3, "old"),)), (("a",), ((9, "z"),)), (("b",), ((7, "w"),)), (("c",), (None,))]]
    for batch_id, batch in enumerate(batches):
        for part, write in ((raw, lambda tx, k, v: tx.merge_raw(codec.encode_key(k), codec.encode_value(v))),
                            (merged, lambda tx, k, v: tx.merge(k, v))):
            tx = part.begin(batch_id)
            for key, value in batch:
                write(tx, key, value)
            assert tx.get(("a",)) == ((5, "x"),) if batch_id == 0 else ((9, "z"),)
            result = tx.commit()
            if part is merged:      # the batch at once: a key twice (a in batch 1) folds as one by one
                tx = many.begin(batch_id)
                tx.merge_raw_many(*zip(*[(codec.encode_key(k), codec.encode_value(v)) for k, v in batch]))
                assert tx.commit().changes == result.changes
            if part is raw:
                assert set(result.values) == ({codec.encode_key((k,)) for k in "ab"} if batch_id else set()), \
                    "only held keys decode (a, b); a new one (c) is stored as given"
        assert raw.meta.digest == merged.meta.digest and raw.meta.key_count == merged.meta.key_count
    assert [raw.get((k,)) for k in "abc"] == [((9, "z"),), ((7, "w"),), (None,)]
    assert many.meta.digest == raw.meta.digest
