"""Restore after each kind of failure, against the real broker: the result
is byte-identical to the original partitions."""
from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from state import changelog, codec
from state.errors import ChangelogGap
from state.kafka_admin import admin, delete_topic
from state.table import StateTable
from tests.state_workload import PARTITIONS, apply_batch, contents, reference, spec

BATCHES = 8
SNAPSHOT_AFTER = (2, 5)


@pytest.fixture
def built(kafka, tmp_path):
    """A table after 8 batches with snapshots after batches 2 and 5; returns (table, raw bytes per partition)."""
    table = StateTable(spec(f"rs-{uuid.uuid4().hex[:8]}"), tmp_path / "state", bootstrap=kafka,
                       snapshot_uri=str(tmp_path / "snapshots"))
    for b in range(BATCHES):
        apply_batch(table, b)
        if b in SNAPSHOT_AFTER:
            for p in range(PARTITIONS):
                table.snapshot(p)
    assert contents(table) == reference(BATCHES - 1)
    original = {p: (list(table.open(p).raw_items()), table.open(p).meta) for p in range(PARTITIONS)}
    yield table, original
    table.close()


def _raw(table: StateTable) -> dict:
    return {p: (list(table.open(p).raw_items()), table.open(p).meta) for p in range(PARTITIONS)}


def test_wiped_local_store_restores_from_snapshot_plus_changelog(built):
    table, original = built
    table.wipe_local()
    reports = [table.restore(p) for p in range(PARTITIONS)]
    assert all(r.snapshot_batch == 5 and r.applied_batch == BATCHES - 1 for r in reports)
    assert _raw(table) == original


def test_without_snapshots_restores_from_the_full_changelog(built):
    table, original = built
    for p in range(PARTITIONS):
        table.snapshots.delete_all(table.spec.name, p)
    table.wipe_local()
    reports = [table.restore(p) for p in range(PARTITIONS)]
    assert all(r.snapshot_batch is None and r.replayed_records > 0 for r in reports)
    assert _raw(table) == original


def test_corrupt_snapshot_is_logged_and_skipped(built, caplog):
    table, original = built
    kept = table.snapshots.list(table.spec.name, 0)
    newest = kept[0]
    # Its own file: an SST shared with the older snapshot (incremental snapshots) would take both down.
    older = {table.snapshots.file_path(m, n) for m in kept[1:] for n in m.files}
    victim = max((Path(table.snapshots.file_path(newest, name)) for name in newest.files
                  if table.snapshots.file_path(newest, name) not in older), key=lambda f: f.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    table.wipe_local()
    with caplog.at_level(logging.ERROR):
        report = table.restore(0)
    assert "SnapshotCorrupt" in caplog.text and victim.name in caplog.text
    assert report.corrupt_snapshots and report.snapshot_batch == 2   # fell back to the older snapshot
    for p in (1, 2):
        table.restore(p)
    assert _raw(table) == original


def test_truncated_changelog_restores_to_snapshot_and_refuses_beyond(built):
    table, original = built
    topic = table.spec.changelog_topic
    ends = {p: changelog.partition_bounds(table.bootstrap, topic, p)[1] for p in range(PARTITIONS)}
    client = admin(table.bootstrap)
    # DeleteRecords is refused on a purely compacted topic; an operator truncating it switches policy first.
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SET)])
    for future in client.incremental_alter_configs([resource]).values():
        future.result(30)
    # The controller accepted the policy; the broker applies it from the metadata log a moment later
    # and refuses DeleteRecords (POLICY_VIOLATION) until then.
    deadline = time.monotonic() + 30
    while True:
        try:
            for future in client.delete_records([TopicPartition(topic, p, ends[p]) for p in range(PARTITIONS)],
                                                request_timeout=30).values():
                future.result(30)
            break
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.POLICY_VIOLATION or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    table.wipe_local()
    report = table.restore(0, target_batch=5)
    assert report.applied_batch == 5 and report.replayed_records == 0
    assert {k: v for k, v in table.open_readonly(0).items()} == {
        k: v for k, v in reference(5).items() if table.partition_of(k) == 0}
    with pytest.raises(ChangelogGap, match=r"offsets \d+\.\.\d+ were deleted") as gap:
        table.restore(1, target_batch=BATCHES - 1)
    assert topic in str(gap.value)

    delete_topic(table.bootstrap, topic)
    with pytest.raises(ChangelogGap, match="does not exist"):
        table.restore(2, target_batch=BATCHES - 1)
    assert table.restore(2, target_batch=5).applied_batch == 5


def test_a_restore_to_an_earlier_batch_stops_at_the_marker_after_it(built):
    """A batch's changelog records carry no batch header: the marker after them names their
    batch. A restore to batch 4 (the snapshot after 2) applies 3 and 4 and none of 5's records,
    which the replay reads before 5's marker."""
    table, _ = built
    assert reference(4) != reference(5)
    table.wipe_local()
    reports = [table.restore(p, target_batch=4) for p in range(PARTITIONS)]
    assert [(r.snapshot_batch, r.applied_batch) for r in reports] == [(2, 4)] * PARTITIONS
    assert sum(r.replayed_records for r in reports) > 0
    assert contents(table, readonly=True) == reference(4)


