"""serving.query's pure parts: window starts as ISO or epoch ms, and which keys scan by string prefix."""
from __future__ import annotations

from pathlib import Path

import pytest

from catalog.definitions import load_all
from serving.query import BadQuery, text_key, window_start_ms

TABLES = load_all(Path(__file__).resolve().parents[3] / "dags" / "tables")


def test_window_starts_are_epoch_ms_or_iso_times():
    table = TABLES["movie_tickets_sold"]
    assert window_start_ms(table, "1767225600000") == 1767225600000
    assert window_start_ms(table, "2026-01-01T00:00:00Z") == 1767225600000
    assert window_start_ms(table, "2026-01-01") == 1767225600000              # UTC unless it says otherwise
    assert window_start_ms(table, "2026-01-01T01:00:00+01:00") == 1767225600000
    with pytest.raises(BadQuery, match="neither epoch milliseconds nor an ISO time"):
        window_start_ms(table, "yesterday")


def test_one_part_string_keys_scan_by_string_prefix_others_by_key_parts():
    assert text_key(TABLES["payments_per_customer"]) and text_key(TABLES["movies"])
    assert not text_key(TABLES["players"]) and not text_key(TABLES["leaderboard"])     # BIGINT keys


def test_time_columns_are_found_by_type_through_keys_aggregates_and_rows(tmp_path):
    """Which shown columns hold a TIMESTAMP or a DATE: a key, a MIN/MAX/LATEST_BY_OFFSET of one
    (not a COUNT or a SUM of one), a source table's value column; never window_start."""
    from catalog.definitions import parse as parse_definition
    from catalog.mapping import time_columns

    path = tmp_path / "t.sql"
    path.write_text("-- schema: day DATE, at TIMESTAMP, v BIGINT\n"
                    "CREATE TABLE t AS SELECT day, MAX(at) AS last, MIN(day) AS first, LATEST_BY_OFFSET(at) AS latest,"
                    " COUNT(at) AS n, SUM(v) AS s FROM e GROUP BY day, TUMBLE(at, INTERVAL '1' HOUR)")
    assert time_columns(parse_definition(path)) == {"day": "DATE", "last": "TIMESTAMP", "first": "DATE",
                                                    "latest": "TIMESTAMP"}
    rows = tmp_path / "r.sql"
    rows.write_text("CREATE TABLE r (id BIGINT PRIMARY KEY, born DATE, seen TIMESTAMP, name STRING) "
                    "WITH (topic='people');")
    assert time_columns(parse_definition(rows)) == {"born": "DATE", "seen": "TIMESTAMP"}


def test_times_come_out_as_iso_8601_in_utc_or_as_the_numbers():
    from serving.presenters import with_times

    columns = {"at": "TIMESTAMP", "day": "DATE"}
    row = {"k": 7, "at": 1795683660000, "day": 20418, "other": 1795683660000}
    assert with_times(row, columns) == {"k": 7, "at": "2026-11-26T09:01:00Z", "day": "2025-11-26",
                                        "other": 1795683660000}
    assert with_times({"at": 1795683660250}, columns)["at"] == "2026-11-26T09:01:00.250Z"
    assert with_times({"at": -62135596800000, "day": -719162}, columns) == {"at": "0001-01-01T00:00:00Z",
                                                                         "day": "0001-01-01"}
    assert with_times(row, columns, "epoch_ms") == row
    assert with_times({"at": None, "day": 10 ** 12}, columns) == {"at": None, "day": 10 ** 12}   # no date holds it
