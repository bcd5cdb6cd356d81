"""What the Flink peers share: the output topic a job writes, a table environment with durable
state (RocksDB, exactly-once checkpoints), and the output read back to its end. Standalone on
purpose, as the peers are: it imports nothing of statetable's (its own venv, .bench/venvs/flink).
"""
from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyflink.table import EnvironmentSettings, TableEnvironment


def output_topic(bootstrap: str, prefix: str) -> str:
    """A new compacted topic of 4 partitions for a job's upserts, named after `prefix`."""
    topic = f"{prefix}-flink-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1, config={"cleanup.policy": "compact"})])[topic].result()
    return topic


def table_env(connector_jar: str, parallelism: int, checkpoints: Path, **conf: str) -> TableEnvironment:
    """A streaming table environment with Flink's durable, exactly-once setup, and `conf` on top."""
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    for key, value in {
        "pipeline.jars": Path(connector_jar).resolve().as_uri(),
        "parallelism.default": str(parallelism),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.interval": "10s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": Path(checkpoints).resolve().as_uri(),
        **conf,
    }.items():
        t_env.get_config().set(key, value)
    return t_env


def latest_by_key(bootstrap: str, topic: str) -> dict[bytes, bytes | None]:
    """Every key's last value in the topic (None for a tombstone), read to the end it had when called."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False})
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    ends = {}
    for p in meta.partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > low:
            ends[p] = high
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    latest: dict[bytes, bytes | None] = {}
    while ends:
        for msg in consumer.consume(10000, timeout=5):
            if msg.error():
                raise RuntimeError(msg.error())
            latest[msg.key()] = msg.value()
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
    consumer.close()
    return latest
