"""Query replicas (serving.replica) on one machine: the query path keeps its own copy of a
table, restored from the snapshot store and following the changelog, and needs nothing the
writer keeps locally. Checked against pandas over the input topic, through the REST API as a
client sees it: every answer names its batch, a bound on lag is honoured, and a replica that
cannot follow answers 503 naming the gap and the fix."""
from __future__ import annotations

import json
import math
import shutil
import time

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from catalog.batch_log import BatchLog
from deploy import samples
from serving.query import QueryService
from spark_jobs import jobs
from state import kafka_admin
from statetable_airflow.api import TokenAuth, create_app
from tests.table_env import isolated_runtime, read_topic

TABLE = "payments_per_customer"
AUTH = {"Authorization": "Bearer replica-test-token"}


@pytest.fixture
def deployment(kafka, tmp_path, monkeypatch):
    monkeypatch.setenv("STATETABLE_QUERY_FROM", "replica")
    monkeypatch.setenv("STATETABLE_QUERY_REFRESH_SECONDS", "0.1")
    return isolated_runtime(kafka, tmp_path, overrides={"snapshot_every": "2"})


def _expected(rt, suffix) -> pd.DataFrame:
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "payments" + suffix)])
    return frame.groupby("customer_id")["amount"].agg(["count", "sum", "max"])


def _rows(client, table=TABLE, **params) -> tuple[set, dict]:
    """Every row through the API, page by page; the batches the pages named."""
    rows, batches, cursor = {}, set(), None
    while True:
        answer = client.get(f"/tables/{table}/rows", headers=AUTH,
                            params={"limit": 1000, **({"cursor": cursor} if cursor else {}), **params})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        batches.add(body["batch"])
        rows.update({r["customer_id"]: r for r in body["rows"]})
        cursor = body["next_cursor"]
        if cursor is None:
            return batches, rows


def _assert_exact(rows: dict, expected: pd.DataFrame) -> None:
    assert set(rows) == set(expected.index)
    for customer, row in rows.items():
        want = expected.loc[customer]
        assert row["payments"] == want["count"] and row["largest"] == want["max"], customer
        assert math.isclose(row["total"], want["sum"], rel_tol=1e-9), customer


def _run_batch(rt, suffix, spark, events: int) -> int:
    samples.produce(TABLE, rt.bootstrap, events, suffix=suffix)
    jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt)
    return BatchLog(rt.batch_dir(TABLE)).last_commit().batch_id


def test_a_replica_serves_every_batch_exactly_without_the_writers_folders(deployment, spark, monkeypatch):
    rt, suffix = deployment
    for key, value in rt.as_env().items():
        monkeypatch.setenv(key, value)
    for _ in range(3):
        _run_batch(rt, suffix, spark, 1500)
    client = TestClient(create_app(TokenAuth("replica-test-token"), service_factory=lambda: QueryService(rt)))
    with client:
        batches, rows = _rows(client)
        last = BatchLog(rt.batch_dir(TABLE)).last_commit().batch_id
        assert batches == {last}
        _assert_exact(rows, _expected(rt, suffix))
        assert (rt.data_dir / "replicas" / TABLE / "p0000" / "CURRENT").exists()
        listing = {t["table"]: t for t in client.get("/tables", headers=AUTH).json()["tables"]}
        assert listing[TABLE]["served_from"] == "replica" and listing[TABLE]["lag_batches"] == 0
        assert listing[TABLE]["readable_batch"] == last

        # The writer's own folders gone: the replica does not need them.
        shutil.rmtree(rt.state_dir / TABLE)
        batch = _run_batch(rt, suffix, spark, 1500)      # the writer restores itself, commits the next batch
        deadline = time.monotonic() + 10
        while True:
            seen, rows = _rows(client)
            if seen == {batch} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert seen == {batch}, f"batch {batch} not visible within 10 s (still {seen})"
        _assert_exact(rows, _expected(rt, suffix))
        assert client.get(f"/tables/{TABLE}/rows/c0001", headers=AUTH,
                          params={"max_lag_batches": 0}).status_code in (200, 404)
        page = client.get("/ui", headers=AUTH).text
        assert f"batch {batch} from its replica, 0 behind" in page


