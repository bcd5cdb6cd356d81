"""An isolated deployment for table tests: the shipped definitions with
suffixed source topics, a private data folder and a topic namespace."""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import defaultdict
from pathlib import Path

from catalog.runtime import Runtime

SHIPPED = Path(__file__).resolve().parent.parent / "dags" / "tables"
# The kill tests crash a chosen set of fault points by default; STATETABLE_KILL_EVERY_POINT=1 crashes
# every point in every engine and kind of table (tests/test_exactly_once.py, tests/test_table_aggregates.py).
KILL_EVERY_POINT = bool(os.environ.get("STATETABLE_KILL_EVERY_POINT"))


def port(base: int) -> int:
    """A port of a test's own, moved by this pytest-xdist worker's offset (tests/conftest.py)."""
    return base + int(os.environ.get("STATETABLE_TEST_PORT_OFFSET", "0"))


def isolated_runtime(bootstrap: str, root: Path, overrides: dict[str, str] | None = None) -> tuple[Runtime, str]:
    suffix = f"-{uuid.uuid4().hex[:8]}"
    tables = root / "tables"
    tables.mkdir(parents=True)
    for path in SHIPPED.glob("*.sql"):
        text = path.read_text()
        text = re.sub(r"^(-- (?:output_)?topic: )(\S+)", lambda m: m.group(1) + m.group(2) + suffix, text, flags=re.M)
        text = re.sub(r"topic='([^']+)'", lambda m: f"topic='{m.group(1)}{suffix}'", text)
        for option, value in (overrides or {}).items():
            text = re.sub(rf"^-- {option}: .*$", f"-- {option}: {value}", text, flags=re.M)
        (tables / path.name).write_text(text)
    rt = Runtime(bootstrap=bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data" / "snapshots"),
                 tables_dir=tables, namespace=f"ns{suffix[1:]}.")
    return rt, suffix


def read_topic(bootstrap: str, topic: str) -> list:
    """Every record of a topic, read with confluent-kafka (independent of Spark)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from spark_jobs.steps.offsets import watermarks
    from state.kafka_config import client_config

    ends = watermarks(bootstrap, topic)
    consumer = Consumer(client_config(bootstrap, **{
        "group.id": "statetable-verifier", "enable.auto.commit": False, "isolation.level": "read_committed",
        "enable.partition.eof": True, "fetch.message.max.bytes": 8388608}))
    consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
    records, done = [], {p for p, (low, high) in ends.items() if low >= high}
    deadline = time.monotonic() + 60
    while len(done) < len(ends) and time.monotonic() < deadline:
        for msg in consumer.consume(10000, timeout=0.2):
            if msg.error():
                # Only the partition's end as it was when the read began ends it: another error (a
                # broker slow under a loaded CI run) is read past, not taken for the end.
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()][1]:
                    done.add(msg.partition())
                continue
            records.append(msg)
    consumer.close()
    return records


def fold_change_topic(bootstrap: str, topic: str) -> tuple[dict, list]:
    """(the topic folded by key: last value, tombstones delete; every (key, batch) seen), read
    with read_committed. Records of a key share a partition, so offset order is commit order."""
    table, seen = {}, []
    records = sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset()))
    for msg in records:
        batch = int(dict(msg.headers())["batch"])
        key = msg.key().decode()
        seen.append((key, batch))
        if msg.value() is None:
            table.pop(key, None)
        else:
            table[key] = json.loads(msg.value())
    return table, seen


def current_rows(bootstrap: str, topic: str, columns: list[str], dtype=None, valid=None) -> "pd.DataFrame":
    """A source table's rows now, independent of the product: its topic read back with
    confluent-kafka and folded by key (the last value wins, a tombstone deletes). A record that is
    no JSON object, or fails `valid(row)`, is bad input: it changes nothing."""
    import pandas as pd

    rows = {}
    for msg in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        if msg.value() is None:
            rows.pop(msg.key(), None)
            continue
        try:
            row = json.loads(msg.value())
        except ValueError:
            continue
        if isinstance(row, dict) and (valid is None or valid(row)):
            rows[msg.key()] = row
    return pd.DataFrame(list(rows.values()), columns=columns, dtype=dtype)


def assert_each_batch_once_and_in_order(seen: list) -> None:
    assert len(seen) == len(set(seen)), "a batch's change of a key appears twice"
    batches = defaultdict(list)
    for key, batch in seen:
        batches[key].append(batch)
    assert all(b == sorted(b) for b in batches.values()), "a key's changes are out of batch order"


HOURLY_SQL = ("-- topic: {topic}\n-- schema: title STRING, amount DOUBLE, ts TIMESTAMP\n-- partitions: 2\n{options}"
              "CREATE TABLE {table} AS SELECT title, COUNT(*) AS n FROM sales "
              "GROUP BY title, TUMBLE(ts, INTERVAL '1' HOUR, INTERVAL '10' MINUTE)")
# (minute of 2026-11-01, title) per batch: out of order, with late events once the watermark (the
# newest accepted event time) passes a window's end plus its 10 minutes of grace.
OUT_OF_ORDER_BATCHES = [
    [(5, "a"), (50, "a"), (70, "b"), (65, "a")],      # watermark 70: window 0-60 closes (60 + grace 10)
    [(30, "a"), (125, "b"), (100, "a")],             # 30 late
    [(20, "a"), (55, "b"), (130, "a"), (119, "b")],  # 20, 55 late, 119 (window 60-120) on time; 60-120 closes
    [(179, "a"), (121, "b"), (10, "c")],             # 121 on time, 10 late; window 120-180 stays open
]


def new_table(rt, table: str, text: str, topic: str, partitions: int = 2) -> "Producer":
    """A table defined by `text`, its input topic (created), and a producer for it."""
    from confluent_kafka import Producer

    from state.kafka_admin import ensure_topic

    (rt.tables_dir / f"{table}.sql").write_text(text)
    ensure_topic(rt.bootstrap, topic, partitions)
    return Producer({"bootstrap.servers": rt.bootstrap})


def hourly_table(rt, table: str, topic: str, options: str = "") -> "Producer":
    """An hourly tumbling count over `topic` (2 partitions), and a producer for it."""
    return new_table(rt, table, HOURLY_SQL.format(topic=topic, options=options, table=table), topic)


def produce_minutes(producer, topic: str, events: list[tuple[int, str]]) -> None:
    for minute, title in events:
        ts = f"2026-11-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
        producer.produce(topic, json.dumps({"title": title, "amount": 1.0, "ts": ts}).encode())
    assert producer.flush(10) == 0


def sse_events(response, until) -> list[dict]:
    """Server-sent events off a streamed response, each as its fields (event, id, data), until
    `until(events)` holds or the stream ends."""
    events, fields = [], {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line == "":
            if "data" in fields:
                events.append(fields)
                if until(events):
                    return events
            fields = {}
            continue
        name, _, value = line.partition(": ")
        fields[name] = value
    return events


def dead_letter_reasons(rt, table: str, by_partition: bool = False, by_topic: bool = False) -> dict:
    """source offset (or (partition, offset), or (topic, partition, offset): a table of two
    streams' dead letters) -> reason, from the table's dead-letter topic."""
    out = {}
    for message in read_topic(rt.bootstrap, rt.dead_letter_topic(table)):
        headers = {k: None if v is None else v.decode() for k, v in message.headers()}
        offset = int(headers["source_offset"])
        key = (headers["source_topic"], int(headers["source_partition"]), offset) if by_topic else \
            (int(headers["source_partition"]), offset) if by_partition else offset
        out[key] = headers["reason"]
    return out
