"""Incremental snapshots on a real RocksDB and a store folder: a snapshot after a small change
uploads only the new SSTs, restores exactly after a wipe, and retention killed at each of its
steps loses nothing a kept snapshot needs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from state import codec, faults
from state.backends import PartitionMeta, RocksBackend
from state.errors import SnapshotCorrupt
from state.snapshots import SHARED, SnapshotStore

ROWS = 20_000


def _write(db: RocksBackend, keys: range, batch: int, tag: str) -> None:
    db.write({codec.encode_key((f"k{i:06d}",)): codec.encode_value((tag * 20, i)) for i in keys},
             PartitionMeta(applied_batch=batch))
    db.db.flush()


def _contents(path: Path) -> dict:
    db = RocksBackend(path, read_only=True)
    try:
        return dict(db.scan()), db.read_meta().applied_batch
    finally:
        db.close()


@pytest.fixture
def history(tmp_path):
    """Four snapshots of one partition: all rows, then three changes of 1% of the keys each."""
    db = RocksBackend(tmp_path / "db")
    store = SnapshotStore(str(tmp_path / "store"))
    manifests = []
    for start in range(0, ROWS, ROWS // 4):
        _write(db, range(start, start + ROWS // 4), 0, "a")
    # The load's four runs merged, as universal compaction merges a load's equal runs once, on its
    # first compaction (bench/snapshot_compaction measures snapshots over a table's life).
    db.db.compact_range(None, None)
    manifests.append(store.save("t", 0, db))
    for batch in (1, 2, 3):
        _write(db, range(batch * 100, batch * 100 + ROWS // 100), batch, "bcd"[batch - 1])
        if batch == 2:
            db.db.compact_range(None, None)    # the SSTs of the first two snapshots are gone from the store
        manifests.append(store.save("t", 0, db))
    expected = {m.batch_id: None for m in manifests}
    db.close()
    return store, manifests, tmp_path, expected


def test_a_snapshot_after_a_small_change_uploads_a_small_part(history):
    store, manifests, _, _ = history
    full = manifests[0]
    assert full.uploaded == full.total_bytes > 0
    for before, later in ((manifests[0], manifests[1]), (manifests[2], manifests[3])):   # 1% of the keys changed
        new = {n for n, f in later.files.items() if f.get("shared") and n not in before.files}
        # CURRENT, MANIFEST and OPTIONS go whole with every snapshot: ~14 KB whatever the state's
        # size, 9.6-10.01% of this small one, so the bound is on the SSTs.
        own = sum(f["size"] for f in later.files.values() if not f.get("shared"))
        assert later.uploaded == own + sum(later.files[n]["size"] for n in new), (later.uploaded, own, new)
        assert later.uploaded - own <= 0.05 * (later.total_bytes - own), (later.uploaded, own, later.total_bytes)
        assert new and any(f.get("shared") and n in before.files for n, f in later.files.items())


def test_every_snapshot_restores_exactly_after_a_wipe(history, tmp_path):
    store, manifests, root, _ = history
    live = _contents(root / "db")
    target = tmp_path / "restored"
    store.download(store.list("t", 0)[0], target)
    assert _contents(target) == live
    for manifest in manifests:
        store.download(manifest, tmp_path / f"b{manifest.batch_id}")
        assert _contents(tmp_path / f"b{manifest.batch_id}")[1] == manifest.batch_id


def test_a_corrupt_shared_sst_is_refused_by_its_checksum(history, tmp_path):
    store, manifests, _, _ = history
    newest = manifests[-1]
    name = next(n for n, f in newest.files.items() if f.get("shared"))
    with open(store.file_path(newest, name), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    with pytest.raises(SnapshotCorrupt, match=name):
        store.download(newest, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_retention_keeps_what_kept_snapshots_name_and_sweeps_the_rest(history, tmp_path):
    store, manifests, root, _ = history
    old = os.path.getmtime(manifests[-1].path) - 10
    for m in manifests:            # the shared files are older than the newest kept snapshot
        for name, entry in m.files.items():
            os.utime(store.file_path(m, name), (old, old))
    deleted = store.retain("t", 0, keep=2)
    kept = store.list("t", 0)
    assert [m.batch_id for m in kept] == [3, 2]
    assert any(SHARED in d for d in deleted)
    named = {store.file_path(m, n) for m in kept for n in m.files}
    on_disk = {str(p) for p in Path(store.root, "t", "p0000", SHARED).iterdir()}
    assert on_disk <= named | {p for p in on_disk if Path(p).name.startswith(".")}
    for m in kept:
        store.download(m, tmp_path / f"kept{m.batch_id}")
        assert _contents(tmp_path / f"kept{m.batch_id}")[1] == m.batch_id


RETAIN = """
import sys
from state.snapshots import SnapshotStore
SnapshotStore(sys.argv[1]).retain("t", 0, keep=2)
"""


@pytest.mark.parametrize("point", sorted(faults.RETENTION_POINTS))
def test_retention_killed_at_each_step_loses_nothing_a_kept_snapshot_needs(history, tmp_path, point):
    store, manifests, root, _ = history
    old = os.path.getmtime(manifests[-1].path) - 10
    for m in manifests:
        for name in m.files:
            os.utime(store.file_path(m, name), (old, old))
    killed = subprocess.run([sys.executable, "-c", RETAIN, store.root], capture_output=True, text=True,
                            env={**os.environ, faults.ENV: point}, cwd=Path(__file__).resolve().parents[3])
    assert killed.returncode == faults.EXIT_CODE, killed.stderr[-2000:]
    survivors = store.list("t", 0)
    assert [m.batch_id for m in survivors][:2] == [3, 2]
    for m in survivors:                          # every snapshot the store still lists is whole
        store.download(m, tmp_path / f"after-{point}-{m.batch_id}")
    store.retain("t", 0, keep=2)                 # the next retention finishes the job
    assert [m.batch_id for m in store.list("t", 0)] == [3, 2]
