"""An isolated deployment for table tests: the shipped definitions with
suffixed source topics, a private data folder and a topic namespace."""
from __future__ import annotations

import re
import uuid
from pathlib import Path

from catalog.runtime import Runtime

SHIPPED = Path(__file__).resolve().parent.parent / "dags" / "tables"


def isolated_runtime(bootstrap: str, root: Path, overrides: dict[str, str] | None = None) -> tuple[Runtime, str]:
    suffix = f"-{uuid.uuid4().hex[:8]}"
    tables = root / "tables"
    tables.mkdir(parents=True)
    for path in SHIPPED.glob("*.sql"):
        text = path.read_text()
        text = re.sub(r"^(-- topic: )(\S+)", lambda m: m.group(1) + m.group(2) + suffix, text, flags=re.M)
        text = re.sub(r"topic='([^']+)'", lambda m: f"topic='{m.group(1)}{suffix}'", text)
        for option, value in (overrides or {}).items():
            text = re.sub(rf"^-- {option}: .*$", f"-- {option}: {value}", text, flags=re.M)
        (tables / path.name).write_text(text)
    rt = Runtime(bootstrap=bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data" / "snapshots"),
                 tables_dir=tables, namespace=f"ns{suffix[1:]}.")
    return rt, suffix


def read_topic(bootstrap: str, topic: str) -> list:
    """Every record of a topic, read with confluent-kafka (independent of Spark)."""
    from confluent_kafka import Consumer, TopicPartition

    from spark_jobs.offsets import watermarks

    ends = watermarks(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verifier", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.message.max.bytes": 8388608})
    consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
    records, done = [], {p for p, (low, high) in ends.items() if low >= high}
    while len(done) < len(ends):
        for msg in consumer.consume(10000, timeout=0.2):
            if msg.error():
                done.add(msg.partition())
                continue
            records.append(msg)
    consumer.close()
    return records
