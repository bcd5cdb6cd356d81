"""Production Kafka, as a user meets it: `statetable stack up --brokers 3 --secure` (three KRaft
brokers, SASL_SSL/SCRAM for clients, mutual TLS between brokers, ACLs), a table run through the
stack's Spark Connect server on it, restored, verified and queried through the CLI; the broker
leading the changelog SIGKILLed while batches commit; the clients Kafka must refuse; and the
stack's Airflow, over the same SASL_SSL, running a chained table when its upstream commits.

Every figure is checked against pandas over the records read back from the topic, not against
statetable's own code. The stack is this module's own (folder and ports), brought up and down
through the CLI."""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from catalog import settings as stack_settings
from deploy.processes import wait_until
from state.kafka_config import CONFIG_ENV
from tests.table_env import assert_each_batch_once_and_in_order, fold_change_topic, isolated_runtime, port, read_topic

STATETABLE = str(Path(sys.executable).parent / "statetable")
TABLE = "payments_per_customer"
PORTS = {"STATETABLE_KAFKA_PORT": str(port(26392)), "STATETABLE_KAFKA_CONTROLLER_PORT": str(port(26393)),
         "STATETABLE_AIRFLOW_PORT": str(port(26080)), "STATETABLE_SPARK_CONNECT_PORT": str(port(26002)),
         "STATETABLE_POSTGRES_PORT": str(port(26432)), "STATETABLE_REGISTRY_PORT": str(port(26091)),
         "STATETABLE_BATCH_PORT": str(port(26084))}
EVENTS = 40000          # 20 batches of 2000: three broker kills land mid-run
BAD_RECORDS = [b"not json", b'{"customer_id": "c1", "amount": "lots"}', b"{}"]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(settings, env) of a running `stack up --brokers 3 --secure --registry`; this process uses its client
    config for the module's duration, as `statetable` commands on the stack's host do."""
    # Its scheduler runs the shipped DAGs on their schedules and on their Assets, as a user's does.
    env = {**os.environ, **PORTS, "STATETABLE_STACK_DIR": str(tmp_path_factory.mktemp("secure-stack")),
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"}
    env.pop(CONFIG_ENV, None)
    up = subprocess.run([STATETABLE, "stack", "up", "--brokers", "3", "--secure", "--registry"], env=env, capture_output=True,
                        text=True, timeout=600)
    try:
        assert up.returncode == 0, f"stack up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        with pytest.MonkeyPatch.context() as patch:
            for name in [*PORTS, "STATETABLE_STACK_DIR"]:
                patch.setenv(name, env[name])
            settings = stack_settings.load()
            patch.setenv(CONFIG_ENV, str(settings.kafka_client_properties))
            yield settings, env
    finally:
        subprocess.run([STATETABLE, "stack", "down"], env=env, capture_output=True, timeout=300)


def _cli(env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([STATETABLE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _job_env(settings, env: dict, rt) -> dict:
    from deploy import connect_server
    from spark_jobs.engine.session import client_url

    return {**env, **rt.as_env(), CONFIG_ENV: str(settings.kafka_client_properties),
            "STATETABLE_SPARK_REMOTE": client_url(settings.connect_url, connect_server.token(settings))}


def _secure_table(settings, root: Path, events: int):
    """An isolated payments table on the secure stack with a change topic, its samples and a few
    records no schema accepts; (runtime, suffix)."""
    from confluent_kafka import Producer

    from deploy import samples
    from state.kafka_config import client_config

    rt, suffix = isolated_runtime(settings.kafka_bootstrap, root)
    sql = rt.tables_dir / f"{TABLE}.sql"
    sql.write_text(f"-- output_topic: payments-changes{suffix}\n" + sql.read_text())
    samples.produce(TABLE, rt.bootstrap, events, suffix=suffix)
    producer = Producer(client_config(rt.bootstrap))
    for value in BAD_RECORDS:
        producer.produce("payments" + suffix, value, key=b"bad")
    assert producer.flush(30) == 0
    return rt, suffix


def _expected(rt, suffix: str) -> pd.DataFrame:
    """count/sum/max per customer, by pandas over the topic's records that parse."""
    rows = []
    for msg in read_topic(rt.bootstrap, "payments" + suffix):
        try:
            row = json.loads(msg.value())
        except ValueError:
            continue
        if isinstance(row.get("amount"), (int, float)) and row.get("customer_id"):
            rows.append(row)
    return pd.DataFrame(rows).groupby("customer_id")["amount"].agg(["count", "sum", "max"])


