"""`make bench`: statetable against Quix Streams, Flink SQL and Spark Structured Streaming.

One run, one private Kafka broker, the same events for every system:
  1. count and sum per key over --events JSON events and --keys keys (4 partitions);
  2. recovery of a --recovery-keys table after its local state is deleted;
  3. freshness: produce one event, time until the queried state shows it.
Every system's result is checked against the producer's reference counts; any
difference fails the run (exit 1) after the report is written. Writes
docs/benchmarks/README.md, results.json and PNG plots, and prints the table.

    .venv/bin/python -m bench.run_all [--events 5000000] [--keys 10000] [--recovery-keys 1000000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.broker import private_broker
from bench.compare import freshness, peers, profile, report
from bench.compare.measure import run_peer
from bench.warm import warm_rows
from bench.workload import compare, produce_distinct, produce_random
from catalog.settings import PROJECT_ROOT


def _best(name: str, runs: list):
    """The fastest of a system's runs, named as its row."""
    return replace(min(runs, key=lambda run: run.result["processing_seconds"]), name=name)


def throughput(bootstrap: str, work: Path, events: int, keys: int, connect_port: int) -> dict:
    topic = "bench-count"
    started = time.perf_counter()
    reference = produce_random(bootstrap, topic, events, keys)
    print(f"[count] produced {events:,} events over {len(reference):,} keys in "
          f"{time.perf_counter() - started:.1f}s", flush=True)
    # The producer's log segments go to disk before any system runs, so none reads while the
    # kernel writes them back (the first run after the producer met that, whichever it was).
    os.sync()
    # statetable takes the backlog in one micro-batch, as Spark Structured Streaming's availableNow does
    # without maxOffsetsPerTrigger; a second row keeps the table's default of up to 1M records a batch.
    # statetable and Spark SS, the two Spark systems the targets compare, run twice each, taking
    # turns, each run in a fresh process on a fresh table or checkpoint; the best run is their row.
    local = {**peers.QUIET_SPARK, "STATETABLE_SPARK_REMOTE": "local"}     # cold: a session of its own
    paired: dict[str, list] = {"statetable": [], "Spark Structured Streaming": []}
    for i in range(2):
        paired["statetable"].append(run_peer(f"statetable, run {i + 1}", peers.statetable(
            bootstrap, topic, work / f"st-{i}", work / f"st-{i}/data", "--batch", str(events),
            "--table", f"bench_counts_{i}"), work / f"st-{i}", env=local))
        paired["Spark Structured Streaming"].append(run_peer(
            f"Spark Structured Streaming, run {i + 1}", peers.spark_structured_streaming(
                bootstrap, topic, work / f"sss-{i}", work / f"sss-{i}/checkpoint"), work / f"sss-{i}",
            env=peers.QUIET_SPARK))
    runs = [
        *[_best(name, pair) for name, pair in paired.items()],
        run_peer("statetable (1M-record batches)", peers.statetable(
            bootstrap, topic, work / "st1m", work / "st1m/data", "--batch", "1000000", "--table", "bench_counts_1m"),
            work / "st1m", env=local),
        run_peer("Apache Flink SQL", peers.flink(bootstrap, topic, work / "flink"), work / "flink"),
        run_peer("Apache Flink SQL (mini-batch)", peers.flink(bootstrap, topic, work / "flink-mb", "--mini-batch"),
                 work / "flink-mb"),
        run_peer("Quix Streams", peers.quix(bootstrap, topic, work / "quix", work / "quix/state", "bench-count",
                                            "--events", str(events)), work / "quix"),
    ]
    rows = []
    for run in runs:
        # A paired system's row is checked on every run of it: the worst check stands.
        check = max((compare(run.name, other.result["counts"], reference)
                     for other in paired.get(run.name, [run])), key=lambda c: c["differences"])
        run.result.pop("counts")
        rows.append({"system": run.name, "version": run.result.get("version"), "events": events,
                     "processing_seconds": run.result["processing_seconds"],
                     "events_per_s": round(events / run.result["processing_seconds"]),
                     "wall_seconds": run.wall_seconds, "peak_rss_mb": run.peak_rss_mb,
                     "rss_split_mb": run.rss_split_mb, "check": check, "detail": run.result})
        if run.name in paired:
            rows[-1]["seconds"] = [r.result["processing_seconds"] for r in paired[run.name]]
        print(f"[count] {run.name}: {rows[-1]['events_per_s']:,} events/s, "
              f"{check['differences']} keys differ from the reference", flush=True)
    warm = warm_rows(bootstrap, topic, work / "warm", reference, connect_port)
    for row in warm["rows"]:
        print(f"[warm] {row['system']}: {row['events_per_s']:,} events/s, {row['check']['differences']} keys differ",
              flush=True)
    # A profiled statetable run (not timed above): Spark's event log for the stage metrics, and
    # py-spy sampling the driver and Python workers.
    def profiled(folder: Path, table: str) -> list:
        return peers.statetable(bootstrap, topic, folder, folder / "data", "--batch", str(events),
                                "--table", table, "--event-log", folder / "events")

    spy = work / "st-pyspy"
    cmd = [Path(sys.executable).parent / "py-spy", "record", "--subprocesses", "--idle", "-r", "50",
           "-f", "speedscope", "-o", spy / "profile.speedscope.json", "--", *profiled(spy, "bench_counts_spy")]
    try:
        run_peer("statetable under py-spy", cmd, spy, env=local)
        spied = profile.pyspy_summary(spy / "profile.speedscope.json")
    except RuntimeError as failed:       # py-spy needs ptrace; say so in the report rather than fail the bench
        spied = {"error": str(failed)[:500]}
        spy = work / "st-profiled"
        run_peer("statetable with its event log", profiled(spy, "bench_counts_profiled"), spy, env=local)
    summary = profile.summarize(spy / "events")
    text = profile.markdown(summary, rows[0]["detail"]["batches"])
    text += "\n" + profile.pyspy_markdown(spied) if "error" not in spied else \
        f"\npy-spy could not profile the run here: {spied['error'][:200]}\n"
    return {"events": events, "keys": keys, "rows": rows, "warm": warm,
            "profile": {**summary, "py_spy": spied, "markdown": text}}


