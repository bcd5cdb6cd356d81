"""The worker daemon's start: pyspark from the installed package, with bytecode compiled at install.

A cold batch's Python workers compiled pyspark from Spark's pyspark.zip (never cached) and, where
PYTHONDONTWRITEBYTECODE is set, pandas and numpy from source, in every daemon: seconds of the
first batch. These check the two install facts that remove it."""
import importlib.util
import sys
from pathlib import Path

import pandas
import pyarrow
import pyspark

from spark_jobs.worker_daemon import installed_first

SITE = "/venv/lib/python3.11/site-packages"
ZIP = f"{SITE}/pyspark/python/lib/pyspark.zip"
PY4J = f"{SITE}/pyspark/python/lib/py4j-0.10.9.9-src.zip"


def test_the_zips_of_the_installed_pyspark_go_after_its_unzipped_files():
    path = ["/work", ZIP, PY4J, "/usr/lib/python311.zip", SITE]
    assert installed_first(path) == ["/work", "/usr/lib/python311.zip", SITE, ZIP, PY4J]


def test_a_worker_that_has_only_the_zips_keeps_them_where_spark_put_them():
    path = ["/work", "/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip", SITE]
    assert installed_first(path) == path       # /opt/spark is not on the path: its zip is the only pyspark


def test_the_venv_holds_compiled_bytecode_for_what_every_worker_imports():
    missing = [m.__name__ for m in (pandas, pyarrow, pyspark)
               if not Path(importlib.util.cache_from_source(m.__file__)).exists()]
    assert not missing, f"no .pyc for {missing} in {sys.prefix}: `make setup` syncs with UV_COMPILE_BYTECODE=1"


def test_a_spark_worker_imports_pyspark_unzipped(spark):
    """Through the test session's real worker daemon: its workers import the installed pyspark."""
    def where(batches):
        import pyspark as worker_pyspark
        for _ in batches:
            yield pyarrow.RecordBatch.from_pydict({"file": [worker_pyspark.__file__]})

    [row] = spark.range(1).mapInArrow(where, "file string").collect()
    assert ".zip" not in row["file"] and Path(row["file"]) == Path(pyspark.__file__)


def test_a_worker_forked_from_the_daemon_never_collects_what_the_daemon_imported(spark):
    """pyspark's daemon runs a full collection after every task of a reused worker: over the
    daemon's imports that was 65-85 ms a task, most of a small batch's Python CPU. Frozen before
    the fork, they are outside every collection (spark_jobs/worker_daemon.py)."""
    def counts(batches):
        import gc
        import sys
        # What the daemon imported (pyarrow's, pyspark's module namespaces) must be outside the
        # tracked generations; how many objects a reused worker's earlier tasks left tracked
        # depends on which tasks it ran, so that count is no measure.
        tracked = {id(o) for o in gc.get_objects()}
        daemon_owned = [sys.modules[m].__dict__ for m in ("pyarrow", "pyspark", "pyspark.worker") if m in sys.modules]
        for _ in batches:
            yield pyarrow.RecordBatch.from_pydict({
                "frozen": [gc.get_freeze_count()], "checked": [len(daemon_owned)],
                "collectable": [sum(id(d) in tracked for d in daemon_owned)]})

    [row] = spark.range(1).mapInArrow(counts, "frozen long, checked long, collectable long").collect()
    assert row["frozen"] > 50_000 and row["checked"] >= 2 and row["collectable"] == 0, row.asDict()
