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
import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path

from catalog.batch_log import BatchCommit, BatchLog
from catalog.definitions import TableDefinition
from catalog.registry import spec_of
from catalog.runtime import Runtime
from spark_jobs.steps.offsets import OffsetDiscontinuity
from spark_jobs.batches.planning import lag


#: Batch durations, seconds: a warm batch takes well under a second, a cold or large one minutes.
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))


@dataclass
class BatchTotals:
    """What a table's committed batches add up to, up to `last_batch`: folded one commit at a
    time, so a long-lived reader (a metrics scrape) adds only the commits it has not seen."""

    last_batch: int = -1
    read: int = 0
    merged: int = 0
    keys_changed: int = 0
    dead_lettered: int = 0
    dead: dict[str, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    seconds_sum: float = 0.0
    keys: dict[int, int] = field(default_factory=dict)        # partition -> keys after its last batch
    # Confluent's wire format: writer schema id -> [records, the batch that first read it, the last]
    schemas: dict[int, list[int]] = field(default_factory=dict)
    committed_at: float | None = None
    last: BatchCommit | None = None

    @property
    def batches(self) -> int:
        return self.buckets[-1]        # the +Inf bucket counts every batch

    def add(self, commit) -> None:
        counts = commit.counts
        self.read += counts.get("read", 0)
        self.merged += counts.get("parsed", 0)
        self.keys_changed += counts.get("keys_changed", 0)
        self.dead_lettered += counts.get("dead_lettered", 0)
        for name, n in counts.items():
            if name.startswith("dead_") and name != "dead_lettered":
                self.dead[name[5:]] = self.dead.get(name[5:], 0) + n
            elif name.startswith("schema_"):
                seen = self.schemas.setdefault(int(name[7:]), [0, commit.batch_id, commit.batch_id])
                seen[0] += n
                seen[2] = commit.batch_id
        for index, bound in enumerate(BUCKETS):
            if commit.seconds <= bound:
                self.buckets[index] += 1
        self.seconds_sum += commit.seconds
        self.keys.update(commit.key_counts or {})
        self.last_batch = commit.batch_id
        self.committed_at = commit.committed_at
        self.last = commit


class _Folds:
    """One fold per batch log, kept for the life of the process: the State tables page, `/tables`
    and `/metrics` of a long-lived server read only the commits since their last look."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.folds: dict[str, BatchTotals] = {}

    def fold(self, rt: Runtime, table: str) -> BatchTotals:
        """A copy of the table's totals, brought up to its newest commit. A log begun again (its
        folded last batch gone) is folded afresh."""
        log = BatchLog(rt.batch_dir(table))
        with self.guard:
            folded = self.folds.setdefault(str(log.location), BatchTotals())
            new = log.commits_after(folded.last_batch)
            if not new and folded.last_batch >= 0 and log.commit(folded.last_batch) is None:
                folded = self.folds[str(log.location)] = BatchTotals()
                new = log.commits_after(-1)
            for commit in new:
                folded.add(commit)
            return _copied(folded)


def _copied(totals: BatchTotals) -> BatchTotals:
    return dataclasses.replace(totals, dead=dict(totals.dead), buckets=list(totals.buckets), keys=dict(totals.keys),
                               schemas={k: list(v) for k, v in totals.schemas.items()})


FOLDS = _Folds()


VERIFY_KEEP = 1000          # drills in a table's verify history (a daily drill: about three years)


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
        size = out.tell()
    if size > VERIFY_KEEP * 2 * len(line):     # rarely: cut to the newest VERIFY_KEEP records
        kept = path.read_text().splitlines()[-VERIFY_KEEP:]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(kept) + "\n")
        os.replace(tmp, path)


def verify_fields(verified: dict) -> dict:
    """The verify result's part of a history record (`verified` is a VerifyResult as JSON, with
    `ok`; empty when the verify never ran)."""
    return {
        "batch_id": verified.get("batch_id"), "keys_compared": verified.get("keys_compared"),
        "differences": verified["missing"] + verified["unexpected"] + verified["different"] if verified else None,
        "digest_mismatches": verified.get("digest_mismatches"), "examples": verified.get("examples", []),
        "verify_seconds": verified.get("seconds"), "chained_from": verified.get("chained_from"),
    }


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def verify_verdict(record: dict | None, now: float | None = None) -> tuple[str, str]:
    """What a table's last restore-and-verify proved, in words, and its kind: `ok` (exact, with
    keys compared), `bad` (the state differs from the recomputation), `failed` (the drill broke
    before it could compare: never a difference) or `none` (nothing proved yet).

    A verify that compared no keys is not proof, and a drill that died on a timeout found no
    difference: the State tables page, `statetable tables` and the drill's log all say which."""
    if record is None:
        return "not verified yet", "none"
    now = time.time() if now is None else now
    when = age_text(now - record["recorded_at"]) if record.get("recorded_at") else "at an unknown time"
    failure = record.get("failure") or "none"
    after = "" if failure == "none" else f" after {failure}"
    if record.get("skipped"):
        return f"not verified{after}: {record.get('reason') or 'the failure could not be injected'} ({when})", "none"
    if record.get("drill_failed") or record.get("differences") is None:
        cause = record.get("drill_failed") or "a step before the verify failed"
        return f"drill failed{after}: {cause} ({when})", "failed"
    batch = record.get("batch_id")
    at = f"batch {batch}" if batch is not None else "no batch"
    if not record.get("keys_compared"):
        return f"not verified yet: {at} holds no keys to compare ({when})", "none"
    restore = record.get("restore_seconds")
    restored = f", restore {restore:.2f}s" if isinstance(restore, (int, float)) else ""
    if record.get("ok"):
        return f"exact at {at}{after}: {record['keys_compared']} keys{restored} ({when})", "ok"
    return (f"DIFFERS at {at}{after}: {record['differences']} of {record['keys_compared']} keys{restored} "
            f"({when})", "bad")


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

    import pyarrow.fs as pafs

    fs, folder = _store_folder(rt, name)
    with fs.open_output_stream(f"{folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json") as out:
        out.write(line.encode())
    found = sorted(f.path for f in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
                   if f.type == pafs.FileType.File)
    for old in found[:-VERIFY_KEEP]:        # the newest VERIFY_KEEP records stay
        fs.delete_file(old)


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


