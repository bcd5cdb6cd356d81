"""A changed definition is never served under the old meaning (issue 14, item 3): writers stop
and name what changed, readers answer 503 instead of old rows, and `statetable rebuild` adopts
the new definition as a new state version. The cut-over is the batch log's commit: a crash
after it leaves a stale local store that the next writer drops and restores. The results are
checked against pandas over the topic, with the new definition applied."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from spark_jobs import jobs
from deploy import samples
from catalog.batch_log import BatchLog
from serving.query import QueryService, StateUnavailable
from state.table import DefinitionChanged
from tests.table_env import isolated_runtime, read_topic

NAME = "sales_by_title"
OLD = ("-- topic: {topic}\n-- schema: title STRING, ticket_total_value DOUBLE\n-- partitions: 4\n"
       "CREATE TABLE sales_by_title AS SELECT title, COUNT(*) AS n FROM sales GROUP BY title")
NEW = ("-- topic: {topic}\n-- schema: title STRING, ticket_total_value DOUBLE\n-- partitions: 2\n"
       "CREATE TABLE sales_by_title AS SELECT title, COUNT(*) AS n, SUM(ticket_total_value) AS total\n"
       "FROM sales WHERE ticket_total_value >= 12 GROUP BY title")


def _expected(rt, topic: str, new: bool) -> dict[str, dict]:
    frame = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, topic)])
    if not new:
        return {t: {"n": int(n)} for t, n in frame.groupby("title").size().items()}
    kept = frame[frame["ticket_total_value"] >= 12]
    grouped = kept.groupby("title")["ticket_total_value"].agg(["size", "sum"])
    return {t: {"n": int(r["size"]), "total": float(r["sum"])} for t, r in grouped.iterrows()}


def _served(service: QueryService, titles) -> dict[str, dict]:
    out = {}
    for title in titles:
        _, row = service.get(NAME, title)
        if row is not None:
            out[title] = {k: v for k, v in row.items() if k != "title"}
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(abs(a[k][c] - b[k][c]) < 1e-6 for c in a[k]) for k in a)


def test_a_changed_definition_stops_writers_and_readers_until_a_rebuild_adopts_it(kafka, tmp_path, spark):
    from spark_jobs.recompute.verify import verify

    rt, suffix = isolated_runtime(kafka, tmp_path)
    topic = "movie_ticket_sales" + suffix
    sql = rt.tables_dir / f"{NAME}.sql"
    sql.write_text(OLD.format(topic=topic))
    samples.produce("movie_tickets_sold", rt.bootstrap, 2000, suffix=suffix)
    jobs.run(NAME, until_caught_up=True, spark=spark, rt=rt)
    old_rows = _expected(rt, topic, new=False)
    serving = QueryService(rt, background=False)         # a reader that loaded the old definition
    assert _served(serving, old_rows) == old_rows

    sql.write_text(NEW.format(topic=topic))
    # Writers stop and say what changed.
    with pytest.raises(DefinitionChanged) as stopped:
        jobs.run(NAME, until_caught_up=True, spark=spark, rt=rt)
    message = str(stopped.value)
    for part in (NAME, "partitions: 4 -> 2", "where: None -> ", "aggregates", f"statetable rebuild {NAME}"):
        assert part in message, (part, message)
    # A reader with the new definition answers 503 naming the change, never the old rows.
    fresh = QueryService(rt, background=False)
    with pytest.raises(StateUnavailable, match="definition changed"):
        fresh.get(NAME, next(iter(old_rows)))
    fresh.close()

    # The adopting rebuild dies right after its commit, before the local folders swap.
    env = {**os.environ, **rt.as_env(), "STATETABLE_FAULT": "rebuild.after_cutover"}
    died = subprocess.run([str(Path(sys.executable).parent / "statetable"), "rebuild", NAME], env=env,
                          capture_output=True, text=True, timeout=600)
    assert died.returncode == 137, died.stderr[-3000:]
    last = BatchLog(rt.batch_dir(NAME)).last_commit()
    assert last.counts["adopted_definition"] == 1 and last.changelog and last.changelog.startswith(rt.namespace)
    assert json.loads((rt.state_dir / NAME / "table.json").read_text())["partitions"] == 4   # not swapped yet
    serving.refresh_all([NAME])
    assert _served(serving, old_rows) == old_rows        # the old state still answers for the old definition

    # The next writer drops the stale local store, restores the new state and goes on. Before any
    # new input, the Delta mirror (what joins read) holds the new definition's rows, no old ones.
    from spark_jobs.delta import mirror

    assert jobs.run(NAME, until_caught_up=True, spark=spark, rt=rt) == []
    rows = [json.loads(r) for r in mirror.committed_rows(rt, NAME)[1].column("row").to_pylist()]
    assert _same({r.pop("title"): r for r in rows}, _expected(rt, topic, new=True))
    samples.produce("movie_tickets_sold", rt.bootstrap, 500, suffix=suffix)
    jobs.run(NAME, until_caught_up=True, spark=spark, rt=rt)
    recorded = json.loads((rt.state_dir / NAME / "table.json").read_text())
    assert recorded["partitions"] == 2 and sorted(p.name for p in (rt.state_dir / NAME).glob("p*")) == \
        ["p0000", "p0001"]
    expected = _expected(rt, topic, new=True)
    assert len(expected) >= 3
    st = jobs.state_table(jobs.load_table(NAME, rt)[0], rt)
    try:
        state = {k[0]: {"n": v[0], "total": v[1]} for p in range(2) for k, v in st.open(p).items()}
    finally:
        st.close()
    assert _same(state, expected), (state, expected)
    result = verify(NAME, spark=spark, rt=rt)
    assert result.ok, result.summary()

    # The reader that served the old state adopts the new definition once the state answers for it.
    serving.refresh_all([NAME])
    assert _same(_served(serving, expected), expected)
    serving.close()
