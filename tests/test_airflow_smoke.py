"""Airflow runs the smoke DAG: `dags test`, a REST trigger, and a 3-date backfill."""
from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import threading
import time
import uuid

import pytest

from deploy import airflow_server, smoke
from deploy.airflow_api import AirflowApi

DAG = smoke.SMOKE_DAG


@pytest.fixture(scope="module")
def smoke_topic(kafka):
    smoke.produce(kafka, smoke.SMOKE_TOPIC, 2000)
    return smoke.SMOKE_TOPIC


@pytest.mark.parametrize("dag_id", [DAG, "movie_tickets_sold__incremental"])
def test_dags_test_runs_every_task_with_spark_submit(stack_settings_, smoke_topic, tmp_path, monkeypatch, dag_id):
    """The spark-submit path (STATETABLE_SPARK_MODE=submit, for clusters without a Spark Connect
    server) still runs the smoke DAG and a table's incremental run, every task."""
    from deploy import samples

    monkeypatch.setenv("STATETABLE_SPARK_MODE", "submit")
    # A namespace of its own: the table's changelog on the shared broker belongs to the session's
    # stack, whose writer would rightly refuse a changelog that its batch log does not explain.
    monkeypatch.setenv("STATETABLE_NAMESPACE", f"ns{uuid.uuid4().hex[:8]}.")
    if dag_id != DAG:
        samples.produce("movie_tickets_sold", stack_settings_.kafka_bootstrap, 20)
    # Its own Airflow home and database, so no scheduler can pick up this run.
    isolated = dataclasses.replace(stack_settings_, state_dir=tmp_path)
    airflow_server.airflow_cli(isolated, "db", "migrate", capture=True)
    done = airflow_server.airflow_cli(isolated, "dags", "test", dag_id, capture=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    runs = airflow_server.airflow_json(isolated, "dags", "list-runs", dag_id)
    assert len(runs) == 1
    states = airflow_server.airflow_json(isolated, "tasks", "states-for-dag-run", dag_id, runs[0]["run_id"])
    states = {s["task_id"]: s["state"] for s in states}
    assert set(states.values()) == {"success"}, states
    expected = {"plan_offsets", "read_range_to_delta", "report"} if dag_id == DAG else \
        {"wait_for_offsets", "run_batches", "snapshot_if_due", "record_stats"}
    assert set(states) == expected
    assert "Spark-Submit cmd" in done.stdout + done.stderr     # the provider's hook ran spark-submit


def test_trigger_over_rest_succeeds(airflow, smoke_topic):
    api = AirflowApi(airflow)
    api.wait_for_dag(DAG)
    run_id = api.trigger(DAG)
    run = api.wait_run(DAG, run_id, timeout=600)
    states = api.task_states(DAG, run_id)
    assert run["state"] == "success", states
    assert set(states.values()) == {"success"}
    result = api.xcom(DAG, run_id, "report")
    assert result["count"] == result["planned"] >= 2000


def test_backfill_three_dates_creates_three_successful_runs(airflow, smoke_topic):
    api = AirflowApi(airflow)
    api.wait_for_dag(DAG)
    created = airflow_server.airflow_cli(
        airflow, "backfill", "create", "--dag-id", DAG, "--from-date", "2026-03-01", "--to-date", "2026-03-03",
        capture=True, check=False,
    )
    assert created.returncode == 0, created.stdout[-2000:] + created.stderr[-2000:]

    deadline = time.monotonic() + 900
    while True:
        backfill_runs = [r for r in api.runs(DAG) if r["run_type"] == "backfill"]
        if len(backfill_runs) == 3 and all(r["state"] in ("success", "failed") for r in backfill_runs):
            break
        assert time.monotonic() < deadline, f"backfill runs not finished: {backfill_runs}"
        time.sleep(3)
    assert sorted(r["logical_date"][:10] for r in backfill_runs) == ["2026-03-01", "2026-03-02", "2026-03-03"]
    assert [r["state"] for r in backfill_runs] == ["success"] * 3


def test_cli_write_waits_out_a_long_sqlite_write_lock(airflow):
    """The CI failure "database is locked" came from a CLI write that gave up after SQLite's
    default 5 s while the scheduler held the lock. Hold the lock 15 s: the write must wait."""
    holder = sqlite3.connect(airflow.airflow_home / "airflow.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(15, holder.execute, args=("COMMIT",))
    release.start()
    try:
        written = airflow_server.airflow_cli(
            airflow, "variables", "set", "statetable_lock_probe", "waited", capture=True, check=False,
        )
    finally:
        release.join()
        holder.close()
    assert written.returncode == 0, written.stdout[-2000:] + written.stderr[-2000:]
    read = airflow_server.airflow_cli(airflow, "variables", "get", "statetable_lock_probe", capture=True)
    assert read.stdout.strip().splitlines()[-1] == "waited"


# Runs inside an Airflow process of the stack, through Airflow's own session factory.
_SAVEPOINT_RACE = """
import sqlite3, sys
from sqlalchemy import text
from airflow import settings

with settings.Session() as session:
    session.execute(text("SELECT 1"))
    with session.begin_nested():
        session.execute(text("SELECT count(*) FROM statetable_savepoint_probe")).scalar()
        other = sqlite3.connect(sys.argv[1], timeout=0.5)
        try:
            other.execute("INSERT INTO statetable_savepoint_probe VALUES ('other')")
            other.commit()
            print("other-committed-in-between")
        except sqlite3.OperationalError:
            print("other-waited")
        other.close()
        session.execute(text("INSERT INTO statetable_savepoint_probe VALUES ('savepoint')"))
    session.commit()
"""


def test_savepoint_write_survives_a_commit_between_its_read_and_its_write(airflow):
    """CI lost `backfill create` to SQLITE_BUSY_SNAPSHOT: Airflow opens a savepoint, reads, and
    inserts; a scheduler commit in between fails the insert at once, whatever the busy timeout.
    Commit from another connection at exactly that moment: the savepoint's write must land."""
    database = airflow.airflow_home / "airflow.db"
    with sqlite3.connect(database, timeout=60) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS statetable_savepoint_probe (writer TEXT)")
        setup.execute("DELETE FROM statetable_savepoint_probe")
    race = subprocess.run(
        [str(airflow_server.VENV_BIN / "python"), "-c", _SAVEPOINT_RACE, str(database)],
        env=airflow_server.airflow_env(airflow), capture_output=True, text=True, timeout=300,
    )
    assert race.returncode == 0, race.stdout[-2000:] + race.stderr[-3000:]
    assert race.stdout.strip().splitlines()[-1] == "other-waited"
    with sqlite3.connect(database, timeout=60) as check:
        writers = [row[0] for row in check.execute("SELECT writer FROM statetable_savepoint_probe")]
    assert writers == ["savepoint"]
