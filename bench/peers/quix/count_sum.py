"""Quix Streams peer: count and sum per key in RocksDB state with a changelog, exactly-once.

Runs in its own venv (.bench/venvs/quix). Modes:
  count   - process --events events from --topic; report the rate and every key's (count, sum);
  recover - with the local state deleted beforehand, process one more event: Quix first
            restores the store from its changelog topic; report the time until that event
            is processed, then every restored key read back from the store;
  serve   - run until SIGTERM, writing every updated (k, n, s) to --output-topic
            (committed with the state, exactly-once): the freshness workload reads it.
Writes <out>/result.json. Standalone on purpose: it imports nothing of statetable's.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import quixstreams
from quixstreams import Application


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--topic", "--group", "--state-dir", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--mode", choices=("count", "recover", "serve"), default="count")
    parser.add_argument("--output-topic")
    args = parser.parse_args()

    app = Application(broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", state_dir=args.state_dir, loglevel="WARNING",
                      consumer_extra_config={"session.timeout.ms": 6000})
    sdf = app.dataframe(app.topic(args.topic, value_deserializer="json", key_deserializer="string"))
    latest: dict[str, tuple[int, int]] = {}
    marks: dict[str, float] = {}

    def add(value: dict, state) -> dict:
        marks.setdefault("first", time.perf_counter())
        n, s = state.get("agg", (0, 0))
        n, s = n + 1, s + value["v"]
        state.set("agg", (n, s))
        return {"k": value["k"], "n": n, "s": s}

    sdf = sdf.apply(add, stateful=True)
    sdf = sdf.update(lambda row: latest.__setitem__(row["k"], (row["n"], row["s"])))
    if args.mode == "serve":
        sdf.to_topic(app.topic(args.output_topic, value_serializer="json", key_serializer="string"))
        Path(args.out, "ready").write_text("")
        app.run()
        Path(args.out, "result.json").write_text(json.dumps({"system": "Quix Streams", "mode": "serve"}))
        return

    started = time.perf_counter()
    app.run(count=args.events, timeout=60, collect=False)
    ended = time.perf_counter()
    first = marks.get("first", ended)
    result = {"system": "Quix Streams", "version": quixstreams.__version__, "mode": args.mode,
              "run_seconds": round(ended - started, 3),
              "processing_seconds": round(ended - first, 3),
              "seconds_to_first_event": round(first - started, 3)}
    if args.mode == "count":
        result["counts"] = latest
    else:
        result["counts"] = read_store(Path(args.state_dir))
    Path(args.out, "result.json").write_text(json.dumps(result))


def read_store(state_dir: Path) -> dict[str, tuple[int, int]]:
    """Every key's aggregate from Quix's RocksDB partitions (closed by now), as the app stored it."""
    from rocksdict import AccessType, Options, Rdict

    out: dict[str, tuple[int, int]] = {}
    for part in sorted(p for p in state_dir.rglob("*") if (p / "CURRENT").is_file()):
        db = Rdict(str(part), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            for raw_key, raw_value in db.items():
                prefix, _, name = raw_key.partition(b"|")
                if name == b'"agg"':
                    n, s = json.loads(raw_value)
                    out[json.loads(prefix)] = (n, s)
        finally:
            db.close()
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
