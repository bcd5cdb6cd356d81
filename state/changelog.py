"""The changelog: a compacted Kafka topic per table, partition p for state partition p.

Each commit publishes its changes in one Kafka transaction: one record per
changed key (tombstone on delete) and, last, a batch marker record under a
reserved key `MARKER_PREFIX + batch id` holding (batch id, digest, key count).
Readers use read_committed, so a batch is on the changelog entirely or not at
all, and a replay that ends on a marker can check its digest. Marker keys are
distinct per batch, so compaction never removes the record of a batch.

The transactional id is fixed per (table, partition): a new writer's
init_transactions fences any zombie and aborts its open transaction.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from state import codec, faults, kafka_errors
from state.digest import from_signed, to_signed
from state.errors import ChangelogCorrupt, ChangelogStalled, ChangelogUndelivered, StateError, StateFenced
from state.kafka_admin import ensure_topic, metadata_consumer, partition_watermarks, topic_metadata
from state.kafka_config import client_config

__all__ = ["BATCH_HEADER", "ChangelogRecord", "ChangelogWriter", "MARKER_PREFIX", "Marker",
           "OUTPUT_BATCH_HEADER", "RECORD_LIMIT", "REFUSAL_PART_BYTES", "VALUE_LIMIT", "ensure_changelog",
           "is_marker", "is_refusal", "marker_batch", "marker_key", "partition_bounds", "refusal_key", "replay", "topic_name"]

log = logging.getLogger(__name__)

MARKER_PREFIX = b"\xff\x00batch\x00"  # data keys never start with 0xff (see codec tags)
BATCH_HEADER = "statetable.batch"
OUTPUT_BATCH_HEADER = "batch"     # on a table's change topic (its readers are not statetable's)


def topic_name(table: str, namespace: str = "") -> str:
    """The default changelog topic of a table; a namespace keeps environments apart on one cluster."""
    return f"{namespace}{table}-changelog"


def marker_key(batch_id: int) -> bytes:
    return MARKER_PREFIX + batch_id.to_bytes(8, "big", signed=True)


def is_marker(key: bytes) -> bool:
    """A batch's marker, or one of its refusal parts (see refusal_key): never a data key."""
    return key.startswith(MARKER_PREFIX)


def marker_batch(key: bytes) -> int:
    """The batch a marker or refusal part key belongs to (see is_marker)."""
    return int.from_bytes(key[len(MARKER_PREFIX):len(MARKER_PREFIX) + 8], "big", signed=True)


def refusal_key(batch_id: int, index: int) -> bytes:
    """Part `index` of a batch's refused keys, published before its marker: a batch can refuse
    more keys than one record holds (300,000 refusals pass the 8 MiB record limit)."""
    return marker_key(batch_id) + b"\x00" + index.to_bytes(4, "big")


def is_refusal(key: bytes) -> bool:
    return key.startswith(MARKER_PREFIX) and len(key) > len(MARKER_PREFIX) + 8


REFUSAL_PART_BYTES = 4 << 20        # refused keys per part record: half the record limit


RECORD_LIMIT = 8388608
# The largest state value a partition commits: a changelog record is the key, the value and a
# few headers, and the broker refuses records past RECORD_LIMIT. A value that would grow past
# it (a COUNT(DISTINCT) of ~225k UUIDs, a TOPK of long rows) is refused with its batch's events
# for that key, which are dead-lettered as state_too_large; the old value stays.
VALUE_LIMIT = RECORD_LIMIT - 65536


def ensure_changelog(bootstrap: str, topic: str, partitions: int) -> str:
    name = topic
    ensure_topic(bootstrap, name, partitions, {
        "cleanup.policy": "compact",
        # Keep a day of history uncompacted, so point-in-time restores to
        # recent batches replay exact intermediate values.
        "min.compaction.lag.ms": "86400000",
        "max.message.bytes": str(RECORD_LIMIT),
    })
    return name


