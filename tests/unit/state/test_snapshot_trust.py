"""Snapshot manifests are data from a bucket others may write to: they never place files
outside the restore folder, never speak for another folder, and a bad download leaves nothing."""
from __future__ import annotations

import dataclasses
import json

import pytest

from state import codec
from state.backends import PartitionMeta, RocksBackend
from state.errors import SnapshotCorrupt
from state.snapshots import MANIFEST, Manifest, SnapshotStore


@pytest.fixture
def saved(tmp_path):
    backend = RocksBackend(tmp_path / "db")
    backend.write({codec.encode_key((i,)): codec.encode_value((i,)) for i in range(50)},
                  PartitionMeta(applied_batch=3))
    store = SnapshotStore(str(tmp_path / "store"))
    manifest = store.save("t", 0, backend)
    backend.close()
    return store, manifest, tmp_path


def _rewrite(manifest: Manifest, **changes) -> Manifest:
    changed = dataclasses.replace(manifest, **changes)
    with open(f"{manifest.path}/{MANIFEST}", "w") as out:
        out.write(changed.to_json())
    return changed


@pytest.mark.parametrize("hostile", ["../../escaped", "/tmp/absolute-escape", "..", "a/b", ""])
def test_a_manifest_file_name_that_is_a_path_is_rejected_and_writes_nothing(saved, hostile):
    store, manifest, root = saved
    first, info = next(iter(manifest.files.items()))
    files = {**manifest.files, hostile: info}
    bad = _rewrite(manifest, files=files)
    target = root / "restore" / "p0000"
    with pytest.raises(SnapshotCorrupt, match="not a plain file name"):
        store.download(bad, target)
    assert not (root / "escaped").exists() and not (root / "restore" / "escaped").exists()
    assert not target.exists()


def test_a_failed_checksum_leaves_no_files_behind(saved):
    store, manifest, root = saved
    victim = max(manifest.files, key=lambda n: manifest.files[n]["size"])
    with open(store.file_path(manifest, victim), "r+b") as f:
        f.seek(0)
        f.write(b"\xff\xfe")
    target = root / "restore" / "p0000"
    with pytest.raises(SnapshotCorrupt, match=victim):
        store.download(manifest, target)
    assert not target.exists() and list((root / "restore").iterdir()) == []


def test_a_good_snapshot_still_downloads_and_opens(saved):
    store, manifest, root = saved
    target = root / "restore" / "p0000"
    store.download(store.list("t", 0)[0], target)
    backend = RocksBackend(target)
    assert backend.read_meta().applied_batch == 3 and backend.get(codec.encode_key((7,))) == codec.encode_value((7,))
    backend.close()
    assert [p.name for p in (root / "restore").iterdir()] == ["p0000"]


def test_a_manifest_that_names_another_folder_or_table_is_ignored(saved):
    store, manifest, root = saved
    assert [m.path for m in store.list("t", 0)] == [manifest.path]
    _rewrite(manifest, path=str(root / "elsewhere"))
    assert store.list("t", 0) == []
    _rewrite(manifest, path=manifest.path, table="other")
    assert store.list("t", 0) == []
    json.loads(open(f"{manifest.path}/{MANIFEST}").read())
