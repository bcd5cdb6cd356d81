"""The Python worker daemon of the Spark Connect server: pyspark's own daemon, with the Arrow pass
and the state library imported before it forks any worker.

The server keeps a daemon per client session (a table's), and Spark stops idle workers after a
minute, so a table scheduled every minute would fork cold workers each run and pay ~1 s of
imports (pyarrow, pandas, the pass) in each. Forked from a daemon that holds them, a worker
starts warm. Set as `spark.python.daemon.module` by the server (deploy/connect_server.py).
"""
import os
import time

import pyspark.daemon

import confluent_kafka  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.json  # noqa: F401
import pyarrow.parquet  # noqa: F401
import pyspark.worker  # noqa: F401
import spark_jobs.arrow_pass  # noqa: F401
import spark_jobs.merge_task  # noqa: F401
import spark_jobs.mirror  # noqa: F401

if __name__ == "__main__":
    # Every worker forked from here inherits it: a merge task tells its batch whether its worker
    # came warm (a daemon that was up, imports done, before the batch began) or cold.
    os.environ[spark_jobs.merge_task.PRELOADED_ENV] = repr(time.time())
    pyspark.daemon.manager()
