"""Exactly once under kills: 40k events (STATETABLE_EO_EVENTS) in >= 20 micro-batches; the job's whole
process tree is SIGKILLed at every named fault point as a client of the Spark Connect server (the
engine of Airflow's tasks), at the points whose step a local session's own JVM does, and at random
moments in both; the Connect server's own process tree is SIGKILLed at random moments too; then
re-run until caught up. The table must equal an independent pandas recomputation over the topic,
the changelog must restore it exactly, the change topic must fold to it with no batch's change
twice, and the bronze table must hold every (partition, offset) exactly once."""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from spark_jobs import jobs
from deploy import samples
from catalog.batch_log import BatchLog
from state import faults
from deploy.processes import wait_until
from tests.table_env import (KILL_EVERY_POINT, assert_each_batch_once_and_in_order, fold_change_topic, isolated_runtime,
                             read_topic)

# 40k events prove what 1M did (every fault point, >= 20 batches, kills mid-run): the kills, not
# the records, are what the test is about; the suite's time is CPU-bound (bench/suite_cpu), and at
# 100k this test alone took 940 s on a slow 2-core machine.
EVENTS = int(os.environ.get("STATETABLE_EO_EVENTS", "40000"))
PER_BATCH = max(1, EVENTS // 20)
RANDOM_KILLS = int(os.environ.get("STATETABLE_EO_RANDOM_KILLS", "2"))
# A point's crash leaves the same durable state whichever engine did the steps before it; what a
# local session adds is that the engine dies with the driver. So every point is crashed over
# Connect below, and in a local session one point after each step its own JVM or Python workers
# do: the plan, the bronze append, a merge task, the commit entry and the mirror's fold (a local
# JVM start per point was a third of this test: 173 of 518 s alone).
# KILL_EVERY_POINT crashes every point in both (about 3 minutes more).
LOCAL_POINTS = tuple(sorted(faults.BATCH_POINTS)) if KILL_EVERY_POINT else (
    "batch.after_plan", "batch.after_bronze", "batch.mid_merge", "batch.after_commit", "mirror.after_merge")
TABLE = "payments_per_customer"
STATETABLE = str(Path(sys.executable).parent / "statetable")


def _job_env(rt, fault: str | None = None, remote: str = "local") -> dict:
    env = {**os.environ, **rt.as_env(), "STATETABLE_FAULT_SCOPE": "group", "STATETABLE_SPARK_REMOTE": remote}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    return env


def start_job(rt, fault=None, max_batches=None, remote="local"):
    args = [STATETABLE, "run", TABLE, "--max-records-per-batch", str(PER_BATCH)]
    args += ["--max-batches", str(max_batches)] if max_batches else ["--until-caught-up"]
    return subprocess.Popen(args, env=_job_env(rt, fault, remote), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)


def wait_session_gone(sid: int, timeout: float = 60) -> None:
    """The job's whole tree (driver, JVM, PySpark daemon and workers) is gone."""
    deadline = time.monotonic() + timeout
    while faults.session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    faults.kill_session(sid)
    assert not faults.session_pids(sid)


@pytest.mark.timeout(3000)
def test_exactly_once_under_kills(kafka, tmp_path, spark, engine, stack_settings_, monkeypatch):
    from deploy import connect_server
    from serving.query import QueryService
    from serving.replica import Follower

    rt, suffix = isolated_runtime(kafka, tmp_path, overrides={"snapshot_every": "3"})
    sql = rt.tables_dir / f"{TABLE}.sql"          # the mirror folds after every odd batch: a 2-batch run reaches
    out = "payments-changes" + suffix               # the change topic, in the changelog's transactions
    sql.write_text(f"-- mirror_every: 2\n-- output_topic: {out}\n" + sql.read_text())     # mirror.after_merge
    samples.produce(TABLE, rt.bootstrap, EVENTS, suffix=suffix)
    log = BatchLog(rt.batch_dir(TABLE))
    # A query replica follows the changelog through every kill below, as a serving host would.
    follower = Follower(rt, {TABLE: jobs.load_table(TABLE, rt)[0]}, 0.2).start()

    assert set(LOCAL_POINTS) <= set(faults.BATCH_POINTS)
    for point in LOCAL_POINTS:
        job = start_job(rt, point, max_batches=2)
        _, err = job.communicate(timeout=600)
        assert job.returncode == -signal.SIGKILL, f"{point}: exit {job.returncode}\n{err[-3000:]}"
        wait_session_gone(job.pid)

    rng = random.Random(20261121)
    for _ in range(RANDOM_KILLS):
        job = start_job(rt)
        time.sleep(rng.uniform(4, 15))     # the JVM starts in ~8 s; a batch of 5k takes under one
        if job.poll() is None:
            faults.kill_session(job.pid)       # SIGKILL the job's whole process tree
        job.wait(timeout=60)
        wait_session_gone(job.pid)

    # As a client of the Spark Connect server: a fault point in the client kills the client's tree
    # (the server's operation runs on, detached, until the server interrupts it); one in a merge
    # task kills that task's Python worker and fails the run. Then random kills of the client, and
    # of the server's whole tree (JVM, Python daemon and workers), which is started again.
    for point in sorted(faults.BATCH_POINTS):
        job = start_job(rt, point, max_batches=2, remote=engine)
        _, err = job.communicate(timeout=600)
        assert job.returncode != 0, f"{point} over Spark Connect: exit {job.returncode}\n{err[-3000:]}"
        wait_session_gone(job.pid)
    for kill in range(RANDOM_KILLS):
        job = start_job(rt, remote=engine)
        time.sleep(rng.uniform(1, 6))
        if kill % 2:
            server = connect_server.process(stack_settings_).pid()
            assert server is not None, "the Spark Connect server is not running"
            faults.kill_session(server)
            try:
                os.waitpid(server, 0)      # the server is this process's child (started here): reap it
            except ChildProcessError:
                pass
            wait_session_gone(server)
            job.wait(timeout=120)
            connect_server.start(stack_settings_)
            connect_server.wait_healthy(stack_settings_)
        elif job.poll() is None:
            faults.kill_session(job.pid)
        job.wait(timeout=120)
        wait_session_gone(job.pid)

    final = start_job(rt, remote=engine)
    _, err = final.communicate(timeout=1800)
    assert final.returncode == 0, err[-3000:]
    commits = log.commits()
    assert len(commits) >= 20
    assert sum(c.counts["read"] for c in commits) == EVENTS

    # Independent recomputation over the topic.
    records = read_topic(rt.bootstrap, "payments" + suffix)
    assert len(records) == EVENTS
    frame = pd.DataFrame([json.loads(m.value()) for m in records])
    expected = frame.groupby("customer_id")["amount"].agg(["count", "sum", "max"])
    state = {k[0]: v for k, v in jobs.state_rows(TABLE, rt).items()}
    table, _ = jobs.load_table(TABLE, rt)
    st = jobs.state_table(table, rt)
    try:
        assert set(state) == set(expected.index)
        for customer, (count, total, largest) in state.items():
            row = expected.loc[customer]
            assert count == row["count"], customer
            assert math.isclose(total, row["sum"], rel_tol=1e-9) and largest == row["max"], customer

        # The changelog restores it exactly (digests equal the last commit's).
        last = log.last_commit()
        st.wipe_local()
        for p in range(table.partitions):
            report = st.restore(p)
            assert (report.applied_batch, format(report.digest, "016x")) == (last.batch_id, last.digests[p])
    finally:
        st.close()

    # The replica that followed through the kills stands at the last commit with the same rows.
    try:
        wait_until(lambda: set(follower.replicas[TABLE].applied.values()) == {last.batch_id}, 60,
                   what="the replica reaching the last commit")
        monkeypatch.setenv("STATETABLE_QUERY_FROM", "replica")
        service = QueryService(rt, background=False, follow=False)
        try:
            page = service.scan(TABLE, limit=1000)
            rows = list(page.rows)
            while page.next_cursor:
                page = service.scan(TABLE, limit=1000, cursor=page.next_cursor)
                rows += page.rows
        finally:
            service.close()
    finally:
        follower.close()
    assert page.batch == last.batch_id and {r["customer_id"] for r in rows} == set(expected.index)
    for row in rows:
        want = expected.loc[row["customer_id"]]
        assert row["payments"] == want["count"] and row["largest"] == want["max"], row
        assert math.isclose(row["total"], want["sum"], rel_tol=1e-9), row

    # The Delta mirror (the folded table overlaid with newer changes), after kills between its
    # change commits and folds, equals it too.
    from spark_jobs.delta import mirror as delta_mirror

    mirror = {json.loads(r["key"])[0]: json.loads(r["row"]) for r in delta_mirror.frame(spark, rt, TABLE).collect()}
    assert set(mirror) == set(expected.index)
    for customer, row in mirror.items():
        assert row["payments"] == expected.loc[customer, "count"], customer
        assert math.isclose(row["total"], expected.loc[customer, "sum"], rel_tol=1e-9), customer

    # The change topic, read with read_committed: folded by key it is the table, and no batch's
    # change of a key appears twice, whatever the kills cut short.
    folded, seen = fold_change_topic(rt.bootstrap, out)
    assert_each_batch_once_and_in_order(seen)
    assert set(folded) == {json.dumps({"customer_id": c}) for c in expected.index}
    for key, row in folded.items():
        customer = json.loads(key)["customer_id"]
        assert row["payments"] == expected.loc[customer, "count"], customer
        assert math.isclose(row["total"], expected.loc[customer, "sum"], rel_tol=1e-9), customer
        assert row["largest"] == expected.loc[customer, "max"], customer

    bronze = spark.read.format("delta").load(rt.delta_path(TABLE, "bronze"))
    assert bronze.count() == EVENTS
    assert bronze.select("source_partition", "source_offset").distinct().count() == EVENTS
