"""How many records go into each Arrow batch that Spark hands to the pass.

Spark 4 cuts these batches by records and by bytes (`spark.sql.execution.arrow.maxBytesPerBatch`,
64 MB). To enforce the byte cap, it measures the Arrow vectors after every row. That check walks
each column, so it grows with the columns the pass reads. Measured in one warm session, over 5M
records of ~25 bytes: the read with the record positions (partition, offset, timestamp) spent
~3 s more JVM CPU than with the value alone. With the check off, the two reads cost the same.

So the read turns the check off and keeps its purpose another way: it sets the record cap so
that a batch holds about 64 MB. That needs the records' size before they are read: the larger of
the table's last batch's mean on the same topic (`read_bytes` / `read`) and a sample of records
at the start of each partition of this batch. The last batch alone is no guide: 2,000 records of
1 MiB after a history of 25-byte ones made one Arrow batch past Arrow's 2 GiB. A records mix the
sample misses can still overflow once, so a batch run again from its plan (an attempt failed)
keeps Spark's own check on, as does a batch whose size is unknown: slower, never unsafe, and no
re-run repeats the cap that failed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time

log = logging.getLogger(__name__)

BATCH_BYTES = 64 << 20          # Spark's default byte cap, kept as the target
POSITION_BYTES = 24             # partition, offset, timestamp and the value's Arrow offset, a record
SAMPLE_RECORDS = 64             # a partition's records sampled for a table's first batch
MAX_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
NO_BYTE_CHECK = str(2 ** 31 - 1)     # Int.MaxValue: Spark skips the per-row size check


def max_records() -> int:
    return int(os.environ.get("STATETABLE_ARROW_BATCH_RECORDS", "200000"))


def records_per_batch(bytes_per_record: float | None) -> int | None:
    """Records an Arrow batch of about BATCH_BYTES holds (None: unknown size, keep Spark's check)."""
    if not bytes_per_record:
        return None
    return max(1, min(max_records(), int(BATCH_BYTES // (bytes_per_record + POSITION_BYTES))))


def records_for(last_commit, bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]],
                resumed: bool = False) -> tuple[int | None, str]:
    """(the record cap for a batch over `ranges`, None for Spark's byte check; why, for its log line)."""
    if resumed:
        return None, "Spark's byte cap (a re-run of the batch's plan: no cap that may have failed it)"
    size, source = record_bytes(last_commit, bootstrap, topic, ranges)
    records = records_per_batch(size)
    records = None if records is None else bucket(records)
    return records, (f"up to {records:,} records, ~{size:.0f} value bytes a record ({source})" if records
                     else f"Spark's byte cap ({source})")


def record_bytes(last_commit, bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]]) -> tuple[float | None, str]:
    """(mean value bytes a record, where that figure comes from) for a batch over `ranges`."""
    counts = getattr(last_commit, "counts", None) or {}
    known = last_commit is not None and last_commit.topic == topic and counts.get("read") and "read_bytes" in counts
    sampled = sample_bytes(bootstrap, topic, ranges, timeout=0.5 if known else 2.0)
    if not sampled:
        return None, "no sample (Spark checks bytes)"
    if known and counts["read_bytes"] / counts["read"] >= sampled[0]:
        return counts["read_bytes"] / counts["read"], f"the last batch's {counts['read']:,} records"
    return sampled[0], f"{sampled[1]:,} sampled records"


def sample_bytes(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]],
                 per_partition: int = SAMPLE_RECORDS, timeout: float = 2.0) -> tuple[float, int] | None:
    """(mean value bytes, records sampled) of the first records of each partition's range; None
    when none arrived in time (an open transaction at the start holds read_committed back)."""
    from confluent_kafka import Consumer, TopicPartition

    from state import kafka_config

    wanted = {p: min(per_partition, end - start) for p, (start, end) in ranges.items() if end > start}
    if not wanted:
        return None
    consumer = Consumer(kafka_config.client_config(
        bootstrap, **{"group.id": "statetable-record-sizes", "enable.auto.commit": False,
                      "isolation.level": "read_committed", "fetch.wait.max.ms": 10}))
    try:
        consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in wanted])
        sizes: dict[int, list[int]] = {p: [] for p in wanted}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(len(sizes[p]) < n for p, n in wanted.items()):
            for message in consumer.consume(num_messages=sum(wanted.values()), timeout=0.2):
                p = message.partition()
                if message.error() is None and p in sizes and len(sizes[p]) < wanted[p] \
                        and message.offset() < ranges[p][1]:
                    sizes[p].append(len(message.value() or b""))
    finally:
        consumer.close()
    seen = [n for each in sizes.values() for n in each]
    if not seen:
        return None
    # The largest partition mean: a partition of large records sets the cap for all of them.
    return max(sum(each) / len(each) for each in sizes.values() if each), len(seen)


def bucket(records: int) -> int:
    """The cap a batch runs with: `records` rounded down to a power of two (or the configured
    maximum), so a handful of Arrow sessions serve every table's record size."""
    if records >= max_records():
        return max_records()
    return 1 << (max(records, 1).bit_length() - 1)


def applied(spark) -> int | None:
    """The record cap `spark`'s Arrow batches run with now, or None for Spark's default."""
    value = spark.conf.get(MAX_RECORDS_CONF, None)
    return int(value) if value else None


@contextlib.contextmanager
def sized(spark, records: int | None):
    """Spark's Arrow batches of at most `records`, with its per-row byte check off, for the jobs
    run inside; the session's own settings come back after (a Connect session is shared by the
    client's later batches)."""
    if records is None:
        yield
        return
    before = {key: spark.conf.get(key, None) for key in (MAX_BYTES_CONF, MAX_RECORDS_CONF)}
    spark.conf.set(MAX_BYTES_CONF, NO_BYTE_CHECK)
    spark.conf.set(MAX_RECORDS_CONF, str(records))
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
