"""Scale-out on loopback: a Spark standalone master with 2 workers (1 core, a state dir each),
moto's S3 server holding the batch log, snapshots and Delta tables, and the Spark Connect
server against the master. Jobs run as separate client processes, as Airflow tasks do.

Proven here: an incremental run on both workers survives SIGKILLs of a whole worker in the
middle of a merge (Spark reruns the task on the other worker, which restores the partition
from the object store and the changelog) and equals an independent pandas recomputation;
bronze in S3 holds every (partition, offset) once; every worker's state wiped, the next batch
hydrates and verify passes; two drivers on "two hosts" race for a batch and one loses loudly.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from catalog.batch_log import BatchLog
from catalog.runtime import Runtime
from deploy import samples
from deploy.processes import wait_until
from serving.replica import read_status
from state import faults
from tests.table_env import isolated_runtime, read_topic

# #17 asked for 1M events through the cluster (STATETABLE_CLUSTER_EVENTS=1000000 runs it; bench.cluster
# measures 1.2M): what a worker's death mid-merge proves holds for any batch size (10,000 records
# a batch still spread every batch over both workers' partitions), and 60k keep the suite inside
# CI's time on a slow 2-core machine (the module took 1,830 s there at 200k).
EVENTS = int(os.environ.get("STATETABLE_CLUSTER_EVENTS", "60000"))
BATCHES = 3                 # each loses a worker mid-merge
DRIVER_KILLS = ("batch.after_plan", "batch.after_merge", "batch.after_commit")
TABLE = "payments_per_customer"
STATETABLE = str(Path(sys.executable).parent / "statetable")


@contextlib.contextmanager
def _environ_kept():
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def cluster(kafka, stack_settings_, tmp_path_factory):
    from deploy import connect_server, object_store, spark_cluster, stack
    from spark_jobs.engine.session import client_url

    settings = replace(stack_settings_, state_dir=tmp_path_factory.mktemp("cluster-stack"),
                       connect_port=stack_settings_.connect_port + 1, s3_port=stack_settings_.s3_port + 1)
    try:
        with _environ_kept():
            stack._start_cluster(settings, 2, time.monotonic())
            connect_server.start(settings)
            connect_server.wait_healthy(settings)
        yield settings, client_url(settings.connect_url, connect_server.token(settings)), \
            object_store.client_env(settings)
    finally:
        connect_server.stop(settings)
        spark_cluster.stop(settings)
        object_store.stop(settings)


@pytest.fixture(scope="module")
def deployment(cluster, kafka, tmp_path_factory):
    """A table deployment whose durable parts (batch log, snapshots, Delta) live in the store."""
    settings, _, s3_env = cluster
    root = tmp_path_factory.mktemp("cluster-table")
    local, suffix = isolated_runtime(kafka, root, overrides={"snapshot_every": "2"})
    store = f"s3://statetable/{uuid.uuid4().hex[:8]}"
    rt = replace(local, store_uri=store, snapshot_uri=f"{store}/snapshots")
    samples.produce(TABLE, kafka, EVENTS, suffix=suffix)
    return rt, suffix


def _env(cluster, rt: Runtime, data_dir: Path | None = None, **extra) -> dict:
    _, remote, s3_env = cluster
    env = {**os.environ, **s3_env, **rt.as_env(), "STATETABLE_SPARK_REMOTE": remote, **extra}
    if data_dir is not None:
        env["STATETABLE_DATA_DIR"] = str(data_dir)       # another host's disk: its own locks and cache
    for key in (faults.ENV, faults.SCOPE_ENV, faults.RELEASE_ENV):
        if key not in extra:
            env.pop(key, None)
    return env


def _run(cluster, rt, *args, data_dir=None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([STATETABLE, *args], env=_env(cluster, rt, data_dir, **extra), capture_output=True,
                          text=True, timeout=900)


def test_status_names_the_master_each_worker_and_the_store(cluster):
    from deploy import stack

    settings, _, _ = cluster
    lines = stack.status_lines(settings)
    assert f"spark-master {settings.master_url} up" in lines
    assert [line for line in lines if line.startswith("spark-worker-")] == [
        f"spark-worker-{i} spark://127.0.0.1:{settings.master_port + 10 + i} up" for i in (1, 2)]
    assert f"s3 {settings.s3_url} up" in lines
    assert "spark-supervisor restarts dead workers up" in lines
    folders = {settings.cluster_dir / f"worker-{i}" / "state" for i in (1, 2)}
    assert len(folders) == 2 and all(f.is_dir() for f in folders)


def test_worker_kills_mid_merge_lose_nothing_and_the_table_equals_a_recomputation(cluster, deployment, tmp_path):
    from deploy import spark_cluster

    settings, _, s3_env = cluster
    rt, suffix = deployment
    per_batch = str(EVENTS // (BATCHES + len(DRIVER_KILLS)))
    served = set()
    for batch in range(BATCHES):
        once = tmp_path / f"killed-{batch}"
        fault = {faults.ENV: "commit.after_changelog", faults.SCOPE_ENV: f"worker@{once}"}
        pids = {i: spark_cluster.worker(settings, i).pid() for i in (1, 2)}
        done = _run(cluster, rt, "run", TABLE, "--max-batches", "1", "--max-records-per-batch", per_batch, **fault)
        assert done.returncode == 0, done.stderr[-4000:]
        for found in re.findall(r"partitions served by (\{.*?\})", done.stderr):
            served |= set(json.loads(found))
        assert once.exists(), "no merge task reached the fault point"
        dead = int(once.read_text().removeprefix("spark-worker-"))
        # The stack's supervisor starts the dead worker again; the other one was never touched.
        wait_until(lambda: spark_cluster.worker(settings, dead).pid() not in (None, pids[dead])
                   and all(spark_cluster.worker_up(settings, i) for i in (1, 2)), 90, 0.5,
                   f"spark-worker-{dead} restarted by the supervisor")
        assert spark_cluster.worker(settings, 3 - dead).pid() == pids[3 - dead]
    assert served == {"spark-worker-1", "spark-worker-2"}, served
    for point in DRIVER_KILLS:              # the driver dies; the next one takes its batch over
        died = _run(cluster, rt, "run", TABLE, "--max-batches", "1", "--max-records-per-batch", per_batch,
                    **{faults.ENV: point})
        assert died.returncode == faults.EXIT_CODE, f"{point}: {died.returncode}\n{died.stderr[-3000:]}"
    final = _run(cluster, rt, "run", TABLE, "--until-caught-up", "--max-records-per-batch", per_batch)
    assert final.returncode == 0, final.stderr[-4000:]

    os.environ.update(s3_env)
    try:
        log = BatchLog(rt.batch_dir(TABLE))
        assert sum(c.counts["read"] for c in log.commits()) == EVENTS
        _assert_equals_recomputation(rt, suffix, tmp_path / "reader")
        # Bronze, read from the store with delta-rs (not the product's reader).
        from deltalake import DeltaTable

        bronze = DeltaTable(rt.delta_path(TABLE, "bronze")).to_pyarrow_table(
            columns=["source_partition", "source_offset"]).to_pandas()
        assert len(bronze) == EVENTS
        assert not bronze.duplicated().any()
    finally:
        for key in s3_env:
            os.environ.pop(key, None)


def _restored_on_a_new_host(rt, name: str, reader_dir: Path) -> dict:
    """The table's rows as a host without any copy restores them from the store and the changelog;
    each partition's digest must equal the last commit's."""
    from spark_jobs import jobs

    reader = replace(rt, data_dir=reader_dir)
    table, _ = jobs.load_table(name, reader)
    st = jobs.state_table(table, reader)
    try:
        last = BatchLog(rt.batch_dir(name)).last_commit()
        for p in range(table.partitions):
            report = st.restore(p)
            assert (report.applied_batch, format(report.digest, "016x")) == (last.batch_id, last.digests[p])
    finally:
        st.close()
    return jobs.state_rows(name, reader)


def _assert_equals_recomputation(rt, suffix, reader_dir: Path) -> None:
    """The state as a new host restores it from the store and the changelog, against pandas."""
    records = read_topic(rt.bootstrap, "payments" + suffix)
    frame = pd.DataFrame([json.loads(m.value()) for m in records])
    expected = frame.groupby("customer_id")["amount"].agg(["count", "sum", "max"])
    state = {k[0]: v for k, v in _restored_on_a_new_host(rt, TABLE, reader_dir).items()}
    assert set(state) == set(expected.index)
    for customer, (count, total, largest) in state.items():
        row = expected.loc[customer]
        assert count == row["count"], customer
        assert math.isclose(total, row["sum"], rel_tol=1e-9) and largest == row["max"], customer


def test_every_worker_wiped_the_next_batch_hydrates_from_the_store_and_verify_passes(cluster, deployment):
    import shutil

    settings, _, _ = cluster
    rt, suffix = deployment
    for i in (1, 2):
        shutil.rmtree(settings.cluster_dir / f"worker-{i}" / "state")
        (settings.cluster_dir / f"worker-{i}" / "state").mkdir()
    samples.produce(TABLE, rt.bootstrap, 2000, suffix=suffix)
    done = _run(cluster, rt, "run", TABLE)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "restored from snapshots and the changelog (no local copy): [0, 1, 2, 3]" in done.stderr, \
        done.stderr[-3000:]
    checked = _run(cluster, rt, "verify", TABLE)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert " 0 missing, 0 unexpected, 0 different" in checked.stdout


def test_two_drivers_on_two_hosts_race_for_a_batch_one_commits_the_other_fails_naming_it(cluster, deployment,
                                                                                        tmp_path):
    rt, suffix = deployment
    samples.produce(TABLE, rt.bootstrap, 1000, suffix=suffix)
    release = tmp_path / "release"
    stalled = subprocess.Popen([STATETABLE, "run", TABLE], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=_env(cluster, rt, tmp_path / "host-a", **{
                                   faults.ENV: "batch.after_plan", faults.SCOPE_ENV: "stall",
                                   faults.RELEASE_ENV: str(release)}))
    try:
        s3_env = cluster[2]
        os.environ.update(s3_env)
        log = BatchLog(rt.batch_dir(TABLE))
        deadline = time.monotonic() + 300
        while log.pending_plan() is None and time.monotonic() < deadline and stalled.poll() is None:
            time.sleep(0.5)
        pending = log.pending_plan()
        assert pending is not None, "the first driver never planned"
        second = _run(cluster, rt, "run", TABLE, data_dir=tmp_path / "host-b")
        assert second.returncode != 0
        assert f"batch {pending.batch_id} is being run by driver pid {stalled.pid} " in second.stderr, \
            second.stderr[-3000:]
        assert log.pending_plan().batch_id == pending.batch_id      # the loser changed nothing
        release.touch()
        _, err = stalled.communicate(timeout=600)
        assert stalled.returncode == 0, err[-3000:]
        assert log.commit(pending.batch_id).holder["pid"] == stalled.pid
    finally:
        release.touch()
        if stalled.poll() is None:
            stalled.kill()
        for key in cluster[2]:
            os.environ.pop(key, None)


# ------------------------------------------------------------------ restore-verify through Airflow
MOVIES = "movie_tickets_sold"


@pytest.fixture(scope="module")
def cluster_airflow(cluster, kafka, stack_settings_):
    """The Airflow of `stack up --workers 2`: tasks on the cluster's Spark Connect server, tables in
    its store. The session's Airflow runs the same tables on the same broker, so this one has a
    namespace of its own (changelogs, dead letters, consumer groups)."""
    from deploy import airflow_server
    from deploy.airflow_api import AirflowApi
    from ops import failures

    settings, _, s3_env = cluster
    settings = replace(settings, airflow_port=stack_settings_.airflow_port + 1,
                       postgres_port=stack_settings_.postgres_port + 1, batch_port=stack_settings_.batch_port + 1)
    env = {**s3_env, **settings.as_env(), "STATETABLE_NAMESPACE": "cluster-",
           failures.BROKER_RESTART_ENV: f"env STATETABLE_STACK_DIR={stack_settings_.state_dir} {STATETABLE} "
                                        f"stack restart-broker"}
    with _environ_kept():
        os.environ.update(env)
        airflow_server.start(settings)
        try:
            airflow_server.wait_healthy(settings)
            yield settings, AirflowApi(settings), Runtime.from_env()
        finally:
            airflow_server.stop(settings)


def _dag_run(api, dag_id: str, conf: dict | None = None) -> tuple[str, dict, dict]:
    api.wait_for_dag(dag_id)
    run_id = api.trigger(dag_id, conf)
    return run_id, api.wait_run(dag_id, run_id, timeout=900), api.task_states(dag_id, run_id)


def _expected_movies(bootstrap: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in read_topic(bootstrap, "movie_ticket_sales"):
        record = json.loads(message.value())
        if record.get("ticket_total_value") is not None:
            counts[record["title"]] = counts.get(record["title"], 0) + 1
    return counts


DRILLS = ["none", "kill_worker", "kill_mid_batch", "kill_engine", "wipe_local_store", "corrupt_latest_snapshot",
          "lose_all_snapshots", "broker_restart"]       # "none" first: it runs the table's first batches


@pytest.mark.parametrize("failure", DRILLS)
def test_restore_verify_passes_every_failure_on_the_cluster(cluster, cluster_airflow, kafka, failure):
    from deploy import spark_cluster
    from ops import failures, status

    settings, api, rt = cluster_airflow
    assert set(DRILLS) == set(failures.FAILURES)
    if failure == "none":       # the table's first batches, on the cluster
        samples.produce(MOVIES, kafka, 3000)
        _, run, states = _dag_run(api, f"{MOVIES}__incremental")
        assert run["state"] == "success", states
    if failure in ("kill_worker", "kill_mid_batch", "kill_engine"):
        samples.produce(MOVIES, kafka, 3000)          # a batch to kill
    run_id, run, states = _dag_run(api, f"{MOVIES}__restore_verify", {"failure": failure})
    assert run["state"] == "success", (states, api.failed_logs(f"{MOVIES}__restore_verify", run_id))
    with _environ_kept():
        os.environ.update(cluster[2])
        record = status.verify_history(rt, MOVIES, limit=1)[0]
    assert record["run_id"] == run_id and record["failure"] == failure and record["ok"] is True, record
    assert record["differences"] == 0 and record["keys_compared"] == len(_expected_movies(kafka))
    facts = record["injected"]["facts"]
    if failure == "kill_worker":
        assert facts["killed_worker"] in ("spark-worker-1", "spark-worker-2") and facts["exit_code"] == 0
        assert all(spark_cluster.worker_up(settings, i) for i in (1, 2))      # the deployment restarted it
    if failure in ("kill_mid_batch", "kill_engine"):
        assert facts["exit_code"] != 0 and facts["killed_batch"] >= 0
    if failure == "kill_engine":
        assert facts["engine_was_down"] is True and facts["engine_restart_seconds"] > 0
    if failure in ("wipe_local_store", "corrupt_latest_snapshot", "lose_all_snapshots", "broker_restart"):
        assert "and on every Spark worker by" in record["injected"]["detail"], record["injected"]
    if failure == "corrupt_latest_snapshot":
        assert record["corrupt_snapshots"] == 4


def test_a_rebuild_on_the_cluster_recomputes_from_bronze_in_the_store(cluster_airflow):
    _, api, rt = cluster_airflow
    run_id, run, states = _dag_run(api, f"{MOVIES}__rebuild")
    assert run["state"] == "success", (states, api.failed_logs(f"{MOVIES}__rebuild", run_id))
    log = api.task_log(f"{MOVIES}__rebuild", run_id, "rebuild")
    assert re.search(r"rebuild movie_tickets_sold: batch \d+, \d+ keys", log), log[-2000:]
    _, run, states = _dag_run(api, f"{MOVIES}__restore_verify", {"failure": "none"})
    assert run["state"] == "success", states


def test_after_the_drills_the_cluster_table_restores_to_an_independent_recomputation(cluster, cluster_airflow,
                                                                                   kafka, tmp_path):
    _, _, rt = cluster_airflow
    with _environ_kept():
        os.environ.update(cluster[2])
        state = {k[0]: v[0] for k, v in _restored_on_a_new_host(rt, MOVIES, tmp_path / "reader").items()}
    assert state == _expected_movies(kafka)


# ------------------------------------------------------------------ query replicas on the cluster
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, token: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError:
        return 0, {}


def _served_movies(port: int, token: str) -> tuple[set, dict] | None:
    """Every row a server answers, page by page, and the batches the pages named; None if refused."""
    rows, batches, cursor = {}, set(), None
    while True:
        status, body = _get(port, f"/tables/{MOVIES}/rows?limit=1000" + (f"&cursor={cursor}" if cursor else ""),
                            token)
        if status != 200:
            return None
        batches.add(body["batch"])
        rows.update({r["title"]: r["tickets_sold"] for r in body["rows"]})
        if (cursor := body["next_cursor"]) is None:
            return batches, rows


def _start_server(cluster, rt, data_dir: Path, port: int, token_file: Path, *readers: str) -> subprocess.Popen:
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([STATETABLE, "serve", "--port", str(port), "--token-file", str(token_file), *readers],
                            env=_env(cluster, rt, data_dir), stdout=subprocess.DEVNULL,
                            stderr=open(data_dir / "serve.log", "ab"))


def test_two_query_servers_on_their_own_data_dirs_follow_the_cluster_table(cluster, cluster_airflow, kafka,
                                                                           tmp_path):
    """`stack up --workers 2`: the writers are the workers, so each server keeps a replica of its
    own. Both answer exactly; a new batch reaches both within 30 s (CI's 2 cores run another
    module beside it: 10 s was missed once, the cause not recorded; a miss now names the
    follower's batch and the readers'); one SIGKILLed, the other keeps answering, never going
    back a batch; the killed one restarted is exact again."""
    _, api, rt = cluster_airflow
    token = uuid.uuid4().hex
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    ports = [_free_port(), _free_port()]
    dirs = [tmp_path / "host-a", tmp_path / "host-b"]
    servers = [_start_server(cluster, rt, dirs[0], ports[0], token_file),
               _start_server(cluster, rt, dirs[1], ports[1], token_file, "--readers", "2")]
    log = BatchLog(rt.batch_dir(MOVIES))

    def exact_at(port: int, batch: int, timeout: float) -> None:
        seen = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = _served_movies(port, token)
            if seen is not None and seen[0] == {batch}:
                assert seen[1] == _expected_movies(kafka)
                return
            time.sleep(0.2)
        # Which side lagged: the follower (its status.json) or the readers' catch-up (/tables).
        host = dirs[ports.index(port)]
        _, listing = _get(port, "/tables", token)
        table = next((t for t in listing.get("tables", ()) if t.get("table") == MOVIES), listing)
        raise AssertionError(f"server {ports.index(port)} on {port}: not at batch {batch} within {timeout} s: "
                             f"{seen and seen[0]}; /tables: {table}; follower: "
                             f"{read_status(host / 'replicas' / MOVIES)}; {(host / 'serve.log').read_text()[-2000:]}")

    try:
        first = log.last_commit().batch_id
        for port in ports:
            exact_at(port, first, 120)       # restored from the store, then following
            status, listing = _get(port, "/tables", token)
            table = next(t for t in listing["tables"] if t["table"] == MOVIES)
            assert (table["served_from"], table["lag_batches"]) == ("replica", 0), table
        for host in dirs:
            assert (host / "replicas" / MOVIES / "p0000" / "CURRENT").exists()
            assert not (host / "state" / MOVIES).exists()       # nothing of a writer's on a serving host

        samples.produce(MOVIES, kafka, 2000)
        _, run, states = _dag_run(api, f"{MOVIES}__incremental")
        assert run["state"] == "success", states
        second = log.last_commit().batch_id
        assert second > first
        for port in ports:
            exact_at(port, second, 30)

        # One server killed while the other answers; the survivor never goes back a batch.
        servers[0].kill()
        servers[0].wait(timeout=30)
        samples.produce(MOVIES, kafka, 2000)
        seen_batches = []

        def survivor_answers(_run) -> None:
            served = _served_movies(ports[1], token)
            assert served is not None and len(served[0]) == 1, served
            seen_batches.append(served[0].pop())

        run = api.wait_run(f"{MOVIES}__incremental", api.trigger(f"{MOVIES}__incremental"), timeout=900,
                           on_poll=survivor_answers)
        assert run["state"] == "success"
        assert seen_batches and seen_batches == sorted(seen_batches) and seen_batches[0] >= second
        third = log.last_commit().batch_id
        assert third > second
        exact_at(ports[1], third, 30)
        servers[0] = _start_server(cluster, rt, dirs[0], ports[0], token_file)
        exact_at(ports[0], third, 30)        # from its own copy plus the changelog it missed
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=30)


def test_statetable_query_on_the_cluster_from_a_fresh_data_dir(cluster, cluster_airflow, kafka, tmp_path):
    _, _, rt = cluster_airflow
    title, count = sorted(_expected_movies(kafka).items())[0]
    done = _run(cluster, rt, "query", MOVIES, title, data_dir=tmp_path / "laptop")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["tickets_sold"] == count
    assert "replica partition 0 restored to batch" in done.stderr and "Traceback" not in done.stderr
    unreachable = _run(cluster, rt, "query", MOVIES, title, data_dir=tmp_path / "offline",
                       AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ENDPOINT_URL_S3="http://127.0.0.1:9")
    assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr
    lines = [line for line in unreachable.stderr.splitlines() if line.strip()]
    assert lines and MOVIES in lines[-1] and ("store" in lines[-1] or "batch log" in lines[-1]), lines[-5:]


DRIVER_WITHOUT_SECRET = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).appName("intruder").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
print(spark.range(3).count(), flush=True)
"""


