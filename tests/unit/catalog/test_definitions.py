"""Table definitions: the shipped tables parse; unsupported SQL fails early and precisely."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from catalog.definitions import DefinitionError, load_all, parse

TABLES = Path(__file__).resolve().parents[3] / "dags" / "tables"


def test_shipped_tables_parse():
    tables = load_all(TABLES)
    assert set(tables) == {"movie_tickets_sold", "payments_per_customer", "players", "products", "leaderboard",
                           "movie_ticket_totals", "movies", "movie_ticket_genres", "tickets_per_genre"}
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
    chained = tables["movie_ticket_totals"]        # a table on movie_tickets_sold's change topic
    assert movies.output_topic == chained.topic == "movie_tickets_sold_changes"
    assert (chained.kind, chained.key_columns, chained.key_format) == ("source", ["title"], "json")
    genres = tables["movie_ticket_genres"]          # a join of two tables, keyed by the left one's key
    assert (genres.table_join, genres.input_table, genres.topic, genres.key_columns) == \
        (True, "movie_ticket_totals", "movie_tickets_sold_changes", ["title"])
    assert [(j.table, j.kind, j.stream_column, j.table_column) for j in genres.joins] == \
        [("movies", "left", "t.title", "title")]
    assert genres.value_columns == ["title", "tickets_sold", "genre"]
    per_genre = tables["tickets_per_genre"]         # an aggregate over the join's rows, via its change topic
    assert (per_genre.over_table, per_genre.input_table, per_genre.topic, per_genre.key_format) == \
        (True, "movie_ticket_genres", "movie_ticket_genres_changes", "json")
    assert [(a.function, a.args) for a in per_genre.aggregates] == [
        ("count", ()), ("sum", ("tickets_sold",)), ("max", ("tickets_sold",)), ("topk", ("tickets_sold", "title"))]


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
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k HAVING SOUNDEX(k) = 'A'", "HAVING: SOUNDEX", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k\nHAVING MEDIAN(v) > 1", "aggregate MEDIAN(v)", 3),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k ORDER BY k", "ORDER", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s\nRIGHT JOIN x ON s.a = x.b GROUP BY k", "RIGHT", 3),
    ("CREATE TABLE t AS SELECT k, v, COUNT(*) AS n FROM s GROUP BY k", "column v outside GROUP BY", 2),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k, TUMBLE(ts, 5)", "window length", 2),
    # sqlglot reads COLLECT_LIST(v) as ARRAY_AGG(v) FILTER(...): the message quotes what the user wrote
    ("CREATE TABLE t AS SELECT k,\n  COLLECT_LIST(v) AS m FROM s GROUP BY k", "aggregate COLLECT_LIST(v) is", 3),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s WHERE RAND() > 0.5 GROUP BY k", "RAND() in WHERE", 2),
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
    path.write_text("-- bronze: no\n-- schema: k STRING\nCREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k")
    with pytest.raises(DefinitionError, match=r"o.sql:1:1: option bronze='no' must be on or off"):
        parse(path)
    path.write_text("-- bronze: OFF\n-- schema: k STRING\nCREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k")
    assert parse(path).bronze is False and "bronze" not in parse(path).meaning()


@pytest.mark.parametrize("raw", ["-1", "20", "ten", ""])
def test_a_bad_batch_niceness_fails_fast_naming_the_setting_and_the_fix(monkeypatch, raw):
    from catalog.priority import batch_niceness

    monkeypatch.setenv("STATETABLE_BATCH_NICE", raw)
    with pytest.raises(ValueError, match=r"STATETABLE_BATCH_NICE=.*integer from 0 .* to 19"):
        batch_niceness()


def test_yielding_the_cpu_lowers_every_thread_and_never_raises_one_back():
    """In a child process (a niceness cannot be raised back without privilege)."""
    import subprocess
    import sys

    script = """
import os, threading
from catalog.priority import yield_cpu_to_queries
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
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    # main thread, an existing thread, a thread started afterwards; a lower setting later changes nothing
    assert done.stdout.split() == ["7", "7", "7", "7"]


