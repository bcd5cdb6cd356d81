"""A class-data archive for the driver JVMs of jobs (Java's AppCDS): Spark, Scala, Delta and the
Kafka source loaded from a memory-mapped archive instead of parsed and verified from jars in every
process. A job's driver starts per run (a CLI command, an Airflow task's spark-submit), and on two
cores its class loading was a third of a short job: a local job of five Delta appends, reads and a
MERGE took 19-20 CPU s of its JVM without the archive and 14 with it (wall 16 -> 11 s).

`make setup` builds it once (`python -m spark_jobs.engine.jvm_archive`): a local session runs such a job
with `-XX:ArchiveClassesAtExit`, and the file is renamed into place only after that JVM exited,
so a job never maps a half-written archive. Its name carries a hash of what it was built from
(the java binary, pyspark's jars, the cached jars); a job whose classpath differs (another
checkout, the s3a jars) finds no archive of its name and starts as before. The JVM itself checks
the archive against its classpath and, where it cannot use it, loads from the jars: the archive
only ever saves time, and `-Xlog:cds=off` keeps that check out of a job's output."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from catalog.settings import CACHE_DIR, JARS_DIR

__all__ = ["archive_path", "build", "conf_java_options", "java_options"]

ARCHIVE_DIR = CACHE_DIR / "jvm"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _classpath_key(jars: list[Path]) -> str:
    import pyspark

    java = shutil.which("java") or "java"
    parts = [os.path.realpath(java)]
    spark_home = Path(pyspark.__file__).parent / "jars"
    for path in [*sorted(spark_home.glob("*.jar")), *jars]:
        try:
            stat = path.stat()
        except OSError:
            continue
        parts.append(f"{path}:{stat.st_size}:{int(stat.st_mtime)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(jars: list[Path]) -> Path:
    return ARCHIVE_DIR / f"driver-{_classpath_key(jars)}.jsa"


def java_options(jars: list[Path]) -> str:
    """The driver's options that map the archive, or "" when none was built for these jars."""
    path = archive_path(jars)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


def conf_java_options(conf: dict[str, str]) -> str:
    """java_options for the driver of a Spark conf: its jars are the conf's `spark.jars` (a job's
    driver and the Spark Connect server's have the same classpath)."""
    return java_options([Path(p) for p in conf.get("spark.jars", "").split(",") if p])


# The job the archive is built from: what a batch's driver loads (Delta's log, reads, writes, a
# MERGE, Arrow), run in a local session of the product's own configuration.
_WORKLOAD = """
import sys
from pyspark.sql import functions as F
from spark_jobs.engine import session
spark = session.get_or_create("statetable-jvm-archive", local=True)
where = sys.argv[1]
for i in range(3):
    spark.range(i * 100, i * 100 + 100).withColumn("v", F.col("id") % 7).write.format("delta").mode("append").save(where)
spark.read.format("delta").load(where).groupBy("v").count().toArrow()
spark.range(0, 50).withColumn("v", F.lit(9)).createOrReplaceTempView("src")
spark.sql(f"MERGE INTO delta.`{where}` t USING src s ON t.id = s.id "
          "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
spark.read.format("delta").load(where).where("v = 9").count()
print(spark.sparkContext._gateway.proc.pid, flush=True)
spark.stop()
"""


def build(jars: list[Path] | None = None) -> str:
    """Build the archive for these jars if there is none; one line saying what was done. By
    default the jars of a job without an object store (spark_jobs.engine.session.spark_jars)."""
    jars = sorted((JARS_DIR / "spark").glob("*.jar")) if jars is None else jars
    final = archive_path(jars)
    if final.is_file():
        return f"jvm archive: {final.name} present"
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    for stale in ARCHIVE_DIR.glob("driver-*.jsa*"):
        stale.unlink(missing_ok=True)            # built for jars or a java no longer here
    partial = final.with_suffix(f".jsa.{os.getpid()}")
    scratch = ARCHIVE_DIR / f"workload-{os.getpid()}"
    env = {**os.environ, "STATETABLE_SPARK_REMOTE": "local",
           "STATETABLE_JOB_JVM_OPTIONS": f"-XX:ArchiveClassesAtExit={partial} {QUIET}"}
    env.pop("STATETABLE_STORE_URI", None)
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", _WORKLOAD, str(scratch / "table")], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return f"jvm archive: not built (the workload exited {done.returncode}); jobs start without it"
        pid = int(done.stdout.split()[-1])
        deadline = time.monotonic() + 120
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)                       # the JVM writes the archive as it exits
        if Path(f"/proc/{pid}").exists() or not partial.is_file():
            return "jvm archive: not built (the JVM did not write it); jobs start without it"
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return (f"jvm archive: {final.name} built in {time.monotonic() - started:.0f}s "
            f"({final.stat().st_size / 1e6:.0f} MB); job drivers map it")


if __name__ == "__main__":
    print(build(), flush=True)
