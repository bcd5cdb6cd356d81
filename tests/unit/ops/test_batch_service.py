"""ops.batch_service: the order and bounds of runs, each run's own log lines, failures in one
line, the token, and the capacity record (the run itself is ops.batch_service.run_table, which
the Airflow tests drive against a real stack; here a stand-in takes its place, as the logic
under test is the service's)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest

from catalog.runtime import Runtime
from ops import batch_service, capacity

SQL = ("-- topic: {t}\n-- schema: k STRING, v DOUBLE\n-- schedule: {cron}\n"
       "CREATE TABLE {t} AS SELECT k, SUM(v) AS total FROM {t} GROUP BY k;\n")


@pytest.fixture
def rt(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    for t in ("a", "b", "c"):
        (tables / f"{t}.sql").write_text(SQL.format(t=t, cron="*/5 * * * *"))
    # A schedule every minute, a deadline the stand-in's runs below can miss when told to.
    (tables / "fast.sql").write_text(SQL.format(t="fast", cron="* * * * *"))
    return dataclasses.replace(Runtime.from_env(), data_dir=tmp_path / "data", tables_dir=tables)


class _Runs:
    """A stand-in for run_table: logs a line, sleeps, records how many ran at once, per table too."""

    def __init__(self, seconds: float = 0.2, fail: set | None = None) -> None:
        self.seconds, self.fail = seconds, fail or set()
        self.now, self.most, self.per_table, self.most_per_table = 0, 0, {}, 0
        self.guard = threading.Lock()

    def __call__(self, name, max_batches, rt, spark=None):
        logging.getLogger("statetable.microbatch").info("%s batch 0: read 10 records", name)
        with self.guard:
            self.now += 1
            self.per_table[name] = self.per_table.get(name, 0) + 1
            self.most = max(self.most, self.now)
            self.most_per_table = max(self.most_per_table, self.per_table[name])
        time.sleep(self.seconds)
        with self.guard:
            self.now -= 1
            self.per_table[name] -= 1
        if name in self.fail:
            raise ValueError(f"{name}: boom\nsecond line")
        return {"outcome": "done", "result": {"table": name}, "phases": {"batches": self.seconds}}


def _service(rt, monkeypatch, runs, slots=2):
    monkeypatch.setattr(batch_service, "run_table", runs)
    service = batch_service.BatchService(rt, slots, spark=object())
    return service


def test_runs_are_bounded_by_slots_one_per_table_each_with_its_own_log_lines(rt, monkeypatch, caplog):
    caplog.set_level(logging.INFO)          # as the service's main() sets it
    runs = _Runs(seconds=0.3)
    service = _service(rt, monkeypatch, runs, slots=2)
    try:
        futures = [service.submit(t, 5) for t in ("a", "a", "b", "c", "a")]
        answers = [f.result(timeout=30) for f in futures]
    finally:
        logging.getLogger().removeHandler(service.logs)
        service.pool.shutdown()
    assert runs.most == 2 and runs.most_per_table == 1
    for table, answer in zip(("a", "a", "b", "c", "a"), answers):
        assert answer["outcome"] == "done"
        assert answer["log"] == [f"statetable.microbatch: {table} batch 0: read 10 records"]
        assert answer["phases"]["service_run"] >= 0.3 and answer["phases"]["batches"] == 0.3
    assert max(a["phases"]["service_queue"] for a in answers) >= 0.3      # five runs, two slots: some waited
    assert service.health()["queued"] == 0 and service.health()["running"] == []


def test_a_failed_run_answers_its_error_in_one_line_and_the_service_goes_on(rt, monkeypatch):
    service = _service(rt, monkeypatch, _Runs(seconds=0.0, fail={"b"}))
    try:
        failed, fine = service.submit("b", 1).result(30), service.submit("a", 1).result(30)
    finally:
        logging.getLogger().removeHandler(service.logs)
        service.pool.shutdown()
    assert failed["outcome"] == "failed" and failed["error"].endswith("b: boom") and failed["type"] == "ValueError"
    assert fine["outcome"] == "done"


def test_the_api_answers_only_the_stacks_token(rt, monkeypatch):
    from fastapi.testclient import TestClient

    service = _service(rt, monkeypatch, _Runs(seconds=0.0))
    try:
        client = TestClient(batch_service.app(service, "s3cret"))
        assert client.post("/runs", json={"table": "a", "max_batches": 1}).status_code == 401
        assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = client.post("/runs", json={"table": "a", "max_batches": 1},
                             headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and answer.json()["outcome"] == "done"
        assert client.post("/runs", json={"table": "", "max_batches": 0},
                           headers={"Authorization": "Bearer s3cret"}).status_code == 422
        assert client.get("/health", headers={"Authorization": "Bearer s3cret"}).json()["slots"] == 2
    finally:
        logging.getLogger().removeHandler(service.logs)
        service.pool.shutdown()


def test_a_run_longer_than_its_schedule_interval_is_over_capacity(rt, monkeypatch):
    service = _service(rt, monkeypatch, _Runs(seconds=0.0))
    try:
        service.submit("a", 1).result(30)
        assert capacity.warning(capacity.read(rt)) is None
        state = capacity.read(rt)
        assert state["runs"] == 1 and state["over_interval_count"] == 0
        # A run of `fast` (due every 60 s) that took 75 s from arrival to end: its next run was due first.
        ended = time.time()
        service.capacity.record("fast", arrived=ended - 75, ended=ended, queued_s=70, interval_s=60.0)
    finally:
        logging.getLogger().removeHandler(service.logs)
        service.pool.shutdown()
    state = capacity.read(rt)
    assert state["over_interval_count"] == 1 and state["longest_queue_s"] == 70
    text = capacity.warning(state)
    assert text.startswith("over capacity: 1 run(s)") and "fast, 75s of a 60s interval, 70s of it queued" in text
    assert capacity.warning(state, now=ended + capacity.WINDOW_S + 1) is None        # an hour later, it has cleared
    assert capacity.interval_seconds("* * * * *") == 60 and capacity.interval_seconds("0 9,17 * * *") == 8 * 3600


def test_a_run_that_met_a_restarted_connect_server_runs_again_once_with_a_new_client(rt, monkeypatch):
    """After the Connect server restarts (a kill_engine drill), pyspark closes every client of the
    old server's sessions; a long-lived service must drop them and run the batch again (it
    finishes from its plan), where a task process would simply have ended."""
    import types

    from spark_jobs.engine import session

    closed = types.SimpleNamespace(client=types.SimpleNamespace(is_closed=True, close=lambda: None))
    stale = types.SimpleNamespace(client=types.SimpleNamespace(is_closed=False, close=lambda: None))
    calls = []

    def run(name, max_batches, rt, spark=None):
        calls.append(spark)
        if len(calls) == 1:      # what the restart did: one client closed, the other's session gone too
            monkeypatch.setitem(session._remote_sessions, "sc://x#arrow-10", closed)
            monkeypatch.setitem(session._remote_sessions, "sc://x", stale)
            raise RuntimeError("[NO_ACTIVE_SESSION] No active Spark session found")
        return {"outcome": "done", "result": {"table": name}, "phases": {}}

    fresh = object()
    monkeypatch.setattr(session, "get_or_create", lambda app: fresh)
    service = _service(rt, monkeypatch, run)
    try:
        answer = service.submit("a", 1).result(30)
    finally:
        logging.getLogger().removeHandler(service.logs)
        service.pool.shutdown()
    assert answer["outcome"] == "done" and len(calls) == 2 and calls[1] is fresh
    assert "sc://x#arrow-10" not in session._remote_sessions and "sc://x" not in session._remote_sessions
