"""Read-only views on a RocksDB secondary instance: consistent, never blocking the writer."""
from __future__ import annotations

import threading
import time

from state.aggregates import Count, RowAggregator
from state.backends import RocksBackend
from state.partition import StatePartition
from state.views import PartitionView

KEYS = 500


def test_reader_never_sees_two_batches_while_writer_commits(tmp_path):
    primary = tmp_path / "p0000"
    writer = StatePartition("views", 0, RocksBackend(primary), RowAggregator({"n": Count()}))
    with writer.begin(0) as tx:
        for i in range(KEYS):
            tx.put((f"k{i:04d}",), (0,))
    view = PartitionView.secondary(primary, tmp_path / "secondary")
    stop = threading.Event()
    committed = []

    def write():
        batch = 1
        while not stop.is_set():
            with writer.begin(batch) as tx:        # every key holds the batch id
                for i in range(KEYS):
                    tx.put((f"k{i:04d}",), (batch,))
            committed.append(batch)
            batch += 1

    thread = threading.Thread(target=write)
    thread.start()
    observed = set()
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            meta = view.refresh()
            rows = view.scan()
            values = {value[0] for _, value in rows}
            assert len(rows) == KEYS
            assert values == {meta.applied_batch}, f"torn read: batches {sorted(values)} at meta {meta.applied_batch}"
            observed.add(meta.applied_batch)
    finally:
        stop.set()
        thread.join()
    assert len(committed) > 5, "the writer must not be blocked by the reader"
    assert len(observed) > 3, "the reader must follow the writer's commits"
    view.close()
    writer.close()
