"""ksqlDB's own query-validation cases, translated into statetable's dialect
(tests/conformance/ksqldb_cases.json says how): each runnable case's inputs go to a real topic
in two batches, its table (without bronze, and without the snapshot a case never reads) runs, and
the rows the query API shows equal the case's last output per key. Refused cases name the feature
they need; kept differences say why (README)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from serving.query import QueryService
from spark_jobs import jobs
from tests.table_env import isolated_runtime, new_table

CASES = json.loads((Path(__file__).parent / "conformance" / "ksqldb_cases.json").read_text())["cases"]
RUNNABLE = [(i, c) for i, c in enumerate(CASES) if "sql" in c]
JOINS = [(i, c) for i, c in enumerate(CASES) if "join_sql" in c]     # windowed joins of two streams


@pytest.fixture(scope="module")
def deployment(kafka, tmp_path_factory):
    return isolated_runtime(kafka, tmp_path_factory.mktemp("ksqldb"))


def _same(got, want) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        return got is not None and want is not None and math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(want, list):
        # statetable's TOPK entries are [score, cols...]: a TOPK of the score alone is ksqlDB's list
        got = [g[0] if isinstance(g, list) and len(g) == 1 else g for g in got or []]
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return got == want


def test_every_case_is_translated_refused_with_its_feature_or_a_documented_difference():
    files = {c["file"] for c in CASES}
    assert len(CASES) >= 100 and len(files) >= 15
    for case in CASES:
        assert ("sql" in case) + ("join_sql" in case) + ("refused" in case) + ("difference" in case) == 1, case["name"]
        assert case.get("refused", "x") and case.get("difference", "x")


def run_case(rt, suffix: str, spark, index: int, case: dict) -> list[dict]:
    """A case's table made, its inputs produced and run in its batches; the rows the query API
    shows (also bench/suite_directions, which times cases)."""
    table, topic = f"ksql{index}", f"ksql{index}{suffix}"
    stream = case["sql"].split(" FROM ")[1].split()[0]
    # Without bronze: a case asks what the query answers, and bronze (the input kept for verify and
    # rebuild) is the same for every query: 178 Delta appends the cases never read (19 cases: 243 -> 199 CPU s).
    producer = new_table(rt, table, f"-- topic: {topic}\n-- schema: {case['schema']}\n-- partitions: 2\n"
                                     "-- bronze: off\n"
                                     f"CREATE TABLE {table} AS {case['sql'].replace(f' FROM {stream}', ' FROM events')}",
                         topic)
    inputs = case["inputs"]
    sizes = case.get("batches") or [len(inputs) // 2, len(inputs) - len(inputs) // 2]   # two batches unless the case says
    assert sum(sizes) == len(inputs), case["name"]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for part in (inputs[start:start + size] for start, size in zip(starts, sizes)):
        for value in part:
            producer.produce(topic, None if value is None else json.dumps(value).encode())
        assert producer.flush(10) == 0
        jobs.run(table, until_caught_up=True, spark=spark, rt=rt, snapshots=False)   # as Airflow's task runs it
    service = QueryService(rt, background=False)
    try:
        return json.loads(json.dumps(service.scan(table).rows))
    finally:
        service.close()


@pytest.mark.parametrize("index, case", RUNNABLE, ids=[f"{c['file']}: {c['name']}" for _, c in RUNNABLE])
def test_ksqldb_case(deployment, spark, index, case):
    rt, suffix = deployment
    rows = run_case(rt, suffix, spark, index, case)

    def key(row: dict) -> str:
        return json.dumps([row[k] for k in case["keys"]])

    got, want = {key(r): r for r in rows}, {key(r): r for r in case["expected"]}
    assert set(got) == set(want), (got, want)
    for k, row in want.items():
        assert set(got[k]) == set(row) and all(_same(got[k][c], v) for c, v in row.items()), (got[k], row)


def run_join_case(rt, suffix: str, spark, index: int, case: dict) -> list[dict]:
    """A stream-stream case: its two streams' inputs to two topics in two batches, its table run,
    and the rows the query API shows, without their record positions."""
    from confluent_kafka import Producer

    from state.kafka_admin import ensure_topic

    table = f"ksqljoin{index}"
    topics = {"left": f"ksql{index}l{suffix}", "right": f"ksql{index}r{suffix}"}
    for topic in topics.values():
        ensure_topic(rt.bootstrap, topic, 2)
    sql = case["join_sql"]
    (rt.tables_dir / f"{table}.sql").write_text(
        f"-- topic: {topics['left']}\n-- schema: {case['schema']}\n-- join_topic: {topics['right']}\n"
        f"-- join_schema: {case['join_schema']}\n-- partitions: 2\nCREATE TABLE {table} AS {sql}")
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    inputs = case["inputs"]
    for part in (inputs[:len(inputs) // 2], inputs[len(inputs) // 2:]):
        for record in part:
            producer.produce(topics[record["side"]], json.dumps(record["value"]).encode())
        assert producer.flush(10) == 0
        jobs.run(table, until_caught_up=True, spark=spark, rt=rt, snapshots=False)
    service = QueryService(rt, background=False)
    try:
        rows = json.loads(json.dumps(service.scan(table).rows))
    finally:
        service.close()
    return [{k: v for k, v in row.items() if k != "rowposition"} for row in rows]


@pytest.mark.parametrize("index, case", JOINS, ids=[f"{c['file']}: {c['name']}" for _, c in JOINS])
def test_ksqldb_stream_stream_join_case(deployment, spark, index, case):
    """A stream-stream join's output is a stream: its rows compare as a multiset."""
    rt, suffix = deployment
    rows = run_join_case(rt, suffix, spark, index, case)
    assert sorted(json.dumps(r, sort_keys=True) for r in rows) == \
        sorted(json.dumps(r, sort_keys=True) for r in case["expected"])
