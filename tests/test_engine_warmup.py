"""A Spark Connect server warms itself before it reports up (spark_jobs/warmup.py).

Driven as a user drives it: `statetable stack kill-engine`, `statetable stack restart-engine`,
`statetable stack status`, then a table's first batch with `statetable run` over that server. The
batch's own record says whether its merge tasks ran in Python workers forked from a daemon that
had the pass imported before the batch began (`cold_workers`). The same restart with the warm-up
turned off shows the figure the assertion would otherwise meet: every partition cold. The time a
warm-up saves goes in the benchmark (bench/warm.py), not in an assertion here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from spark_jobs import warmup
from tests.table_env import new_table

STATETABLE = str(Path(sys.executable).parent / "statetable")
TABLE = "warm_counts"
SQL = ("-- topic: {topic}\n-- schema: k STRING, v BIGINT\n-- partitions: 2\n"
       "CREATE TABLE warm_counts AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;\n")
# A table of rows, as the demo's `players`: the Spark-SQL pass, which merges in the shared session.
ROWS = "rows_by_id"
ROWS_SQL = "-- partitions: 2\nCREATE TABLE rows_by_id (id BIGINT PRIMARY KEY, name STRING) WITH (topic='{topic}');\n"


def _cli(env: dict, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    done = subprocess.run([STATETABLE, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in ok, f"statetable {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.mark.timeout(900)
def test_a_restarted_engine_is_warm_before_the_first_batch(kafka, engine, tmp_path):
    from catalog.runtime import Runtime

    topic = f"warm-{uuid.uuid4().hex[:8]}"
    rt = Runtime(bootstrap=kafka, data_dir=tmp_path / "data", snapshot_uri=str(tmp_path / "data" / "snapshots"),
                 tables_dir=tmp_path / "tables", namespace=f"w{uuid.uuid4().hex[:6]}.")
    rt.tables_dir.mkdir()
    producer = new_table(rt, TABLE, SQL.format(topic=topic), topic)
    env = {**os.environ, **rt.as_env(), "STATETABLE_SPARK_REMOTE": engine}
    expected: dict[str, list[int]] = {}

    def first_batch_after_restart(records: str, produced: int) -> dict:
        _cli(env, "stack", "kill-engine")
        restarted = _cli(env | {warmup.RECORDS_ENV: records}, "stack", "restart-engine").stdout
        for i in range(produced):
            key, value = f"k{i % 37}", i % 11
            producer.produce(topic, json.dumps({"k": key, "v": value}).encode(), partition=i % 2)
            slot = expected.setdefault(key, [0, 0])
            slot[0] += 1
            slot[1] += value
        assert producer.flush(30) == 0
        ran = _cli(env, "run", TABLE, "--until-caught-up").stdout
        (commit,) = [json.loads(line) for line in ran.splitlines() if line.startswith("{")]
        assert commit["read"] == produced
        return {"restart": restarted, "commit": commit}

    cold = first_batch_after_restart("0", 3_000)
    assert "spark-connect not warmed (STATETABLE_ENGINE_WARMUP_RECORDS=0)" in cold["restart"]
    # Without the warm-up the batch forks the session's daemon itself: both partitions merge cold.
    assert cold["commit"]["cold_workers"] == 2, cold["commit"]

    warm = first_batch_after_restart("5000", 3_000)
    assert re.search(r"spark-connect warmed in [0-9.]+s: 5,000 records through statetable_engine_warmup",
                     warm["restart"]), warm["restart"]
    status = _cli(env, "stack", "status", ok=(0, 3)).stdout      # 3: a part is down (no Airflow here)
    assert re.search(r"^spark-connect warmed in [0-9.]+s \(5,000 records\)$", status, re.M), status
    assert warm["commit"]["cold_workers"] == 0, warm["commit"]
    # The server keeps a worker daemon per session, and the scratch table's Arrow pass ran in its
    # record cap's own: the warm-up forks the shared session's too (without it, both cold here).
    rows_topic = f"rows-{uuid.uuid4().hex[:8]}"
    rows = new_table(rt, ROWS, ROWS_SQL.format(topic=rows_topic), rows_topic)
    for i in range(100):
        rows.produce(rows_topic, json.dumps({"id": i, "name": f"n{i}"}).encode(), str(i).encode(), partition=i % 2)
    assert rows.flush(30) == 0
    from catalog.registry import load_table
    from spark_jobs.batches.microbatch import engine_of

    assert engine_of(load_table(ROWS, rt)[0]) == "spark"
    (commit,) = [json.loads(line) for line in _cli(env, "run", ROWS, "--until-caught-up").stdout.splitlines()
                 if line.startswith("{")]
    assert commit["read"] == 100 and commit["cold_workers"] == 0, commit

    # The warm-up's scratch table stays out of the deployment's folders, and the user's table is exact.
    from spark_jobs import jobs

    assert {k[0]: list(v) for k, v in jobs.state_rows(TABLE, rt).items()} == expected
    row = json.loads(_cli(env, "query", TABLE, "k5").stdout)
    assert [row["n"], row["s"]] == expected["k5"]
    assert not (rt.data_dir / "batches" / warmup.WARMUP_TABLE).exists()
