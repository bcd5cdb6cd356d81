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


def _fast_log(tmp_path, batches: int) -> BatchLog:
    """A log of `batches` plans and commits written as the product writes them, without the
    conditional create's fsyncs (the format is the same)."""
    import json
    from dataclasses import asdict

    folder = tmp_path / "log"
    folder.mkdir(parents=True)
    for i in range(batches):
        for suffix, entry in (("plan", _plan(i)), ("commit", _commit(i))):
            (folder / f"{i:012d}.{suffix}.json").write_text(json.dumps(asdict(entry), sort_keys=True))
    (folder / POINTER).write_text(json.dumps({"batch_id": batches - 1}))
    return BatchLog(folder)


def _same(a: BatchCommit, b: BatchCommit) -> bool:
    from dataclasses import asdict

    from catalog.batch_log import SLIM_DROP

    strip = lambda c: {k: v for k, v in asdict(c).items() if k not in SLIM_DROP}    # noqa: E731
    return strip(a) == strip(b)


def test_a_long_log_compacted_keeps_every_commit_and_few_files(tmp_path):
    log = _fast_log(tmp_path, 5000)
    before = log.commits()
    assert log.compact(keep=100) == 4899
    files = sorted(p.name for p in (tmp_path / "log").iterdir())
    blocks = [f"checkpoint-block-{b:08d}.json.gz" for b in range(5)]    # batches 0..4899, 1,000 a block
    assert files == sorted(files[:200] + blocks + ["checkpoint-head.json", "last-commit.json"])
    after = log.commits()
    assert [c.batch_id for c in after] == list(range(5000))
    assert all(_same(a, b) for a, b in zip(before, after))
    assert _same(log.commit(17), before[17]) and log.commit(17).ranges == {0: (170, 180)}
    assert log.last_commit_id() == 4999 and [c.batch_id for c in log.commits_after(4890)] == list(range(4891, 5000))

    counting = _Counting(log.store)
    log.store = counting
    for i in range(5000, 5099):
        log.write_plan(_plan(i), "t")
        log.write_commit(_commit(i), "t")
        assert log.compact_if_due(keep=100) is None
    assert counting.listings == 0                  # not due until 2x keep past the checkpoint
    assert [c.batch_id for c in log.commits()] == list(range(5099)) and counting.listings == 0
    log.write_plan(_plan(5099), "t")
    log.write_commit(_commit(5099), "t")
    assert log.compact_if_due(keep=100) == 4999 and counting.listings == 1
    assert [c.batch_id for c in log.commits()] == list(range(5100))


COMPACT = """
import sys
from catalog.batch_log import BatchLog
BatchLog(sys.argv[1]).compact(keep=100)
"""


