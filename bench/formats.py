"""Workload 1 (count and sum per key) over the same events written as JSON and as Avro: what a
format costs a batch, on both passes, and which step holds Avro back.

    .venv/bin/python -m bench.formats [--events 500000] [--keys 10000] [--runs 2]

The same events (bench.workload's key/value stream, seeded) go to two topics, JSON and Avro
(`-- format: avro` with a schema file: the decoding is the same as avro-confluent's without the
registry round trip, which is once per schema id). Each table is run warm (a small topic first),
best of `--runs`, and checked against the producer's reference. Beside the batch it times the
format alone, in this process over the same values: pyarrow's JSON reader (what the JSON path
types with) against the Avro transcoding (one native pass per block, formats/avro_block.py, into
canonical JSON, then the same reader), and Spark Structured Streaming over the same two topics
(from_json; spark-avro's from_avro with the writer schema given by hand). It starts a broker of its own on ports 29892-29893 and a local Spark session, and
stops both; prints JSON.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import tempfile
import time
from pathlib import Path

from bench.suite_directions import _broker

SCHEMA = {"type": "record", "name": "Event", "fields": [{"name": "k", "type": "string"},
                                                         {"name": "v", "type": "long"}]}
TABLE = ("-- topic: {topic}\n-- schema: k STRING, v BIGINT\n-- partitions: 4\n{format}"
         "CREATE TABLE {name} AS SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k\n")


def _events(events: int, keys: int, seed: int = 5):
    rng = random.Random(seed)
    for _ in range(events):
        yield f"key{rng.randrange(keys):07d}", rng.randrange(1000)


def _avro(writer, key: str, value: int) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, writer, {"k": key, "v": value})
    return out.getvalue()


def _produce(bootstrap: str, topic: str, events: int, keys: int, avro: bool) -> dict:
    import fastavro

    from bench.workload import _producer
    from deploy.samples import send_records
    from state.kafka_admin import ensure_topic

    ensure_topic(bootstrap, topic, 4)
    writer = fastavro.parse_schema(SCHEMA)
    reference: dict[str, list[int]] = {}

    def records():
        for key, value in _events(events, keys):
            slot = reference.setdefault(key, [0, 0])
            slot[0] += 1
            slot[1] += value
            yield key.encode(), (_avro(writer, key, value) if avro else b'{"k":"%s","v":%d}' % (key.encode(), value))

    started = time.monotonic()
    send_records(_producer(bootstrap), topic, records())
    print(f"  {topic}: {events:,} events in {time.monotonic() - started:.1f}s", flush=True)
    return reference


def _format_alone(events: int, keys: int) -> dict:
    """The decode step alone, over the same values in memory (no Kafka, no Spark)."""
    import fastavro
    import pyarrow as pa

    from catalog.definitions import parse
    from spark_jobs.frames.arrow_values import parse_values
    from spark_jobs.frames.formats import transcode

    writer = fastavro.parse_schema(SCHEMA)
    pairs = list(_events(events, keys))
    json_values = pa.array([b'{"k":"%s","v":%d}' % (k.encode(), v) for k, v in pairs], pa.binary())
    avro_values = pa.array([_avro(writer, k, v) for k, v in pairs], pa.binary())
    folder = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    (folder / "event.avsc").write_text(json.dumps(SCHEMA))
    (folder / "t.sql").write_text(TABLE.format(topic="x", name="t", format="-- format: avro\n-- value_schema: event.avsc\n"))
    table = parse(folder / "t.sql")
    out = {}
    parse_values(json_values.slice(0, 1000), table.schema)        # imports and first calls, outside the clock
    parse_values(transcode(avro_values.slice(0, 1000), table)[0], table.schema)
    started = time.process_time()
    parse_values(json_values, table.schema)
    out["json_parse_cpu_s"] = round(time.process_time() - started, 3)
    started = time.process_time()
    as_json, _ = transcode(avro_values, table)
    out["avro_transcode_cpu_s"] = round(time.process_time() - started, 3)
    started = time.process_time()
    parse_values(as_json, table.schema)
    out["avro_then_json_parse_cpu_s"] = round(time.process_time() - started, 3)
    out["json_mb"] = round(pa.compute.sum(pa.compute.binary_length(json_values)).as_py() / 1e6, 1)
    out["avro_mb"] = round(pa.compute.sum(pa.compute.binary_length(avro_values)).as_py() / 1e6, 1)
    out["events"] = events
    return out


def _spark_structured_streaming(bootstrap: str, topic: str, header: str, reference: dict, fmt: str,
                                events: int) -> dict:
    """Spark Structured Streaming over the same topic (its own driver, availableNow, RocksDB state):
    JSON with from_json, Avro with spark-avro's from_avro and the writer schema given by hand, as
    open-source Spark reads Avro (it cannot read Confluent's framing at all: SPARK-34652)."""
    import subprocess

    from bench.compare.peers import QUIET_SPARK, spark_structured_streaming
    from bench.workload import compare

    out = Path(tempfile.mkdtemp(prefix="bench-formats-ss-"))
    extra = ["--avro-schema", json.dumps(SCHEMA)] if fmt == "avro" else []
    subprocess.run([str(a) for a in spark_structured_streaming(bootstrap, topic, out, out / "checkpoint", *extra)],
                   check=True, env={**os.environ, **QUIET_SPARK})
    result = json.loads((out / "result.json").read_text())
    check = compare(f"{fmt}/spark-ss", {k: tuple(v) for k, v in result["counts"].items()},
                    {k: tuple(v) for k, v in reference.items()})
    seconds = result["processing_seconds"]
    print(f"  {fmt} in Spark Structured Streaming: {round(events / seconds):,} events/s ({seconds}s)", flush=True)
    return {"format": fmt, "engine": "spark-structured-streaming", "events": events, "seconds": seconds,
            "events_per_s": round(events / seconds), "check": "ok" if check["differences"] == 0 else check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    cfg, broker = _broker(29892)
    try:
        from bench.workload import compare
        from catalog.mapping import row_of
        from spark_jobs import jobs
        from spark_jobs.engine import session
        from tests.table_env import isolated_runtime

        spark = session.get_or_create("bench-formats")
        rt, suffix = isolated_runtime(cfg.kafka_bootstrap, Path(tempfile.mkdtemp(prefix="bench-formats-")))
        (rt.tables_dir / "event.avsc").write_text(json.dumps(SCHEMA))
        topics = {}
        for fmt in ("json", "avro"):
            header = "" if fmt == "json" else "-- format: avro\n-- value_schema: event.avsc\n"
            for size, events in (("warm", 20_000), ("full", args.events)):
                topic = f"formats-{fmt}-{size}{suffix}"
                reference = _produce(rt.bootstrap, topic, events, args.keys, avro=fmt == "avro")
                topics[(fmt, size)] = (topic, header, reference)
        results = []
        for engine in ("arrow", "spark"):
            os.environ["STATETABLE_ENGINE"] = engine
            for fmt in ("json", "avro"):
                best = None
                for run in range(args.runs):
                    for size in ("warm", "full"):
                        topic, header, reference = topics[(fmt, size)]
                        name = f"f_{fmt}_{engine}_{size}_{run}"
                        (rt.tables_dir / f"{name}.sql").write_text(TABLE.format(topic=topic, name=name, format=header))
                        started = time.monotonic()
                        done = jobs.run(name, until_caught_up=True, spark=spark, rt=rt, snapshots=False)
                        seconds = time.monotonic() - started
                        if size == "full":
                            table = jobs.load_table(name, rt)[0]
                            rows = (row_of(table, k, v) for k, v in jobs.state_rows(name, rt).items())
                            check = compare(f"{fmt}/{engine}", {r["k"]: (r["n"], r["total"]) for r in rows},
                                            {k: tuple(v) for k, v in reference.items()})
                            row = {"format": fmt, "engine": engine, "events": args.events, "batches": len(done),
                                   "seconds": round(seconds, 2), "events_per_s": round(args.events / seconds),
                                   "check": "ok" if check["differences"] == 0 else check}
                            if best is None or row["seconds"] < best["seconds"]:
                                best = row
                print(f"  {fmt} on the {engine} pass: {best['events_per_s']:,} events/s ({best['seconds']}s)",
                      flush=True)
                results.append(best)
        spark.stop()
        peers = [_spark_structured_streaming(rt.bootstrap, *topics[(fmt, "full")], fmt, args.events)
                 for fmt in ("json", "avro")]
        by = {(r["format"], r["engine"]): r["events_per_s"] for r in results}
        print(json.dumps({"workload": "count and sum per key", "keys": args.keys, "batches": results,
                          "spark_structured_streaming": peers,
                          "avro_over_json": {e: round(by[("avro", e)] / by[("json", e)], 2) for e in ("arrow", "spark")},
                          "format_alone": _format_alone(min(args.events, 200_000), args.keys)}, indent=1))
    finally:
        broker.stop(timeout=30)


if __name__ == "__main__":
    main()
