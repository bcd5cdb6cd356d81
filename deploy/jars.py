"""The project's JVM artifacts: fetched once from Maven Central, then used offline.

Maven resolves the dependency trees declared in deploy/maven/*.pom.xml into a
repository in the user's cache (~/.cache/statetable/m2/<set>, as Maven's own ~/.m2 and uv's
~/.cache/uv live there) and copies the jars into the checkout's .cache/jars/<set>. A second
clone, a worktree or `make clean` then resolves from disk: the three sets took 55 s and 56 CPU
s of downloads and Maven on a clean clone with an empty repository, 6 s and 12 CPU s with it
filled. Spark's set leaves out every artifact the pyspark wheel
already ships, so a second, older copy of a class (jackson, scala-library,
hadoop) can never shadow the one Spark was built against.

The sets are fetched side by side, each by a Maven of its own with a repository
of its own (two Maven 3.8 processes writing one repository race on the same
files): on a clean clone the three took 39 + 16 + 43 s one after the other,
most of it waiting on downloads, and 48 s side by side. Two checkouts fetching the same set at
once take turns (a lock file per set): their Mavens would share a repository.
"""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from catalog.settings import JARS_DIR, PROJECT_ROOT
from catalog.errors import NotInstalled

MAVEN_DIR = PROJECT_ROOT / "deploy" / "maven"
JAR_SETS = {"kafka": "kafka-broker.pom.xml", "spark": "spark-extras.pom.xml", "s3": "s3-extras.pom.xml",
            "flink": "flink-kafka.pom.xml", "registry": "schema-registry.pom.xml",
            "cdc": "kafka-connect.pom.xml"}
DEFAULT_SETS = ("kafka", "spark", "s3", "registry", "cdc")  # flink: only `make bench` needs it
MAVEN_REPOS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "statetable" / "m2"
_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


def artifact_id(jar_name: str) -> str:
    """'jackson-core-2.13.5.jar' -> 'jackson-core'."""
    return _VERSION_SUFFIX.sub("", jar_name)


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _maven(name: str, out_dir: Path, exclude: list[str]) -> None:
    cmd = [
        "mvn", "-q", "-B", "-Dstyle.color=never",
        "-s", str(MAVEN_DIR / "settings.xml"),
        f"-Dmaven.repo.local={MAVEN_REPOS / name}",
        "-f", str(MAVEN_DIR / JAR_SETS[name]),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out_dir}",
    ]
    if name == "registry":
        cmd.append("-DincludeTypes=tar.gz")     # the built application, one archive
    if exclude:
        cmd.append("-DexcludeArtifactIds=" + ",".join(sorted(exclude)))
    MAVEN_REPOS.mkdir(parents=True, exist_ok=True)
    with open(MAVEN_REPOS / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(cmd, check=True)


def fetch(names: tuple[str, ...] = DEFAULT_SETS) -> None:
    """Copy the named jar sets into the cache, side by side; a no-op for a set already complete."""
    from concurrent.futures import ThreadPoolExecutor

    provided = {artifact_id(p.name) for p in pyspark_jars_dir().glob("*.jar")}
    with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
        for done in pool.map(lambda name: _fetch_set(name, provided), names):
            print(done, flush=True)


def _fetch_set(name: str, provided: set[str]) -> str:
    out_dir = JARS_DIR / name
    stamp = out_dir / ".complete"
    pom_path = MAVEN_DIR / JAR_SETS[name]
    if stamp.exists() and stamp.stat().st_mtime >= pom_path.stat().st_mtime:
        return f"jars: {name} cached ({_count(name, out_dir)} in {out_dir})"
    started = time.monotonic()
    for old in [*out_dir.glob("*.jar"), *out_dir.glob("*.tar.gz")]:
        old.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    _maven(name, out_dir, sorted(provided) if name in ("spark", "s3") else [])
    stamp.touch()
    return f"jars: {name} fetched ({_count(name, out_dir)}) in {time.monotonic() - started:.1f}s"


def _count(name: str, out_dir: Path) -> str:
    """'46 jars', or '1 archive' for a set that is one built application (the registry's)."""
    found = jars(name)
    return f"{len(found)} jars" if found else f"{len(list(out_dir.glob('*.tar.gz')))} archive"


def jars(name: str) -> list[Path]:
    return sorted((JARS_DIR / name).glob("*.jar"))


def kafka_classpath() -> str:
    found = jars("kafka")
    if not found:
        raise NotInstalled("the Kafka broker jars are missing from .cache/jars/kafka; run `make setup`")
    return ":".join(str(p) for p in found)


if __name__ == "__main__":
    if sys.argv[1:2] != ["fetch"] or not set(sys.argv[2:]) <= set(JAR_SETS):
        raise SystemExit(f"usage: python -m deploy.jars fetch [{'|'.join(JAR_SETS)} ...]")
    fetch(tuple(sys.argv[2:]) or DEFAULT_SETS)
