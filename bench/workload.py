"""The benchmark's events and the reference they are checked against.

Events are JSON `{"k": key, "v": value}`, keyed by `k` (so the default
partitioner keeps a key in one partition, which is what a per-key stateful
consumer such as Quix Streams needs without a repartition). The reference is
counted here, in the producer, independently of every system under test.
"""
from __future__ import annotations

import random
import time

from confluent_kafka import Producer

from deploy.samples import send_records
from state.kafka_admin import ensure_topic

Reference = dict[str, tuple[int, int]]


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 20000,
                     "queue.buffering.max.messages": 2_000_000, "compression.type": "lz4"})


def produce_random(bootstrap: str, topic: str, events: int, keys: int, partitions: int = 4,
                   seed: int = 5, reference: Reference | None = None) -> Reference:
    """`events` events over `keys` random keys; returns (count, sum) per key, added to `reference`."""
    ensure_topic(bootstrap, topic, partitions)
    rng = random.Random(seed)
    expected = {k: list(v) for k, v in (reference or {}).items()}
    started = time.monotonic()

    def records():
        for i in range(events):
            key, value = f"key{rng.randrange(keys):07d}", rng.randrange(1000)
            slot = expected.setdefault(key, [0, 0])
            slot[0] += 1
            slot[1] += value
            if i and i % 1_000_000 == 0:
                print(f"  produced {i:,} events ({i / (time.monotonic() - started):,.0f}/s)", flush=True)
            yield key.encode(), b'{"k":"%s","v":%d}' % (key.encode(), value)

    send_records(_producer(bootstrap), topic, records())
    return {k: (n, s) for k, (n, s) in expected.items()}


def produce_distinct(bootstrap: str, topic: str, first: int, count: int, partitions: int = 4) -> Reference:
    """One event (value 1) for each of keys first..first+count-1: a table of `count` new keys."""
    ensure_topic(bootstrap, topic, partitions)
    keys = (f"key{i:07d}".encode() for i in range(first, first + count))
    send_records(_producer(bootstrap), topic, ((key, b'{"k":"%s","v":1}' % key) for key in keys))
    return {f"key{i:07d}": (1, 1) for i in range(first, first + count)}


def compare(system: str, got: dict, expected: Reference) -> dict:
    """Every key's (count, sum) against the reference; the summary names a few differing keys."""
    got = {k: (int(v[0]), int(v[1])) for k, v in got.items()}
    wrong = sorted(k for k in expected.keys() | got.keys() if got.get(k) != expected.get(k))
    return {"system": system, "keys_expected": len(expected), "keys_reported": len(got),
            "differences": len(wrong),
            "examples": [{"key": k, "expected": expected.get(k), "got": got.get(k)} for k in wrong[:5]]}

