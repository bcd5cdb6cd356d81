"""A table's year (#46): what a batch, a snapshot, a verify, a restore and the disk cost once a
table is old and large, against the same table young, in one run.

A private broker and a local Spark session in this process. Table `aging`: ~100-byte rows
(LATEST_BY_OFFSET of an 80-character payload and a SUM) over --keys keys in 4 partitions,
loaded in batches of up to 1M events; then, in order:

  young      --probe batches of --batch-events events: time per batch at about 100 batches
  aged       the batch log aged to --age batches through BatchLog itself (empty committed
             batches, as a rebuild writes them, compacted as the product compacts them)
  old        --probe batches again: time per batch at --age batches
  snapshot   every partition snapshotted, then 1% of the keys changed and snapshotted again:
             bytes uploaded by each (incremental snapshots upload only new SSTs)
  verify     a full verify, 1% of the keys changed, then a verify from that checkpoint
  restore    the local state wiped, every partition restored from snapshots plus changelog
  disk       files and bytes the table leaves outside and inside its state folders
  long run   --consecutive batches with a query server answering beside them: RSS of this
             process and its Spark JVM, and of the server, sampled every 10 batches
  keys       the same --rate-events workload into this table and into a 10k-key table

Prints one JSON object (also written to --out).

    .venv/bin/python -m bench.aging [--keys 2000000] [--age 100000] [--consecutive 1000]
    # the issue's shape: --keys 20000000 --age 100000 --consecutive 1000
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOKEN = "bench-token-" + "a" * 24
DEFINITION = """-- topic: {topic}
-- schema: k STRING, payload STRING, v BIGINT
-- partitions: 4
-- snapshot_every: 1000000000
-- max_records_per_batch: 1000000
-- mirror_every: {mirror_every}
CREATE TABLE {name} AS
SELECT k, LATEST_BY_OFFSET(payload) AS payload, SUM(v) AS total
FROM events
GROUP BY k;
"""


def _produce(bootstrap: str, topic: str, keys, seed: int) -> int:
    """One event per key in `keys`, through the samples' producer (deploy.samples)."""
    from deploy.samples import producer_for, send_records

    rng, pad = random.Random(seed), "p" * 60

    def records():
        for k in keys:
            key = f"k{k:09d}"
            yield key.encode(), json.dumps({"k": key, "payload": f"{pad}{rng.getrandbits(64):020d}",
                                            "v": k % 1000}).encode()

    return send_records(producer_for(bootstrap), topic, records())


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in Path("/proc").glob("[0-9]*"):
        try:
            if int((child / "stat").read_text().split(") ")[1].split()[1]) == pid:
                out += _tree(int(child.name))
        except (FileNotFoundError, ValueError, IndexError):
            continue
    return out


def _disk(paths: list[Path]) -> dict:
    files, size = 0, 0
    for root in paths:
        for path in root.rglob("*") if root.exists() else ():
            if path.is_file():
                files += 1
                size += path.stat().st_size
    return {"files": files, "mb": round(size / 2**20, 1)}


def _median_batch_seconds(run, batches: int, events: int, keys: int, topic: str, bootstrap: str, seed: int) -> list:
    rng, seconds = random.Random(seed), []
    for i in range(batches):
        _produce(bootstrap, topic, (rng.randrange(keys) for _ in range(events)), seed + i)
        (commit,) = run(max_batches=1)
        seconds.append(commit.seconds)
    return seconds


