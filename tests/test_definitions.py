"""Table definitions: the shipped tables parse; unsupported SQL fails early and precisely."""
from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.definitions import DefinitionError, load_all, parse

TABLES = Path(__file__).resolve().parent.parent / "dags" / "tables"


def test_shipped_tables_parse():
    tables = load_all(TABLES)
    assert set(tables) == {"movie_tickets_sold", "payments_per_customer", "players", "products", "leaderboard"}
    movies = tables["movie_tickets_sold"]
    assert (movies.topic, movies.key_columns, movies.partitions) == ("movie_ticket_sales", ["title"], 4)
    assert [(a.name, a.function, a.args) for a in movies.aggregates] == [("tickets_sold", "count", ("ticket_total_value",))]
    board = tables["leaderboard"]
    assert board.topic == "score-events" and board.key_columns == ["s.product_id"]
    assert [(j.table, j.kind, j.stream_column, j.table_column) for j in board.joins] == [
        ("players", "inner", "s.player_id", "id"), ("products", "inner", "s.product_id", "id")]
    (top,) = board.aggregates
    assert (top.function, top.n, top.args[:2]) == ("topk", 3, ("s.score", "s.player_id"))
    players = tables["players"]
    assert (players.kind, players.topic, players.key_columns) == ("source", "players", ["id"])


def test_windows_and_where(tmp_path):
    path = tmp_path / "w.sql"
    path.write_text("-- schema: title STRING, v DOUBLE, ts TIMESTAMP\n"
                    "CREATE TABLE w AS SELECT title, COUNT(*) AS n, AVG(v) AS a, COUNT(DISTINCT v) AS d FROM sales "
                    "WHERE v > 0 GROUP BY title, HOP(ts, INTERVAL '10' MINUTE, INTERVAL '5' MINUTE, INTERVAL '1' MINUTE)")
    table = parse(path)
    assert table.event_time == "ts" and table.where == "v > 0"
    assert (table.window.size_ms, table.window.advance, table.window.grace_ms) == (600_000, 300_000, 60_000)
    assert [a.function for a in table.aggregates] == ["count", "avg", "count_distinct"]


@pytest.mark.parametrize("sql, construct, line", [
    ("CREATE TABLE t AS SELECT k,\n  MEDIAN(v) AS m FROM s GROUP BY k", "aggregate MEDIAN(v)", 3),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k HAVING COUNT(*) > 1", "HAVING", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k ORDER BY k", "ORDER", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s\nRIGHT JOIN x ON s.a = x.b GROUP BY k", "RIGHT", 3),
    ("CREATE TABLE t AS SELECT k, v, COUNT(*) AS n FROM s GROUP BY k", "column v outside GROUP BY", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k, TUMBLE(ts, 5)", "window length", 2),
])
def test_unsupported_constructs_name_file_line_column_and_the_alternative(tmp_path, sql, construct, line):
    path = tmp_path / "bad.sql"
    path.write_text("-- schema: k STRING, v DOUBLE, ts TIMESTAMP\n" + sql)
    with pytest.raises(DefinitionError) as err:
        parse(path)
    message = str(err.value)
    assert str(path) in message and construct in message and "Supported" in message
    assert f"{path}:{line}:" in message, message


def test_bad_options_name_the_option_and_fix(tmp_path):
    path = tmp_path / "o.sql"
    path.write_text("-- partitions: many\n-- schema: k STRING\nCREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k")
    with pytest.raises(DefinitionError, match="partitions='many' must be an integer"):
        parse(path)
    path.write_text("-- colour: red\nCREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k")
    with pytest.raises(DefinitionError, match="unknown option 'colour'"):
        parse(path)


@pytest.mark.parametrize("raw", ["-1", "20", "ten", ""])
def test_a_bad_batch_niceness_fails_fast_naming_the_setting_and_the_fix(monkeypatch, raw):
    from spark_jobs.priority import batch_niceness

    monkeypatch.setenv("STATETABLE_BATCH_NICE", raw)
    with pytest.raises(ValueError, match=r"STATETABLE_BATCH_NICE=.*integer from 0 .* to 19"):
        batch_niceness()


def test_yielding_the_cpu_lowers_every_thread_and_never_raises_one_back():
    """In a child process (a niceness cannot be raised back without privilege)."""
    import subprocess
    import sys

    script = """
import os, threading
from spark_jobs.priority import yield_cpu_to_queries
started = threading.Event(); stop = threading.Event(); tids = []
def spin():
    tids.append(threading.get_native_id()); started.set(); stop.wait()
threading.Thread(target=spin).start(); started.wait()
os.environ["STATETABLE_BATCH_NICE"] = "7"
first = yield_cpu_to_queries()
late = []
t = threading.Thread(target=lambda: late.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
t.start(); t.join()
os.environ["STATETABLE_BATCH_NICE"] = "3"
again = yield_cpu_to_queries()
print(first, os.getpriority(os.PRIO_PROCESS, tids[0]), late[0], again)
stop.set()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    # main thread, an existing thread, a thread started afterwards; a lower setting later changes nothing
    assert done.stdout.split() == ["7", "7", "7", "7"]
