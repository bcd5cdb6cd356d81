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


@dataclass(frozen=True)
class Runtime:
    bootstrap: str
    data_dir: Path
    snapshot_uri: str
    tables_dir: Path
    namespace: str = ""   # prefix of derived topics (changelogs, dead letters): environments share a cluster

    @classmethod
    def from_env(cls) -> "Runtime":
        stack = stack_settings.load()
        data_dir = Path(os.environ.get("STATETABLE_DATA_DIR", stack.data_dir)).resolve()
        return cls(
            bootstrap=os.environ.get("STATETABLE_KAFKA_BOOTSTRAP", stack.kafka_bootstrap),
            data_dir=data_dir,
            snapshot_uri=os.environ.get("STATETABLE_SNAPSHOT_URI", str(data_dir / "snapshots")),
            tables_dir=Path(os.environ.get("STATETABLE_TABLES_DIR", PROJECT_ROOT / "dags" / "tables")).resolve(),
            namespace=os.environ.get("STATETABLE_NAMESPACE", ""),
        )

    def as_env(self) -> dict[str, str]:
        """The environment that makes `from_env` in a child process (spark-submit, the CLI) return this."""
        return {
            "STATETABLE_KAFKA_BOOTSTRAP": self.bootstrap, "STATETABLE_DATA_DIR": str(self.data_dir),
            "STATETABLE_SNAPSHOT_URI": self.snapshot_uri, "STATETABLE_TABLES_DIR": str(self.tables_dir),
            "STATETABLE_NAMESPACE": self.namespace,
        }

    def dead_letter_topic(self, table: str) -> str:
        return f"{self.namespace}{table}-dlq"

    @property
    def state_dir(self) -> Path:
        return self.data_dir / "state"

    def batch_dir(self, table: str) -> Path:
        return self.data_dir / "batches" / table

    def delta_path(self, table: str, kind: str) -> str:
        """kind: bronze (parsed events), mirror (the state as a Delta table), dlq (dead letters)."""
        return str(self.data_dir / "delta" / f"{table}_{kind}")
