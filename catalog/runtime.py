"""Where a deployment keeps things: broker, state cache, snapshots, batch
logs, Delta tables, table definitions. All from the environment, with the
local stack's defaults, so jobs run the same under spark-submit, Airflow,
the CLI and tests."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from catalog import settings as stack_settings
from catalog.settings import PROJECT_ROOT
from state.errors import BadSetting


def private_dir(folder: Path) -> Path:
    """`folder`, made or tightened to 0700 when it is this user's. Everything a table leaves
    (state, snapshots, the batch log, Delta) lives below it, so no other user reads a table
    around the query API's authorisation, whatever umask wrote the files: the provider inside a
    user's own Airflow runs under Airflow's umask (022), and data dirs of older versions were
    made with it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            folder.chmod(0o700)
    except OSError:         # not ours to make or tighten (a read-only mount): used as it is
        pass
    return folder


@dataclass(frozen=True)
class Runtime:
    bootstrap: str
    data_dir: Path
    snapshot_uri: str
    tables_dir: Path
    namespace: str = ""   # prefix of derived topics (changelogs, dead letters): environments share a cluster
    store_uri: str = ""   # s3://bucket/prefix: batch logs, snapshots and Delta tables in an object store; "": data_dir

    @classmethod
    def from_env(cls) -> "Runtime":
        stack = stack_settings.load()
        stack_settings.adopt_cluster_env(stack)
        stack_settings.adopt_kafka_env(stack)
        data_dir = private_dir(Path(os.environ.get("STATETABLE_DATA_DIR", stack.data_dir)).resolve())
        store = os.environ.get("STATETABLE_STORE_URI", "").rstrip("/")
        if store and not store.startswith("s3://"):
            raise BadSetting(f"STATETABLE_STORE_URI={store!r}: the durable store is an s3://bucket/prefix URI "
                             f"(or unset, for folders under STATETABLE_DATA_DIR)")
        return cls(
            bootstrap=os.environ.get("STATETABLE_KAFKA_BOOTSTRAP", stack.kafka_bootstrap),
            data_dir=data_dir,
            snapshot_uri=os.environ.get("STATETABLE_SNAPSHOT_URI",
                                        f"{store}/snapshots" if store else str(data_dir / "snapshots")),
            tables_dir=Path(os.environ.get("STATETABLE_TABLES_DIR", PROJECT_ROOT / "dags" / "tables")).resolve(),
            namespace=os.environ.get("STATETABLE_NAMESPACE", ""),
            store_uri=store,
        )

    def as_env(self) -> dict[str, str]:
        """The environment that makes `from_env` in a child process (spark-submit, the CLI) return this."""
        return {
            "STATETABLE_KAFKA_BOOTSTRAP": self.bootstrap, "STATETABLE_DATA_DIR": str(self.data_dir),
            "STATETABLE_SNAPSHOT_URI": self.snapshot_uri, "STATETABLE_TABLES_DIR": str(self.tables_dir),
            "STATETABLE_NAMESPACE": self.namespace, "STATETABLE_STORE_URI": self.store_uri,
        }

    def dead_letter_topic(self, table: str) -> str:
        return f"{self.namespace}{table}-dlq"

    @property
    def state_dir(self) -> Path:
        """The driver's cache of state partitions (a task uses `task_state_dir`: its own host's)."""
        return self.data_dir / "state"

    def batch_dir(self, table: str) -> Path | str:
        """The batch log's location: durable, so that any driver can run the next batch."""
        return f"{self.store_uri}/batches/{table}" if self.store_uri else self.data_dir / "batches" / table

    def verified_dir(self, table: str) -> str:
        """Where verify keeps the expected state it proved exact (spark_jobs.delta.verify_chain)."""
        return f"{self.store_uri}/verified/{table}" if self.store_uri else str(self.data_dir / "verified" / table)

    def delta_path(self, table: str, kind: str) -> str:
        """kind: bronze (parsed events), mirror (the state as a Delta table), dlq (dead letters)."""
        if self.store_uri:
            return spark_path(f"{self.store_uri}/delta/{table}_{kind}")
        return str(self.data_dir / "delta" / f"{table}_{kind}")


WORKER_STATE_ENV = "STATETABLE_WORKER_STATE_DIR"


def task_state_dir(driver_state_dir: str) -> str:
    """Where a Spark task keeps state partitions: its own host's cache when the worker says
    (a cluster worker sets STATETABLE_WORKER_STATE_DIR, as separate machines have separate
    disks), else the driver's folder (local[*], one machine). The cache is never the truth: a
    partition missing or stale there is restored from snapshots and the changelog on open."""
    return os.environ.get(WORKER_STATE_ENV) or driver_state_dir


LOCAL_REPLICAS_ENV = "STATETABLE_LOCAL_REPLICAS"


def _named_replica_roots() -> list[Path]:
    return [Path(d) / "replicas" for d in os.environ.get(LOCAL_REPLICAS_ENV, "").split(os.pathsep) if d]


def local_replica_roots(rt: "Runtime") -> tuple[str, ...]:
    """Where query replicas on the driver's host keep their copies, which a writer missing a
    partition copies from before it reads snapshots (standby replicas cutting recovery, as in
    Kafka Streams): the deployment's own data dir's, and every data dir named in
    STATETABLE_LOCAL_REPLICAS (os.pathsep-separated)."""
    return tuple(str(p) for p in [rt.data_dir / "replicas", *_named_replica_roots()])


def task_replica_roots(driver_roots: tuple[str, ...]) -> tuple[Path, ...]:
    """A task's replica folders: the driver's when it runs beside the driver (a local session);
    on a cluster worker, those its own environment names (the data dirs of the `serve`
    processes on that machine), since the driver's folders are on another disk."""
    if os.environ.get(WORKER_STATE_ENV):
        return tuple(_named_replica_roots())
    return tuple(Path(r) for r in driver_roots)


def arrow_filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a local folder, s3:// or Spark's s3a:// name."""
    import pyarrow.fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri("s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri)


def spark_path(uri: str) -> str:
    """The same object as Spark's Hadoop filesystem names it (s3a://); other tools read s3://."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri
