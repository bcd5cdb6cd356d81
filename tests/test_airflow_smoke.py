"""Airflow runs the smoke DAG: `dags test`, a REST trigger, and a 3-date backfill."""
from __future__ import annotations

import dataclasses
import json
import time
import os
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from deploy import airflow_server, smoke
from deploy.airflow_api import AirflowApi
from deploy.processes import wait_until

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
    from deploy import postgres_server

    isolated = dataclasses.replace(stack_settings_, state_dir=tmp_path,
                                   postgres_port=stack_settings_.postgres_port + 2)
    postgres_server.start(isolated)
    try:
        airflow_server.airflow_cli(isolated, "db", "migrate", capture=True)
        done = airflow_server.airflow_cli(isolated, "dags", "test", dag_id, capture=True, check=False)
        _check_dags_test(isolated, dag_id, done)
    finally:
        postgres_server.stop(isolated)


def _check_dags_test(isolated, dag_id: str, done) -> None:
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


def test_the_metadata_database_is_the_stacks_own_postgres(airflow):
    """Airflow's metadata lives in the stack's PostgreSQL: reached with psycopg over loopback,
    the password in mode-600 files only, never in Airflow's config, the URL or a log."""
    import psycopg

    from deploy import postgres_server

    env = airflow_server.airflow_env(airflow)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://statetable@127.0.0.1:")
    password = (airflow.postgres_dir / ".password").read_text().strip()
    assert len(password) >= 32
    for secret in (airflow.postgres_dir / ".password", postgres_server.passfile(airflow)):
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    assert postgres_server.data_dir(airflow).stat().st_mode & 0o777 == 0o700
    shown = airflow_server.airflow_cli(airflow, "config", "get-value", "database", "sql_alchemy_conn", capture=True)
    assert shown.stdout.strip().splitlines()[-1] == postgres_server.url(airflow)
    with postgres_server.connect(airflow) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SELECT count(*) FROM dag").fetchone()[0] >= 1      # Airflow's own tables
        server_major = conn.execute("SHOW server_version_num").fetchone()[0][:2]
        # Issue 66: Airflow's role is no superuser, so its password runs no program on the host
        # (the server's user namespace maps to the stack's user), and the superuser's is gone.
        assert conn.execute("SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user").fetchone() \
            == (False, True)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
    assert server_major == str(postgres_server.MAJOR)
    assert not (airflow.postgres_dir / ".admin_password").exists()

    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=airflow.host, port=airflow.postgres_port, user=postgres_server.USER,
                        dbname="airflow", passfile="/dev/null", password="wrong", connect_timeout=5)
    for log in airflow.state_dir.rglob("*.log"):
        assert password not in log.read_text(errors="replace"), log


class _StatsdListener:
    """A UDP socket where the stack's Airflow sends StatsD lines (see conftest)."""

    def __init__(self, port: int) -> None:
        import socket

        self.lines: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopped.is_set():
            try:
                self.lines += self.sock.recv(65536).decode(errors="replace").splitlines()
            except OSError:
                continue

    def _values(self, name: str, kind: str) -> list[float]:
        found = []
        for line in list(self.lines):
            stat, _, rest = line.partition(":")
            fields = rest.split("|")
            if stat == name and len(fields) > 1 and fields[1] == kind:
                found.append(float(fields[0]))
        return found

    def sum(self, name: str, kind: str) -> float:
        return sum(self._values(name, kind))

    def count(self, name: str, kind: str) -> int:
        return len(self._values(name, kind))

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.sock.close()


FOUR = ("players", "products", "movies", "payments_per_customer")
DATABASE_TROUBLE = ("database is locked", "OperationalError", "deadlock detected", "could not serialize",
                    "ReadTimeout", "timed out", "too many clients")


