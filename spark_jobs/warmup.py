"""The engine's warm-up: one small batch of a scratch table, run before the server reports up.

A fresh Spark Connect server pays, in its first job, what every later job gets for free: the
shared session's Python worker daemon (forked, with the Arrow pass and the state library
imported), the Kafka source's and Delta's classes loaded and their hot paths JIT-compiled, the
transactional producer's first connection. In `make bench` on the 2-core machine, a fresh server's
first 1M-record batch took 10.8 s against 2.6 s for the next; after this warm-up, 3.3 s against
2.2 s. Paid here, it is paid before the first user batch: the server is "up" once it is warm.

The scratch table is a real table (`WARMUP_TABLE`, a count and sum per key), run through the same
`jobs.run` as any table, so every step of a batch is touched: plan, read, pass, merge, commit,
publish. It lives in its own namespace and folder, its batches carry on from one warm-up to the
next (records appended to its scratch topic each time), and no user table sees it.
"""
from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import replace
from pathlib import Path

from catalog.runtime import Runtime
from state.errors import BadSetting
from spark_jobs.errors import WarmupFailed

log = logging.getLogger("statetable.warmup")

WARMUP_TABLE = "statetable_engine_warmup"
WARMUP_NAMESPACE = "statetable-warmup."
RECORDS_ENV = "STATETABLE_ENGINE_WARMUP_RECORDS"
DEFAULT_RECORDS = 100_000
PARTITIONS = 2
REPORT = "warmup.json"        # in the warm-up's folder: what the last warm-up did, for `stack status`

TABLE_SQL = """-- topic: {topic}
-- schema: k STRING, v BIGINT
-- partitions: %d
CREATE TABLE %s AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;
""" % (PARTITIONS, WARMUP_TABLE)


def records() -> int:
    """How many records a warm-up batch reads (0 turns the warm-up off)."""
    raw = os.environ.get(RECORDS_ENV, str(DEFAULT_RECORDS)).strip()
    if not raw.isdigit():
        raise BadSetting(f"{RECORDS_ENV}={raw!r}: give a number of records for the engine's warm-up batch "
                         f"(e.g. {DEFAULT_RECORDS}), or 0 to start the engine without one")
    return int(raw)


def scratch_runtime(rt: Runtime, folder: Path) -> Runtime:
    """A runtime of the scratch table's own: the deployment's brokers, Kafka security and store
    kind (folders, or the object store under a prefix of its own), so the warm-up proves them
    too; its own definitions, batch log and topics (a namespace named after its folder), so two
    stacks on one Kafka never share a changelog and no user table meets it."""
    (folder / "tables").mkdir(parents=True, exist_ok=True)
    (folder / "tables" / f"{WARMUP_TABLE}.sql").write_text(TABLE_SQL.format(topic=topic(folder)))
    store = f"{rt.store_uri}/engine-warmup" if rt.store_uri else ""
    data = folder / "data"
    return replace(rt, tables_dir=folder / "tables", data_dir=data, store_uri=store,
                   snapshot_uri=f"{store}/snapshots" if store else str(data / "snapshots"),
                   namespace=_namespace(folder))


def _namespace(folder: Path) -> str:
    import hashlib

    return f"{WARMUP_NAMESPACE}{hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]}."


def topic(folder: Path) -> str:
    return f"{_namespace(folder)}events"


def produce(rt: Runtime, topic: str, count: int, seed: int) -> None:
    from confluent_kafka import Producer

    from state.kafka_admin import ensure_topic
    from state.kafka_config import client_config

    ensure_topic(rt.bootstrap, topic, PARTITIONS)
    producer = Producer(client_config(rt.bootstrap, **{"linger.ms": 20, "compression.type": "lz4"}))
    rng = random.Random(seed)
    for i in range(count):
        producer.produce(topic, b'{"k":"w%d","v":%d}' % (rng.randrange(1000), rng.randrange(100)),
                         partition=i % PARTITIONS)
        if i % 10_000 == 9_999:
            producer.poll(0)
    left = producer.flush(60)
    if left:
        raise WarmupFailed(f"the warm-up's producer could not deliver {left} records to {topic} in 60 s")


def warm(spark, rt: Runtime, folder: Path, count: int | None = None) -> dict:
    """Run the scratch table over `count` new records on `spark` (the server's shared session);
    what it did, also written to `folder`/warmup.json for `stack status`."""
    from spark_jobs import jobs

    count = records() if count is None else count
    started = time.monotonic()
    scratch = scratch_runtime(rt, folder)
    produce(scratch, topic(folder), count, seed=int(time.time()))
    commits = jobs.run(WARMUP_TABLE, until_caught_up=True, spark=spark, rt=scratch, snapshots=False)
    fork_workers(spark)
    report = {"finished_at": time.time(), "seconds": round(time.monotonic() - started, 2), "records": count,
              "batches": [c.batch_id for c in commits], "read": sum(c.counts["read"] for c in commits),
              "steps_ms": {k[3:]: v for c in commits for k, v in c.counts.items() if k.startswith("ms_")}}
    record(folder, report)
    log.info("engine warmed in %.1fs: %d records through %s", report["seconds"], report["read"], WARMUP_TABLE)
    return report


def fork_workers(spark, tasks: int = PARTITIONS) -> None:
    """The scratch table's batch ran its Arrow pass, merge and all, in its record cap's own session
    (session.arrow_session). The Spark-SQL pass and the tables of tables merge in the shared
    session itself, and the server keeps a Python worker daemon per session: without this, the
    first such batch after a start (on a fresh stack, the demo's `players`) forked that daemon,
    imports and all, and logged its partitions cold. One trivial Python job there forks it now."""
    spark.range(tasks, numPartitions=tasks).mapInArrow(_unchanged, "id long").collect()


def _unchanged(batches):
    yield from batches


def record(folder: Path, report: dict) -> None:
    """Keep what a warm-up did (or why it failed) where `stack status` reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT).write_text(json.dumps(report))
