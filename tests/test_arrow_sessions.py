"""Two tables' batches at once on the one Spark Connect server, as the scheduler runs them: one
of ~40-byte records, one of ~300 KB records. Each batch's Arrow record cap is the one its own
table needs, read back from the session its pass ran in and recorded in the batch log; and the
session every job shares is left with Spark's own Arrow settings, whatever the interleaving."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from catalog.batch_log import BatchLog
from spark_jobs.engine import arrow_batches
from tests.table_env import isolated_runtime, new_table

STATETABLE = str(Path(sys.executable).parent / "statetable")
SQL = ("-- topic: {topic}\n-- schema: k STRING, v BIGINT, pad STRING\n-- partitions: 2\n"
       "CREATE TABLE {table} AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;\n")


@pytest.mark.timeout(900)
def test_overlapping_batches_each_run_with_their_own_tables_arrow_cap(kafka, engine, tmp_path):
    rt, suffix = isolated_runtime(kafka, tmp_path)
    shapes = {"small_rows": (3000, 0), "large_rows": (24, 300_000)}      # records, pad bytes
    expected = {}
    for table, (count, pad) in shapes.items():
        topic = f"{table}-{uuid.uuid4().hex[:6]}{suffix}"
        producer = new_table(rt, table, SQL.format(topic=topic, table=table), topic)
        producer = type(producer)({"bootstrap.servers": rt.bootstrap, "message.max.bytes": 2_000_000})
        for i in range(count):
            producer.produce(topic, json.dumps({"k": f"k{i % 5}", "v": i, "pad": "x" * pad}).encode(),
                             partition=i % 2)
        assert producer.flush(60) == 0
        expected[table] = {f"k{j}": (len(range(j, count, 5)), sum(range(j, count, 5))) for j in range(5)}

    env = {**os.environ, **rt.as_env(), "STATETABLE_SPARK_REMOTE": engine}
    runs = {table: subprocess.Popen([STATETABLE, "run", table, "--until-caught-up", "--max-records-per-batch",
                                     str(max(1, shapes[table][0] // 6))],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for table in shapes}
    for table, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "Traceback" not in err, f"{table}: {err[-3000:]}"

    caps = {}
    for table in shapes:
        commits = BatchLog(rt.batch_dir(table)).commits()
        assert len(commits) >= 6
        caps[table] = {(c.counts["arrow_records"], c.counts["arrow_records_applied"]) for c in commits}
        for cap, applied in caps[table]:
            assert cap and applied == cap, (table, caps[table])     # the pass ran with its own table's cap
    small, large = (max(cap for cap, _ in caps[t]) for t in ("small_rows", "large_rows"))
    assert small == arrow_batches.max_records()
    assert large == arrow_batches.bucket(arrow_batches.BATCH_BYTES // (300_000 + 40 + arrow_batches.POSITION_BYTES))

    # The session every job attaches to keeps what a fresh session of the server has: nothing
    # leaked into it. Asked from a process of its own (a Connect client in this one would turn
    # the tests' later local sessions into Connect ones).
    probe = ("import json, sys, uuid\n"
             "from spark_jobs.engine import arrow_batches as a\n"
             "from spark_jobs.engine.session import remote_session\n"
             "keys = (a.MAX_RECORDS_CONF, a.MAX_BYTES_CONF)\n"
             "shared, fresh = remote_session(sys.argv[1]), remote_session(sys.argv[1], 'probe-' + uuid.uuid4().hex)\n"
             "print(json.dumps([[s.conf.get(k, None) for k in keys] for s in (shared, fresh)]))\n")
    done = subprocess.run([sys.executable, "-c", probe, engine], env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    shared, fresh = json.loads(done.stdout.strip().splitlines()[-1])
    assert shared == fresh and arrow_batches.NO_BYTE_CHECK not in shared, (shared, fresh)

    from spark_jobs import jobs

    for table in shapes:
        assert {k[0]: tuple(v) for k, v in jobs.state_rows(table, rt).items()} == expected[table]
