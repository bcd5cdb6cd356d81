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