STREAM = "-- schema: k STRING, v DOUBLE, n BIGINT, ts TIMESTAMP\n"


@pytest.mark.parametrize("header, sql, problem, position", [
    ("", "CREATE TABLE t AS SELECT k,\n  SUM(nope) AS s FROM s GROUP BY k", "unknown column nope", "3:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s\nWHERE colour = 'red' GROUP BY k",
     "unknown column colour", "3:"),
    ("", "CREATE TABLE t AS SELECT missing, COUNT(*) AS c FROM s GROUP BY missing", "unknown column missing", "2:"),
    ("", "CREATE TABLE t AS SELECT k, SUM(v) AS x,\n COUNT(*) AS x FROM s GROUP BY k", "alias 'x' is used twice",
     "3:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS k FROM s GROUP BY k", "alias 'k' is also a key column", "2:"),
    ("", "CREATE TABLE t AS SELECT k, TOPK(0, v, k) AS top FROM s GROUP BY k", "TOPK's first argument 0", "2:"),
    ("", "CREATE TABLE t AS SELECT k, TOPK(1e9, v, k) AS top FROM s GROUP BY k", "TOPK's first argument 1e9", "2:"),
    ("-- schedule: -5\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k", "schedule='-5'", "1:1"),
    ("-- schedule: every tuesday\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "schedule='every tuesday'", "1:1"),
    ("", "CREATE TABLE `../../x` AS SELECT k, COUNT(*) AS c FROM s GROUP BY k", "table name '../../x'", "2:"),
    ("", "CREATE TABLE Caps AS SELECT k, COUNT(*) AS c FROM s GROUP BY k", "table name 'Caps'", "2:"),
    ("-- Partitions: 2\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "unknown option 'Partitions'; did you mean 'partitions'", "1:1"),
    ("-- partition: 2\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "did you mean 'partitions'", "1:1"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k, TUMBLE(ts, INTERVAL '0' SECOND)",
     "window length INTERVAL '0' SECOND must be positive", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k, TUMBLE(v, INTERVAL '1' HOUR)",
     "must be a TIMESTAMP field", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(DISTINCT v, n) AS d FROM s GROUP BY k", "over several columns", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s WHERE " + "(" * 500 + "v > 0" + ")" * 500
     + " GROUP BY k", "nest deeper than 64", "2:"),
    ("-- ttl: 30d\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "table 't': ttl counts in event time, and it has no event_time; add '-- event_time: <field>'", "1:1"),
    ("-- ttl: 30d\n-- event_time: v\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "event_time 'v' is not a TIMESTAMP field", "1:1"),
    ("-- ttl: a month\n-- event_time: ts\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k",
     "option ttl: 'a month' is not a duration like 30s, 15m, 1h or 7d", "1:1"),
    ("-- ttl: 1h\n", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k, TUMBLE(ts, INTERVAL '1' HOUR)",
     "a windowed table drops old windows by itself", "1:1"),
    ("", "CREATE TABLE t AS SELECT COUNT(*) AS c FROM s GROUP BY UPPER(k)",
     "GROUP BY UPPER(k) must also be in SELECT with a name", "2:"),
    ("", "CREATE TABLE t AS SELECT TO_DATE(ts) AS d, COUNT(*) AS c FROM s GROUP BY d",
     "is DATE; a computed key must be one of ['STRING', 'BIGINT', 'INT', 'DOUBLE', 'BOOLEAN']: CAST it", "2:"),
    ("", "CREATE TABLE t AS SELECT RAND() AS r, COUNT(*) AS c FROM s GROUP BY RAND()", "RAND", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s\nGROUP BY k, SET(1)",
     "SQL does not parse (Invalid expression / Unexpected token); a word SQL reserves", "3:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k, SESSION(ts, INTERVAL '0' MINUTE)",
     "window length INTERVAL '0' MINUTE must be positive", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k, SESSION(v, INTERVAL '5' MINUTE)",
     "must be a TIMESTAMP field", "2:"),
    ("", "CREATE TABLE t AS SELECT k, COUNT(*) AS window_end FROM s GROUP BY k, SESSION(ts, INTERVAL '5' MINUTE)",
     "alias 'window_end' is also a key column", "2:"),
])
def test_bad_definitions_fail_with_file_line_column_and_what_to_do(tmp_path, header, sql, problem, position):
    path = tmp_path / "bad.sql"
    path.write_text(header + STREAM + sql)
    with pytest.raises(DefinitionError) as err:
        parse(path)
    message = str(err.value)
    assert problem in message, message
    assert message.startswith(f"{path}:{position}"), message


def test_a_joined_tables_unknown_column_names_the_file_position_and_the_columns(tmp_path):
    (tmp_path / "players.sql").write_text(
        "CREATE TABLE players (id BIGINT PRIMARY KEY, name STRING) WITH (topic='players');")
    (tmp_path / "board.sql").write_text(
        STREAM + "CREATE TABLE board AS SELECT s.k, TOPK(3, s.v, p.nickname) AS top FROM s\n"
                 "JOIN players p ON s.n = p.id GROUP BY s.k")
    with pytest.raises(DefinitionError, match=r"board.sql:2:\d+: unknown column p.nickname: table 'players' "
                                              r"has columns \['id', 'name'\]"):
        load_all(tmp_path)


def test_one_bad_definition_costs_only_its_own_table_and_the_tables_that_join_it(tmp_path):
    for name in ("movie_tickets_sold", "players", "leaderboard", "products"):
        (tmp_path / f"{name}.sql").write_text((TABLES / f"{name}.sql").read_text())
    (tmp_path / "players.sql").write_text("CREATE TABLE players (id BIGINT PRIMARY KEY, name STRING);")  # no topic
    (tmp_path / "broken.sql").write_text("this is not SQL")
    broken: dict[str, str] = {}
    tables = load_all(tmp_path, broken=broken)
    assert set(tables) == {"movie_tickets_sold", "products"}
    assert set(broken) == {"players", "leaderboard", "broken"}
    assert "needs a topic" in broken["players"] and "JOIN 'players'" in broken["leaderboard"]
    with pytest.raises(DefinitionError):
        load_all(tmp_path)


def test_the_fingerprint_changes_with_meaning_and_not_with_operations(tmp_path):
    from catalog.definitions import meaning_changes

    base = STREAM + "CREATE TABLE t AS SELECT k, COUNT(v) AS c FROM s GROUP BY k"
    path = tmp_path / "t.sql"
    first = parse(path, base)
    assert parse(path, "-- schedule: @hourly\n-- snapshot_every: 3\n" + base).fingerprint == first.fingerprint
    assert parse(path, base.replace("COUNT(v) AS c", "COUNT(v)  AS  c")).fingerprint == first.fingerprint
    for changed in (base.replace("COUNT(v)", "COUNT(n)"), base.replace("GROUP BY", "WHERE v > 0 GROUP BY"),
                    "-- partitions: 2\n" + base, "-- topic: other\n" + base,
                    base.replace("v DOUBLE", "v DOUBLE, extra STRING")):
        other = parse(path, changed)
        assert other.fingerprint != first.fingerprint
        assert meaning_changes(first.meaning(), other.meaning())
    assert meaning_changes(first.meaning(), parse(path, "-- partitions: 2\n" + base).meaning()) == \
        ["partitions: 4 -> 2"]


@pytest.mark.parametrize("where, construct", [
    ("FOO(v) > 1", "FOO(v) in WHERE"),
    ("v > (SELECT 1)", "(SELECT 1) in WHERE"),
    ("RAND() > 0.5", "RAND() in WHERE"),
])
def test_where_outside_the_supported_functions_fails_at_its_position_with_the_list(tmp_path, where, construct):
    path = tmp_path / "w.sql"
    path.write_text("-- schema: k STRING, v DOUBLE, ts TIMESTAMP\n"
                    f"CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s WHERE {where} GROUP BY k")
    with pytest.raises(DefinitionError) as err:
        parse(path)
    message = str(err.value)
    assert re.search(rf"{re.escape(str(path))}:2:\d+: {re.escape(construct)} is not supported", message), message
    assert "Spark's scalar functions" in message and "clocks, random values" in message


def test_a_ttl_is_event_time_milliseconds_kept_by_a_hidden_max_and_part_of_the_meaning(tmp_path):
    text = STREAM + "-- event_time: ts\n{}CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s GROUP BY k"
    (tmp_path / "t.sql").write_text(text.format("-- ttl: 30d\n"))
    table = parse(tmp_path / "t.sql")
    assert table.ttl_ms == 30 * 86_400_000 and table.timed
    assert [(a.name, a.function, a.args, a.hidden) for a in table.aggregates] == [
        ("c", "count", (), False), ("_last_event_ms", "max", ("_event_ms",), True)]
    (tmp_path / "u.sql").write_text(text.format("-- ttl: 7d\n"))
    (tmp_path / "v.sql").write_text(text.format(""))
    assert len({table.fingerprint, parse(tmp_path / "u.sql").fingerprint, parse(tmp_path / "v.sql").fingerprint}) == 3
    source = tmp_path / "src.sql"
    source.write_text("-- ttl: 1d\nCREATE TABLE src (id BIGINT PRIMARY KEY, name STRING) WITH (topic='src');")
    with pytest.raises(DefinitionError, match="ttl is for aggregate tables; a source table's rows go away with a "
                                              "tombstone"):
        parse(source)


def test_a_session_window_parses_with_its_gap_grace_and_a_shown_window_end(tmp_path):
    (tmp_path / "t.sql").write_text(STREAM + "CREATE TABLE t AS SELECT k, COUNT(*) AS c FROM s\n"
                                    "GROUP BY k, SESSION(ts, INTERVAL '30' MINUTE, INTERVAL '5' MINUTE)")
    table = parse(tmp_path / "t.sql")
    assert (table.window.session, table.window.size_ms, table.window.grace_ms) == (True, 1_800_000, 300_000)
    assert [(a.name, a.function, a.args, a.hidden) for a in table.aggregates] == [
        ("c", "count", (), False), ("window_end", "max", ("_event_ms",), False)]
    assert table.routing_width == 1 and table.event_time == "ts" and table.meaning()["window"][-1] == "session"


def test_row_date_functions_over_epoch_milliseconds_match_pandas():
    """SELECT and HAVING see window_start and window_end as epoch milliseconds; the date functions
    read them as UTC instants, as pandas does."""
    import pandas as pd
    import sqlglot

    from catalog.expressions import compile_value

    starts = [1_793_491_200_000 + i * 37_123_457 for i in range(50)]
    stamps = pd.to_datetime(pd.Series(starts), unit="ms", utc=True)
    functions = {
        "YEAR(w)": stamps.dt.year, "MONTH(w)": stamps.dt.month, "DAY(w)": stamps.dt.day,
        "HOUR(w)": stamps.dt.hour, "MINUTE(w)": stamps.dt.minute,
        "DAYOFWEEK(w)": (stamps.dt.dayofweek + 1) % 7 + 1,          # pandas: Monday 0; Spark: Sunday 1
        "TO_DATE(w)": stamps.dt.strftime("%Y-%m-%d"),
        "DATE_TRUNC('HOUR', w)": stamps.dt.floor("h").astype("int64") // 1_000_000,
        "DATE_TRUNC('DAY', w)": stamps.dt.floor("D").astype("int64") // 1_000_000,
    }
    for sql, expected in functions.items():
        value = compile_value(sqlglot.parse_one(sql, dialect="spark"), {"w"})
        assert [value({"w": w}) for w in starts] == expected.tolist(), sql
    assert compile_value(sqlglot.parse_one("HOUR(w)", dialect="spark"), {"w"})({"w": None}) is None


def _parsed(tmp_path, schema: str, sql: str):
    path = tmp_path / "t.sql"
    path.write_text(f"-- schema: {schema}\nCREATE TABLE t AS {sql}")
    return parse(path)


def test_the_sql_a_ksqldb_user_writes_parses_as_ksqldb_reads_it(tmp_path):
    """Renamed keys, GROUP BY alone, scalar functions in GROUP BY, SELECT * with GROUP BY, a single
    grouping set and LIKE ... ESCAPE (tests/conformance has ksqlDB's cases of each, run)."""
    renamed = _parsed(tmp_path, "id INT, data STRING", "SELECT data AS new_key, COUNT(*) AS n FROM s GROUP BY data")
    assert (renamed.key_columns, renamed.derived, renamed.key_types) == (["new_key"], {"new_key": "data"},
                                                                         {"new_key": "STRING"})
    copied = _parsed(tmp_path, "data STRING", "SELECT data, data AS copy, COUNT(*) AS n FROM s GROUP BY data")
    assert (copied.key_columns, copied.computed) == (["data"], {"copy": "data"})
    distinct = _parsed(tmp_path, "name STRING", "SELECT name FROM s GROUP BY name")
    assert [(a.name, a.function, a.hidden) for a in distinct.aggregates] == [("_h0", "count", True)]
    only_having = _parsed(tmp_path, "name STRING",
                          "SELECT name, LENGTH(name) AS len FROM s GROUP BY name HAVING COUNT(name) = 2")
    assert (only_having.having, only_having.computed) == ("_h0 = 2", {"len": "LENGTH(name)"})
    functions = _parsed(tmp_path, "col1 STRING, col2 STRING, col3 STRING",
                        "SELECT INITCAP(col1) AS g1, col2 AS g2, TRIM(col3) AS g3, CONCAT(INITCAP(col1), col2, "
                        "TRIM(col3)) AS foo, COUNT(*) AS n FROM s GROUP BY INITCAP(col1), col2, TRIM(col3) "
                        "HAVING SUBSTRING(TRIM(col3), 1, 4) = 'teen'")
    assert functions.key_columns == ["g1", "g2", "g3"]
    assert functions.computed == {"foo": "CONCAT(g1, g2, g3)"} and functions.having == "SUBSTRING(g3, 1, 4) = 'teen'"
    star = _parsed(tmp_path, "id INT, id2 INT", "SELECT *, COUNT(*) AS n FROM s GROUP BY id, id2")
    assert star.key_columns == ["id", "id2"]
    grouping_set = _parsed(tmp_path, "f1 INT, f2 STRING, f3 INT",
                           "SELECT f1, f2, f3, COUNT(*) AS n FROM s GROUP BY (f3, f2, f1)")
    assert grouping_set.key_columns == ["f3", "f2", "f1"]
    escaped = _parsed(tmp_path, "k STRING, v STRING", "SELECT k, COUNT(*) AS n FROM s WHERE v LIKE 'a!%' ESCAPE '!' "
                                                      "GROUP BY k")
    assert escaped.where == "v LIKE 'a!%' ESCAPE '!'"
    padded = _parsed(tmp_path, "k STRING", "SELECT LPAD(k, 5, 'x') AS k5, COUNT(*) AS n FROM s GROUP BY LPAD(k, 5, 'x')")
    assert padded.key_types == {"k5": "STRING"}


@pytest.mark.parametrize("schema, sql, message", [
    ("id INT, id2 INT", "SELECT *, COUNT(*) AS n FROM s GROUP BY id", ":2:26: column id2 outside GROUP BY"),
    ("data STRING", "SELECT data AS n, COUNT(*) AS n FROM s GROUP BY data", "'n' is also a key column"),
    ("k STRING", "SELECT k, COUNT(*) AS n FROM s WHERE k = CAST(CURRENT_TIMESTAMP() AS STRING) GROUP BY k",
     "CURRENT_TIMESTAMP() in WHERE is not supported"),
    ("k STRING", "SELECT CAST(UUID() AS STRING) AS u, COUNT(*) AS n FROM s GROUP BY CAST(UUID() AS STRING)",
     "UUID() in GROUP BY is not supported"),
    ("k STRING", "SELECT k, COUNT(*) AS n FROM s WHERE MY_UDF(k) GROUP BY k", "MY_UDF(k) in WHERE is not supported"),
    ("k STRING", "SELECT k, COUNT(*) AS n FROM s WHERE k IN (SELECT 1) GROUP BY k", "in WHERE is not supported"),
    ("k STRING, p STRING", "SELECT k, COUNT(*) AS n FROM s WHERE k RLIKE p GROUP BY k",
     "takes p from each event"),
    ("k STRING, n INT", "SELECT REPEAT(k, n) AS r, COUNT(*) AS c FROM s GROUP BY REPEAT(k, n)",
     "takes n from each event"),
    ("k STRING, n INT", "SELECT k, COUNT(DISTINCT LPAD(k, n + 1, 'x')) AS c FROM s GROUP BY k",
     "takes n + 1 from each event"),
    ("k STRING", "SELECT k, COUNT(*) AS n FROM s WHERE k LIKE 'a!b' ESCAPE '!' GROUP BY k",
     "'!' must come before %, _ or itself, not 'b' in WHERE"),
])
def test_what_would_not_repeat_or_that_ksqldb_refuses_fails_in_one_line(tmp_path, schema, sql, message):
    with pytest.raises(DefinitionError) as err:
        _parsed(tmp_path, schema, sql)
    assert message in str(err.value).splitlines()[0], str(err.value)


@pytest.mark.parametrize("pattern, escape, arrow", [
    ("a!%b", "!", "a\\%b"), ("!!x", "!", "\\!x"), ("c\\d", "!", "c\\\\d"), ("x!_", "!", "x\\_"), ("50%", None, "50%"),
])
def test_a_like_escape_character_becomes_the_backslash_arrow_and_spark_read(pattern, escape, arrow):
    import pyarrow as pa
    import pyarrow.compute as pc
    from catalog.expressions import backslash_escaped

    assert backslash_escaped(pattern, escape) == arrow
    values = ["a%b", "axb", "!x", "c\\d", "x_", "xy", "50%", "500"]
    unescaped = pattern.replace("!!", "\0").replace("!", "").replace("\0", "!") if escape else pattern
    literal = [v == unescaped for v in values] if escape else [v.startswith("50") for v in values]
    assert pc.match_like(pa.array(values), backslash_escaped(pattern, escape)).to_pylist() == literal


def test_window_retention_keeps_closed_windows_that_long_and_needs_a_window(tmp_path):
    base = "-- schema: k STRING, ts TIMESTAMP\n{}CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k{}"
    path = tmp_path / "t.sql"
    path.write_text(base.format("", ", SESSION(ts, INTERVAL '10' SECOND)"))
    default = parse(path)
    path.write_text(base.format("-- window_retention: 30d\n", ", SESSION(ts, INTERVAL '10' SECOND)"))
    kept = parse(path)
    assert (default.window.retention_ms, kept.window.retention_ms) == (10_000, 30 * 86_400_000)
    assert kept.window.expiry_horizon(100 * 86_400_000) == 70 * 86_400_000 - 10_000
    assert kept.fingerprint != default.fingerprint
    path.write_text(base.format("-- window_retention: 30d\n", ""))
    with pytest.raises(DefinitionError, match=r"t.sql:2:1: table 't' has no window; remove window_retention"):
        parse(path)


def test_a_like_pattern_from_the_event_that_spark_would_refuse_filters_the_event_not_the_batch(tmp_path):
    """Spark fails a whole batch on one pattern with a bad escape: a pattern taken from the event
    is guarded, a literal one is checked when the table loads."""
    sql = "SELECT id, COUNT(*) AS n FROM s WHERE {} GROUP BY id"
    schema = "id INT, val STRING, pattern STRING"
    assert _parsed(tmp_path, schema, sql.format("val LIKE pattern ESCAPE '!'")).where == \
        "CASE WHEN pattern RLIKE '^([^!]|![%_!])*$' THEN val LIKE pattern ESCAPE '!' END"
    assert _parsed(tmp_path, schema, sql.format("val NOT LIKE pattern")).where == \
        "CASE WHEN pattern RLIKE '^([^\\\\\\\\]|\\\\\\\\[%_\\\\\\\\])*$' THEN val NOT LIKE pattern END"
    assert _parsed(tmp_path, schema, sql.format("val LIKE 'a%'")).where == "val LIKE 'a%'"
