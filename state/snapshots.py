"""Snapshots of state partitions in a store given by URI (local path or s3://).

A snapshot is a RocksDB checkpoint with a sha256 of each file and a manifest
written LAST: a snapshot without a manifest never happened (a crash mid-upload
leaves only garbage that retention removes). Storage goes through pyarrow.fs,
so the same code writes to a local folder and to S3.

Snapshots are incremental, as Spark's RocksDB state store and Flink's
incremental checkpoints are: SST files never change once written, so each is
stored once per partition, content-addressed (`sst/<sha256>.sst`), and a
snapshot uploads only the SSTs the store does not hold yet; the small files
(MANIFEST, CURRENT, OPTIONS, WAL) go into the snapshot's own folder. An SST
already uploaded is recognised without reading it by the RocksDB database it
came from (its IDENTITY), its file name and size, as the previous snapshot's
manifest recorded them. Retention deletes a snapshot's manifest first, then
its folder, then the SSTs no remaining manifest names: a kill at any step
leaves every kept snapshot whole (the rest is swept by the next retention).
"""
from __future__ import annotations

import functools
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
from state.errors import BadSetting

__all__ = ["CHUNK", "MANIFEST", "Manifest", "SHARED", "SnapshotStore"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNK = 4 << 20
SHARED = "sst"                 # a partition's folder of content-addressed SST files
_HEX = frozenset("0123456789abcdef")


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
    files: dict[str, dict] = field(default_factory=dict)  # name -> {"sha256", "size"[, "shared", "source"]}
    definition: str | None = None             # fingerprint of the definition the state was built with
    uploaded: int | None = None               # bytes this snapshot uploaded (the rest it shares)

    @property
    def total_bytes(self) -> int:
        return sum(int(f.get("size", 0)) for f in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        return cls(**json.loads(text))


def _sha256_of(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


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


def _is_sha256(text) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


def _identity(backend) -> str | None:
    """The RocksDB database's IDENTITY (a UUID made when the database was created): an SST name
    and size mean the same bytes only within one database."""
    path = getattr(backend, "path", None)
    try:
        return (Path(path) / "IDENTITY").read_text().strip() or None if path is not None else None
    except OSError:
        return None


def _checkpoint_place(backend) -> dict:
    """Where a snapshot's checkpoint is made: beside the database, so RocksDB hard-links its SSTs
    instead of copying them, and a writer killed mid-snapshot leaves it where the next snapshot of
    the partition (which only its one writer takes) removes it, not in /tmp for good."""
    path = getattr(backend, "path", None)
    if path is None:
        return {"prefix": "statetable-cp-"}
    prefix = f".{Path(path).name}.checkpoint-"
    for stale in Path(path).parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)
    return {"prefix": prefix, "dir": Path(path).parent}


class SnapshotStore:
    def __init__(self, uri: str) -> None:
        self.uri = uri                  # resolved on first use: building a table does no I/O

    @functools.cached_property
    def _place(self) -> tuple:
        return _filesystem(self.uri)

    @property
    def fs(self):
        return self._place[0]

    @property
    def root(self) -> str:
        return self._place[1]

    def _partition_dir(self, table: str, partition: int) -> str:
        return f"{self.root}/{table}/p{partition:04d}"

    @staticmethod
    def file_path(manifest: Manifest, name: str) -> str:
        """Where a snapshot's file is stored: a shared SST in its partition's `sst/` folder, any
        other file in the snapshot's own folder."""
        entry = manifest.files[name]
        if entry.get("shared"):
            return f"{manifest.path.rsplit('/', 1)[0]}/{SHARED}/{entry['sha256']}.sst"
        return f"{manifest.path}/{name}"

    # -- write ---------------------------------------------------------------
    def save(self, table: str, partition: int, backend, definition: str | None = None) -> Manifest:
        """Checkpoint `backend` and store it, uploading only the SSTs the store lacks."""
        meta = backend.read_meta()
        identity = _identity(backend)
        known = self._known_ssts(table, partition, identity)
        uploaded = 0
        if hasattr(backend, "settle") and backend.settle():
            log.info("%s[%d]: merged into one sorted run before its snapshot (no run held a quarter of it)", table, partition)
        with tempfile.TemporaryDirectory(**_checkpoint_place(backend)) as tmp:
            checkpoint = Path(tmp) / "cp"
            backend.checkpoint(checkpoint)
            folder = f"{self._partition_dir(table, partition)}/b{meta.applied_batch:012d}-{uuid.uuid4().hex[:8]}"
            self.fs.create_dir(folder, recursive=True)
            files = {}
            for i, source in enumerate(sorted(p for p in checkpoint.iterdir() if p.is_file())):
                if source.suffix == ".sst":
                    files[source.name], sent = self._share(table, partition, source, identity, known)
                else:
                    files[source.name] = self._upload(source, f"{folder}/{source.name}")
                    sent = files[source.name]["size"]
                uploaded += sent
                if i == 0:
                    faults.point("snapshot.mid_upload")
        manifest = Manifest(
            table=table, partition=partition, batch_id=meta.applied_batch,
            changelog_offset=meta.changelog_offset, digest=meta.digest, key_count=meta.key_count,
            format_version=meta.format_version, created_at=time.time(), path=folder, files=files,
            definition=definition, uploaded=uploaded,
        )
        with self.fs.open_output_stream(f"{folder}/{MANIFEST}") as out:
            out.write(manifest.to_json().encode())
        log.info("%s[%d] snapshot at batch %d: uploaded %d of %d bytes", table, partition, meta.applied_batch,
                 uploaded, manifest.total_bytes)
        return manifest

    def _known_ssts(self, table: str, partition: int, identity: str | None) -> dict[str, dict]:
        """The shared SSTs the newest snapshot of this database recorded, by `identity:name:size`."""
        if identity is None:
            return {}
        newest = next(iter(self.list(table, partition)), None)
        if newest is None:
            return {}
        return {entry["source"]: entry for entry in newest.files.values()
                if entry.get("shared") and str(entry.get("source", "")).startswith(f"{identity}:")
                and _is_sha256(entry.get("sha256"))}

    def _share(self, table: str, partition: int, source: Path, identity: str | None,
               known: dict[str, dict]) -> tuple[dict, int]:
        """An SST as a shared object: reused untouched when the previous snapshot of the same
        database holds it (and the object is still there, whole), else hashed and uploaded once
        per content. Returns the manifest entry and the bytes uploaded."""
        size = source.stat().st_size
        key = f"{identity}:{source.name}:{size}" if identity else None
        shared_dir = f"{self._partition_dir(table, partition)}/{SHARED}"
        entry = known.get(key) if key else None
        if entry is not None and self._object_size(f"{shared_dir}/{entry['sha256']}.sst") == size:
            return {"sha256": entry["sha256"], "size": size, "shared": True, "source": key}, 0
        sha = _sha256_of(source)
        target = f"{shared_dir}/{sha}.sst"
        if self._object_size(target) == size:
            return {"sha256": sha, "size": size, "shared": True, **({"source": key} if key else {})}, 0
        self.fs.create_dir(shared_dir, recursive=True)
        part = f"{shared_dir}/.{sha}.{uuid.uuid4().hex[:8]}.part"
        stored = self._upload(source, part)
        if stored["sha256"] != sha:
            self.fs.delete_file(part)
            raise SnapshotCorrupt(f"{source.name} changed while it was uploaded ({sha[:16]}… then "
                                  f"{stored['sha256'][:16]}…)")
        self.fs.move(part, target)
        return {"sha256": sha, "size": size, "shared": True, **({"source": key} if key else {})}, size

    def _object_size(self, path: str) -> int | None:
        from pyarrow import fs

        info = self.fs.get_file_info(path)
        return info.size if info.type == fs.FileType.File else None

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
            if expected.get("shared") and not _is_sha256(expected.get("sha256")):
                raise SnapshotCorrupt(f"snapshot {manifest.path}: shared file {name!r} names no sha256")
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
            with self.fs.open_input_stream(self.file_path(manifest, name)) as src, open(dest, "xb") as out:
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
        """Keep the newest `keep` complete snapshots; delete the rest, unfinished uploads, and the
        shared SSTs no kept snapshot names.

        Order makes it crash-safe: a snapshot's manifest goes first (after which it never
        happened), then its folder, and shared SSTs only after every manifest that went; an SST
        is deleted only when no manifest left in the store names it and it is older than the
        newest kept snapshot (a snapshot being written may have uploaded it already)."""
        from pyarrow import fs

        if keep < 1:
            raise BadSetting(f"snapshot retention for table {table!r} must keep at least 1, not {keep}")
        complete = self.list(table, partition)
        keep_paths = {m.path for m in complete[:keep]}
        newest_kept = complete[min(keep, len(complete)) - 1].created_at if complete else 0
        base = self._partition_dir(table, partition)
        deleted = []
        for info in self.fs.get_file_info(fs.FileSelector(base, allow_not_found=True)):
            if info.type != fs.FileType.Directory or info.path in keep_paths or info.base_name == SHARED:
                continue
            is_old_complete = any(m.path == info.path for m in complete)
            # An unfinished upload may belong to a running snapshot: leave young ones alone.
            if is_old_complete or (info.mtime is not None and info.mtime.timestamp() < newest_kept):
                if is_old_complete:
                    self.fs.delete_file(f"{info.path}/{MANIFEST}")
                    faults.point("snapshot.retain_after_manifest")
                self.fs.delete_dir(info.path)
                deleted.append(info.path)
        faults.point("snapshot.retain_before_shared")
        named = {entry["sha256"] for m in self.list(table, partition) for entry in m.files.values()
                 if entry.get("shared")}
        for info in self.fs.get_file_info(fs.FileSelector(f"{base}/{SHARED}", allow_not_found=True)):
            if info.type != fs.FileType.File:
                continue
            sha = info.base_name.split(".")[1] if info.base_name.startswith(".") else info.base_name.split(".")[0]
            young = info.mtime is None or info.mtime.timestamp() >= newest_kept
            if sha in named or young:
                continue
            self.fs.delete_file(info.path)
            deleted.append(info.path)
            faults.point("snapshot.retain_mid_shared")
        return deleted

    def copy_to(self, other: "SnapshotStore", table: str, partition: int) -> int:
        """Copies every complete snapshot into `other` (a drill's scratch store); manifests are
        rewritten to name their new folder, which is the only place a manifest may speak for."""
        from dataclasses import replace

        copied = 0
        for manifest in self.list(table, partition):
            folder = f"{other._partition_dir(table, partition)}/{manifest.path.rsplit('/', 1)[-1]}"
            other.fs.create_dir(folder, recursive=True)
            moved = replace(manifest, path=folder)
            for name, entry in manifest.files.items():
                if not _plain_name(name) or (entry.get("shared") and not _is_sha256(entry.get("sha256"))):
                    continue        # download() refuses such a manifest anyway
                dest = other.file_path(moved, name)
                if entry.get("shared") and other._object_size(dest) == entry.get("size"):
                    continue
                other.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
                with self.fs.open_input_stream(self.file_path(manifest, name)) as src, \
                        other.fs.open_output_stream(dest) as out:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
            with other.fs.open_output_stream(f"{folder}/{MANIFEST}") as out:
                out.write(moved.to_json().encode())
            copied += 1
        return copied

    def delete_table(self, table: str) -> None:
        self.fs.delete_dir_contents(f"{self.root}/{table}", missing_dir_ok=True)

    def delete_all(self, table: str, partition: int) -> None:
        self.fs.delete_dir_contents(self._partition_dir(table, partition), missing_dir_ok=True)
