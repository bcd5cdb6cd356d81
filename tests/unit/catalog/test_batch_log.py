"""catalog.batch_log: the newest commit and a follower's next commits without listing the log."""
from __future__ import annotations

from catalog.batch_log import POINTER, BatchCommit, BatchLog, BatchPlan


def _plan(i: int) -> BatchPlan:
    return BatchPlan(batch_id=i, topic="t", ranges={0: (i * 10, i * 10 + 10)}, watermark_ms=None)


def _commit(i: int) -> BatchCommit:
    return BatchCommit(batch_id=i, topic="t", ranges={0: (i * 10, i * 10 + 10)}, changelog_offsets={0: i},
                       digests={0: "0"}, key_counts={0: i}, counts={"read": 10}, watermark_ms=None, seconds=0.1)


class _Counting:
    """The log's store, counting listings."""

    def __init__(self, store) -> None:
        self.store, self.listings = store, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def names(self):
        self.listings += 1
        return self.store.names()


def _log(tmp_path, batches: int) -> BatchLog:
    log = BatchLog(tmp_path / "log")
    for i in range(batches):
        log.write_plan(_plan(i), "t")
        log.write_commit(_commit(i), "t")
    return log


def test_the_newest_commit_and_the_pending_plan_are_found_without_listing(tmp_path):
    log = _log(tmp_path, 50)
    log.write_plan(_plan(50), "t")
    log.store = _Counting(log.store)
    assert log.last_commit().batch_id == 49
    assert log.pending_plan().batch_id == 50
    assert [c.batch_id for c in log.commits_after(46)] == [47, 48, 49]
    assert log.commits_after(49) == []
    assert log.store.listings == 0


def test_a_pointer_behind_the_log_is_stepped_past_and_a_missing_one_listed_once(tmp_path):
    log = _log(tmp_path, 5)
    log.store.put(POINTER, log._encode({"batch_id": 2}))       # a crash before the pointer, or a stale driver
    assert log.last_commit_id() == 4
    (tmp_path / "log" / POINTER).unlink()                     # a log from before the pointer existed
    log.store = _Counting(log.store)
    assert log.last_commit().batch_id == 4 and log.store.listings == 1
    assert log.pending_plan() is None


def test_an_empty_log_and_a_first_plan(tmp_path):
    log = BatchLog(tmp_path / "log")
    assert log.last_commit() is None and log.pending_plan() is None and log.commits_after(-1) == []
    log.write_plan(_plan(0), "t")
    assert log.pending_plan().batch_id == 0
