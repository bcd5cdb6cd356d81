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
from state import faults
from tests.table_env import isolated_runtime, read_topic

EVENTS = int(os.environ.get("STATETABLE_CLUSTER_EVENTS", "60000"))
BATCHES = 6
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
    from spark_jobs.session import client_url

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
    folders = {settings.cluster_dir / f"worker-{i}" / "state" for i in (1, 2)}
    assert len(folders) == 2 and all(f.is_dir() for f in folders)


def test_worker_kills_mid_merge_lose_nothing_and_the_table_equals_a_recomputation(cluster, deployment, tmp_path):
    from deploy import spark_cluster

    settings, _, s3_env = cluster
    rt, suffix = deployment
    per_batch = str(EVENTS // (BATCHES + len(DRIVER_KILLS)))
    served, killed = set(), 0
    for batch in range(BATCHES):
        once = tmp_path / f"killed-{batch}"
        fault = {} if batch % 2 else {faults.ENV: "commit.after_changelog", faults.SCOPE_ENV: f"worker@{once}"}
        done = _run(cluster, rt, "run", TABLE, "--max-batches", "1", "--max-records-per-batch", per_batch, **fault)
        assert done.returncode == 0, done.stderr[-4000:]
        for found in re.findall(r"partitions served by (\{.*?\})", done.stderr):
            served |= set(json.loads(found))
        if fault:
            assert once.exists(), "no merge task reached the fault point"
            killed += 1
            dead = [i for i in (1, 2) if not spark_cluster.worker(settings, i).is_running()]
            assert len(dead) == 1, f"one worker should have died, not {dead}"
            spark_cluster.start_worker(settings, dead[0])         # the stack brings it back
            spark_cluster.wait_healthy(settings)
    assert killed >= 3
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


def _assert_equals_recomputation(rt, suffix, reader_dir: Path) -> None:
    """The state as a new host restores it from the store and the changelog, against pandas."""
    from spark_jobs import jobs

    records = read_topic(rt.bootstrap, "payments" + suffix)
    frame = pd.DataFrame([json.loads(m.value()) for m in records])
    expected = frame.groupby("customer_id")["amount"].agg(["count", "sum", "max"])
    reader = replace(rt, data_dir=reader_dir)
    table, _ = jobs.load_table(TABLE, reader)
    st = jobs.state_table(table, reader)
    try:
        last = BatchLog(rt.batch_dir(TABLE)).last_commit()
        for p in range(table.partitions):
            report = st.restore(p)
            assert (report.applied_batch, format(report.digest, "016x")) == (last.batch_id, last.digests[p])
    finally:
        st.close()
    state = {k[0]: v for k, v in jobs.state_rows(TABLE, reader).items()}
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


def test_the_kill_worker_drill_loses_a_worker_mid_merge_and_the_restored_table_verifies(cluster, deployment):
    from ops import failures

    settings, remote, s3_env = cluster
    rt, suffix = deployment
    samples.produce(TABLE, rt.bootstrap, 3000, suffix=suffix)
    restart = (f"env STATETABLE_STACK_DIR={settings.state_dir} STATETABLE_S3_PORT={settings.s3_port} "
               f"STATETABLE_SPARK_MASTER_PORT={settings.master_port} {STATETABLE} stack restart-workers")
    with _environ_kept():
        os.environ.update({**_env(cluster, rt), failures.WORKER_RESTART_ENV: restart})
        injected = failures.inject(TABLE, "kill_worker", rt)
    assert injected.facts["killed_worker"] in ("spark-worker-1", "spark-worker-2"), injected
    assert injected.facts["exit_code"] == 0
    from deploy import spark_cluster

    assert all(spark_cluster.worker_up(settings, i) for i in (1, 2))      # the deployment restarted it
    checked = _run(cluster, rt, "verify", TABLE)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert " 0 missing, 0 unexpected, 0 different" in checked.stdout
