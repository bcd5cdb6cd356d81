"""A table's topics from the user's side: create its input topic, produce one's own events
to it, read what was dead-lettered and why.

The local broker does not create topics on first use (auto-creation would give a table's
topic the broker's default partitions and hide a mistyped name), so a user's own table
needs its topic made with the partitions its definition declares. Producing goes through
the same client settings as every statetable client, with every delivery checked: a record
the broker did not take is an error, never a count.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from catalog.definitions import TableDefinition
from catalog.errors import UserError
from catalog.registry import load_table
from catalog.runtime import Runtime
from state.kafka_admin import admin, ensure_topic, metadata_consumer, partition_watermarks, topic_metadata
from state.kafka_config import client_config
from spark_jobs.errors import TopicMissing
from ops.errors import ProduceIncomplete

PROGRESS_EVERY = 50_000


def _table(name: str, rt: Runtime) -> TableDefinition:
    return load_table(name, rt)[0]


def input_topic(table: TableDefinition) -> str:
    if table.stream_schema:         # a join's left side is a stream: its records are the join's input
        return table.topic
    if table.table_join or table.over_table:
        raise UserError(f"table {table.name!r} reads table {table.input_table!r}'s changes, not a topic of its own; "
                         f"produce to {table.input_table!r}'s topic instead")
    return table.topic


def create_topic(name: str, rt: Runtime | None = None) -> dict:
    """The table's input topic with its definition's partitions; an existing topic is kept (and
    must have that many partitions). {"topic", "partitions", "created", "topics"}: `topics` lists
    each topic made, two for a windowed join of streams (its second stream's too)."""
    rt = rt or Runtime.from_env()
    table = _table(name, rt)
    made, client = [], admin(rt.bootstrap)
    for topic in [input_topic(table)] + ([table.stream_join.topic] if table.stream_join is not None else []):
        existed = topic_metadata(client, rt.bootstrap, topic) is not None
        ensure_topic(rt.bootstrap, topic, table.partitions)
        made.append({"topic": topic, "partitions": table.partitions, "created": not existed})
    return {**made[0], "topics": made}


@dataclass
class Produced:
    topic: str
    records: int
    not_json_objects: int
    seconds: float


def _send(producer, topic: str, value: bytes, key: bytes | None, delivered) -> str | None:
    """Hand one record to the producer, waiting while its queue is full; the reason when the
    client refuses it before sending (larger than message.max.bytes)."""
    while True:
        try:
            producer.produce(topic, value, key=key, on_delivery=delivered)
            return None
        except BufferError:
            producer.poll(0.05)
        except KafkaException as exc:
            return exc.args[0].str()


def produce_lines(name: str, lines: Iterable[str], rt: Runtime | None = None,
                  progress: Callable[[int, float], None] | None = None, join: bool = False) -> Produced:
    """Every non-blank line as one record of the table's input topic (with `join`, a windowed
    join's second stream's), keyed by the table's key columns (a windowed join's: the stream's
    join column) where the line is a JSON object holding them (so one key's events stay in order
    on one partition). Lines that are not JSON objects are sent too: the table dead-letters them
    with a reason, as it would anyone's; the count says how many."""
    rt = rt or Runtime.from_env()
    table = _table(name, rt)
    spec = table.stream_join
    if join and spec is None:
        raise UserError(f"table {name!r} reads one topic, {input_topic(table)!r}; --join is for a windowed join of "
                        f"two streams (`-- join_topic:`)")
    topic = spec.topic if join else input_topic(table)
    if topic_metadata(admin(rt.bootstrap), rt.bootstrap, topic) is None:
        raise TopicMissing(f"table {name!r}: its topic {topic!r} does not exist (the broker does not create topics "
                           f"on first use); create it with `statetable create-topic {name}`")
    keys = [c for c in table.key_columns if c in dict(table.schema)] if spec is None else \
        [spec.right_key if join else spec.left_key]
    failures: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failures.append(err.str())

    producer = Producer(client_config(rt.bootstrap, **{"enable.idempotence": True, "linger.ms": 20,
                                                        "log_level": 2}))
    sent = not_objects = 0
    refused: list[str] = []
    started = time.monotonic()
    try:
        for number, line in enumerate(lines, start=1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            key = None
            try:
                parsed = json.loads(text)
            except (ValueError, RecursionError):     # nested past the parser: the table dead-letters it
                parsed = None
            if isinstance(parsed, dict) and keys and all(k in parsed for k in keys):
                key = json.dumps([parsed[k] for k in keys], separators=(",", ":")).encode()
            error = _send(producer, topic, text.encode("utf-8", "surrogateescape"), key, delivered)
            if error:
                refused.append(f"line {number}: {error}")
                continue
            sent += 1
            not_objects += not isinstance(parsed, dict)
            if sent % PROGRESS_EVERY == 0:
                producer.poll(0)
                if progress:
                    progress(sent, time.monotonic() - started)
    finally:
        # Whatever stops the loop, what was handed over is delivered and confirmed before this
        # returns or raises: a rerun must know which records are in the topic.
        left = producer.flush(60)
    if left or failures or refused:
        problems = [f"{len(refused)} lines refused before sending (first: {refused[0]})"] if refused else []
        if left or failures:
            problems.append(f"{left + len(failures)} of {sent} sent records not delivered"
                            + (f" ({failures[0]})" if failures else " within 60 s"))
        raise ProduceIncomplete(f"table {name!r}: {sent - left - len(failures)} records delivered to {topic!r}; "
                           + "; ".join(problems))
    return Produced(topic, sent, not_objects, round(time.monotonic() - started, 3))


def dead_letters(name: str, rt: Runtime | None = None, limit: int = 20) -> dict:
    """The newest `limit` dead letters of a table (their reason, source coordinates and the start
    of the value; at most `limit` read from each partition's end) and the count per reason over
    every committed batch (from the batch log, not by reading the whole topic)."""
    from ops.status import FOLDS

    rt = rt or Runtime.from_env()
    _table(name, rt)
    totals = FOLDS.fold(rt, name)
    by_reason = dict(sorted(totals.dead.items(), key=lambda item: -item[1]))
    topic = rt.dead_letter_topic(name)
    meta = topic_metadata(admin(rt.bootstrap), rt.bootstrap, topic)
    if meta is None or not limit:
        return {"topic": topic, "total": sum(by_reason.values()), "by_reason": by_reason, "newest": []}
    watermarks = {p: partition_watermarks(metadata_consumer(rt.bootstrap), rt.bootstrap, TopicPartition(topic, p))
                  for p in meta.partitions}
    consumer = Consumer(client_config(rt.bootstrap, **{
        "group.id": "statetable-dead-letters", "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": "read_committed", "log_level": 2}))
    newest: list[dict] = []
    try:
        pending = {p for p, (low, high) in watermarks.items() if high > low}
        consumer.assign([TopicPartition(topic, p, max(watermarks[p][0], watermarks[p][1] - limit)) for p in pending])
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    if msg.error().code() == -191:      # _PARTITION_EOF
                        pending.discard(msg.partition())
                    continue
                headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (msg.headers() or [])}
                reason = headers.get("reason", "unknown")
                value = (msg.value() or b"").decode("utf-8", "replace")
                newest.append({"reason": reason, "source_partition": _int(headers.get("source_partition")),
                               "source_offset": _int(headers.get("source_offset")), "size": _int(headers.get("size")),
                               "truncated": headers.get("truncated") == "true", "timestamp": msg.timestamp()[1],
                               "value": value[:200] + ("…" if len(value) > 200 else "")})
                if msg.offset() + 1 >= watermarks[msg.partition()][1]:
                    pending.discard(msg.partition())
    finally:
        consumer.close()
    newest.sort(key=lambda d: (d["timestamp"], d["source_partition"] or 0, d["source_offset"] or 0))
    return {"topic": topic, "total": sum(by_reason.values()), "by_reason": by_reason, "newest": newest[-limit:]}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
