"""Push streams (`/tables/{t}/changes`) that outlive what let them in: a revoked token, a
removed grant, an edited definition, and more followers than the limit arriving at once. The
API runs in a real uvicorn server with an auth whose tokens and grants the test changes."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import uvicorn

from spark_jobs import jobs
from tests.table_env import isolated_runtime, new_table, port, sse_events

PORT = port(28391)
SQL = """-- topic: {topic}
-- schema: k STRING, amount BIGINT
-- partitions: 2
CREATE TABLE payments AS SELECT k, COUNT(amount) AS payments, SUM(amount) AS total FROM events GROUP BY k;
"""


class Revocable:
    """Tokens that can be revoked and grants that can be removed while a stream is open."""

    def __init__(self) -> None:
        self.tokens = {"alice-token": "alice", "bob-token": "bob"}
        self.grants = {"alice": {"payments"}, "bob": {"payments"}}

    async def check(self, token, request):
        return self.tokens.get(token)

    async def may_read(self, principal, table: str) -> bool:
        return table in self.grants.get(principal, set())


@pytest.fixture(scope="module")
def served(kafka, spark, tmp_path_factory):
    from serving.query import QueryService
    from statetable_airflow.api import create_app

    rt, suffix = isolated_runtime(kafka, tmp_path_factory.mktemp("push"))
    topic = f"payments{suffix}"
    producer = new_table(rt, "payments", SQL.format(topic=topic), topic)
    for i in range(6):
        producer.produce(topic, json.dumps({"k": f"k{i % 3}", "amount": i}).encode())
    producer.flush(30)
    jobs.run("payments", until_caught_up=True, spark=spark, rt=rt)
    auth = Revocable()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STATETABLE_API_MAX_FOLLOWERS", "2")
        patch.setenv("STATETABLE_API_RECHECK_SECONDS", "1")
        patch.setenv("STATETABLE_API_FOLLOW_POLL_SECONDS", "0.1")
        app = create_app(auth, service_factory=lambda: QueryService(rt))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{PORT}", auth, rt
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _events(response, until) -> list[tuple[str, str]]:
    """(event, data) of a stream until `until(events)` holds or the stream ends."""
    pairs = []

    def enough(events) -> bool:
        pairs[:] = [(e.get("event", "message"), e["data"]) for e in events]
        return until(pairs)

    sse_events(response, enough)
    return pairs


@pytest.mark.parametrize("take_away", ["revoke the token", "remove the grant"])
def test_an_open_stream_ends_within_the_recheck_when_its_reader_loses_access(served, take_away):
    base, auth, _ = served
    user, token = ("alice", "alice-token")
    with httpx.stream("GET", f"{base}/tables/payments/changes", headers={"Authorization": f"Bearer {token}"},
                      params={"after_batch": -1}, timeout=60) as response:
        assert response.status_code == 200

        def first_batch_then_cut(events) -> bool:
            if len(events) == 1:
                assert events[0][0] == "batch"
                if take_away == "revoke the token":
                    auth.tokens.pop(token)
                else:
                    auth.grants[user].discard("payments")
            return events[-1][0] == "error"

        started = time.monotonic()
        events = _events(response, first_batch_then_cut)
        waited = time.monotonic() - started
    try:
        assert events[-1][0] == "error", events
        cause = json.loads(events[-1][1])["error"]
        assert ("no longer valid" in cause) if take_away == "revoke the token" else ("no longer read" in cause)
        assert waited < 20
        assert httpx.get(f"{base}/tables/payments/changes", headers={"Authorization": f"Bearer {token}"},
                         timeout=10).status_code in (401, 403)
    finally:
        auth.tokens[token] = user
        auth.grants[user].add("payments")


def test_the_follower_limit_holds_for_requests_that_arrive_at_once(served):
    base, _, _ = served
    statuses: list[int] = []
    opened = threading.Barrier(10, timeout=30)
    release = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", f"{base}/tables/payments/changes", headers={"Authorization": "Bearer bob-token"},
                          params={"after_batch": 1000}, timeout=60) as response:
            statuses.append(response.status_code)
            opened.wait()
            release.wait(30)

    threads = [threading.Thread(target=follow) for _ in range(10)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(statuses) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(statuses) == [200, 200] + [503] * 8, statuses
    finally:
        release.set()
        for t in threads:
            t.join(timeout=30)


def test_a_definition_edited_without_a_rebuild_is_refused_with_the_cause(served):
    base, _, rt = served
    path = rt.tables_dir / "payments.sql"
    original = path.read_text()
    path.write_text(original.replace("COUNT(amount) AS payments, SUM(amount) AS total",
                                     "SUM(amount) AS payments, COUNT(amount) AS total"))
    try:
        response = httpx.get(f"{base}/tables/payments/changes", headers={"Authorization": "Bearer bob-token"},
                             params={"after_batch": -1}, timeout=30)
        assert response.status_code == 503, response.text
        assert "rebuild" in response.text and "payments" in response.text
    finally:
        path.write_text(original)
    with httpx.stream("GET", f"{base}/tables/payments/changes", headers={"Authorization": "Bearer bob-token"},
                      params={"after_batch": -1}, timeout=30) as response:
        assert response.status_code == 200
        events = _events(response, lambda e: len(e) == 1)
    body = json.loads(events[0][1])
    assert {c["key"]["k"]: (c["row"]["payments"], c["row"]["total"]) for c in body["changes"]} == \
        {"k0": (2, 3), "k1": (2, 5), "k2": (2, 7)}