def test_compaction_killed_at_each_step_loses_no_commit(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from state import faults

    for point in sorted(faults.BATCH_LOG_POINTS):
        log = _fast_log(tmp_path / point, 1000)
        before = log.commits()
        killed = subprocess.run([sys.executable, "-c", COMPACT, log.location], capture_output=True, text=True,
                                env={**os.environ, faults.ENV: point}, cwd=Path(__file__).resolve().parents[3])
        assert killed.returncode == faults.EXIT_CODE, (point, killed.stderr[-2000:])
        after = BatchLog(log.location)
        assert len(after.commits()) == 1000 and all(_same(a, b) for a, b in zip(before, after.commits())), point
        assert after.last_commit().batch_id == 999 and after.commit(3).batch_id == 3
        assert after.compact(keep=100) == 899                    # the next compaction finishes the job
        names = sorted(p.name for p in Path(log.location).iterdir())
        assert len(names) == 203 and [n for n in names if n.startswith("checkpoint-")] == [
            "checkpoint-block-00000000.json.gz", "checkpoint-head.json"], point
        assert all(_same(a, b) for a, b in zip(before, BatchLog(log.location).commits())), point


def test_the_next_commit_finishes_a_sweep_a_kill_cut_short(tmp_path):
    """Killed after the head moved, before the sweep: the next commit's compact_if_due sweeps,
    rather than leaving the folded files for another 2x `keep` batches."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from state import faults

    log = _fast_log(tmp_path, 1000)
    killed = subprocess.run([sys.executable, "-c", COMPACT, log.location], capture_output=True, text=True,
                            env={**os.environ, faults.ENV: "batch_log.after_head"}, cwd=Path(__file__).resolve().parents[3])
    assert killed.returncode == faults.EXIT_CODE, killed.stderr[-2000:]
    assert len(list(Path(log.location).iterdir())) > 2000
    after = BatchLog(log.location)
    after.write_plan(_plan(1000), "t")
    after.write_commit(_commit(1000), "t")
    assert after.compact_if_due(keep=100) == 900
    assert len(list(Path(log.location).iterdir())) < 210
    assert after.compact_if_due(keep=100) is None             # swept: nothing due until 2x keep more
    assert [c.batch_id for c in BatchLog(log.location).commits()] == list(range(1001))


class _Metered:
    """The log's store, counting the bytes each call reads and writes."""

    def __init__(self, store) -> None:
        self.store, self.read, self.written = store, 0, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get(self, name):
        data = self.store.get(name)
        self.read += len(data or b"")
        return data

    def put(self, name, data):
        self.written += len(data)
        self.store.put(name, data)


def test_a_compaction_costs_the_same_at_any_age(tmp_path):
    """A compaction rewrites the block its batches fall in, not every folded commit, so what it
    reads and writes at 20,000 batches is what it does at 2,000."""
    costs = {}
    for age in (2000, 20000):
        log = _fast_log(tmp_path / str(age), age)
        log.compact(keep=100)
        for i in range(age, age + 300):                   # past the block boundary the first took
            log.write_plan(_plan(i), "t")
            log.write_commit(_commit(i), "t")
        metered = _Metered(log.store)
        log.store = metered
        assert log.compact(keep=100) == age + 199
        costs[age] = metered.read + metered.written
        assert [c.batch_id for c in log.commits()][-3:] == [age + 297, age + 298, age + 299]
        assert log.commit(age + 150).ranges == {0: (10 * (age + 150), 10 * (age + 150) + 10)}
    assert costs[20000] <= 1.2 * costs[2000], costs


def test_a_log_compacted_into_one_file_is_read_then_moved_into_blocks(tmp_path):
    """The format before blocks: one checkpoint holding every folded commit, named by its head."""
    import gzip
    import json
    from dataclasses import asdict

    from catalog.batch_log import HEAD, SLIM_DROP

    log = _fast_log(tmp_path, 2500)
    before = log.commits()
    folder = tmp_path / "log"
    entries = [{k: v for k, v in json.loads((folder / f"{i:012d}.commit.json").read_text()).items()
                if k not in SLIM_DROP} for i in range(2300)]
    (folder / "checkpoint-000000002299.json.gz").write_bytes(
        gzip.compress(json.dumps({"upto": 2299, "commits": entries}).encode()))
    (folder / HEAD).write_text(json.dumps({"upto": 2299, "file": "checkpoint-000000002299.json.gz"}))
    for i in range(2300):
        (folder / f"{i:012d}.plan.json").unlink()
        (folder / f"{i:012d}.commit.json").unlink()
    legacy = BatchLog(folder)
    assert all(_same(a, b) for a, b in zip(before, legacy.commits())) and len(legacy.commits()) == 2500
    assert legacy.commit(1234).ranges == {0: (12340, 12350)}
    assert legacy.compact(keep=100) == 2399
    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint-"))
    assert names == ["checkpoint-block-00000000.json.gz", "checkpoint-block-00000001.json.gz",
                     "checkpoint-block-00000002.json.gz", "checkpoint-head.json"]
    moved = BatchLog(folder)
    assert [asdict(c) for c in moved.commits()] == [asdict(c) for c in legacy.commits()]
    assert all(_same(a, b) for a, b in zip(before, moved.commits())) and moved.commit(1234).batch_id == 1234
