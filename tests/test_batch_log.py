"""The batch log's fencing: of drivers that race for a batch, exactly one writes each entry.

Against a real folder and a real S3 API (moto's server, the stack's store);
the racers are separate processes, as drivers on separate hosts would be.
"""
from __future__ import annotations

import multiprocessing
import os
import uuid

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