@dataclass(frozen=True)
class Marker:
    batch_id: int
    digest: int
    key_count: int
    rejected: tuple = ()        # ((encoded key, reason), ...) the batch could not commit; kept for re-runs
    parts: int = 0              # refusal part records before the marker (refusal_key); their keys come first

    def encode(self) -> bytes:
        base = (self.batch_id, to_signed(self.digest), self.key_count)
        if self.parts:
            return codec.encode_value(base + (self.rejected, self.parts))
        return codec.encode_value(base + ((self.rejected,) if self.rejected else ()))

    @classmethod
    def decode(cls, data: bytes) -> "Marker":
        batch_id, digest, key_count, *rest = codec.decode_value(data)
        return cls(batch_id, from_signed(digest), key_count, tuple(tuple(r) for r in rest[0]) if rest else (),
                   rest[1] if len(rest) > 1 else 0)

    def split(self) -> tuple["Marker", list[bytes]]:
        """(the marker to publish, the values of its refusal parts): refused keys in parts of at
        most REFUSAL_PART_BYTES, so the marker and every part fit one record."""
        parts, current, size = [], [], 0
        for entry in self.rejected:
            weight = len(entry[0]) + len(entry[1]) + 16
            if current and size + weight > REFUSAL_PART_BYTES:
                parts.append(tuple(current))
                current, size = [], 0
            current.append(entry)
            size += weight
        if not parts:
            return self, []
        parts.append(tuple(current))
        return replace(self, rejected=(), parts=len(parts)), [codec.encode_value(p) for p in parts]

    def joined(self, refused: list) -> "Marker":
        """This marker with the refused keys its parts carried (in order) before its own."""
        if not self.parts:
            return self
        if len(refused) != self.parts:
            raise ChangelogCorrupt(f"batch {self.batch_id}: its marker names {self.parts} refusal parts, "
                             f"{len(refused)} were read before it")
        return replace(self, rejected=tuple(tuple(r) for part in refused for r in part) + self.rejected, parts=0)


