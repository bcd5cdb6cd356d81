"""Spark reads exactly a planned offset range from the real broker and
round-trips it through Delta; the broker keeps every record across a restart."""
from __future__ import annotations

import json
import random

from confluent_kafka import Producer

from deploy import kafka_server
from spark_jobs import smoke
from spark_jobs.steps.offsets import OffsetRange, full_range
from state.kafka_admin import ensure_topic

RECORDS = 100_000
PARTITIONS = 4


def _produce(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """Returns amount by (partition, offset), as acknowledged by the broker."""
    ensure_topic(bootstrap, topic, PARTITIONS)
    rng = random.Random(42)
    acked: dict[tuple[int, int], int] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})

    def on_delivery(err, msg):
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = json.loads(msg.value())["amount"]

    for i in range(RECORDS):
        payload = json.dumps({"id": i, "amount": rng.randint(-500, 5000)}).encode()
        producer.produce(topic, payload, partition=rng.randrange(PARTITIONS), on_delivery=on_delivery)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert len(acked) == RECORDS
    return acked


def test_exact_offset_range_delta_roundtrip_and_restart(kafka, spark, stack_settings_, topic_name, tmp_path):
    acked = _produce(kafka, topic_name)
    everything = full_range(kafka, topic_name)
    assert everything.record_count == RECORDS

    # An explicit, uneven range per partition: [start, end).
    planned = OffsetRange(topic_name, {
        p: (start + 1000 * (p + 1), end - 777 * p) for p, (start, end) in everything.ranges.items()
    })
    expected = {(p, o): a for (p, o), a in acked.items() if planned.ranges[p][0] <= o < planned.ranges[p][1]}

    result = smoke.run(spark, kafka, planned, str(tmp_path / "delta"))
    assert result["count"] == len(expected) == planned.record_count
    assert result["sum"] == sum(expected.values())

    stored = spark.read.format("delta").load(str(tmp_path / "delta"))
    roundtrip = {(r["partition"], r["offset"]): r["amount"] for r in stored.where("run_key = 'adhoc'").collect()}
    assert roundtrip == expected

    # Data survives `stack down` / `stack up` of the broker.
    proc = kafka_server.process(stack_settings_)
    assert proc.stop(timeout=25)
    kafka_server.start(stack_settings_)
    kafka_server.wait_healthy(stack_settings_)
    after = full_range(kafka, topic_name)
    assert after.ranges == everything.ranges
    reread = smoke.read_range(spark, kafka, after).selectExpr("partition", "offset").collect()
    assert {(r["partition"], r["offset"]) for r in reread} == set(acked)


def test_the_batch_jvm_and_its_python_workers_yield_the_cpu_to_queries(spark):
    """Queries share the host with local[*] batches: every JVM thread and every Python worker runs
    at the batch niceness (10 by default), so a committing batch cannot take the readers' cores."""
    import os

    jvm = spark.sparkContext._gateway.proc.pid
    niceness = set()
    for tid in os.listdir(f"/proc/{jvm}/task"):
        try:
            niceness.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except ProcessLookupError:
            continue                # a thread that ended since the listing
    assert niceness == {10}
    workers = spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getpriority(os.PRIO_PROCESS, 0))
    assert set(workers.collect()) == {10}