def test_a_driver_without_the_clusters_secret_cannot_run_on_its_workers(cluster, tmp_path):
    """Issue 66: the master ran without spark.authenticate, so any local user could run code as
    the stack's user on its workers. A driver that cannot read the secret (another user's) is
    refused: its application never registers and runs nothing."""
    import urllib.request

    from deploy import spark_cluster

    settings, _, _ = cluster
    secret_file = settings.cluster_dir / ".auth_secret"
    assert secret_file.stat().st_mode & 0o077 == 0            # another user cannot read it
    for pid in (spark_cluster.master(settings).pid(), spark_cluster.worker(settings, 1).pid()):
        assert secret_file.read_text().strip() not in Path(f"/proc/{pid}/cmdline").read_text()
    script = tmp_path / "intruder.py"
    script.write_text(DRIVER_WITHOUT_SECRET)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_SPARK_AUTH", "SPARK_"))}
    try:
        done = subprocess.run([sys.executable, str(script), settings.master_url], env=env, capture_output=True,
                              text=True, timeout=15)
        counted = done.stdout.strip()
    except subprocess.TimeoutExpired as stopped:
        counted = (stopped.stdout or b"").decode().strip()
    assert counted != "3", "a driver without the secret ran a job on the cluster"
    with urllib.request.urlopen(f"http://{settings.host}:{spark_cluster.master_ui_port(settings)}/json/") as r:
        apps = json.load(r)
    names = [a.get("name") for a in apps.get("activeapps", []) + apps.get("completedapps", [])]
    assert "intruder" not in names and "statetable-connect" in names