class ChangelogWriter:
    """Publishes one batch of one partition per Kafka transaction."""

    QUEUE_RECORDS = 1_000_000       # librdkafka's queue; a batch of more is sent as deliveries make room

    def __init__(self, bootstrap: str, topic: str, partition: int, batch_headers: bool = True) -> None:
        self.topic = topic
        self.partition = partition
        self.batch_headers = batch_headers
        self.producer = Producer(client_config(bootstrap, **{
            "transactional.id": f"statetable.{topic}.{partition}",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": self.QUEUE_RECORDS,
            "message.max.bytes": RECORD_LIMIT,
            "transaction.timeout.ms": 60000,
            # A writer lives for one batch, so its start is paid every batch: connect to the
            # broker at once and retry the coordinator lookup soon. init_transactions took 60-70
            # ms, and 500 ms more about every other time in Spark tasks; with these, 10-20 ms.
            "enable.sparse.connections": False,
            "retry.backoff.ms": 10,
            "reconnect.backoff.ms": 10,
            # Records for other topics (a table's change topic) go by their key's hash, as a Java
            # producer would place them: a consumer keyed the same way finds them.
            "partitioner": "murmur2_random",
            "error_cb": kafka_errors.recorder(bootstrap),
        }))
        try:
            self.producer.init_transactions(30)
        except KafkaException as exc:
            error = exc.args[0]
            if error.name() in kafka_errors.AUTHORIZATION_ERRORS:
                raise kafka_errors.denied(bootstrap, error.name(), "write", f"statetable.{topic}.{partition}") \
                    from None
            if kafka_errors.is_connection_failure(error):
                raise kafka_errors.connection_error(bootstrap, self.producer, f"publishing to {topic!r}") from None
            raise

    def publish(self, batch_id: int, changes: dict[bytes, bytes | None], marker: Marker,
                extra: list[tuple[str, bytes, bytes | None]] = (), attempts: int = 3) -> int:
        """Publish `changes`, the `extra` records ((topic, key, value) for other topics, partitioned
        by key) and the marker in one transaction; returns the offset after the marker. A
        read_committed reader of any of these topics sees all of the batch or none of it.

        A transaction Kafka aborts because a broker was lost mid-way (librdkafka's abortable
        errors: a leader or the coordinator gone) is published again whole, up to `attempts`
        times; readers never saw the aborted one."""
        for attempt in range(1, attempts + 1):
            try:
                return self._transaction(batch_id, changes, marker, extra)
            except _Aborted as aborted:
                if attempt == attempts:
                    raise aborted.cause from None
                log.warning("changelog %s[%d] batch %d: transaction aborted (%s); publishing it again (attempt %d "
                            "of %d)", self.topic, self.partition, batch_id, aborted.cause, attempt + 1, attempts)
        raise AssertionError("unreachable")

    def _transaction(self, batch_id: int, changes: dict[bytes, bytes | None], marker: Marker,
                     extra: list[tuple[str, bytes, bytes | None]]) -> int:
        # A batch's records carry no header and no delivery callback of their own: its marker,
        # the transaction's last record, names the batch of the records before it (a partition
        # has one writer, so a transaction's records are contiguous), and commit_transaction
        # fails if any record was not delivered. Both cost a q18 merge task ~1.3 us a record of
        # ~3 (250,000 records beside two busy cores: 0.77 s with them, 0.45 s without).
        # Records of older builds carry BATCH_HEADER; replay still reads it.
        extra_headers = [(OUTPUT_BATCH_HEADER, str(batch_id).encode())]
        marker_offset: list[int] = []
        errors: list = []

        def on_marker(err, msg):
            if err is not None:
                errors.append(err)
            else:
                marker_offset.append(msg.offset())

        try:
            self.producer.begin_transaction()
            # Half the records sent before the point, when a test arms it; a flush there otherwise
            # would stop every batch's sends mid-way for nothing.
            half = len(changes) // 2 if faults.armed()[0] == "commit.mid_changelog" else -1
            if half < 0:
                self._produce_all(self.topic, [{"key": key, "value": value} for key, value in changes.items()],
                                  self.partition)
            else:
                for i, (key, value) in enumerate(changes.items()):
                    self._produce(key, value, None, None)
                    if i == half:
                        self.producer.flush(30)
                        faults.point("commit.mid_changelog")
            self._produce_extra(extra, extra_headers)
            marker, parts = marker.split()
            for index, part in enumerate(parts):
                self._produce(refusal_key(batch_id, index), part, None, None)
            self._produce(marker_key(batch_id), marker.encode(), [(BATCH_HEADER, str(batch_id).encode())], on_marker)
            self._commit()
        except (KafkaException, SystemError) as exc:
            error = _kafka_error(exc)
            if error is None:
                raise
            if error.code() == KafkaError._FATAL:
                error = self._fatal_cause() or error
            if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                raise StateFenced(f"{self.topic}[{self.partition}]: another writer owns this partition") from exc
            if error.txn_requires_abort():
                self.producer.abort_transaction(30)
                raise _Aborted(exc) from None
            raise
        if errors or not marker_offset:
            raise ChangelogUndelivered(f"changelog {self.topic}[{self.partition}] batch {batch_id} not delivered: {errors}")
        return marker_offset[0] + 1

    def _fatal_cause(self) -> KafkaError | None:
        """Why the producer is dead. A produce() after librdkafka raised a fatal error says only
        `_FATAL` ("Unable to produce message: Local: Fatal error"); every transactional call
        answers with the fatal error itself (fenced, say). A CI run met the first form when the
        fence landed between two produce calls of one batch."""
        try:
            self.producer.abort_transaction(5)
        except KafkaException as exc:
            return _kafka_error(exc)
        return None

    def _commit(self, patience: float = 60.0) -> None:
        """commit_transaction, asked again while its error is retriable (a coordinator moving):
        librdkafka's contract for a commit whose outcome is not yet known."""
        deadline = time.monotonic() + patience
        while True:
            try:
                self.producer.commit_transaction(min(patience, 30))
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _produce_all(self, topic: str, messages: list[dict], partition: int | None = None) -> None:
        """Records to one topic in one call (produce_batch): librdkafka loops over them in C, where
        a produce a record spent a fifth of a q18 merge task in Python (250,000 records: 0.29 s of
        Python for one each, 0.13 s for the batch). No partition: each by the partitioner, as
        produce() places it. What the queue cannot take comes back marked _QUEUE_FULL, and is sent
        again once deliveries make room; any other error fails the transaction as a single
        produce's would."""
        placed = {} if partition is None else {"partition": partition}
        while messages:
            if self.producer.produce_batch(topic, messages, **placed) == len(messages):
                return
            failed = [m for m in messages if "_error" in m]
            if not failed:      # fewer queued and none marked: never assume the rest was sent
                raise StateError(f"changelog {self.topic}[{self.partition}]: produce_batch queued part of a batch "
                                 f"for {topic!r} and named no failed record")
            for message in failed:
                error = message.pop("_error")
                if error.code() != KafkaError._QUEUE_FULL:
                    raise KafkaException(error)
            messages = failed
            self.producer.poll(0.05)

    def _produce_extra(self, extra: list[tuple[str, bytes, bytes | None]], headers) -> None:
        """A batch's records for other topics. produce_batch takes no headers (librdkafka's batch
        call has none), so with the batch header each is one produce (about 4 us a record in a
        busy merge task, against 1.5 us for a batch: a table's change topic cost its merge task
        more than its changelog did); a table that publishes without it (`output_headers: none`)
        sends them as a batch a topic."""
        if not self.batch_headers:
            by_topic: dict[str, list[dict]] = {}
            for topic, key, value in extra:
                by_topic.setdefault(topic, []).append({"key": key, "value": value})
            for topic, messages in by_topic.items():
                self._produce_all(topic, messages)
            return
        produce = self.producer.produce
        for topic, key, value in extra:
            while True:
                try:
                    produce(topic, value, key, headers=headers)
                    break
                except BufferError:
                    self.producer.poll(0.05)

    def _produce(self, key: bytes, value: bytes | None, headers, callback) -> None:
        placed = {"partition": self.partition}
        if headers is not None:
            placed["headers"] = headers
        if callback is not None:
            placed["on_delivery"] = callback
        while True:
            try:
                self.producer.produce(self.topic, value, key=key, **placed)
                return
            except BufferError:
                self.producer.poll(0.05)

    def close(self) -> None:
        self.producer.flush(10)


