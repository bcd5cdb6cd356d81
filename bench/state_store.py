"""State store benchmark: merge rate, commit rate with changelog, snapshot
and restore times. Prints one JSON object.

    .venv/bin/python -m bench.state_store            # starts its own broker on test ports
    .venv/bin/python -m bench.state_store --keys 1000000
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path


from bench.broker import private_broker  # noqa: E402
from state import codec  # noqa: E402
from state.aggregates import Count, RowAggregator  # noqa: E402
from state.backends import RocksBackend  # noqa: E402
from state.partition import StatePartition  # noqa: E402
from state.table import StateTable, TableSpec  # noqa: E402


def bench_merge(root: Path, partials: int, keys: int) -> dict:
    """Fold `partials` partial counts over `keys` keys into RocksDB in one commit (no changelog)."""
    part = StatePartition("merge", 0, RocksBackend(root / "merge"), RowAggregator({"n": Count()}))
    encoded = [codec.encode_key((f"key{i:07d}",)) for i in range(keys)]
    with part.begin(0) as tx:       # first commit creates the keys
        for key in encoded:
            tx.merge_encoded(key, (1,))
    started = time.perf_counter()
    tx = part.begin(1)
    for i in range(partials):
        tx.merge_encoded(encoded[i % keys], (1,))
    fold = time.perf_counter() - started
    result = tx.commit()
    seconds = time.perf_counter() - started
    assert part.get(("key0000000",)) == (1 + partials // keys,)
    part.close()
    return {"partials": partials, "keys": keys, "seconds": round(seconds, 3),
            "partials_per_s": round(partials / seconds), "keys_per_s": round(result.keys_changed / (seconds - fold)),
            "note": "keys_per_s: read-modify-write of the distinct keys at commit (multi-get, merge, encode, digest, WriteBatch)"}


def build_table(root: Path, bootstrap: str, keys: int, batches: int) -> tuple[StateTable, dict]:
    """One partition with `keys` keys written by `batches` commits through the changelog."""
    spec = TableSpec(f"bench-{uuid.uuid4().hex[:6]}", 1, RowAggregator({"n": Count()}))
    table = StateTable(spec, root / "state", bootstrap=bootstrap, snapshot_uri=str(root / "snapshots"))
    part = table.open(0)
    per_batch = keys // batches
    commit_seconds, records = 0.0, 0
    for b in range(batches):
        tx = part.begin(b)
        for i in range(b * per_batch, (b + 1) * per_batch):
            tx.merge_encoded(codec.encode_key((f"key{i:07d}",)), (1,))
        started = time.perf_counter()
        records += tx.commit().keys_changed
        commit_seconds += time.perf_counter() - started
    return table, {"records": records, "seconds": round(commit_seconds, 3),
                   "records_per_s": round(records / commit_seconds)}


def restore_both_ways(table: StateTable, snapshot_batch: int, original) -> dict:
    """Partition 0 restored from its newest snapshot plus the changelog after it, then from
    the whole changelog; both must give the writer's digest."""
    table.wipe_local()
    started = time.perf_counter()
    from_snapshot = table.restore(0)
    snap_restore_s = time.perf_counter() - started
    assert from_snapshot.snapshot_batch == snapshot_batch and from_snapshot.digest == original.digest
    table.snapshots.delete_all(table.spec.name, 0)
    table.wipe_local()
    started = time.perf_counter()
    from_changelog = table.restore(0)
    full_restore_s = time.perf_counter() - started
    assert from_changelog.digest == original.digest and from_changelog.key_count == original.key_count
    return {
        "keys": original.key_count,
        "snapshot_plus_tail_seconds": round(snap_restore_s, 3),
        "tail_records": from_snapshot.replayed_records,
        "full_replay_seconds": round(full_restore_s, 3),
        "full_replay_records": from_changelog.replayed_records,
        "speedup": round(full_restore_s / snap_restore_s, 1),
    }


def bench_restore_with_history(root: Path, bootstrap: str, keys: int, rounds: int) -> dict:
    """The same restore when every key was updated `rounds` times before the snapshot, as in a
    table that has run for a while (a compacted topic keeps its active segment whole, so the
    changelog holds every update), then a tail updating 10% of the keys."""
    spec = TableSpec(f"bench-h-{uuid.uuid4().hex[:6]}", 1, RowAggregator({"n": Count()}))
    table = StateTable(spec, root / "state-history", bootstrap=bootstrap, snapshot_uri=str(root / "snapshots-h"))
    part = table.open(0)
    encoded = [codec.encode_key((f"key{i:07d}",)) for i in range(keys)]
    slices, batch = 10, 0
    for _ in range(rounds):
        for s in range(slices):
            with part.begin(batch) as tx:
                for key in encoded[s::slices]:
                    tx.merge_encoded(key, (1,))
            batch += 1
    manifest = table.snapshot(0)
    with part.begin(batch) as tx:
        for key in encoded[::slices]:
            tx.merge_encoded(key, (1,))
    result = restore_both_ways(table, manifest.batch_id, part.meta)
    table.close()
    return {"updates_per_key_before_snapshot": rounds, **result}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--merge-partials", type=int, default=1_000_000)
    parser.add_argument("--merge-keys", type=int, default=100_000)
    parser.add_argument("--history-rounds", type=int, default=3,
                        help="updates per key before the snapshot in the restore_with_history figure")
    args = parser.parse_args()

    with private_broker(29492) as cfg:
        root = Path(tempfile.mkdtemp(prefix="statetable-bench-state-"))
        out = {"merge": bench_merge(root, args.merge_partials, args.merge_keys)}

        # 90% of the keys, snapshot, then the last 10% as the changelog tail.
        table, commit = build_table(root, cfg.kafka_bootstrap, int(args.keys * 0.9), 9)
        out["commit_with_changelog"] = commit
        part = table.open(0)
        started = time.perf_counter()
        manifest = table.snapshot(0)
        snap_s = time.perf_counter() - started
        tail = part.begin(9)
        for i in range(int(args.keys * 0.9), args.keys):
            tail.merge_encoded(codec.encode_key((f"key{i:07d}",)), (1,))
        tail.commit()
        assert part.meta.key_count == args.keys
        started = time.perf_counter()
        full_manifest = table.snapshot(0)
        full_snap_s = time.perf_counter() - started
        original = part.meta
        out["snapshot"] = {"keys": args.keys, "seconds": round(full_snap_s, 3),
                           "ms_per_1m_keys": round(full_snap_s * 1000 * 1_000_000 / args.keys, 1),
                           "bytes": sum(f["size"] for f in full_manifest.files.values()),
                           "seconds_at_90pct": round(snap_s, 3)}
        # Restore from the 90% snapshot + 10% tail: drop the newest snapshot first.
        shutil.rmtree(full_manifest.path)
        out["restore"] = restore_both_ways(table, manifest.batch_id, original)
        table.close()
        out["restore_with_history"] = bench_restore_with_history(root, cfg.kafka_bootstrap, args.keys,
                                                                 args.history_rounds)
        print(json.dumps(out, indent=1))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
