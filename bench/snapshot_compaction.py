"""What an incremental snapshot uploads after 1% of a partition's keys change, by RocksDB
compaction style (#46: "a snapshot after 1% change uploads at most 5% of a full one").

An incremental snapshot uploads the SST files the store does not hold yet. Leveled compaction
(RocksDB's default) merges each flush into level 1, and with keys changed at random every file
of level 1 overlaps the flush, so every few snapshots the whole partition is rewritten and
uploaded again. Universal compaction merges the small new runs among themselves and rewrites
the large base run only when the space it wastes passes a bound, so most snapshots upload about
what changed. This measures both on one partition, side by side in one run, with the partition
written and checkpointed as statetable's RocksDB backend does (a synced write batch per batch,
a checkpoint per snapshot); it also reports what universal compaction costs: disk (space
amplification) and point reads.

    .venv/bin/python -m bench.snapshot_compaction [--keys 500000] [--snapshots 60]

Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _options(style: str):
    from rocksdict import DBCompactionStyle, Options, UniversalCompactOptions

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)
    options.increase_parallelism(2)
    if style.startswith("universal"):
        options.set_compaction_style(DBCompactionStyle.universal())
        amplification, trigger = re.fullmatch(r"universal(?:-(\d+))?(?:-t(\d+))?", style).groups()
        uco = UniversalCompactOptions()
        uco.max_size_amplification_percent = int(amplification or 200)
        options.set_universal_compaction_options(uco)
        if trigger:               # sorted runs before universal merges to reduce them (RocksDB: 4)
            options.set_level_zero_file_num_compaction_trigger(int(trigger))
    return options


def _ssts(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.suffix == ".sst"}


def run(style: str, keys: int, snapshots: int, changed: float, root: Path, seed: int = 7) -> dict:
    from rocksdict import Checkpoint, Rdict, WriteBatch, WriteOptions

    rng = random.Random(seed)
    db_path = root / style
    base, _, settle = style.partition("+settle")       # universal+settle50: RocksBackend.settle(0.50) first
    db = Rdict(str(db_path), _options(base))
    sync = WriteOptions()
    sync.sync = True

    def value(k: int, version: int) -> bytes:
        return (f"{k:012d}|{version:08d}|".encode() + rng.randbytes(40).hex().encode())[:100]

    batch = WriteBatch(raw_mode=True)
    for k in range(keys):
        batch.put(f"key-{k:010d}".encode(), value(k, 0))
        if len(batch) >= 50_000:
            db.write(batch, sync)
            batch = WriteBatch(raw_mode=True)
    db.write(batch, sync)

    held: set[str] = set()
    shares, seconds = [], []
    for n in range(snapshots + 1):
        if n:
            batch = WriteBatch(raw_mode=True)
            for k in rng.sample(range(keys), int(keys * changed)):
                batch.put(f"key-{k:010d}".encode(), value(k, n))
            db.write(batch, sync)
        target = root / f"{style}-cp"
        if target.exists():
            shutil.rmtree(target)
        started = time.perf_counter()
        if settle:
            from state.backends import sorted_runs

            runs = sorted_runs(db.live_files())
            if len(runs) > 1 and max(runs) < int(settle) / 100 * sum(runs):
                db.compact_range(None, None)
        Checkpoint(db).create_checkpoint(str(target))
        files = _ssts(target)
        new = sum(size for name, size in files.items() if name not in held)
        total = sum(files.values())
        if n:                      # the first snapshot is the full upload everything is compared with
            shares.append(new / total)
            seconds.append(time.perf_counter() - started)
        held |= set(files)
    probe = rng.sample(range(keys), 20_000)
    started = time.perf_counter()
    for k in probe:
        db.get(f"key-{k:010d}".encode())
    gets = time.perf_counter() - started
    live = sum(_ssts(db_path).values())
    db.close()
    logical = keys * (len("key-0000000000") + 100)
    return {"style": style, "snapshots": snapshots,
            "upload_share_median": round(statistics.median(shares), 4),
            "upload_share_p90": round(sorted(shares)[int(0.9 * (len(shares) - 1))], 4),
            "upload_share_max": round(max(shares), 4),
            "upload_share_mean": round(statistics.fmean(shares), 4),
            "snapshots_over_5pct": sum(s > 0.05 for s in shares),
            "checkpoint_s_median": round(statistics.median(seconds), 4),
            "sst_bytes": live, "space_amplification": round(live / logical, 2),
            "point_get_us": round(gets / len(probe) * 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--snapshots", type=int, default=60)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--styles", nargs="+", default=["leveled", "universal", "universal+settle25"],
                        help="leveled, or universal[-N][-tT] with N its max_size_amplification_percent (default 200) "
                             "and T its level0_file_num_compaction_trigger (default 4), "
                             "+settleP: merged into one run first when the largest holds under P%")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="statetable-bench-compaction-"))
    try:
        results = [run(style, args.keys, args.snapshots, args.changed, root) for style in args.styles]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"keys": args.keys, "changed_per_snapshot": args.changed, "results": results}, indent=2))


if __name__ == "__main__":
    main()