def test_a_replica_that_cannot_follow_answers_503_naming_the_gap_and_the_fix(deployment, spark, monkeypatch):
    rt, suffix = deployment
    for key, value in rt.as_env().items():
        monkeypatch.setenv(key, value)
    _run_batch(rt, suffix, spark, 1000)
    service = QueryService(rt)
    try:
        assert len(service.scan(TABLE, limit=1000).rows) > 0
        # A batch the replica never saw, then its changelog is lost (a deleted topic).
        last = _run_batch(rt, suffix, spark, 1000)
        kafka_admin.delete_topic(rt.bootstrap, f"{rt.namespace}{TABLE}-changelog")
        time.sleep(1)
        client = TestClient(create_app(TokenAuth("replica-test-token"), service_factory=lambda: service))
        deadline = time.monotonic() + 60      # a replay cut off mid-way by the deletion gives up after 30 s idle
        while (answer := client.get(f"/tables/{TABLE}/rows", headers=AUTH)).status_code == 200 \
                and time.monotonic() < deadline:
            assert answer.json()["batch"] <= last
            time.sleep(0.2)
        assert answer.status_code == 503, answer.text
        detail = answer.json()["detail"]
        assert "cannot follow" in detail and f"{TABLE}-changelog" in detail and \
            f"statetable restore {TABLE}" in detail, detail
        assert "Traceback" not in detail
        listing = {t["table"]: t for t in client.get("/tables", headers=AUTH).json()["tables"]}
        assert listing[TABLE]["available"] is False and listing[TABLE]["lag_batches"] >= 1
        assert last >= 1
    finally:
        service.close()


def test_max_lag_batches_refuses_an_answer_that_trails_the_batch_log(deployment, spark, monkeypatch):
    rt, suffix = deployment
    for key, value in rt.as_env().items():
        monkeypatch.setenv(key, value)
    _run_batch(rt, suffix, spark, 800)
    service = QueryService(rt, background=False)        # no follower thread: it stays at what it saw
    try:
        client = TestClient(create_app(TokenAuth("replica-test-token"), service_factory=lambda: service))
        first = client.get(f"/tables/{TABLE}/rows", headers=AUTH, params={"max_lag_batches": 0})
        assert first.status_code == 200, first.text
        served = first.json()["batch"]
        # Two batches commit; without a refresh thread this service stays at the batch it saw.
        _run_batch(rt, suffix, spark, 400)
        _run_batch(rt, suffix, spark, 400)
        time.sleep(0.6)                                    # past the batch log cache
        behind = client.get(f"/tables/{TABLE}/rows", headers=AUTH, params={"max_lag_batches": 1})
        assert behind.status_code == 503, behind.text
        assert f"answers from batch {served}, 2 behind" in behind.json()["detail"]
        assert client.get(f"/tables/{TABLE}/rows", headers=AUTH, params={"max_lag_batches": 2}).status_code == 200
        assert client.get(f"/tables/{TABLE}/rows", headers=AUTH, params={"max_lag_batches": -1}).status_code == 422
    finally:
        service.close()


def test_a_writer_that_lost_its_copy_starts_from_a_local_replica_and_stays_exact(deployment, spark, monkeypatch,
                                                                                 caplog):
    """Kafka Streams' standby replicas cut recovery: a writer missing its partitions copies them
    from a query replica on its host (a live database of another data dir, one batch behind
    here), replays the changelog past it, and merges the next batch exactly."""
    import dataclasses
    import logging

    from catalog.runtime import LOCAL_REPLICAS_ENV
    from ops import failures
    from serving.replica import LastCommits, TableReplica

    rt, suffix = deployment
    for key, value in rt.as_env().items():
        monkeypatch.setenv(key, value)
    for _ in range(3):
        _run_batch(rt, suffix, spark, 1500)
    serving = dataclasses.replace(rt, data_dir=rt.data_dir.parent / "serving-host")
    # Its own data dir, the deployment's batch log and snapshots (a shared store, as on a cluster).
    replica = TableReplica(jobs.load_table(TABLE, rt)[0], serving, commits=LastCommits(rt))
    try:
        assert replica.sync() == 2
        _run_batch(rt, suffix, spark, 1500)           # the replica now trails by one batch
        failures.inject(TABLE, "wipe_local_store", rt)
        monkeypatch.setenv(LOCAL_REPLICAS_ENV, str(serving.data_dir))
        with caplog.at_level(logging.INFO, logger="statetable"):
            caplog.clear()          # only this batch's lines: the first batch's opens restored too
            assert _run_batch(rt, suffix, spark, 1500) == 4
            said = "\n".join(r.getMessage() for r in caplog.records)
        assert "copied from a local query replica, then the changelog: [0, 1, 2, 3]" in said
        assert "restored from snapshots" not in said
    finally:
        replica.close()
    state = {k[0]: v for k, v in jobs.state_rows(TABLE, rt).items()}
    expected = _expected(rt, suffix)
    assert set(state) == set(expected.index)
    for customer, (count, total, largest) in state.items():
        assert (count, largest) == (expected.loc[customer, "count"], expected.loc[customer, "max"]), customer
        assert math.isclose(total, expected.loc[customer, "sum"], rel_tol=1e-9), customer