def test_restore_past_the_changelog_end_names_the_missing_batches(built):
    table, _ = built
    with pytest.raises(ChangelogGap, match=rf"batches {BATCHES}\.\.{BATCHES + 3} are missing"):
        table.restore(0, target_batch=BATCHES + 3)


def test_partition_hydrates_in_a_second_empty_state_directory(built, tmp_path):
    table, original = built
    elsewhere = StateTable(table.spec, tmp_path / "other-executor", bootstrap=table.bootstrap,
                           snapshot_uri=table.snapshots.uri)
    try:
        hydrated = {p: (list(elsewhere.open(p).raw_items()), elsewhere.open(p).meta) for p in range(PARTITIONS)}
    finally:
        elsewhere.close()
    assert hydrated == original


@pytest.mark.parametrize("fence_lands", ["at flush", "between two produce calls"])
def test_a_writer_fenced_by_a_newer_one_stops_and_its_batch_is_never_visible(kafka, fence_lands):
    """Two writers of one changelog partition: the newer one's init_transactions fences the older,
    whose next publish must fail as StateFenced and leave nothing a read_committed reader sees.
    confluent-kafka raises the fence from inside flush as a SystemError; or, when librdkafka
    learned of it between two produce calls (a CI run on a loaded machine), from produce() as a
    bare `_FATAL` that names no cause."""
    from state.changelog import ChangelogWriter, Marker, ensure_changelog, replay
    from state.errors import StateFenced

    topic = ensure_changelog(kafka, f"fence-{uuid.uuid4().hex[:8]}-changelog", 1)
    older = ChangelogWriter(kafka, topic, 0)
    older.publish(1, {b"k1": b"v1"}, Marker(1, 0, 1))
    newer = ChangelogWriter(kafka, topic, 0)
    if fence_lands == "between two produce calls":
        produce = older._produce_all

        def then_wait(*args, **kwargs):
            produce(*args, **kwargs)
            time.sleep(2)                    # the broker's fencing answer arrives before the marker's
        older._produce_all = then_wait
    with pytest.raises(StateFenced):
        older.publish(2, {b"k2": b"v2", b"k3": b"v3"}, Marker(2, 0, 3))
    # The offset publish returns, not the partition's read_committed end: commit_transaction returns
    # once the coordinator has decided, and the commit marker (which moves the last stable offset)
    # reaches the partition a moment later, so the LSO read at once can still stop at batch 1.
    end = newer.publish(2, {b"k2": b"v2"}, Marker(2, 0, 2))
    newer.close()
    records = [r for chunk in replay(kafka, topic, 0, 0, end) for r in chunk]
    assert [r.key for r in records] == [b"k1", changelog.marker_key(1), b"k2", changelog.marker_key(2)]


def test_a_batch_larger_than_the_producers_queue_reaches_the_changelog_whole_and_once(kafka):
    """A batch's records go in one produce_batch; what librdkafka's queue cannot take comes back
    marked queue-full and is sent again as deliveries make room: every record once, then the
    marker, whatever the queue's size."""
    from state.changelog import ChangelogWriter, Marker, ensure_changelog, replay

    class SmallQueue(ChangelogWriter):
        QUEUE_RECORDS = 500

    topic = ensure_changelog(kafka, f"queue-{uuid.uuid4().hex[:8]}-changelog", 1)
    writer = SmallQueue(kafka, topic, 0)
    changes = {f"k{i}".encode(): None if i % 7 == 0 else f"v{i}".encode() for i in range(5_000)}
    end = writer.publish(1, changes, Marker(1, 0, len(changes)))
    writer.close()
    records = [r for chunk in replay(kafka, topic, 0, 0, end) for r in chunk]
    assert {r.key: r.value for r in records[:-1]} == changes and len(records) == len(changes) + 1
    assert records[-1].key == changelog.marker_key(1)


def test_a_push_query_finds_where_a_batch_begins_in_its_changelog_after_the_other_batches_marker(built):
    """With no earlier commit to name where batch 5's records begin (a push query's first batch on
    a topic), they begin after batch 4's marker: the changes it serves are batch 5's alone, the
    keys batch 5 changed, with the values it left."""
    from types import SimpleNamespace

    from serving.changes import _batch_start

    table, _ = built
    topic = table.spec.changelog_topic
    for p in range(PARTITIONS):
        end = changelog.partition_bounds(table.bootstrap, topic, p)[1]
        records = [r for chunk in changelog.replay(table.bootstrap, topic, p, 0, end) for r in chunk]
        markers = {changelog.marker_batch(r.key): r.offset for r in records if changelog.is_marker(r.key)}
        assert sorted(markers) == list(range(BATCHES))
        start = _batch_start(SimpleNamespace(bootstrap=table.bootstrap), topic, p, 0, markers[5] + 1, 5)
        assert start == markers[4] + 1
        served = {codec.decode_key(r.key): None if r.value is None else codec.decode_value(r.value)
                  for r in records if start <= r.offset <= markers[5] and not changelog.is_marker(r.key)}
        before, after = reference(4), reference(5)
        assert served == {k: after.get(k) for k in set(before) | set(after)
                          if table.partition_of(k) == p and before.get(k) != after.get(k)}
