"""How to start each peer: its interpreter (own venv or statetable's) and its arguments."""
from __future__ import annotations

import sys
from pathlib import Path

from deploy import jars
from catalog.settings import PROJECT_ROOT

VENVS = PROJECT_ROOT / ".bench" / "venvs"
PEERS = PROJECT_ROOT / "bench" / "peers"
QUIET_SPARK = {"STATETABLE_SPARK_LOG_LEVEL": "ERROR"}


def _venv_python(name: str) -> Path:
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"bench peer {name!r} has no venv at {python.parent.parent}; run `make bench` "
                         f"(it syncs bench/peers/{name}/uv.lock into it)")
    return python


def statetable(bootstrap: str, topic: str, out: Path, data_dir: Path, *extra: str) -> list:
    return [sys.executable, "-m", "bench.peers.statetable_count", "--bootstrap", bootstrap, "--topic", topic,
            "--out", out, "--data-dir", data_dir, *extra]


def quix(bootstrap: str, topic: str, out: Path, state_dir: Path, group: str, *extra: str) -> list:
    return [_venv_python("quix"), PEERS / "quix" / "count_sum.py", "--bootstrap", bootstrap, "--topic", topic,
            "--group", group, "--state-dir", state_dir, "--out", out, *extra]


def flink(bootstrap: str, topic: str, out: Path, *extra: str) -> list:
    connector = next((p for p in jars.jars("flink") if "flink-sql-connector-kafka" in p.name), None)
    if connector is None:
        raise SystemExit("Flink's Kafka connector jar is missing; run `python -m deploy.jars fetch flink`")
    return [_venv_python("flink"), PEERS / "flink" / "count_sum.py", "--bootstrap", bootstrap, "--topic", topic,
            "--out", out, "--checkpoints", out / "checkpoints", "--connector-jar", connector, *extra]


def spark_structured_streaming(bootstrap: str, topic: str, out: Path, checkpoint: Path, *extra: str) -> list:
    return [sys.executable, "-m", "bench.peers.spark_structured_streaming", "--bootstrap", bootstrap,
            "--topic", topic, "--out", out, "--checkpoint", checkpoint, *extra]


def versions() -> dict[str, str]:
    """Installed versions, read from each venv's metadata (no import of the peers here)."""
    import subprocess

    def version_in(python: Path, dist: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({dist!r}))"
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        return done.stdout.strip() or "?"

    return {"statetable": version_in(Path(sys.executable), "statetable"),
            "pyspark": version_in(Path(sys.executable), "pyspark"),
            "rocksdict": version_in(Path(sys.executable), "rocksdict"),
            "quixstreams": version_in(_venv_python("quix"), "quixstreams"),
            "apache-flink": version_in(_venv_python("flink"), "apache-flink"),
            "flink-sql-connector-kafka": next((p.name[len("flink-sql-connector-kafka-"):-4]
                                               for p in jars.jars("flink")), "?")}
