"""One way to build a SparkSession for every statetable job.

Jars come from the project's cache as local files (spark.jars), never from a
network resolve at job start, so jobs run offline and start the same way under
spark-submit, Airflow and tests.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from catalog.priority import batch_niceness, yield_cpu_to_queries
from catalog.settings import JARS_DIR

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_jars() -> list[Path]:
    """Local jar files for Spark's `spark.jars`: Kafka source and Delta Lake."""
    found = sorted((JARS_DIR / "spark").glob("*.jar"))
    if not any(p.name.startswith("spark-sql-kafka") for p in found):
        raise SystemExit(f"Spark's Kafka source jar is missing from {JARS_DIR / 'spark'}; run `make setup`")
    return found


def spark_conf(app_name: str, master: str | None = None) -> dict[str, str]:
    jar_paths = [str(p) for p in spark_jars()]
    conf = {
        "spark.app.name": app_name,
        "spark.jars": ",".join(jar_paths),
        # Also on the driver's own classpath: in local mode the Kafka source and Delta then load once,
        # from the application class loader, instead of again in the executor's loader for spark.jars,
        # with their JIT warm-up paid twice (a cold 1M-record batch: 18.0 -> 12.8 s).
        "spark.driver.extraClassPath": os.pathsep.join(jar_paths),
        # 1g as Spark's own default: the driver holds per-batch stats and small partials, not the
        # batch, and a 2g heap only grew the JVM's peak RSS (a 5M-event batch: 1347 -> 877-992 MB).
        "spark.driver.memory": os.environ.get("STATETABLE_SPARK_DRIVER_MEMORY", "1g"),
        "spark.sql.shuffle.partitions": os.environ.get("STATETABLE_SHUFFLE_PARTITIONS", "4"),
        "spark.ui.enabled": os.environ.get("STATETABLE_SPARK_UI", "false"),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.databricks.delta.snapshotPartitions": "2",
        # The Arrow pass pre-aggregates per Arrow batch: bigger batches, fewer partial rows to shuffle.
        "spark.sql.execution.arrow.maxRecordsPerBatch": os.environ.get("STATETABLE_ARROW_BATCH_RECORDS", "200000"),
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG}",
        **DELTA_CONF,
    }
    # Under spark-submit the master comes from the command line (the Airflow
    # Spark connection); a direct Python session defaults to local mode.
    if master or not os.environ.get("SPARK_ENV_LOADED"):
        conf["spark.master"] = master or os.environ.get("STATETABLE_SPARK_MASTER", "local[*]")
    return conf


def submit_options(app_name: str) -> dict:
    """Arguments for SparkSubmitOperator / spark-submit.

    The driver JVM exists before the Python job runs under spark-submit, so
    the jars must be on its command line; setting spark.jars later only
    reaches executors.
    """
    conf = spark_conf(app_name)
    jars_csv = conf.pop("spark.jars")
    conf.pop("spark.app.name")
    conf.pop("spark.master", None)
    return {"jars": jars_csv, "conf": conf, "name": app_name}


def get_or_create(app_name: str, master: str | None = None, extra_conf: dict[str, str] | None = None):
    """A SparkSession with the Kafka source and Delta Lake on its classpath."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in {**spark_conf(app_name, master), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the venv's interpreter (state/, confluent-kafka, rocksdict live there).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    batch_niceness()      # a bad STATETABLE_BATCH_NICE fails here, before a JVM starts
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("STATETABLE_SPARK_LOG_LEVEL", "WARN"))
    gateway = getattr(spark.sparkContext._gateway, "proc", None)
    if gateway is not None:     # the JVM this process started (local mode); its Python workers inherit
        yield_cpu_to_queries(gateway.pid)
    return spark
