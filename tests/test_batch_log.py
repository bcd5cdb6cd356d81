"""The batch log's fencing: of drivers that race for a batch, exactly one writes each entry.

Against a real folder and a real S3 API (moto's server, the stack's store);
the racers are separate processes, as drivers on separate hosts would be.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from catalog.batch_log import BatchCommit, BatchHeld, BatchLog, BatchPlan

RACERS = 4


def _plan(batch_id: int = 0, end: int = 10) -> BatchPlan:
    return BatchPlan(batch_id=batch_id, topic="events", ranges={0: (0, end)}, watermark_ms=None)


def _commit(batch_id: int = 0) -> BatchCommit:
    return BatchCommit(batch_id=batch_id, topic="events", ranges={0: (0, 10)}, changelog_offsets={0: 3},
                       digests={0: "00"}, key_counts={0: 1}, counts={"read": 10}, watermark_ms=None, seconds=0.1)


@pytest.fixture(params=["folder", "s3"])
def location(request, tmp_path, monkeypatch):
    if request.param == "folder":
        return str(tmp_path / "batches" / "t")
    env = request.getfixturevalue("s3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return f"s3://statetable/test-{uuid.uuid4().hex[:8]}/batches/t"


def _race(location: str, entry: str, barrier, results) -> None:
    log = BatchLog(location)
    barrier.wait()
    try:
        if entry == "plan":
            log.write_plan(_plan(end=10 + os.getpid() % 7), "t")      # each racer would plan other offsets
        else:
            log.write_commit(_commit(), "t")
        results.put((os.getpid(), "wrote", ""))
    except BatchHeld as held:
        results.put((os.getpid(), "held", str(held)))


@pytest.mark.parametrize("entry", ["plan", "commit"])
def test_of_drivers_racing_for_one_entry_exactly_one_writes_it_and_the_others_are_told_who(location, entry):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    racers = [ctx.Process(target=_race, args=(location, entry, barrier, results)) for _ in range(RACERS)]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(30)
    winners = [pid for pid, outcome, _ in outcomes if outcome == "wrote"]
    assert len(winners) == 1, outcomes
    log = BatchLog(location)
    written = log.plan(0) if entry == "plan" else log.commit(0)
    assert written.holder["pid"] == winners[0]
    if entry == "plan":
        assert written.ranges == {0: (0, 10 + winners[0] % 7)}          # the winner's plan, whole
    for pid, outcome, message in outcomes:
        if outcome == "held":
            assert message.startswith("t: batch 0 ") and f"pid {winners[0]} " in message, message


def test_a_pending_batch_of_a_live_driver_is_refused_and_of_a_dead_one_taken_over_once(location):
    log = BatchLog(location)
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    live = ctx.Process(target=_write_plan_and_wait, args=(location, started))
    live.start()
    assert started.wait(60)
    plan = log.pending_plan()
    with pytest.raises(BatchHeld, match=rf"t: batch 0 is being run by driver pid {live.pid} "):
        log.take_over(plan, "t")
    live.kill()
    live.join(30)
    log.take_over(plan, "t")                       # the holder is dead: this driver takes the batch
    assert log.holder(0)["pid"] == os.getpid()
    log.take_over(plan, "t")                       # and may take it again (a retry in the same driver)
    log.write_commit(_commit(), "t")
    assert log.pending_plan() is None and log.last_commit().holder["pid"] == os.getpid()


def _write_plan_and_wait(location: str, started) -> None:
    import time

    BatchLog(location).write_plan(_plan(), "t")
    started.set()
    time.sleep(120)


def test_acceptance_entries_are_read_back(location):
    log = BatchLog(location)
    log.write_plan(_plan(), "t")
    log.write_commit(_commit(), "t")
    log.write_acceptance(0, {"topic": "events", "starts": {"0": 12}, "problem": "reset"})
    assert log.read_position()[2] == {0: 12}


def test_a_sweep_removes_its_entries_in_a_request_per_thousand(location):
    """What a compaction removes goes in DeleteObjects requests of up to 1,000 keys, not one
    request a key: on S3 a sweep of ~2x `keep` batches is a few requests."""
    log = BatchLog(location)
    names = [f"{i:020d}.plan.json" for i in range(2403)]
    for name in names[:2] + names[1500:1502] + names[2400:]:     # a few in each request, a few kept
        log.store.put(name, b"{}")
    calls: list[str] = []
    if location.startswith("s3://"):
        log.store.client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    log.store.delete(names[:2400])                               # names no entry has are no error
    assert calls == (["DeleteObjects"] * 3 if location.startswith("s3://") else []), calls
    assert sorted(log.store.names()) == names[2400:]


def _statetable(env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(Path(sys.executable).parent / "statetable"), *args], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"statetable {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_5000_batch_log_compacted_through_a_crash_restores_and_verifies_exact(where, kafka, tmp_path, request,
                                                                                 monkeypatch):
    """A year of `*/5` batches in small: 5,000 entries in the log (empty committed batches, as a
    rebuild writes them), a compaction killed after its checkpoint names them and before it
    removes what it folded, then the table runs on, its local state is lost, and it is restored
    and verified exact, through the CLI, against the records read back with pandas."""
    from dataclasses import replace

    import pandas as pd

    from deploy import samples
    from spark_jobs import jobs
    from state import faults
    from tests.table_env import isolated_runtime, read_topic

    rt, suffix = isolated_runtime(kafka, tmp_path)
    if where == "s3":
        for key, value in request.getfixturevalue("s3").items():
            monkeypatch.setenv(key, value)
        store = f"s3://statetable/test-{uuid.uuid4().hex[:8]}"
        rt = replace(rt, store_uri=store, snapshot_uri=f"{store}/snapshots")
    # The folder's jobs run on the stack's Spark Connect server, as a user's do (a local driver JVM
    # per CLI job cost ~12 CPU s more each); the store's jobs in local sessions, whose executors
    # get this process's S3 settings (the session's server was started without them).
    remote = request.getfixturevalue("engine") if where == "folder" else "local"
    env = {**os.environ, **rt.as_env(), "STATETABLE_SPARK_REMOTE": remote}
    for key in (faults.ENV, faults.SCOPE_ENV):
        env.pop(key, None)
    table = "payments_per_customer"
    samples.produce(table, rt.bootstrap, 2000, suffix=suffix)
    _statetable(env, "run", table, "--until-caught-up")

    log = BatchLog(rt.batch_dir(table))
    first = log.last_commit()
    empty = {p: (end, end) for p, (_, end) in first.ranges.items()}
    entries = 5000 if where == "folder" else 1100           # S3: 2 puts per entry, past one block of 1,000
    for batch_id in range(first.batch_id + 1, entries):
        log.write_plan(BatchPlan(batch_id, first.topic, empty, first.watermark_ms, topic_id=first.topic_id,
                                 definition=first.definition), table)
        log.write_commit(replace(first, batch_id=batch_id, ranges=empty, counts={"read": 0}, seconds=0.0,
                                 holder=None), table)
    assert len(log.store.names()) >= 2 * entries

    compact = "import sys\nfrom catalog.batch_log import BatchLog\nBatchLog(sys.argv[1]).compact()\n"
    killed = subprocess.run([sys.executable, "-c", compact, str(rt.batch_dir(table))], capture_output=True, text=True,
                            env={**env, faults.ENV: "batch_log.after_head"}, timeout=600)
    assert killed.returncode == faults.EXIT_CODE, killed.stderr[-3000:]
    crashed = BatchLog(rt.batch_dir(table))
    assert crashed.last_commit().batch_id == entries - 1 and crashed.commit(first.batch_id).counts["read"] == 2000
    assert len(crashed.store.names()) >= 2 * entries     # the head moved; nothing folded was removed yet

    samples.produce(table, rt.bootstrap, 500, suffix=suffix)
    _statetable(env, "run", table, "--until-caught-up")    # its commit finishes the compaction
    after = BatchLog(rt.batch_dir(table))
    last = after.last_commit()
    assert last.batch_id == entries and last.counts["read"] == 500
    assert len(after.store.names()) <= 2 * 2 * 100 + 10     # ~2x the kept batches' plans and commits
    commits = after.commits()
    assert [c.batch_id for c in commits] == list(range(entries + 1))
    assert sum(c.counts["read"] for c in commits) == 2500

    shutil.rmtree(rt.state_dir / table, ignore_errors=True)          # the driver's disk is lost
    restored = _statetable(env, "restore", table)
    verified = _statetable(env, "verify", table, "--full")
    assert f"at batch {entries} (in full)" in verified.stdout, verified.stdout[-2000:]
    assert "0 missing, 0 unexpected, 0 different, digest mismatches in partitions none" in verified.stdout
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "payments" + suffix)])
    expected = frame.groupby("customer_id")["amount"].agg(["count", "sum"])
    state = {k[0]: v for k, v in jobs.state_rows(table, rt).items()}
    assert set(state) == set(expected.index), restored.stdout[-2000:]
    for customer, row in state.items():
        assert row[0] == expected.loc[customer, "count"]
        assert abs(row[1] - expected.loc[customer, "sum"]) <= 1e-6 * max(1.0, abs(row[1])), customer
