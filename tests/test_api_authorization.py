"""Inside Airflow, reading a table is authorised by Airflow's auth manager, not only authenticated:
the route asks whether the user may read the XComs of the table's incremental DAG. The auth
manager here is a stand-in with per-DAG grants (Airflow's simple manager has none to test)."""
from __future__ import annotations

from types import SimpleNamespace

from fastapi.testclient import TestClient

from statetable_airflow.api import AirflowAuth, create_app


class GrantsByDag:
    """Users and the DAG ids each may read; records every question it was asked."""

    def __init__(self, grants: dict[str, set[str]]) -> None:
        self.grants, self.asked = grants, []

    async def get_user_from_token(self, token: str):
        if token not in self.grants:
            raise ValueError("bad token")
        return SimpleNamespace(name=token)

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        self.asked.append((method, user.name, getattr(access_entity, "value", None), details.id))
        return method == "GET" and details.id in self.grants[user.name]


class Tables:
    def tables(self):
        return [{"table": "orders"}, {"table": "leaderboard"}]

    def broken_tables(self):
        return {"drafts": "drafts.sql:1:1: unknown column"}

    def get(self, table, key, times="epoch_ms"):
        return 7, {"k": key}

    def scan(self, *args):
        return SimpleNamespace(batch=7, rows=[], next_cursor=None)

    def close(self):
        pass


def _client(manager) -> TestClient:
    return TestClient(create_app(AirflowAuth(auth_manager=manager), service_factory=Tables))


def test_a_user_reads_only_the_tables_whose_dag_the_auth_manager_grants():
    manager = GrantsByDag({"alice": {"orders__incremental"}, "bob": set()})
    client = _client(manager)
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}

    assert client.get("/tables/orders/rows/1", headers=alice).json()["row"] == {"k": "1"}
    assert ("GET", "alice", "XCOM", "orders__incremental") in manager.asked
    denied = client.get("/tables/leaderboard/rows/1", headers=alice)
    assert denied.status_code == 403 and "leaderboard__incremental" in denied.json()["detail"]
    assert client.get("/leaderboard", headers=alice).status_code == 403
    listing = client.get("/tables", headers=alice).json()
    assert [t["table"] for t in listing["tables"]] == ["orders"] and listing["broken"] == {}

    for route in ("/tables/orders/rows/1", "/tables/orders/rows", "/tables/orders/changes", "/leaderboard/1"):
        assert client.get(route, headers=bob).status_code == 403, route
    assert client.get("/tables", headers=bob).json()["tables"] == []
    carol = GrantsByDag({"carol": {"drafts__incremental"}})
    assert _client(carol).get("/tables", headers={"Authorization": "Bearer carol"}).json()["broken"] == \
        {"drafts": "drafts.sql:1:1: unknown column"}
    assert client.get("/tables", headers={"Authorization": "Bearer mallory"}).status_code == 401


def test_the_openapi_document_needs_a_token_and_there_are_no_docs_pages():
    client = _client(GrantsByDag({"alice": set()}))
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/openapi.json", headers={"Authorization": "Bearer alice"}).json()["paths"]
    for route in ("/docs", "/redoc"):
        assert client.get(route, headers={"Authorization": "Bearer alice"}).status_code == 404