def _assert_state_equals(rt, expected: pd.DataFrame) -> dict:
    from spark_jobs import jobs

    state = {k[0]: v for k, v in jobs.state_rows(TABLE, rt).items()}
    assert set(state) == set(expected.index)
    for customer, (count, total, largest) in state.items():
        row = expected.loc[customer]
        assert count == row["count"], customer
        assert math.isclose(total, row["sum"], rel_tol=1e-9) and largest == row["max"], customer
    return state


def _topic_replication(settings, topics: list[str]) -> dict[str, tuple[int, str, set[int]]]:
    """(replicas, min.insync.replicas, in-sync replica counts) per topic, read with the admin
    client as the brokers' own principal."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from deploy import kafka_security, kafka_server

    admin = AdminClient(kafka_security.admin_config(settings, kafka_server.internal_bootstrap(settings)))
    meta = admin.list_topics(timeout=10).topics
    out = {}
    for name in topics:
        assert name in meta, f"topic {name} does not exist"
        configs = admin.describe_configs([ConfigResource("topic", name)])
        value = next(iter(configs.values())).result(10)["min.insync.replicas"].value
        parts = meta[name].partitions.values()
        out[name] = (min(len(p.replicas) for p in parts), value, {len(p.isrs) for p in parts})
    return out


def test_a_table_runs_restores_verifies_and_serves_on_three_secure_brokers(secure, tmp_path):
    settings, env = secure
    status = _cli(env, "stack", "status")
    for _ in range(3):      # an API server too busy to answer in 10 s (3 suites' stacks on 2 cores) says so: ask again
        if status.returncode == 0 or "did not answer" not in status.stdout:
            break
        time.sleep(5)
        status = _cli(env, "stack", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    for broker, broker_port in enumerate((port(26392), port(26402), port(26412)), start=1):
        assert f"kafka-{broker} 127.0.0.1:{broker_port} up" in lines
    config = settings.kafka_client_properties
    assert f"kafka-client-config {config}" in lines
    assert f"registry http://127.0.0.1:{port(26091)}/apis/ccompat/v7 up" in lines
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    assert not [line for line in listening.splitlines() if line.split()[3].endswith((f":{port(26091)}", f":{port(26092)}"))
                and not line.split()[3].startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))], "the registry binds loopback"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert "sasl.password" in config.read_text() and "password" not in status.stdout + status.stderr

    rt, suffix = _secure_table(settings, tmp_path, 30000)
    job_env = _job_env(settings, env, rt)
    run = _cli(job_env, "run", TABLE, "--until-caught-up", "--max-records-per-batch", "10000")
    assert run.returncode == 0, run.stderr[-3000:]
    expected = _expected(rt, suffix)
    state = _assert_state_equals(rt, expected)

    # What statetable created lives on all three brokers, and a write needs two of them.
    topics = [f"{rt.namespace}{TABLE}-changelog", rt.dead_letter_topic(TABLE), f"payments-changes{suffix}"]
    for name, (replicas, min_isr, _) in _topic_replication(settings, topics).items():
        assert (replicas, min_isr) == (3, "2"), name
    dead = read_topic(rt.bootstrap, rt.dead_letter_topic(TABLE))
    assert sorted(m.value() for m in dead if m.value() in BAD_RECORDS) == sorted(BAD_RECORDS)
    changes, seen = _folded_changes(rt, suffix)
    assert set(changes) == set(state)
    assert_each_batch_once_and_in_order(seen)

    # The local store lost (the wipe_local_store drill), restored from snapshots and the
    # replicated changelog, verified against a recomputation, and queried.
    shutil.rmtree(rt.data_dir / "state")
    restore = _cli(job_env, "restore", TABLE)
    assert restore.returncode == 0, restore.stderr[-3000:]
    _assert_state_equals(rt, expected)
    verify = _cli(job_env, "verify", TABLE)
    assert verify.returncode == 0, verify.stdout + verify.stderr[-3000:]
    customer = sorted(state)[0]
    query = _cli(job_env, "query", TABLE, customer)
    assert query.returncode == 0, query.stderr
    row = json.loads(query.stdout)
    assert row["payments"] == expected.loc[customer, "count"], row
    assert _table_status(rt)["durability_warnings"] == []

    # A topic someone made with one replica is named by `stack status` as a durability warning.
    from confluent_kafka.admin import AdminClient, NewTopic

    from deploy import kafka_security, kafka_server

    admin = AdminClient(kafka_security.admin_config(settings, kafka_server.internal_bootstrap(settings)))
    for future in admin.create_topics([NewTopic(f"lonely{suffix}", 1, 1)]).values():
        future.result(30)
    status = _cli(env, "stack", "status")
    assert status.returncode == 0, status.stdout
    assert any(line.startswith(f"kafka-warning topic lonely{suffix} has replication factor 1, below 3")
               for line in status.stdout.splitlines()), status.stdout


def _folded_changes(rt, suffix: str) -> tuple[dict, list]:
    """The change topic folded by customer (its keys are JSON objects of the key columns)."""
    changes, seen = fold_change_topic(rt.bootstrap, f"payments-changes{suffix}")
    return {json.loads(key)["customer_id"]: row for key, row in changes.items()}, seen


def _table_status(rt) -> dict:
    from ops import status
    from spark_jobs import jobs

    return status.table_status(jobs.load_table(TABLE, rt)[0], rt)


def _changelog_leader(settings, topic: str) -> int | None:
    """The broker leading most of the changelog's partitions (None while it has none)."""
    from collections import Counter

    from confluent_kafka.admin import AdminClient

    from deploy import kafka_security, kafka_server

    admin = AdminClient(kafka_security.admin_config(settings, kafka_server.internal_bootstrap(settings)))
    meta = admin.list_topics(timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    leaders = Counter(p.leader for p in meta.partitions.values() if p.leader >= 0)
    return leaders.most_common(1)[0][0] if leaders else None


@pytest.mark.timeout(1500)
def test_the_changelog_leader_broker_dies_while_batches_commit(secure, tmp_path):
    """The exactly-once kill test's broker phase: the broker leading the changelog is SIGKILLed
    at random moments while batches commit, and started again; the final state equals pandas,
    the change topic folds to the table, and no (key, batch) appears twice."""
    from catalog.batch_log import BatchLog
    from deploy import kafka_server

    settings, env = secure
    rt, suffix = _secure_table(settings, tmp_path, EVENTS)
    # A failure here has been a Spark task's error the runner did not take for a lost broker:
    # the traceback (the task's own, as Spark reports it) says which.
    job_env = {**_job_env(settings, env, rt), "STATETABLE_DEBUG": "1"}
    changelog = f"{rt.namespace}{TABLE}-changelog"
    log = BatchLog(rt.batch_dir(TABLE))
    rng = random.Random(20261125)
    job = subprocess.Popen([STATETABLE, "run", TABLE, "--until-caught-up", "--max-records-per-batch", "2000"],
                           env=job_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kills = []
    try:
        wait_until(lambda: log.commits() or job.poll() is not None, 300, what="the first batch commits")
        while len(kills) < 3 and job.poll() is None:
            time.sleep(rng.uniform(0.5, 3))
            leader = _changelog_leader(settings, changelog)
            if leader is None or not kafka_server.process(settings, leader).kill():
                continue
            kills.append((leader, len(log.commits())))
            time.sleep(rng.uniform(2, 5))          # batches go on with two brokers
            kafka_server.start(settings, leader)
            kafka_server.wait_healthy(settings)
            # the next kill lands in a later batch: three batches each lose their changelog leader
            wait_until(lambda: len(log.commits()) > kills[-1][1] or job.poll() is not None, 300,
                       what="a batch to commit after the broker came back")
        _, err = job.communicate(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
    assert len(kills) == 3, f"the job ended before three kills: {kills}; {err[-8000:]}"
    assert len({batches for _, batches in kills}) == 3, kills
    assert job.returncode == 0, err[-5000:]       # a batch that met the lost broker ran again from its plan
    print(json.dumps({"kills": kills, "batches": len(log.commits()), "batch_reruns": err.count("running it again")}))

    state = _assert_state_equals(rt, _expected(rt, suffix))
    assert sum(c.counts["read"] for c in log.commits()) == EVENTS + len(BAD_RECORDS)
    changes, seen = _folded_changes(rt, suffix)
    assert set(changes) == set(state)
    for customer, row in changes.items():
        assert row["payments"] == state[customer][0], customer
    assert_each_batch_once_and_in_order(seen)
    # The restarted brokers caught up: every replica of the changelog is in sync again.
    wait_until(lambda: _topic_replication(settings, [changelog])[changelog][2] == {3}, 60,
               what="the changelog's replicas are all in sync")


def _refused(env: dict, rt, config: Path) -> str:
    done = _cli({**env, **rt.as_env(), CONFIG_ENV: str(config)}, "produce-sample", TABLE, "--events", "10",
                timeout=180)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    # The CLI's own last line: librdkafka's log lines (`%<level>|...`) come from its threads, and
    # one can land after the message the CLI printed.
    return [line for line in done.stderr.strip().splitlines() if not line.startswith("%")][-1]


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_clients_without_credentials_with_a_wrong_password_or_without_acls_are_refused(secure, tmp_path):
    from confluent_kafka.admin import (
        AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
    )

    from deploy import kafka_security, kafka_server

    settings, env = secure
    rt, _ = isolated_runtime(settings.kafka_bootstrap, tmp_path)
    good = settings.kafka_client_properties.read_text()
    brokers = [kafka_server.address(settings, b) for b in (1, 2, 3)]

    ca = next(line for line in good.splitlines() if line.startswith("ssl.ca.location"))
    anonymous = _refused(env, rt, _private(tmp_path / "anonymous.properties", f"security.protocol=SSL\n{ca}\n"))
    assert "anonymous client" in anonymous and any(b in anonymous for b in brokers), anonymous

    wrong = "\n".join("sasl.password=not-the-password" if line.startswith("sasl.password") else line
                      for line in good.splitlines())
    line = _refused(env, rt, _private(tmp_path / "wrong.properties", wrong))
    assert "refused user 'statetable' (SCRAM-SHA-512)" in line and "wrong username or password" in line, line
    assert any(b in line for b in brokers), line

    admin = AdminClient(kafka_security.admin_config(settings, kafka_server.internal_bootstrap(settings)))
    upsert = UserScramCredentialUpsertion("nobody", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          b"nobody-password")
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)
    nobody = "\n".join("sasl.username=nobody" if line.startswith("sasl.username") else
                       "sasl.password=nobody-password" if line.startswith("sasl.password") else line
                       for line in good.splitlines())
    line = _refused(env, rt, _private(tmp_path / "nobody.properties", nobody))
    assert "user 'nobody' (SCRAM-SHA-512) lacks DESCRIBE on topic 'payments" in line, line
    assert "TOPIC_AUTHORIZATION_FAILED" in line and "kafka-acls.sh" in line and any(b in line for b in brokers), line


def test_a_tables_commit_runs_the_table_on_its_change_topic_without_waiting_for_its_schedule(secure):
    """movie_ticket_totals reads movie_tickets_sold's change topic: triggering movie_tickets_sold's
    DAG on the secure stack's Airflow makes movie_ticket_totals' DAG run on the Asset event, with
    the stack's client config in every task; the chain equals pandas over the sales topic."""
    from catalog.runtime import Runtime
    from deploy import samples
    from deploy.airflow_api import AirflowApi
    from spark_jobs import jobs

    settings, _ = secure
    rt = Runtime.from_env()                      # the stack's own deployment: shipped tables, its data folder
    samples.produce("movie_tickets_sold", rt.bootstrap, 3000)
    api = AirflowApi(settings)
    api.wait_for_dag("movie_ticket_totals__incremental")
    before = {r["dag_run_id"] for r in api.runs("movie_ticket_totals__incremental")}
    run_id = api.trigger("movie_tickets_sold__incremental")
    assert api.wait_run("movie_tickets_sold__incremental", run_id, timeout=600)["state"] == "success"

    def downstream() -> list[dict]:
        return [r for r in api.runs("movie_ticket_totals__incremental")
                if r["dag_run_id"] not in before and r["run_type"] == "asset_triggered"]

    wait_until(lambda: downstream() and downstream()[0]["state"] in ("success", "failed"), 600, interval=3,
               what="movie_ticket_totals' DAG to run on movie_tickets_sold's Asset event")
    assert downstream()[0]["state"] == "success", downstream()
    # Further down the shipped chain: the join with movies runs on movie_tickets_sold's event too (it
    # reads the same change topic), and tickets per genre on the join's own commit.
    def asset_runs(dag: str) -> list[dict]:
        return [r for r in api.runs(f"{dag}__incremental") if r["run_type"] == "asset_triggered"]

    for dag in ("movie_ticket_genres", "tickets_per_genre"):
        wait_until(lambda: asset_runs(dag) and asset_runs(dag)[0]["state"] in ("success", "failed"), 600, interval=3,
                   what=f"{dag}'s DAG to run on an Asset event")
        assert asset_runs(dag)[0]["state"] == "success", asset_runs(dag)
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "movie_ticket_sales")])
    expected = {(t,): n for t, n in frame.groupby("title")["ticket_total_value"].count().items()}
    totals = {k: v["tickets_sold"] if isinstance(v, dict) else v[-1]
              for k, v in jobs.state_rows("movie_ticket_totals", rt).items()}
    assert totals == expected
    # movies never ran here: every title is in the NULL genre (a LEFT join), with all its tickets.
    assert {k[0]: v[1:3] for k, v in jobs.state_rows("tickets_per_genre", rt).items()} == \
        {None: (len(expected), (sum(expected.values()), len(expected)))}
