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
    name, kwargs = TableRunTrigger("t", 3, end_here=True).serialize()
    assert name == "statetable_airflow.triggers.TableRunTrigger"
    again = TableRunTrigger(**kwargs, from_a_newer_dag_file=1)
    assert (again.table, again.max_batches, again.end_here) == ("t", 3, True)