def recovery(bootstrap: str, work: Path, keys: int) -> dict:
    topic, head = "bench-recovery", int(keys * 0.9)
    reference = produce_distinct(bootstrap, topic, 0, head)
    st = lambda *extra: peers.statetable(bootstrap, topic, work / "st", work / "st/data", "--table", "bench_recovery",
                                         *extra)
    run_peer("statetable build (snapshot)", st("--mode", "build", "--snapshot"), work / "st", env=peers.QUIET_SPARK)
    reference.update(produce_distinct(bootstrap, topic, head, keys - head))
    run_peer("statetable build (changelog tail)", st("--mode", "build"), work / "st", env=peers.QUIET_SPARK)
    restored = run_peer("statetable", st("--mode", "recover"), work / "st")
    run_peer("Quix build", peers.quix(bootstrap, topic, work / "quix", work / "quix/state", "bench-recovery",
                                      "--events", str(keys)), work / "quix")
    run_peer("Spark build", peers.spark_structured_streaming(bootstrap, topic, work / "sss", work / "sss/checkpoint"),
             work / "sss", env=peers.QUIET_SPARK)
    # Quix and Spark recover by processing one more event after their local state is gone.
    shutil.rmtree(work / "quix" / "state")
    after = {**reference, **produce_distinct(bootstrap, topic, keys, 1)}
    quix = run_peer("Quix Streams", peers.quix(bootstrap, topic, work / "quix", work / "quix/state", "bench-recovery",
                                               "--events", "1", "--mode", "recover"), work / "quix")
    spark = run_peer("Spark Structured Streaming", peers.spark_structured_streaming(
        bootstrap, topic, work / "sss", work / "sss/checkpoint", "--mode", "recover"), work / "sss",
        env=peers.QUIET_SPARK)
    rows = []
    for run, expected, seconds, how in (
            (restored, reference, restored.result["processing_seconds"], "newest snapshot + changelog tail"),
            (quix, after, quix.result["seconds_to_first_event"], "changelog replay"),
            (spark, after, spark.result["processing_seconds"], "checkpoint reload (first batch)")):
        check = compare(run.name, run.result.pop("counts"), expected)
        rows.append({"system": run.name, "how": how, "recovery_seconds": seconds, "wall_seconds": run.wall_seconds,
                     "peak_rss_mb": run.peak_rss_mb, "check": check, "detail": run.result})
        print(f"[recovery] {run.name}: {seconds:.2f}s ({how}), {check['differences']} keys differ", flush=True)
    return {"keys": keys, "tail_keys": keys - head, "rows": rows}


def formats(events: int, out: Path) -> dict:
    """Workload 1 over the same events as JSON and as Avro, statetable's two passes beside Spark
    Structured Streaming (bench.formats, in a process of its own); its JSON also to formats.json."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "bench.formats", "--events", str(events), "--runs", "1"],
                          capture_output=True, text=True, check=True)
    text = done.stdout[done.stdout.index("\n{") + 1:]
    (out / "formats.json").write_text(text)
    return json.loads(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--recovery-keys", type=int, default=1_000_000)
    parser.add_argument("--freshness-samples", type=int, default=10)
    parser.add_argument("--scheduled-samples", type=int, default=3,
                        help="samples of scheduled-mode freshness (each waits up to a minute and a DAG run); 0 skips")
    parser.add_argument("--port", type=int, default=25592)
    parser.add_argument("--formats-events", type=int, default=1_000_000,
                        help="events of the JSON-against-Avro rows (bench.formats; its own broker)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "benchmarks")
    args = parser.parse_args()

    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": peers.versions(),
                     "machine": report.machine()}
    work = Path(tempfile.mkdtemp(prefix="statetable-bench-compare-"))
    with private_broker(args.port) as cfg:
        results["throughput"] = throughput(cfg.kafka_bootstrap, work / "count", args.events, args.keys, args.port + 7)
        results["recovery"] = recovery(cfg.kafka_bootstrap, work / "recovery", args.recovery_keys)
        results["freshness"] = {"rows": [
            freshness.statetable_warm(cfg.kafka_bootstrap, work / "fresh", args.freshness_samples),
            freshness.quix(cfg.kafka_bootstrap, work / "fresh", args.freshness_samples)]}
        if args.scheduled_samples:
            results["freshness"]["rows"].insert(0, freshness.statetable_scheduled(
                cfg.kafka_bootstrap, work / "fresh", args.scheduled_samples, args.port + 10))
    results["formats"] = formats(args.formats_events, args.out)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table = report.write(results, args.out)
    print(table)
    shutil.rmtree(work, ignore_errors=True)
    checked = [*results["throughput"]["rows"], *results["recovery"]["rows"], *results["throughput"]["warm"]["rows"],
               *results["throughput"]["warm"]["first_batches"]]
    wrong = [r["check"] for r in checked if r["check"]["differences"]] + \
        [r["check"] for r in results["formats"]["batches"] + results["formats"]["spark_structured_streaming"]
         if r["check"] != "ok"]
    if wrong:
        print("RESULT MISMATCH:", json.dumps(wrong, indent=1), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
