"""Exact Kafka offset ranges: read from the broker, handed to Spark verbatim.

A batch is defined by its planned per-partition [start, end) offsets, never by
"whatever is there now", so a re-run reads exactly the same records.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from catalog.runtime import Runtime
from state import kafka_config
from spark_jobs.errors import OffsetDiscontinuity, TopicMissing


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    ranges: dict[int, tuple[int, int]]  # partition -> [start, end)

    @property
    def record_count(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    def spark_options(self) -> dict[str, str]:
        """startingOffsets/endingOffsets for Spark's Kafka source (end is exclusive there too)."""
        starting = {self.topic: {str(p): start for p, (start, _) in self.ranges.items()}}
        ending = {self.topic: {str(p): end for p, (_, end) in self.ranges.items()}}
        return {"startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)}

    def to_json(self) -> str:
        return json.dumps({"topic": self.topic, "ranges": {str(p): list(r) for p, r in self.ranges.items()}})

    @classmethod
    def from_json(cls, text: str) -> "OffsetRange":
        data = json.loads(text)
        return cls(data["topic"], {int(p): (int(r[0]), int(r[1])) for p, r in data["ranges"].items()})


# Spark's Kafka source with its consumer's defaults (500 records a poll, 1 MB a
# partition fetch) reads small JSON records at ~0.3-0.4M/s here; larger polls
# and fetches reach ~0.6M/s on the same 2 cores. A task that reads up to the
# end of a partition ends with a fetch at the log end, which the broker holds
# for fetch.max.wait.ms (500 by default): 1.2 s of a 1.4 s read of 12 records
# in 4 partitions on 2 cores; 10 ms costs nothing where data is waiting.
READ_OPTIONS = {
    "kafka.max.poll.records": "20000",
    "kafka.max.partition.fetch.bytes": "16777216",
    "kafka.fetch.max.bytes": "67108864",
    "kafka.fetch.max.wait.ms": "10",
    "kafka.isolation.level": "read_committed",
}


def spark_reader(spark, bootstrap: str, offsets: OffsetRange, group: str | None = None):
    """Spark's Kafka source over exactly `offsets`.

    `group`: a fixed consumer group id, so the executors' pooled consumers (keyed by group and
    partition) serve the next batch too; without it every query makes its own consumers. The
    source assigns partitions itself and never commits, so the group only names the pool."""
    reader = spark.read.format("kafka").option("subscribe", offsets.topic)
    options = {**kafka_config.spark_options(bootstrap), **READ_OPTIONS, **offsets.spark_options(), **({"kafka.group.id": group} if group else {})}
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def watermarks(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """Low and high watermark of every partition of `topic`."""
    from confluent_kafka import TopicPartition

    from state.kafka_admin import metadata_consumer, partition_watermarks, topic_metadata

    consumer = metadata_consumer(bootstrap)
    topic_meta = topic_metadata(consumer, bootstrap, topic, "read", timeout)
    if topic_meta is None:
        raise TopicMissing(f"topic {topic!r} does not exist on {bootstrap}; create it or produce to it first")
    return {p: partition_watermarks(consumer, bootstrap, TopicPartition(topic, p), timeout)
            for p in sorted(topic_meta.partitions)}


def full_range(bootstrap: str, topic: str) -> OffsetRange:
    """Everything currently retained in `topic`."""
    return OffsetRange(topic, watermarks(bootstrap, topic))


def topic_id(bootstrap: str, topic: str, timeout: float = 10.0) -> str | None:
    """Kafka's id of the topic's current incarnation: a deleted and recreated topic gets a new one,
    which offsets alone cannot show when the new topic has grown past the old end."""
    from confluent_kafka import TopicCollection

    from state.kafka_admin import admin

    client = admin(bootstrap)
    try:
        (future,) = client.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()
        return str(future.result(timeout).topic_id)
    except Exception:       # an old broker without topic ids: offsets still catch most resets
        return None


def next_starts(table: str, topic: str, marks: dict[int, tuple[int, int]], current_id: str | None,
                read_topic: str | None, read_id: str | None, read_ends: dict[int, int] | None) -> dict[int, int]:
    """Where the next batch starts in each partition, given where reading stopped
    (`read_topic`/`read_id`/`read_ends`, None before the first batch).

    Raises OffsetDiscontinuity naming the table, topic, partitions and offsets when the topic
    does not continue from there; nothing is ever skipped or re-read silently."""
    if read_ends is None:
        return {p: low for p, (low, _) in marks.items()}
    problems = []
    if read_topic != topic:
        problems.append(f"its topic changed from {read_topic!r} to {topic!r}")
    elif read_id and current_id and read_id != current_id:
        problems.append(f"the topic was deleted and recreated (topic id {read_id} is now {current_id})")
    else:
        for p, end in sorted(read_ends.items()):
            if p not in marks:
                problems.append(f"partition {p} is gone (read up to offset {end})")
                continue
            low, high = marks[p]
            if high < end:
                problems.append(f"partition {p} ends at offset {high}, before offset {end} where reading stopped "
                                f"(recreated or truncated)")
            elif low > end:
                problems.append(f"partition {p}: offsets {end}..{low - 1} were deleted before they were read "
                                f"(retention)")
        for p, (low, _) in sorted(marks.items()):
            if p not in read_ends and low > 0:
                problems.append(f"new partition {p}: offsets 0..{low - 1} were deleted before they were read")
    if problems:
        raise OffsetDiscontinuity(
            f"table {table!r}, topic {topic!r}: " + "; ".join(problems) + ". Nothing was read. To go on from the "
            f"earliest offsets the topic holds now, adding its records to the current state, run "
            f"`statetable accept-offsets {table}`; the batch log records the acceptance.")
    return {p: read_ends.get(p, 0) for p in marks}