def test_four_tables_at_once_with_the_scheduler_on_meet_no_database_error_or_timeout(airflow, kafka):
    """Four tables' incremental runs triggered in the same second, beside the running scheduler,
    dag-processor and triggerer: every run succeeds as one task, every XCom lands, the table's
    rows equal an independent pandas recomputation, and no Airflow or database log says the
    metadata database failed or a call to the API server timed out (SQLite's single writer did)."""
    import dataclasses

    import pandas as pd

    from catalog.runtime import Runtime
    from deploy import samples
    from spark_jobs import jobs
    from tests.table_env import read_topic

    logs = [*airflow.airflow_home.glob("*.log"), *airflow.postgres_dir.glob("*.log")]
    before = {log: log.stat().st_size for log in logs}
    for table in ("players", "movies", "payments_per_customer"):        # players' sample holds products too
        samples.produce(table, kafka, 3000)
    api = AirflowApi(airflow)
    for table in FOUR:
        api.wait_for_dag(f"{table}__incremental")
    statsd = _StatsdListener(int(os.environ["AIRFLOW__METRICS__STATSD_PORT"]))
    try:
        runs = {table: api.trigger(f"{table}__incremental") for table in FOUR}
        for table, run_id in runs.items():
            run = api.wait_run(f"{table}__incremental", run_id, timeout=900)
            states = api.task_states(f"{table}__incremental", run_id)
            assert run["state"] == "success" and states == {"run_batches": "success"}, (table, states)
            stats = api.xcom(f"{table}__incremental", run_id, "run_batches")
            assert stats["lag"] == 0 and stats["batches"] >= 1, (table, stats)
            # It ended in the triggerer (no worker process), and still sent its Asset event, as
            # the stack's runs user, with the batches' facts and the run it came from.
            assert stats["ended_in"] == "triggerer", (table, stats)
            events = api._call("GET", "/api/v2/assets/events?limit=100&order_by=-timestamp")["asset_events"]
            mine = [e for e in events if e["uri"] == f"statetable://tables/{table}"
                    and e["extra"].get("run_id") == run_id]
            assert len(mine) == 1 and mine[0]["extra"]["last_batch"] == stats["last_batch"] \
                and mine[0]["extra"]["read"] == stats["read"], (table, mine)
            # The run's numbers also went out through Airflow's own metrics (StatsD here).
            wait_until(lambda: statsd.sum(f"airflow.statetable.{table}.read", "c") == stats["read"], 30,
                       what=f"{table}'s records read in StatsD")
            assert statsd.sum(f"airflow.statetable.{table}.batches", "c") == stats["batches"]
            assert statsd.count(f"airflow.statetable.{table}.batch_duration", "ms") == stats["batches"]
    finally:
        statsd.close()

    rt = dataclasses.replace(Runtime.from_env(), bootstrap=kafka, data_dir=airflow.data_dir,
                             snapshot_uri=str(airflow.data_dir / "snapshots"))
    payments = pd.DataFrame([json.loads(m.value()) for m in read_topic(kafka, "payments")])
    expected = payments.groupby("customer_id")["amount"].agg(["count", "sum", "max"])
    rows = jobs.state_rows("payments_per_customer", rt)
    assert {key[0] for key in rows} == set(expected.index)
    for (customer,), (count, total, largest) in rows.items():
        want = expected.loc[customer]
        assert (count, largest) == (want["count"], want["max"]) and abs(total - want["sum"]) < 1e-6, customer

    # Each run's task sent its OpenLineage events, with the table's inputs and outputs.
    lineage_file = Path(json.loads(os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"])["log_file_path"])
    events = [json.loads(line) for line in lineage_file.read_text().splitlines() if line.strip()]
    for table, run_id in runs.items():
        mine = [e for e in events if e["job"]["name"] == f"{table}__incremental.run_batches"
                and json.dumps(e["run"]["facets"]).count(run_id)]
        assert sorted(e["eventType"] for e in mine) == ["COMPLETE", "START"], (table, [e["eventType"] for e in mine])
        complete = next(e for e in mine if e["eventType"] == "COMPLETE")
        names = lambda side: {(d["namespace"], d["name"]) for d in complete[side]}     # noqa: E731
        broker = f"kafka://{kafka.split(',')[0]}"
        topic = {"players": "players", "products": "products", "movies": "movies",
                 "payments_per_customer": "payments"}[table]
        assert (broker, topic) in names("inputs"), complete["inputs"]
        assert {(broker, f"{table}-changelog"), (broker, f"{table}-dlq"),
                ("file", str(rt.delta_path(table, "mirror")))} <= names("outputs"), complete["outputs"]

    # The Airflow-mounted API's /metrics (Airflow's JWT) agrees with the batch log.
    from catalog.batch_log import BatchLog
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    token = airflow_server.api_token(airflow)
    scraped = httpx.get(f"{airflow.airflow_url}/statetable/metrics", timeout=60,
                        headers={"Authorization": f"Bearer {token}", "Accept": "application/openmetrics-text"})
    assert scraped.status_code == 200, scraped.text[:500]
    values = {(s.name, s.labels.get("table")): s.value
              for f in text_string_to_metric_families(scraped.text) for s in f.samples if not s.labels.get("le")}
    for table in FOUR:
        assert values[("statetable_lag_records", table)] == 0
        assert values[("statetable_last_batch", table)] == BatchLog(rt.batch_dir(table)).last_commit().batch_id

    for log in logs:
        with open(log, errors="replace") as handle:
            handle.seek(before.get(log, 0))
            new = handle.read()
        trouble = [line for line in new.splitlines() if any(word in line for word in DATABASE_TROUBLE)]
        assert trouble == [], f"{log.name}: {trouble[:5]}"