def _age(rt, table: str, until: int) -> dict:
    """Empty committed batches up to `until`, written and compacted by BatchLog as the product
    writes a batch without input (a rebuild's plan and commit)."""
    from dataclasses import replace

    from catalog.batch_log import BatchLog, BatchPlan

    log = BatchLog(rt.batch_dir(table))
    last = log.last_commit()
    started = time.monotonic()
    ends = {p: end for p, (_, end) in last.ranges.items()}
    empty = {p: (end, end) for p, end in ends.items()}
    for batch_id in range(last.batch_id + 1, until):
        log.write_plan(BatchPlan(batch_id, last.topic, empty, last.watermark_ms, topic_id=last.topic_id,
                                 definition=last.definition), table)
        log.write_commit(replace(last, batch_id=batch_id, ranges=empty, counts={"read": 0}, seconds=0.0,
                                 committed_at=time.time(), holder=None), table)
        log.compact_if_due()
    return {"batches": until, "seconds": round(time.monotonic() - started, 1)}


PHASES = ("age", "snapshot", "verify", "restore", "long_run", "keys")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--age", type=int, default=100_000)
    parser.add_argument("--probe", type=int, default=20, help="batches timed young and old")
    parser.add_argument("--batch-events", type=int, default=10_000)
    parser.add_argument("--consecutive", type=int, default=1000)
    parser.add_argument("--rate-events", type=int, default=1_000_000)
    parser.add_argument("--broker-port", type=int, default=25612)
    parser.add_argument("--api-port", type=int, default=25615)
    parser.add_argument("--snapshot-rounds", type=int, default=10,
                        help="rounds of 1%% of the keys changed, each snapshotted (one round can hit a compaction)")
    parser.add_argument("--mirror-every", type=int, default=10,
                        help="the table's mirror_every (the product's default 10); a fold rewrites most of "
                             "the mirror's files, so a large table raises it (README, 'A table's year')")
    parser.add_argument("--only", nargs="+", choices=PHASES, help="run only these phases (after the load)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs/benchmarks/aging.json"))
    args = parser.parse_args()

    def want(phase: str) -> bool:
        return not args.only or phase in args.only

    from bench.broker import private_broker
    from catalog.registry import load_table
    from spark_jobs.recompute.verify import verify
    from spark_jobs import jobs
    from spark_jobs.engine import session
    from state.kafka_admin import ensure_topic
    from tests.table_env import isolated_runtime

    root = Path(tempfile.mkdtemp(prefix="statetable-bench-aging-"))
    result: dict = {"keys": args.keys, "partitions": 4, "row_bytes": "~100", "mirror_every": args.mirror_every}
    with private_broker(args.broker_port) as cfg:
        rt, suffix = isolated_runtime(cfg.kafka_bootstrap, root)
        spark = session.get_or_create("bench-aging")
        tables = {}
        for name, topic in (("aging", "aging_events" + suffix), ("aging_small", "aging_small_events" + suffix)):
            ensure_topic(rt.bootstrap, topic, 4)
            (rt.tables_dir / f"{name}.sql").write_text(DEFINITION.format(topic=topic, name=name,
                                                                                 mirror_every=args.mirror_every))
            tables[name] = topic

        def run(table="aging", **kw):
            return jobs.run(table, spark=spark, rt=rt, **kw)

        started = time.monotonic()
        _produce(rt.bootstrap, tables["aging"], range(args.keys), 1)
        produced = time.monotonic() - started
        loaded = run(until_caught_up=True)
        result["load"] = {"produce_seconds": round(produced, 1), "batches": len(loaded),
                          "seconds": round(time.monotonic() - started - produced, 1),
                          "events_per_second": round(args.keys / max(sum(c.seconds for c in loaded), 1e-6))}
        print(f"[load] {args.keys:,} keys in {len(loaded)} batches", flush=True)

        if want("age"):
            young = _median_batch_seconds(run, args.probe, args.batch_events, args.keys, tables["aging"], rt.bootstrap, 10)
            result["young"] = {"batch": loaded[-1].batch_id + args.probe, "median_batch_seconds": statistics.median(young)}
            result["aged"] = _age(rt, "aging", args.age)
            print(f"[age] batch log aged to {args.age:,} batches in {result['aged']['seconds']}s", flush=True)
            old = _median_batch_seconds(run, args.probe, args.batch_events, args.keys, tables["aging"], rt.bootstrap, 20)
            result["old"] = {"batch": args.age + args.probe, "median_batch_seconds": statistics.median(old)}
            result["old_over_young"] = round(result["old"]["median_batch_seconds"] /
                                             result["young"]["median_batch_seconds"], 3)

        table, _ = load_table("aging", rt)
        if want("snapshot"):
            # Each round changes 1% of the keys and snapshots every partition; the share a round
            # uploads depends on whether a compaction rewrote runs since the last one, so the
            # rounds' mean is the cost per snapshot and their maximum the worst one.
            st = jobs.state_table(table, rt)
            try:
                full = [st.snapshot(p) for p in range(4)]
                full_bytes = sum(m.total_bytes for m in full)
                rounds = []
                for r in range(args.snapshot_rounds):
                    _produce(rt.bootstrap, tables["aging"], random.Random(300 + r).sample(range(args.keys), args.keys // 100),
                             300 + r)
                    st.close()
                    run(until_caught_up=True)
                    started = time.monotonic()
                    after = [st.snapshot(p) for p in range(4)]
                    rounds.append({"uploaded": sum(m.uploaded for m in after), "total": sum(m.total_bytes for m in after),
                                   "seconds": round(time.monotonic() - started, 2)})
                    print(f"[snapshot] round {r + 1}: uploaded {rounds[-1]['uploaded'] / rounds[-1]['total']:.1%}",
                          flush=True)
                shares = [x["uploaded"] / x["total"] for x in rounds]
                result["snapshot"] = {
                    "full_bytes": full_bytes, "full_uploaded": sum(m.uploaded for m in full),
                    "rounds": rounds, "uploaded_share": round(statistics.mean(shares), 4),
                    "uploaded_share_median": round(statistics.median(shares), 4),
                    "uploaded_share_max": round(max(shares), 4),
                    "after_1pct_seconds": round(statistics.median(x["seconds"] for x in rounds), 2)}
            finally:
                st.close()

        if want("verify"):
            first = verify("aging", spark=spark, rt=rt, full=True)
            _produce(rt.bootstrap, tables["aging"], random.Random(4).sample(range(args.keys), args.keys // 100), 4)
            run(until_caught_up=True)
            chained = verify("aging", spark=spark, rt=rt)
            result["verify"] = {"full_seconds": first.seconds, "full_ok": first.ok, "chained_seconds": chained.seconds,
                                "chained_ok": chained.ok, "chained_from": chained.chained_from,
                                "chained_over_full": round(chained.seconds / max(first.seconds, 1e-6), 3)}
            print(f"[verify] full {first.seconds}s, chained {chained.seconds}s", flush=True)

        if want("restore"):
            st = jobs.state_table(table, rt)
            try:
                st.wipe_local()
                started = time.monotonic()
                for p in range(4):
                    st.restore(p)
                result["restore_seconds"] = round(time.monotonic() - started, 2)
            finally:
                st.close()

        def disk() -> dict:
            data = Path(rt.data_dir)
            outside = [data / "batches" / "aging", *[Path(rt.delta_path("aging", k)) for k in
                                                      ("bronze", "mirror", "mirror_changes", "dlq")],
                       Path(rt.verified_dir("aging"))]
            return {"outside_state": _disk(outside), "state": _disk([data / "state"]),
                    "snapshots": _disk([Path(rt.snapshot_uri)]), "batch_log": _disk([data / "batches" / "aging"])}

        if want("long_run"):
            result["disk_before_long_run"] = disk()
            env = {**os.environ, **rt.as_env(), "STATETABLE_API_TOKEN": TOKEN}
            server = subprocess.Popen([str(Path(sys.executable).parent / "statetable"), "serve", "--port",
                                       str(args.api_port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
            stop = threading.Event()

            def ask() -> None:
                import httpx

                with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5) as client:
                    while not stop.is_set():
                        try:
                            client.get(f"http://127.0.0.1:{args.api_port}/tables/aging/rows", params={"limit": 10})
                        except httpx.TransportError:
                            pass
                        time.sleep(0.05)

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            samples, seconds, n = [], [], args.consecutive
            rng = random.Random(5)
            try:
                for i in range(args.consecutive):
                    _produce(rt.bootstrap, tables["aging"], (rng.randrange(args.keys) for _ in range(1000)), 100 + i)
                    (commit,) = run(max_batches=1)
                    seconds.append(commit.seconds)
                    if i % 10 == 0:
                        samples.append({"batch": i, "driver_and_jvm_mb": round(sum(_rss_mb(p) for p in _tree(os.getpid())), 1),
                                        "api_server_mb": round(sum(_rss_mb(p) for p in _tree(server.pid)), 1)})
                    if i % 100 == 99:
                        print(f"[long run] {i + 1:,} of {n:,} batches, median {statistics.median(seconds[-100:]):.2f}s, "
                              f"RSS {samples[-1]['driver_and_jvm_mb']:.0f} MB + API {samples[-1]['api_server_mb']:.0f} MB",
                              flush=True)
            finally:
                stop.set()
                server.terminate()
                server.wait(timeout=30)

            def window(lo: int, hi: int, key: str) -> float:
                values = [s[key] for s in samples if lo <= s["batch"] < hi]
                return round(statistics.mean(values), 1) if values else None     # a run too short to say

            result["long_run"] = {
                "batches": n, "median_batch_seconds": statistics.median(seconds),
                "rss_mb": {key: {"batches_100_200": window(100, 200, key), "last_100": window(n - 100, n, key)}
                           for key in ("driver_and_jvm_mb", "api_server_mb")},
                "samples": samples}
            result["disk_after_long_run"] = disk()
            # Files a batch leaves until Delta maintenance (every maintain_every batches) and its
            # retention (delta_retention, a time) remove them: bounded by the batches in that window.
            result["files_per_batch_during_long_run"] = round(
                (result["disk_after_long_run"]["outside_state"]["files"] -
                 result["disk_before_long_run"]["outside_state"]["files"]) / max(n, 1), 2)

        if want("keys"):
            rates = {}
            _produce(rt.bootstrap, tables["aging_small"], range(10_000), 6)
            run("aging_small", until_caught_up=True)
            for name, keys in (("aging", args.keys), ("aging_small", 10_000)):
                rng = random.Random(7)
                _produce(rt.bootstrap, tables[name], (rng.randrange(keys) for _ in range(args.rate_events)), 7)
                commits = run(name, until_caught_up=True)
                rates[name] = round(sum(c.counts["read"] for c in commits) / max(sum(c.seconds for c in commits), 1e-6))
            result["events_per_second"] = {"large_table": rates["aging"], "10k_key_table": rates["aging_small"],
                                           "large_over_small": round(rates["aging"] / max(rates["aging_small"], 1), 3)}
        spark.stop()
    shutil.rmtree(root, ignore_errors=True)

    rss = result.get("long_run", {}).get("rss_mb", {}).values()
    result["targets"] = {      # None: the phase did not run (--only), or ran too short to say
        "batch_time_old_within_1_2x": result["old_over_young"] <= 1.2 if "old_over_young" in result else None,
        "snapshot_after_1pct_at_most_5pct": (result["snapshot"]["uploaded_share"] <= 0.05
                                             if "snapshot" in result else None),
        "chained_verify_at_most_20pct": (result["verify"]["chained_over_full"] <= 0.2
                                         if "verify" in result else None),
        "rss_flat_within_1_1x": (all(v["last_100"] <= 1.1 * v["batches_100_200"] for v in rss)
                                 if rss and all(v["batches_100_200"] and v["last_100"] for v in rss) else None),
    }
    text = json.dumps(result, indent=1)
    Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
