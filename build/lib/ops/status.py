"""What a table looks like from outside: last batch, lag, snapshot age,
last verify result, dead letters. The Airflow UI page, the query API's
table list and the DAG tasks all read it from here.

Verify results are appended to `<data>/verify/<table>.jsonl`, one line per
restore-and-verify run, so the history survives Airflow's metadata cleanup
and any process can read it without Airflow; with a durable store, each is an
object under `<store>/verify/<table>/`, so every host sees them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from catalog.batch_log import BatchLog
from catalog.definitions import TableDefinition
from catalog.registry import spec_of
from catalog.runtime import Runtime
from spark_jobs.offsets import OffsetDiscontinuity, lag


def _verify_file(rt: Runtime, name: str) -> Path:
    return rt.data_dir / "verify" / f"{name}.jsonl"


def record_verify(rt: Runtime, name: str, record: dict) -> None:
    line = json.dumps({"recorded_at": time.time(), **record}, default=str, sort_keys=True)
    if rt.store_uri:
        _record_in_store(rt, name, line)
        return
    path = _verify_file(rt, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:        # one write of a short line: appends never interleave
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def verify_fields(verified: dict) -> dict:
    """The verify result's part of a history record (`verified` is a VerifyResult as JSON, with
    `ok`; empty when the verify never ran)."""
    return {
        "batch_id": verified.get("batch_id"), "keys_compared": verified.get("keys_compared"),
        "differences": verified["missing"] + verified["unexpected"] + verified["different"] if verified else None,
        "digest_mismatches": verified.get("digest_mismatches"), "examples": verified.get("examples", []),
        "verify_seconds": verified.get("seconds"),
    }


def verify_history(rt: Runtime, name: str, limit: int = 20) -> list[dict]:
    if rt.store_uri:
        return _history_in_store(rt, name, limit)
    path = _verify_file(rt, name)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()[-limit:]
    return [json.loads(line) for line in reversed(lines) if line.strip()]


def _store_folder(rt: Runtime, name: str):
    from catalog.runtime import arrow_filesystem

    return arrow_filesystem(f"{rt.store_uri}/verify/{name}")


def _record_in_store(rt: Runtime, name: str, line: str) -> None:
    """With a store, any Airflow worker may run the drill and any host reads the history: a
    record is an object of its own (S3 appends nothing), named to sort by time."""
    import uuid

    fs, folder = _store_folder(rt, name)
    with fs.open_output_stream(f"{folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json") as out:
        out.write(line.encode())


def _history_in_store(rt: Runtime, name: str, limit: int) -> list[dict]:
    import pyarrow.fs as pafs

    fs, folder = _store_folder(rt, name)
    found = [f.path for f in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
             if f.type == pafs.FileType.File]
    records = []
    for path in sorted(found, reverse=True)[:limit]:
        with fs.open_input_stream(path) as src:
            records.append(json.loads(src.read()))
    return records


def snapshot_age_seconds(table: TableDefinition, rt: Runtime) -> float | None:
    """Age of the oldest 'newest snapshot' over the partitions: how far back a restore may start."""
    from state.snapshots import SnapshotStore

    store = SnapshotStore(rt.snapshot_uri)
    newest = []
    for p in range(table.partitions):
        manifests = store.list(table.name, p)
        if not manifests:
            return None
        newest.append(manifests[0].created_at)
    return round(time.time() - min(newest), 1)


def table_status(table: TableDefinition, rt: Runtime) -> dict:
    batch_log = BatchLog(rt.batch_dir(table.name))
    commits = batch_log.commits()
    pending = batch_log.pending_plan()
    last = commits[-1] if commits else None
    try:
        current_lag = lag(table.name, rt, table.topic, table)
    except OffsetDiscontinuity as exc:
        current_lag = f"discontinuity: {exc}"
    except Exception as exc:        # the page must render even with the broker down
        current_lag = f"unknown ({type(exc).__name__})"
    history = verify_history(rt, table.name, limit=1)
    changelog = spec_of(table, rt).changelog
    return {
        "table": table.name,
        "kind": table.kind,
        "key": list(table.key_columns),
        "partitions": table.partitions,
        "schedule": table.schedule,
        "last_batch": None if last is None else {
            "batch_id": last.batch_id, "committed_at": last.committed_at, "seconds": last.seconds,
            "read": last.counts.get("read", 0), "dead_lettered": last.counts.get("dead_lettered", 0),
            "late": last.counts.get("late", 0), "keys_changed": last.counts.get("keys_changed", 0),
        },
        "pending_batch": None if pending is None else pending.batch_id,
        "lag": current_lag,
        "snapshot_age_seconds": snapshot_age_seconds(table, rt),
        "dead_letters": sum(c.counts.get("dead_lettered", 0) for c in commits),
        "last_verify": history[0] if history else None,
        "durability_warnings": durability_warnings(rt, [changelog, rt.dead_letter_topic(table.name)]
                                                   + ([table.output_topic] if table.output_topic else [])),
    }


def durability_warnings(rt: Runtime, topics: list[str]) -> list[str]:
    """The table's topics that live on fewer brokers than statetable asks for (one line each);
    the check itself failing is a warning too, never a silently clean bill."""
    from state.kafka_admin import admin, replication_warnings

    try:
        return replication_warnings(admin(rt.bootstrap), rt.bootstrap, topics)
    except Exception as exc:        # noqa: BLE001 - the page must render even with the broker down
        return [f"replication of {', '.join(topics)} unknown: {exc}"]