def shape(table: TableDefinition) -> str:
    """What the table is, in the words its SQL would use."""
    if table.stream_join is not None:
        j = table.stream_join
        grouped = f"aggregate by {', '.join(table.key_columns)} over a " if table.aggregates else ""
        return f"{grouped}windowed {j.kind} join of streams {table.topic} and {j.topic}"
    if table.table_join:
        left = table.input_table or f"stream {table.topic}"
        return f"join of tables ({left} with {', '.join(j.table for j in table.joins)})"
    if table.over_table:
        return f"aggregate over table {table.input_table}"
    window = table.window
    kind = None if window is None else "session" if window.session else "tumbling" \
        if (window.advance_ms or window.size_ms) == window.size_ms else "hopping"
    windowed = f", {kind} windows" if kind else ""
    return ("aggregate" if table.kind == "aggregate" else "rows by key") + f" of topic {table.topic}{windowed}"


def utc(epoch: float | None) -> str | None:
    from datetime import datetime, timezone

    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


PROBE_SECONDS = 5.0
PROBE_KEPT_SECONDS = 10.0
_probes: dict[str, tuple[float, str | None]] = {}       # bootstrap -> (monotonic time of the probe, why silent)
_probes_lock = threading.Lock()


def broker_silence(rt: Runtime) -> str | None:
    """Why no Kafka broker answers at the stack's address (one line), or None when one does.

    A status of many tables (`statetable tables`, the State tables page) asks the broker each
    table's lag and its topics' replication; with the broker down each question waited out its
    own timeout, and the shipped nine tables took 139 s to list. One probe, kept a few seconds
    whatever it found, answers for all of them: a page or a scrape costs one metadata request,
    not one per table."""
    from confluent_kafka import KafkaException

    from catalog.messages import one_line
    from state.kafka_admin import admin
    from state.kafka_errors import connection_error, is_connection_failure

    with _probes_lock:
        probed = _probes.get(rt.bootstrap)
        if probed and time.monotonic() - probed[0] < PROBE_KEPT_SECONDS:
            return probed[1]
        client = admin(rt.bootstrap)
        why = None
        try:
            client.list_topics(timeout=PROBE_SECONDS)
        except KafkaException as exc:       # another error came from a broker: the table's own checks report it
            if exc.args and is_connection_failure(exc.args[0]):
                why = one_line(connection_error(rt.bootstrap, client, "listing topics"))
        _probes[rt.bootstrap] = (time.monotonic(), why)
        return why


