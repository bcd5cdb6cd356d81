"""Recovery with and without a standby: a 1M-key table's partitions restored by a writer that
lost its local copy, from the snapshots plus the changelog, and from a query replica on its host
(Kafka Streams' "standby replicas to reduce recovery time"); and a query replica restarted after
a stop, from its own copy plus the changelog, against one restored afresh. One run, side by side.

The state library only (no Spark): a private broker, a table of `--keys` keys in 4 partitions
written in `--batches` batches, a snapshot halfway, a replica following it. Every restored copy
must equal the writer's (digest and key count per partition). Prints one JSON object.

    .venv/bin/python -m bench.replica_seed [--keys 1000000] [--batches 10]
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

PARTITIONS = 4


def _write_batches(table, keys: int, batches: int, first: int, snapshot_at: int | None) -> None:
    """Each batch adds keys/batches new keys and updates as many old ones."""
    per = keys // batches
    for batch in range(first, first + batches):
        rows: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        for i in range(per):
            key = (f"k{(batch - first) * per + i:08d}",)
            rows[table.partition_of(key)].append(key)
            if batch > first:
                old = (f"k{(batch - first - 1) * per + i:08d}",)
                rows[table.partition_of(old)].append(old)
        for p, ks in rows.items():
            with table.open(p).begin(batch) as tx:
                for key in ks:
                    tx.merge(key, (1, 1.0))
        if batch == snapshot_at:
            for p in range(PARTITIONS):
                table.snapshot(p)


def _metas(table) -> dict[int, tuple]:
    return {p: (table.open(p).meta.applied_batch, table.open(p).meta.digest, table.open(p).meta.key_count)
            for p in range(PARTITIONS)}


def _timed_open(make, wipe: Path | None) -> tuple[float, dict, object]:
    if wipe is not None:
        shutil.rmtree(wipe, ignore_errors=True)
    table = make()
    started = time.monotonic()
    for p in range(PARTITIONS):
        table.open(p)
    seconds = time.monotonic() - started
    return round(seconds, 2), _metas(table), table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--broker-port", type=int, default=25692)
    args = parser.parse_args()

    from bench.broker import private_broker
    from state.aggregates import Count, RowAggregator, Sum
    from state.table import StateTable, TableSpec

    root = Path(tempfile.mkdtemp(prefix="statetable-bench-seed-"))
    spec = TableSpec("seed_bench", PARTITIONS, RowAggregator({"n": Count(), "s": Sum()}),
                     changelog=f"seed-bench-{uuid.uuid4().hex[:8]}-changelog")
    snapshots = str(root / "snapshots")
    try:
        with private_broker(args.broker_port) as cfg:
            bootstrap = cfg.kafka_bootstrap
            writer = StateTable(spec, root / "writer", bootstrap=bootstrap, snapshot_uri=snapshots)
            _write_batches(writer, args.keys, args.batches, 0, args.batches // 2 - 1)
            replica = StateTable(spec, root / "host" / "replicas", bootstrap=bootstrap, snapshot_uri=snapshots,
                                 create_topics=False)
            for p in range(PARTITIONS):
                replica.follow(p)
            truth = _metas(writer)
            writer.close()

            def writer_table(seeds=()):
                return lambda: StateTable(spec, root / "writer", bootstrap=bootstrap, snapshot_uri=snapshots,
                                          create_topics=False, seed_dirs=seeds)

            plain, plain_metas, t = _timed_open(writer_table(), root / "writer" / spec.name)
            t.close()
            seeded, seeded_metas, t = _timed_open(writer_table((root / "host" / "replicas",)), root / "writer" / spec.name)
            seeded_from = sorted(p for p, r in t.restored.items() if r.seeded_from)

            # A replica stopped while 3 more batches commit, then restarted on its own copy; against a
            # replica restored afresh (snapshot + changelog) to the same batch.
            replica.close()
            _write_batches(t, args.keys // args.batches * 3, 3, args.batches, None)
            after = _metas(t)
            t.close()

            def follow_all(table) -> float:
                started = time.monotonic()
                for p in range(PARTITIONS):
                    table.follow(p)
                return round(time.monotonic() - started, 2)

            resumed = StateTable(spec, root / "host" / "replicas", bootstrap=bootstrap, snapshot_uri=snapshots,
                                 create_topics=False)
            resume_s = follow_all(resumed)
            resumed_metas = _metas(resumed)
            resumed.close()
            shutil.rmtree(root / "fresh", ignore_errors=True)
            fresh = StateTable(spec, root / "fresh", bootstrap=bootstrap, snapshot_uri=snapshots, create_topics=False)
            fresh_s = follow_all(fresh)
            fresh_metas = _metas(fresh)
            fresh.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = sum(m[2] for m in truth.values())
    print(json.dumps({
        "keys": keys, "partitions": PARTITIONS, "batches": args.batches,
        "snapshot_batch": args.batches // 2 - 1,
        "writer_restore_s": {"snapshot_and_changelog": plain, "local_replica_and_changelog": seeded},
        "speedup": round(plain / seeded, 2) if seeded else None,
        "seeded_partitions": seeded_from,
        "replica_restart_s": {"own_copy_and_changelog": resume_s, "restored_afresh": fresh_s,
                              "batches_missed": 3, "target_30s_met": resume_s <= 30},
        "exact": plain_metas == truth and seeded_metas == truth and resumed_metas == after and fresh_metas == after,
    }, indent=1))


if __name__ == "__main__":
    main()
