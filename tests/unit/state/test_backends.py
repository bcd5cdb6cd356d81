"""state.backends.RocksBackend: bounded info logs, and a secondary that does nothing when nothing
was written (a query server caught up every 0.1 s and logged each time: ~1 GB a day)."""
from __future__ import annotations

import os
import time

from serving.query import OWNER_FILE, sweep_dead_secondaries
from state.backends import INFO_LOGS, PartitionMeta, RocksBackend, sorted_runs


def test_reopening_a_store_keeps_a_bounded_number_of_info_logs(tmp_path):
    for i in range(12):
        db = RocksBackend(tmp_path / "p0")
        db.write({b"k%d" % i: b"v"}, PartitionMeta(applied_batch=i))
        db.close()
    logs = [name for name in os.listdir(tmp_path / "p0") if name.startswith("LOG")]
    assert "LOG" in logs and len(logs) <= INFO_LOGS, logs


def test_a_secondary_catches_up_only_when_the_primary_wrote(tmp_path):
    primary = RocksBackend(tmp_path / "primary")
    primary.write({b"a": b"1"}, PartitionMeta(applied_batch=0))
    secondary = RocksBackend(tmp_path / "secondary", secondary_of=tmp_path / "primary")
    try:
        secondary.catch_up()
        assert secondary.get(b"a") == b"1"
        log = tmp_path / "secondary" / "LOG"
        size = log.stat().st_size
        for _ in range(50):
            secondary.catch_up()
        assert log.stat().st_size == size              # idle: no catch-up, no log line
        primary.write({b"b": b"2"}, PartitionMeta(applied_batch=1))
        secondary.catch_up()
        assert secondary.get(b"b") == b"2" and secondary.read_meta().applied_batch == 1
        assert "stats_dump_period_sec: 0" in log.read_text()       # nothing written on a timer either
    finally:
        secondary.close()
        primary.close()


def test_the_folders_of_dead_query_servers_are_swept_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from catalog.batch_log import start_ticks

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = start_ticks(dead.pid)
    dead.wait()
    mine, theirs, legacy_new, legacy_old = (tmp_path / f"query-{n}" for n in ("mine", "dead", "new", "old"))
    for folder in (mine, theirs, legacy_new, legacy_old):
        folder.mkdir()
    (mine / OWNER_FILE).write_text(f"{os.getpid()} {start_ticks(os.getpid())}")
    (theirs / OWNER_FILE).write_text(f"{dead.pid} {dead_start or 1}")
    old = time.time() - 7200
    os.utime(legacy_old, (old, old))
    assert sorted(p.name for p in sweep_dead_secondaries(tmp_path)) == ["query-dead", "query-old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["query-mine", "query-new"]


def test_both_backends_implement_the_written_interface(tmp_path):
    from state.backends import Backend, MemoryBackend

    rocks = RocksBackend(tmp_path / "p")
    try:
        assert isinstance(rocks, Backend) and isinstance(MemoryBackend(), Backend)
    finally:
        rocks.close()


def test_a_store_whose_largest_run_is_under_the_share_settles_into_one_run_and_then_stays_as_it_is(tmp_path):
    db = RocksBackend(tmp_path / "p0")
    try:
        for run in range(3):     # a load in three flushes (under universal's trigger of 4 runs): a third each
            db.write({b"k%06d" % i: b"v" * 100 for i in range(run, 21_000, 3)}, PartitionMeta(applied_batch=run))
            db.db.flush()
        rows = dict(db.scan())
        assert db.settle() is False             # a third each: over the default quarter (SCATTERED_SHARE)
        assert db.settle(0.5) is True
        data = [f for f in db.db.live_files() if f["num_entries"] > 1]
        assert len(data) == 1 and data[0]["num_entries"] == 21_000 and dict(db.scan()) == rows
        db.write({b"k%06d" % i: b"w" * 100 for i in range(200)}, PartitionMeta(applied_batch=3))   # 1% changed
        db.db.flush()
        assert db.settle() is False     # the merged run still holds nearly all: nothing to merge
        assert len(db.db.live_files()) >= 2 and dict(db.scan())[b"k000007"] == b"w" * 100
    finally:
        db.close()


def test_a_deep_level_cut_into_files_is_one_sorted_run_and_each_level_0_file_is_one():
    files = [{"level": 6, "size": 67_909_963}, {"level": 6, "size": 60_000_000}, {"level": 6, "size": 58_728_000},
             {"level": 0, "size": 1_132}, {"level": 0, "size": 2_000_000}, {"level": 5, "size": 9_000}]
    assert sorted(sorted_runs(files)) == [1_132, 9_000, 2_000_000, 186_637_963]


def test_the_backend_interface_has_a_read_only_and_a_read_write_half_and_no_test_hook(tmp_path):
    """Kafka Streams' ReadOnlyKeyValueStore / KeyValueStore split: a reader's store has no write,
    and nothing in either half exists only for tests (tests/tamper.py reaches past them)."""
    from state.backends import Backend, MemoryBackend, ReadableBackend

    def members(protocol) -> set[str]:
        return {name for name in vars(protocol) if not name.startswith("_")}

    assert members(ReadableBackend) == {"get", "multi_get", "scan", "read_meta", "close"}
    assert members(Backend) == {"write", "compact"} and issubclass(Backend, ReadableBackend)
    writer = RocksBackend(tmp_path / "p0")
    writer.write({b"a": b"1"}, PartitionMeta(applied_batch=0))
    writer.close()
    reader = RocksBackend(tmp_path / "p0", read_only=True)
    try:
        assert isinstance(reader, ReadableBackend) and isinstance(MemoryBackend(), Backend)
        assert not any(hasattr(cls, "corrupt_value") for cls in (RocksBackend, MemoryBackend))
    finally:
        reader.close()
