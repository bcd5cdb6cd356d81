"""statetable_airflow.triggers: what a run's trigger costs the triggerer, and what it verifies."""
from __future__ import annotations

import ssl

import httpx

from statetable_airflow.triggers import TableRunTrigger, _verify


def test_plain_http_loads_no_certificates_and_https_verifies_with_one_context(monkeypatch):
    assert _verify("http") is False
    context = _verify("https")
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname and context.cert_store_stats()["x509_ca"] > 0
    assert _verify("https") is context                        # loaded once per triggerer
    loads = []
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *a, **k: loads.append(a))
    for _ in range(3):
        httpx.AsyncClient(verify=_verify("http"))
        httpx.AsyncClient(verify=_verify("https"))
    assert loads == []        # a certificate store costs 34 ms of CPU a load: none per run
    httpx.AsyncClient()
    assert len(loads) == 1    # what the trigger did before: one load per run


def test_the_trigger_round_trips_through_its_serialized_form():
    name, kwargs = TableRunTrigger("t", 3, end_here=True, outlets=["statetable://tables/t"]).serialize()
    assert name == "statetable_airflow.triggers.TableRunTrigger"
    again = TableRunTrigger(**kwargs, from_a_newer_dag_file=1)
    assert (again.table, again.max_batches, again.end_here, again.outlets) == ("t", 3, True, ["statetable://tables/t"])
    older = TableRunTrigger(**{k: v for k, v in kwargs.items() if k != "outlets"})     # a DAG file from before
    assert older.outlets == []


def test_a_token_is_renewed_a_minute_before_it_expires_and_an_unreadable_one_soon():
    import base64
    import json
    import time

    from statetable_airflow.triggers import _expires

    payload = base64.urlsafe_b64encode(json.dumps({"exp": 2_000_000_000}).encode()).decode().rstrip("=")
    assert _expires(f"head.{payload}.sig") == 2_000_000_000
    assert time.time() < _expires("not-a-jwt") <= time.time() + 300


def test_a_run_ends_in_the_triggerer_only_where_the_stack_gave_it_the_api_connection(monkeypatch):
    from statetable_airflow.operators import API_CONN_ENV, RUN_END_ENV, ends_in_triggerer

    monkeypatch.delenv(API_CONN_ENV, raising=False)
    monkeypatch.delenv(RUN_END_ENV, raising=False)
    assert not ends_in_triggerer()          # another deployment: the worker sends the Asset event
    monkeypatch.setenv(API_CONN_ENV, "{}")
    assert ends_in_triggerer()
    monkeypatch.setenv(RUN_END_ENV, "worker")
    assert not ends_in_triggerer()