def _lag(table: TableDefinition, rt: Runtime) -> int | str:
    try:
        return lag(table.name, rt, table.topic, table)
    except OffsetDiscontinuity as exc:
        return f"discontinuity: {exc}"
    except Exception as exc:        # the page must render even with the broker down
        from catalog.messages import one_line

        return f"unknown: {one_line(exc)}"


def table_status(table: TableDefinition, rt: Runtime) -> dict:
    batch_log = BatchLog(rt.batch_dir(table.name))
    totals = FOLDS.fold(rt, table.name)
    pending = batch_log.pending_plan()
    last = totals.last
    silent = broker_silence(rt)
    current_lag = f"unknown: {silent}" if silent else _lag(table, rt)
    history = verify_history(rt, table.name, limit=1)
    changelog = spec_of(table, rt).changelog
    verdict = verify_verdict(history[0] if history else None)
    return {
        "table": table.name,
        "kind": table.kind,
        "shape": shape(table),
        "topic": table.topic,
        "key": list(table.key_columns),
        "partitions": table.partitions,
        "schedule": table.schedule,
        "last_batch": None if last is None else {
            "batch_id": last.batch_id, "committed_at": last.committed_at, "committed_at_utc": utc(last.committed_at),
            "seconds": last.seconds,
            "read": last.counts.get("read", 0), "dead_lettered": last.counts.get("dead_lettered", 0),
            "late": last.counts.get("late", 0), "keys_changed": last.counts.get("keys_changed", 0),
        },
        "batches": totals.batches,
        "keys": sum(totals.keys.values()) if totals.keys else 0,
        "pending_batch": None if pending is None else pending.batch_id,
        "lag": current_lag,
        "freshness_seconds": None if last is None else round(time.time() - last.committed_at, 1),
        "snapshot_age_seconds": snapshot_age_seconds(table, rt),
        "dead_letters": totals.dead_lettered,
        "dead_letters_by_reason": dict(sorted(totals.dead.items())),
        # Which writer schemas the topic's records carried, and when each first arrived: a producer's
        # new schema is visible here the batch it is read (Confluent's wire format only).
        **({"writer_schemas": [{"id": sid, "records": n, "first_batch": first, "last_batch": newest}
                               for sid, (n, first, newest) in sorted(totals.schemas.items())],
            "last_batch_writer_schema_ids": sorted(int(k[7:]) for k in (last.counts if last else {})
                                                   if k.startswith("schema_"))}
           if totals.schemas else {}),
        "last_verify": history[0] if history else None,
        "verified": {"text": verdict[0], "kind": verdict[1]},
        "durability_warnings": durability_warnings(rt, [changelog, rt.dead_letter_topic(table.name)]
                                                   + ([table.output_topic] if table.output_topic else []), silent),
    }


def durability_warnings(rt: Runtime, topics: list[str], silent: str | None = None) -> list[str]:
    """The table's topics that live on fewer brokers than statetable asks for (one line each);
    the check itself failing is a warning too, never a silently clean bill."""
    from state.kafka_admin import admin, replication_warnings

    if silent:
        return [f"replication of {', '.join(topics)} unknown: {silent}"]
    try:
        return replication_warnings(admin(rt.bootstrap), rt.bootstrap, topics)
    except Exception as exc:        # noqa: BLE001 - the page must render even with the broker down
        return [f"replication of {', '.join(topics)} unknown: {exc}"]
