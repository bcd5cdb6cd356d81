"""Verify from a verified checkpoint (#46 item 2): after an exact verify at batch M, the next one
recomputes from M's checkpoint plus bronze's later batches, and still finds a flipped value in
a key untouched since M and in one changed after it; a checkpoint whose file was damaged is
refused by its SHA-256 and verify recomputes from the beginning, saying so. The table itself is
checked against pandas over the records read back from the topic."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Producer

from spark_jobs.recompute.verify import verify

from spark_jobs import jobs
from state import codec
from tests.table_env import isolated_runtime, read_topic
from tests.tamper import corrupt_value

TABLE = "payments_per_customer"


def _produce(rt, suffix: str, customers: list[str], per_customer: int, start: int) -> None:
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    for i in range(per_customer):
        for c in customers:
            producer.produce("payments" + suffix, json.dumps(
                {"customer_id": c, "amount": float((start + i) % 97), "payment_ts": "2026-11-26T10:00:00Z"}).encode(),
                key=c.encode())
    assert producer.flush(30) == 0


def _expected(rt, suffix: str) -> dict:
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "payments" + suffix)])
    grouped = frame.groupby("customer_id")["amount"].agg(["count", "sum", "max"])
    return {c: (int(r["count"]), float(r["sum"]), float(r["max"])) for c, r in grouped.iterrows()}


def _flip(rt, key: str, value: tuple) -> None:
    table, _ = jobs.load_table(TABLE, rt)
    st = jobs.state_table(table, rt)
    try:
        part = st.open(st.partition_of((key,)))
        corrupt_value(part.backend, codec.encode_key((key,)), codec.encode_value(value))
    finally:
        st.close()


@pytest.mark.timeout(900)
def test_a_chained_verify_finds_what_a_full_one_finds_and_refuses_a_damaged_checkpoint(kafka, spark, tmp_path):
    from state.kafka_admin import ensure_topic

    rt, suffix = isolated_runtime(kafka, tmp_path)
    ensure_topic(rt.bootstrap, "payments" + suffix, 4)
    everyone = [f"c{i:03d}" for i in range(200)]
    _produce(rt, suffix, everyone, 20, 0)
    jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt, max_records_per_batch=1500)
    first = verify(TABLE, spark=spark, rt=rt)
    assert first.ok and first.chained_from is None and first.keys_compared == 200, first.summary()
    assert "in full" in first.summary()

    # 1% of the keys change in two more batches; the state equals pandas over the topic.
    changed = everyone[:2]
    _produce(rt, suffix, changed, 5, 1000)
    jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt)
    state = {k[0]: v for k, v in jobs.state_rows(TABLE, rt).items()}
    expected = _expected(rt, suffix)
    assert set(state) == set(expected)
    assert all(state[c][0] == expected[c][0] and abs(state[c][1] - expected[c][1]) < 1e-6 for c in expected)
    second = verify(TABLE, spark=spark, rt=rt)
    assert second.ok and second.chained_from == first.batch_id and second.keys_compared == 200, second.summary()
    assert f"from the checkpoint verified at batch {first.batch_id}" in second.summary()

    # A damaged checkpoint file is refused by its SHA-256: that verify recomputes from the
    # beginning, says so, and leaves a checkpoint of its own.
    folders = sorted(Path(rt.verified_dir(TABLE)).iterdir())
    assert [f.name for f in folders] == [f"b{second.batch_id:012d}"]     # older checkpoints are removed
    victim = sorted(folders[0].glob("p*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    _produce(rt, suffix, [everyone[4]], 1, 3000)
    jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt)
    fallback = verify(TABLE, spark=spark, rt=rt)
    assert fallback.ok and fallback.chained_from is None, fallback.summary()
    assert "refused" in fallback.note and victim.name in fallback.note and "SHA-256" in fallback.note
    assert "recomputed from the beginning" in fallback.summary()

    # A value flipped in a key untouched since the checkpoint, and in one changed after it.
    untouched, touched = everyone[150], changed[0]
    _flip(rt, untouched, (1, 5.0, 5.0))
    _flip(rt, touched, (7, 7.0, 7.0))
    _produce(rt, suffix, [everyone[3], touched], 1, 2000)   # `touched` changes again after the checkpoint
    jobs.run(TABLE, until_caught_up=True, spark=spark, rt=rt)
    third = verify(TABLE, spark=spark, rt=rt)
    assert third.chained_from == fallback.batch_id, third.summary()
    assert not third.ok and third.different == 2, third.summary()
    assert {e["key"][0] for e in third.examples} == {untouched, touched}
    full = verify(TABLE, spark=spark, rt=rt, full=True)
    assert full.chained_from is None and full.different == 2       # the full recompute agrees
