"""Per-table metrics in the OpenMetrics format, for `/metrics` on every query server.

Operators scrape numbers, not JSON pages: lag, freshness, batch durations, dead letters by
reason, state size, snapshot and verify ages. Everything here is read from what the tables
already leave behind (the batch log, the snapshot store, the verify history, the state
folders, the broker's offsets), so every host that serves queries exports the same values
and a scrape never touches a writer.

Counters and the batch-duration histogram fold the batch log: each scrape reads only the
commits after the last one it folded, so its cost grows with the batches since the previous
scrape, not with the table's age.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from catalog.runtime import Runtime
from ops.status import BUCKETS, FOLDS

PREFIX = "statetable"
log = logging.getLogger("statetable.metrics")


def _bytes_under(path: Path) -> int:
    total = 0
    for entry in path.rglob("*"):
        try:
            if entry.is_file():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


class TableCollector(Collector):
    """The metric families of the given tables' status rows (ops.status.table_status plus the
    server's own `readable_batch`), computed at scrape time."""

    def __init__(self, rt: Runtime | None, rows: list[dict], now: float | None = None) -> None:
        self.rt = rt
        self.rows = rows
        self.now = time.time() if now is None else now

    def collect(self):
        def gauge(name: str, doc: str, unit: str = ""):
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["table"], unit=unit)

        last_batch = gauge("last_batch", "id of the table's last committed batch")
        commit_age = gauge("last_commit_age", "seconds since the table's last commit", "seconds")
        lag_records = gauge("lag_records", "records in the input topic not yet read by a committed batch")
        lag_seconds = gauge("lag", "0 when caught up, else seconds since the last commit: how long "
                                   "unread records have waited at most", "seconds")
        keys = gauge("keys", "keys in the table's state after its last batches")
        state_bytes = gauge("state_bytes", "bytes of the table's local state folders on this host")
        snapshot_age = gauge("snapshot_age", "age of the oldest newest snapshot over the partitions",
                             "seconds")
        verify_ok = gauge("last_verify_ok", "1 if the last restore-and-verify proved the table exact, 0 if not")
        verify_age = gauge("last_verify_age", "seconds since the last restore-and-verify", "seconds")
        replica_lag = gauge("replica_lag_batches", "batches this server's answers trail the last commit")
        read = CounterMetricFamily(f"{PREFIX}_records_read", "records read by committed batches", labels=["table"])
        merged = CounterMetricFamily(f"{PREFIX}_records_merged", "records merged into state by committed batches",
                                     labels=["table"])
        changed = CounterMetricFamily(f"{PREFIX}_keys_changed", "keys changed by committed batches",
                                      labels=["table"])
        dead = CounterMetricFamily(f"{PREFIX}_records_dead_lettered", "records sent to the dead-letter topic",
                                   labels=["table", "reason"])
        schemas = CounterMetricFamily(f"{PREFIX}_records_by_writer_schema",
                                      "records read per writer schema id (Confluent's wire format)",
                                      labels=["table", "schema_id"])
        duration = HistogramMetricFamily(f"{PREFIX}_batch_duration_seconds", "seconds per committed batch",
                                         labels=["table"])
        failed = gauge("scrape_failed", "1 when this table's metrics could not be read (the server log says why)")
        for row in self.rows:
            name = row["table"]
            try:
                folded = FOLDS.fold(self.rt, name)
            except Exception:       # noqa: BLE001 - one table must not take every table's scrape down
                log.exception("metrics of %s", name)
                failed.add_metric([name], 1)
                continue
            failed.add_metric([name], 0)
            if folded.batches:
                last_batch.add_metric([name], folded.last_batch)
                commit_age.add_metric([name], max(0.0, self.now - folded.committed_at))
                keys.add_metric([name], sum(folded.keys.values()))
            if isinstance(row.get("lag"), int):
                lag_records.add_metric([name], row["lag"])
                caught_up = row["lag"] == 0 or folded.committed_at is None
                lag_seconds.add_metric([name], 0.0 if caught_up else max(0.0, self.now - folded.committed_at))
            state_bytes.add_metric([name], _bytes_under(self.rt.state_dir / name))
            if row.get("snapshot_age_seconds") is not None:
                snapshot_age.add_metric([name], row["snapshot_age_seconds"])
            verify = row.get("last_verify") or {}
            if verify.get("ok") is not None and verify.get("recorded_at") is not None:
                verify_ok.add_metric([name], 1 if verify["ok"] else 0)
                verify_age.add_metric([name], max(0.0, self.now - verify["recorded_at"]))
            if row.get("lag_batches") is not None:
                replica_lag.add_metric([name], row["lag_batches"])
            read.add_metric([name], folded.read)
            merged.add_metric([name], folded.merged)
            changed.add_metric([name], folded.keys_changed)
            for reason, n in sorted(folded.dead.items()):
                dead.add_metric([name, reason], n)
            for schema_id, (n, _, _) in sorted(folded.schemas.items()):
                schemas.add_metric([name, str(schema_id)], n)
            # add() counted each batch in every bucket it fits: the counts are cumulative already.
            duration.add_metric([name], [(_le(b), n) for b, n in zip(BUCKETS, folded.buckets)], folded.seconds_sum)
        yield from (failed, last_batch, commit_age, lag_records, lag_seconds, keys, state_bytes, snapshot_age, verify_ok,
                    verify_age, replica_lag, read, merged, changed, dead, schemas, duration)


class StackCollector(Collector):
    """What holds for the stack, not one table: whether its batch service keeps up with the
    tables' schedules (ops.capacity)."""

    def __init__(self, rt: Runtime | None, now: float | None = None) -> None:
        self.rt = rt
        self.now = time.time() if now is None else now

    def collect(self):
        from ops import capacity

        over = GaugeMetricFamily(f"{PREFIX}_over_capacity", "1 while a run in the last hour took longer than its "
                                                             "table's schedule interval (the stack falls behind)")
        runs_over = GaugeMetricFamily(f"{PREFIX}_runs_over_interval", "runs in the last hour that took longer than "
                                                                       "their table's schedule interval")
        queued = GaugeMetricFamily(f"{PREFIX}_batch_queue_longest", "the longest wait for a batch slot among the "
                                                                    "last hour's runs", unit="seconds")
        state = capacity.read(self.rt) if self.rt is not None else None
        if state is not None:
            recent = [r for r in state.get("over_interval", []) if r["ended_at"] >= self.now - capacity.WINDOW_S]
            over.add_metric([], 1 if recent else 0)
            runs_over.add_metric([], len(recent))
            queued.add_metric([], state.get("longest_queue_s", 0.0))
        yield from (over, runs_over, queued)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def exposition(rt: Runtime, rows: list[dict], accept: str | None) -> tuple[bytes, str]:
    """The scrape's body and content type: OpenMetrics when the scraper asks for it (Prometheus
    does), else Prometheus' text format."""
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(rt, rows))
    registry.register(StackCollector(rt))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def exported_names() -> set[str]:
    """Every sample name `/metrics` can export (dashboards and alert rules may use only these)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    families = [*TableCollector(None, []).collect(), *StackCollector(None).collect()]
    return {family.name + suffix for family in families for suffix in suffixes[family.type]}
