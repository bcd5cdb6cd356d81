"""Snapshots of state partitions in a store given by URI (local path or s3://).

A snapshot is a RocksDB checkpoint copied file by file, with a sha256 of each
file computed while copying, and a manifest written LAST: a snapshot without
a manifest never happened (a crash mid-upload leaves only garbage that
retention removes). Storage goes through pyarrow.fs, so the same code writes
to a local folder and to S3.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from state import faults
from state.errors import SnapshotCorrupt

__all__ = ["CHUNK", "MANIFEST", "Manifest", "SnapshotStore"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNK = 4 << 20


@dataclass(frozen=True)
class Manifest:
    table: str
    partition: int
    batch_id: int
    changelog_offset: int
    digest: int
    key_count: int
    format_version: int
    created_at: float
    path: str                                 # folder of the snapshot inside the store
    files: dict[str, dict] = field(default_factory=dict)  # name -> {"sha256", "size"}
    definition: str | None = None             # fingerprint of the definition the state was built with

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        return cls(**json.loads(text))


def _filesystem(uri: str):
    from pyarrow import fs

    if "://" not in uri:
        path = Path(uri).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return fs.LocalFileSystem(), str(path)
    return fs.FileSystem.from_uri(uri)


def _plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name \
        and "\x00" not in name and not name.startswith("~")


class SnapshotStore:
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.root = _filesystem(uri)

    def _partition_dir(self, table: str, partition: int) -> str:
        return f"{self.root}/{table}/p{partition:04d}"

    # -- write ---------------------------------------------------------------
    def save(self, table: str, partition: int, backend, definition: str | None = None) -> Manifest:
        """Checkpoint `backend` and copy it into the store."""
        meta = backend.read_meta()
        with tempfile.TemporaryDirectory(prefix="statetable-cp-") as tmp:
            checkpoint = Path(tmp) / "cp"
            backend.checkpoint(checkpoint)
            folder = f"{self._partition_dir(table, partition)}/b{meta.applied_batch:012d}-{uuid.uuid4().hex[:8]}"
            self.fs.create_dir(folder, recursive=True)
            files = {}
            for i, source in enumerate(sorted(p for p in checkpoint.iterdir() if p.is_file())):
                files[source.name] = self._upload(source, f"{folder}/{source.name}")
                if i == 0:
                    faults.point("snapshot.mid_upload")
        manifest = Manifest(
            table=table, partition=partition, batch_id=meta.applied_batch,
            changelog_offset=meta.changelog_offset, digest=meta.digest, key_count=meta.key_count,
            format_version=meta.format_version, created_at=time.time(), path=folder, files=files,
            definition=definition,
        )
        with self.fs.open_output_stream(f"{folder}/{MANIFEST}") as out:
            out.write(manifest.to_json().encode())
        return manifest

    def _upload(self, source: Path, dest: str) -> dict:
        sha, size = hashlib.sha256(), 0
        with open(source, "rb") as src, self.fs.open_output_stream(dest) as out:
            while chunk := src.read(CHUNK):
                sha.update(chunk)
                out.write(chunk)
                size += len(chunk)
        return {"sha256": sha.hexdigest(), "size": size}

    # -- read ----------------------------------------------------------------
    def list(self, table: str, partition: int) -> list[Manifest]:
        """Manifests of complete snapshots, newest batch first."""
        from pyarrow import fs

        base = self._partition_dir(table, partition)
        infos = self.fs.get_file_info(fs.FileSelector(base, allow_not_found=True))
        manifests = []
        for info in infos:
            if info.type != fs.FileType.Directory:
                continue
            try:
                with self.fs.open_input_stream(f"{info.path}/{MANIFEST}") as src:
                    manifest = Manifest.from_json(src.read().decode())
            except (FileNotFoundError, OSError, ValueError, TypeError):
                continue  # no manifest: an unfinished upload
            if manifest.path != info.path or (manifest.table, manifest.partition) != (table, partition):
                # A manifest speaks only for its own folder: one naming another place is not trusted.
                log.error("snapshot %s: its manifest names %s (table %r, partition %r); ignored", info.path,
                          manifest.path, manifest.table, manifest.partition)
                continue
            manifests.append(manifest)
        return sorted(manifests, key=lambda m: (m.batch_id, m.created_at), reverse=True)

    def download(self, manifest: Manifest, target: Path) -> None:
        """Copy a snapshot into `target`, verifying every checksum; raises SnapshotCorrupt.

        A manifest is data from a bucket that others may write to: its file names are plain
        names, never paths, and the files land in a fresh side folder that becomes `target`
        only once every checksum holds, so a bad snapshot leaves nothing behind."""
        for name, expected in manifest.files.items():
            if not _plain_name(name) or not isinstance(expected, dict):
                raise SnapshotCorrupt(f"snapshot {manifest.path}: file name {name!r} is not a plain file name")
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        side = Path(tempfile.mkdtemp(prefix=f".{target.name}.download-", dir=target.parent))
        try:
            for name, expected in manifest.files.items():
                self._download_file(manifest, name, expected, side / name)
            side.rename(target)
        finally:
            shutil.rmtree(side, ignore_errors=True)

    def _download_file(self, manifest: Manifest, name: str, expected: dict, dest: Path) -> None:
        sha, size = hashlib.sha256(), 0
        try:
            with self.fs.open_input_stream(f"{manifest.path}/{name}") as src, open(dest, "xb") as out:
                while chunk := src.read(CHUNK):
                    sha.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise SnapshotCorrupt(f"snapshot {manifest.path}: file {name} is missing") from None
        if sha.hexdigest() != expected.get("sha256") or size != expected.get("size"):
            raise SnapshotCorrupt(
                f"snapshot {manifest.path}: file {name} has sha256 {sha.hexdigest()[:16]}… size {size}, "
                f"manifest says {str(expected.get('sha256'))[:16]}… size {expected.get('size')}"
            )

    # -- retention ---------------------------------------------------------------
    def retain(self, table: str, partition: int, keep: int) -> list[str]:
        """Keep the newest `keep` complete snapshots; delete the rest and unfinished uploads."""
        from pyarrow import fs

        if keep < 1:
            raise ValueError(f"snapshot retention for table {table!r} must keep at least 1, not {keep}")
        complete = self.list(table, partition)
        keep_paths = {m.path for m in complete[:keep]}
        newest_kept = complete[min(keep, len(complete)) - 1].created_at if complete else 0
        base = self._partition_dir(table, partition)
        deleted = []
        for info in self.fs.get_file_info(fs.FileSelector(base, allow_not_found=True)):
            if info.type != fs.FileType.Directory or info.path in keep_paths:
                continue
            is_old_complete = any(m.path == info.path for m in complete)
            # An unfinished upload may belong to a running snapshot: leave young ones alone.
            if is_old_complete or (info.mtime is not None and info.mtime.timestamp() < newest_kept):
                self.fs.delete_dir(info.path)
                deleted.append(info.path)
        return deleted

    def copy_to(self, other: "SnapshotStore", table: str, partition: int) -> int:
        """Copies every complete snapshot into `other` (a drill's scratch store); manifests are
        rewritten to name their new folder, which is the only place a manifest may speak for."""
        from dataclasses import replace

        copied = 0
        for manifest in self.list(table, partition):
            folder = f"{other._partition_dir(table, partition)}/{manifest.path.rsplit('/', 1)[-1]}"
            other.fs.create_dir(folder, recursive=True)
            for name in manifest.files:
                if not _plain_name(name):
                    continue        # download() refuses such a manifest anyway
                with self.fs.open_input_stream(f"{manifest.path}/{name}") as src, \
                        other.fs.open_output_stream(f"{folder}/{name}") as out:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
            with other.fs.open_output_stream(f"{folder}/{MANIFEST}") as out:
                out.write(replace(manifest, path=folder).to_json().encode())
            copied += 1
        return copied

    def delete_table(self, table: str) -> None:
        self.fs.delete_dir_contents(f"{self.root}/{table}", missing_dir_ok=True)

    def delete_all(self, table: str, partition: int) -> None:
        self.fs.delete_dir_contents(self._partition_dir(table, partition), missing_dir_ok=True)
