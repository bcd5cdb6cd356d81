"""The same DAGs on Airflow's CeleryExecutor: a table's run goes through the broker to a Celery
worker process (as it would to another machine) and its rows equal an independent count."""
from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import replace

import pytest

from catalog.runtime import Runtime
from deploy import samples
from deploy.processes import wait_until
from spark_jobs import jobs
from tests.table_env import read_topic

TABLE = "movies_per_genre_celery"
SQL = """-- topic: {topic}
-- schema: title STRING, genre STRING
-- partitions: 2
-- schedule: */5 * * * *
CREATE TABLE {table} AS SELECT genre, COUNT(title) AS titles FROM {topic} GROUP BY genre;
"""


@pytest.fixture(scope="module")
def celery_airflow(kafka, engine, stack_settings_, tmp_path_factory):
    from deploy import airflow_server
    from deploy.airflow_api import AirflowApi

    root = tmp_path_factory.mktemp("celery")
    settings = replace(stack_settings_, state_dir=root / "stack", airflow_port=stack_settings_.airflow_port + 3,
                       postgres_port=stack_settings_.postgres_port + 3, batch_port=stack_settings_.batch_port + 3)
    token = settings.connect_dir / ".token"             # the session's Spark Connect server
    token.parent.mkdir(parents=True)
    shutil.copy(stack_settings_.connect_dir / ".token", token)
    tables = root / "tables"
    tables.mkdir()
    topic = f"movies_celery_{os.getpid()}"
    (tables / f"{TABLE}.sql").write_text(SQL.format(table=TABLE, topic=topic))
    saved = dict(os.environ)
    # A successful run ends in the triggerer on the stack; this stack resumes it on a worker, the
    # path a deployment without the triggerer's API connection takes, so Celery carries it.
    os.environ.update({**settings.as_env(), airflow_server.EXECUTOR_ENV: "celery",
                       "STATETABLE_TABLES_DIR": str(tables), "STATETABLE_NAMESPACE": "celery-",
                       "STATETABLE_RUN_END": "worker"})
    try:
        airflow_server.start(settings)
        airflow_server.wait_healthy(settings)
        rt = Runtime(bootstrap=kafka, data_dir=settings.data_dir, snapshot_uri=str(settings.data_dir / "snapshots"),
                     tables_dir=tables, namespace="celery-")
        yield settings, AirflowApi(settings), rt, topic
    finally:
        airflow_server.stop(settings)
        os.environ.clear()
        os.environ.update(saved)


def test_a_tables_run_goes_through_a_celery_worker(celery_airflow, kafka):
    from deploy import airflow_server

    settings, api, rt, topic = celery_airflow
    samples.produce_movies(kafka, topic)
    dag_id = f"{TABLE}__incremental"
    api.wait_for_dag(dag_id, timeout=300)
    run_id = api.trigger(dag_id)
    run = api.wait_run(dag_id, run_id, timeout=600)
    ti = api.task_instances(dag_id, run_id)["run_batches"]
    assert run["state"] == "success", ti
    assert ti["executor"] in (None, "CeleryExecutor") and ti["queue"] == "default"
    worker_log = airflow_server.process(settings, "celery-worker").log_file
    # The worker logs the Celery task's success just after the task instance's state reached Airflow.
    wait_until(lambda: "succeeded in" in worker_log.read_text(errors="replace"), 60,
               what="the Celery worker to log the task's success")
    assert "ExecuteTask" in worker_log.read_text(errors="replace")
    expected = Counter(json.loads(m.value())["genre"] for m in read_topic(kafka, topic))
    assert {key[0]: row[0] for key, row in jobs.state_rows(TABLE, rt).items()} == dict(expected)
