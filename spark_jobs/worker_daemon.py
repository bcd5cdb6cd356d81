"""The Python worker daemon of every statetable session: pyspark's own daemon, with the Arrow pass
and the state library imported before it forks any worker.

The server keeps a daemon per client session (a table's), and Spark stops idle workers after a
minute, so a table scheduled every minute would fork cold workers each run and pay ~1 s of
imports (pyarrow, pandas, the pass) in each. Forked from a daemon that holds them, a worker
starts warm. Set as `spark.python.daemon.module` for every session (spark_jobs/engine/session.py).

A reused worker runs a full `gc.collect()` after every task (pyspark.daemon). Over the ~100,000
objects of these imports each took 65-85 ms, and a small batch runs 8-10 Python tasks: 0.7 of its
2.4 CPU s. So the daemon freezes what it imported before it forks (gc.freeze): no collection in a
worker walks those objects again, and their pages stay shared with the daemon, not copied by a
collector's writes. What a task allocates is collected as before.
"""
import gc
import os
import sys
import time
from pathlib import Path


def installed_first(path: list[str]) -> list[str]:
    """Spark puts $SPARK_HOME/python/lib/pyspark.zip (and py4j's zip) first on a worker's path.
    Python never caches bytecode for a zip, so every daemon compiled pyspark from source: ~2 s of
    a cold batch's read step. When that zip belongs to the pyspark installed on this path (a pip
    install: <site-packages>/pyspark/python/lib/pyspark.zip), the same files unzipped, with their
    compiled bytecode, go first; the zips stay last, for an install that has only them."""
    zips = [p for p in path if p.endswith(".zip") and Path(p).parents[2].name == "pyspark"
            and str(Path(p).parents[3]) in path]
    return [p for p in path if p not in zips] + zips


sys.path[:] = installed_first(sys.path)

import pyspark.daemon  # noqa: E402

import confluent_kafka  # noqa: E402,F401
import pyarrow.compute  # noqa: E402,F401
import pyarrow.json  # noqa: E402,F401
import pyarrow.parquet  # noqa: E402,F401
import pyspark.worker  # noqa: E402,F401
import spark_jobs.frames.arrow_pass  # noqa: E402,F401
import spark_jobs.steps.merge_task  # noqa: E402,F401
import spark_jobs.delta.mirror  # noqa: E402,F401

if __name__ == "__main__":
    # Every worker forked from here inherits it: a merge task tells its batch whether its worker
    # came warm (a daemon that was up, imports done, before the batch began) or cold.
    os.environ[spark_jobs.steps.merge_task.PRELOADED_ENV] = repr(time.time())
    gc.freeze()
    pyspark.daemon.manager()
