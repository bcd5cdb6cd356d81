"""`/metrics` as Prometheus scrapes it, from a real `statetable serve`: before any batch, after
batches with dead letters, after a verify; every value checked against the batch log and an
independent count of the topic. And the Grafana dashboard and alert rules shipped beside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from catalog.batch_log import BatchLog
from deploy import samples
from deploy.processes import wait_until
from spark_jobs import jobs
from tests.table_env import isolated_runtime, port, read_topic
from tests.test_query_api import TOKEN

PORT = port(int(os.environ.get("STATETABLE_TEST_METRICS_PORT", "28187")))
TABLE = "payments_per_customer"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
BAD = [b"not json", b'{"customer_id": "c1", "amount": "lots"}', b'{"customer_id": "c2", "amount": 1e999}']
STATETABLE = str(Path(sys.executable).parent / "statetable")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def env(kafka, tmp_path_factory):
    rt, suffix = isolated_runtime(kafka, tmp_path_factory.mktemp("metrics"))
    for other in rt.tables_dir.glob("*.sql"):        # one table: the scrape is about its numbers
        if other.stem != TABLE:
            other.unlink()
    return rt, suffix


@pytest.fixture(scope="module")
def server(env):
    """`statetable serve` as a real process (the query API tests' way of starting one)."""
    from tests.test_query_api import _serve

    env[0].data_dir.mkdir(parents=True, exist_ok=True)        # its log goes there; no batch has run yet
    yield from _serve(env[0], PORT)


def _auth() -> dict:
    return {"Authorization": f"Bearer {TOKEN}"}


def scrape(base: str) -> dict[tuple, float]:
    """Every sample as {(name, (label, value)...): value}, parsed by prometheus_client's own
    OpenMetrics parser (which refuses a malformed exposition)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    answer = httpx.get(base + "/metrics", headers={**_auth(), "Accept": OPENMETRICS}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, *sorted({"table": TABLE, **labels}.items())))


def test_metrics_follow_batches_dead_letters_and_a_verify(env, server, spark, engine):
    from confluent_kafka import Producer

    rt, suffix = env
    topic = f"payments{suffix}"
    assert httpx.get(server + "/metrics", timeout=10).status_code == 401       # reads are authorised
    samples.produce(TABLE, rt.bootstrap, 3000, suffix=suffix)
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    for record in BAD:
        producer.produce(topic, record)
    assert producer.flush(10) == 0

    before = scrape(server)
    assert value(before, "statetable_lag_records") == 3000 + len(BAD)
    assert value(before, "statetable_records_read_total") == 0
    assert value(before, "statetable_last_batch") is None                    # no batch yet: no sample
    assert value(before, "statetable_last_verify_ok") is None

    commits = jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=800)
    assert len(commits) >= 4
    after = scrape(server)
    log = BatchLog(rt.batch_dir(TABLE)).commits()
    assert value(after, "statetable_last_batch") == log[-1].batch_id
    assert value(after, "statetable_records_read_total") == sum(c.counts["read"] for c in log) == 3000 + len(BAD)
    assert value(after, "statetable_records_merged_total") == sum(c.counts["parsed"] for c in log)
    assert value(after, "statetable_keys_changed_total") == sum(c.counts["keys_changed"] for c in log)
    reasons = Counter()
    for commit in log:
        reasons.update({k[5:]: n for k, n in commit.counts.items() if k.startswith("dead_") and k != "dead_lettered"})
    assert sum(reasons.values()) == len(BAD)
    for reason, n in reasons.items():
        assert value(after, "statetable_records_dead_lettered_total", reason=reason) == n
    assert value(after, "statetable_lag_records") == 0 and value(after, "statetable_lag_seconds") == 0
    assert value(after, "statetable_batch_duration_seconds_count") == len(log)
    assert value(after, "statetable_batch_duration_seconds_bucket", le="+Inf") == len(log)
    assert value(after, "statetable_batch_duration_seconds_sum") == pytest.approx(sum(c.seconds for c in log))
    customers = {json.loads(m.value())["customer_id"] for m in read_topic(rt.bootstrap, topic)
                 if m.value() not in BAD}
    assert value(after, "statetable_keys") == len(customers)
    assert value(after, "statetable_state_bytes") > 0
    # The server's readers catch up on their refresh interval: right after the last commit its
    # answers may trail by a batch (CI saw 1 once); the gauge must come down to 0 on its own.
    wait_until(lambda: value(scrape(server), "statetable_replica_lag_batches") == 0, 30,
               what="the server's answers to reach the last commit")

    verified = subprocess.run([STATETABLE, "verify", TABLE], env={**os.environ, **rt.as_env(),
                              "STATETABLE_SPARK_REMOTE": engine}, capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    checked = scrape(server)
    assert value(checked, "statetable_last_verify_ok") == 1
    assert value(checked, "statetable_last_verify_age_seconds") < value(checked, "statetable_last_commit_age_seconds")
    assert value(checked, "statetable_records_read_total") == 3000 + len(BAD)      # a scrape folds nothing twice


def test_grafana_dashboard_and_alert_rules_name_only_exported_metrics():
    """The dashboard is valid JSON of Grafana's dashboard shape, the alert rules are Prometheus
    rule groups, and every metric either uses is one `/metrics` exports."""
    from serving import metrics

    names = metrics.exported_names()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "statetable-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["title"] and dashboard["uid"]
    assert {"table"} <= {v["name"] for v in dashboard["templating"]["list"]}
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(queries) >= 8
    rules = yaml.safe_load((ROOT / "deploy" / "grafana" / "statetable-alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert {"StatetableLagRising", "StatetableNoVerify26h", "StatetableDeadLettersRising",
            "StatetableVerifyFailed"} <= set(alerts)
    import re

    for expr in queries + [a["expr"] for a in alerts.values()]:
        used = set(re.findall(r"statetable_[a-z_]+", expr))
        assert used and used <= names, (expr, used - names)
