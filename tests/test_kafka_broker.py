"""The broker is a real Kafka: compaction, transactions and watermarks behave."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from state.kafka_admin import ensure_topic
from spark_jobs.steps.offsets import watermarks


def _read_all(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed") -> list:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False,
        "isolation.level": isolation,
    })
    ends = watermarks(bootstrap, topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, idle_since = [], time.monotonic()
    positions_done = set()
    while time.monotonic() - idle_since < 5 and len(positions_done) < partitions:
        msg = consumer.poll(0.5)
        if msg is None:
            positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
            positions_done = {tp.partition for tp in positions if tp.offset >= ends[tp.partition][1]}
            continue
        if msg.error():
            continue
        idle_since = time.monotonic()
        records.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
    consumer.close()
    return records


def test_compacted_topic_drops_old_values_after_segment_roll(kafka, topic_name):
    ensure_topic(kafka, topic_name, 1, {
        "cleanup.policy": "compact", "segment.ms": "200", "min.cleanable.dirty.ratio": "0.001",
        "delete.retention.ms": "100", "min.compaction.lag.ms": "0",
    })
    producer = Producer({"bootstrap.servers": kafka})
    for version in range(50):
        for key in ("a", "b", "c"):
            producer.produce(topic_name, f"{key}-v{version}".encode(), key=key.encode())
    producer.flush()
    deadline = time.monotonic() + 90
    values: list = []
    while time.monotonic() < deadline:
        time.sleep(1)
        producer.produce(topic_name, b"roll", key=b"roller")  # a write after segment.ms rolls the segment
        producer.flush()
        values = [v.decode() for k, v, _, _ in _read_all(kafka, topic_name, 1) if k != b"roller"]
        if "a-v0" not in values:
            break
    assert "a-v0" not in values, "the cleaner never removed the superseded value a-v0"
    assert {"a-v49", "b-v49", "c-v49"} <= set(values), "compaction must keep the latest value of every key"
    assert values.count("a-v49") == 1


def test_aborted_transaction_invisible_to_read_committed(kafka, topic_name):
    ensure_topic(kafka, topic_name, 2)
    producer = Producer({"bootstrap.servers": kafka, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic_name, f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(30)  # put the records on the log; abort would otherwise just purge the local queue
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(7):
        producer.produce(topic_name, f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)

    committed = sorted(v.decode() for _, v, _, _ in _read_all(kafka, topic_name, 2, "read_committed"))
    uncommitted = sorted(v.decode() for _, v, _, _ in _read_all(kafka, topic_name, 2, "read_uncommitted"))
    assert committed == sorted(f"committed-{i}" for i in range(7))
    assert sorted(f"aborted-{i}" for i in range(10)) == [v for v in uncommitted if v.startswith("aborted")]


def test_high_watermarks_equal_records_produced_per_partition(kafka, topic_name):
    ensure_topic(kafka, topic_name, 4)
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    produced = {0: 13, 1: 0, 2: 250, 3: 1001}
    for partition, count in produced.items():
        for i in range(count):
            producer.produce(topic_name, str(i).encode(), partition=partition)
    assert producer.flush(30) == 0
    marks = watermarks(kafka, topic_name)
    assert {p: high for p, (_, high) in marks.items()} == produced
    assert {p: low for p, (low, _) in marks.items()} == {0: 0, 1: 0, 2: 0, 3: 0}


def test_cluster_id_never_starts_with_a_dash(monkeypatch):
    """The storage tool reads an id starting with '-' as an option; such ids are drawn again."""
    import uuid

    from deploy import kafka_server

    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(kafka_server.uuid, "uuid4", lambda: next(draws))
    assert kafka_server.new_cluster_id() == "A" * 22
    assert next(draws, None) is None        # the first draw ('-...') was refused
