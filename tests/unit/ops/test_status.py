"""ops.status.verify_verdict: what the State tables page and `statetable tables` say a drill proved."""
from __future__ import annotations

import pytest

from ops.status import age_text, verify_verdict

NOW = 1_800_000_000.0


def record(**fields):
    return {"recorded_at": NOW - 90, "failure": "none", "ok": True, "batch_id": 7, "keys_compared": 12,
            "differences": 0, "restore_seconds": 0.5, **fields}


@pytest.mark.parametrize("given, text, kind", [
    (None, "not verified yet", "none"),
    (record(), "exact at batch 7: 12 keys, restore 0.50s (1.5m ago)", "ok"),
    (record(failure="wipe_local_store"), "exact at batch 7 after wipe_local_store: 12 keys", "ok"),
    (record(ok=False, differences=3), "DIFFERS at batch 7: 3 of 12 keys", "bad"),
    # A verify that compared nothing is no proof, green or otherwise.
    (record(keys_compared=0), "not verified yet: batch 7 holds no keys to compare", "none"),
    (record(batch_id=None, keys_compared=0), "not verified yet: no batch holds no keys", "none"),
    # A drill that broke before comparing found no difference: its cause, never DIFFERS.
    (record(ok=False, differences=None, keys_compared=None, drill_failed="restore: ReadTimeout: timed out"),
     "drill failed: restore: ReadTimeout: timed out", "failed"),
    (record(ok=False, differences=None, keys_compared=None), "drill failed: a step before the verify failed",
     "failed"),
    (record(ok=None, skipped=True, reason="table 't' has no committed batch yet"),
     "not verified: table 't' has no committed batch yet", "none"),
])
def test_every_outcome_in_words(given, text, kind):
    said, said_kind = verify_verdict(given, NOW)
    assert said.startswith(text) and said_kind == kind, said
    assert "None" not in said


def test_an_old_record_without_time_or_restore_still_reads():
    said, kind = verify_verdict({"failure": None, "ok": True, "batch_id": 0, "keys_compared": 2, "differences": 0},
                                NOW)
    assert (said, kind) == ("exact at batch 0: 2 keys (at an unknown time)", "ok")


def test_ages():
    assert [age_text(s) for s in (None, 5, 90, 7200, 172800)] == ["never", "5s ago", "1.5m ago", "2.0h ago",
                                                                   "2.0d ago"]


def test_the_verify_history_keeps_its_newest_records(tmp_path, monkeypatch):
    from catalog.runtime import Runtime
    from ops import status

    monkeypatch.setattr(status, "VERIFY_KEEP", 10)
    rt = Runtime("127.0.0.1:1", tmp_path, str(tmp_path / "snapshots"), tmp_path / "tables")
    for i in range(35):
        status.record_verify(rt, "t", {"batch_id": i, "ok": True})
    lines = (tmp_path / "verify" / "t.jsonl").read_text().splitlines()
    assert 10 <= len(lines) <= 20 and status.verify_history(rt, "t", limit=1)[0]["batch_id"] == 34
    assert [r["batch_id"] for r in status.verify_history(rt, "t", limit=100)][-1] >= 15


def test_with_no_broker_every_table_says_why_from_one_probe(tmp_path, monkeypatch):
    """`statetable tables` with the stack down listed the shipped nine tables in 139 s: each
    table's lag and replication check waited out its own timeout. One probe now answers for
    all of them, and each table still says why its lag is unknown."""
    import socket
    from pathlib import Path

    from catalog.definitions import load_all
    from catalog.runtime import Runtime
    from ops import status
    from state import kafka_admin

    with socket.socket() as s:          # a port nothing listens on: a broker that is down
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    shipped = Path(__file__).resolve().parents[3] / "dags" / "tables"
    rt = Runtime(f"127.0.0.1:{closed}", tmp_path, str(tmp_path / "snapshots"), shipped)
    probes = []
    real_admin = kafka_admin.admin
    monkeypatch.setattr(kafka_admin, "admin", lambda bootstrap: probes.append(bootstrap) or real_admin(bootstrap))

    def asked(*args, **kwargs):
        raise AssertionError("a table asked the broker its lag after the probe found no broker")
    monkeypatch.setattr(status, "lag", asked)
    tables = load_all(shipped)
    assert len(tables) >= 9
    for table in tables.values():
        info = status.table_status(table, rt)
        assert info["lag"].startswith(f"unknown: kafka 127.0.0.1:{closed}: no broker answered"), info["lag"]
        topics = [status.spec_of(table, rt).changelog, rt.dead_letter_topic(table.name)]
        topics += [table.output_topic] if table.output_topic else []
        assert info["durability_warnings"] == [f"replication of {', '.join(topics)} {info['lag']}"]
    assert probes == [rt.bootstrap]      # one probe for every table