class _Aborted(StateError):
    """A transaction the producer aborted after an abortable error; it may be published again."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _kafka_error(exc: Exception) -> KafkaError | None:
    """The KafkaError behind an exception. confluent-kafka reports a fatal error (fenced) met
    while flush runs delivery callbacks as a SystemError whose context is the KafkaException."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        if isinstance(candidate, KafkaException) and candidate.args and isinstance(candidate.args[0], KafkaError):
            return candidate.args[0]
    return None


@dataclass(frozen=True)
class ChangelogRecord:
    offset: int
    key: bytes
    value: bytes | None
    batch_id: int


def partition_bounds(bootstrap: str, topic: str, partition: int) -> tuple[int, int] | None:
    """(log start, end) offsets of a changelog partition; None if the topic is gone."""
    consumer = metadata_consumer(bootstrap, read_committed=True)
    meta = topic_metadata(consumer, bootstrap, topic, "read")
    if meta is None or partition not in meta.partitions:
        return None
    return partition_watermarks(consumer, bootstrap, TopicPartition(topic, partition))


def replay(bootstrap: str, topic: str, partition: int, start: int, end: int,
           chunk: int = 20000) -> Iterator[list[ChangelogRecord]]:
    """Committed records of [start, end) in chunks, in offset order.

    The last offsets of a transactional log are commit markers that are never
    delivered, so the end is recognised by the partition-EOF event rather
    than by waiting for an offset that will not come.
    """
    if start >= end:
        return
    consumer = Consumer(client_config(bootstrap, **{
        "group.id": "statetable-restore", "enable.auto.commit": False,
        "isolation.level": "read_committed", "fetch.max.bytes": 52428800, "fetch.wait.max.ms": 20,
        "max.partition.fetch.bytes": 16777216, "enable.partition.eof": True,
    }))
    consumer.assign([TopicPartition(topic, partition, start)])
    position, idle_since = start, time.monotonic()
    try:
        while position < end:
            messages = consumer.consume(chunk, timeout=0.02)
            records = []
            at_eof = False
            for msg in messages:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        at_eof = msg.offset() >= end
                        continue
                    raise KafkaException(msg.error())
                if msg.offset() >= end:
                    position = end
                    break
                headers = dict(msg.headers() or ())
                batch = int(headers[BATCH_HEADER]) if BATCH_HEADER in headers else -1
                records.append(ChangelogRecord(msg.offset(), msg.key(), msg.value(), batch))
                position = msg.offset() + 1
            if records:
                idle_since = time.monotonic()
                yield records
            if at_eof:
                return
            if not records and time.monotonic() - idle_since > 30:
                raise ChangelogStalled(f"changelog {topic}[{partition}] stalled at {position} before {end}")
    finally:
        consumer.close()
