"""Answers in the shapes a seed's service promised, built from the table's rows.

The query API serves rows as the table stores them; a presenter turns one into
the shape an existing client expects (the video-game leaderboard's top-3 list),
so that shape lives in one place for the API, the CLI and the demo.

Times are shown as people read them: a TIMESTAMP column as ISO 8601 in UTC
(`2026-11-26T09:01:00Z`, milliseconds only when there are some), a DATE as
`2026-11-26`; epoch milliseconds (and days since 1970) on request. The state,
the Delta mirror and the change topics keep the numbers: a table reading a
change topic takes them as TIMESTAMP, and Flink or ksqlDB as a BIGINT to convert.
"""
from __future__ import annotations

import datetime as dt

TIMES = ("iso", "epoch_ms")        # how an answer shows times: the CLI's --times, the API's ?times=
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def iso_timestamp(millis: int) -> str:
    stamp = (_EPOCH + dt.timedelta(milliseconds=millis)).replace(tzinfo=None)
    return stamp.isoformat(timespec="milliseconds" if stamp.microsecond else "seconds") + "Z"


def iso_date(days: int) -> str:
    return (_EPOCH + dt.timedelta(days=days)).date().isoformat()


def with_times(row: dict | None, columns: dict[str, str], times: str = "iso") -> dict | None:
    """`row` with its TIMESTAMP and DATE `columns` (catalog.mapping.time_columns) in ISO 8601;
    unchanged when `times` is epoch_ms. A value no date can hold (state written before years
    outside 1-9999 were dead-lettered) stays a number rather than failing the answer."""
    if row is None or times == "epoch_ms" or not columns:
        return row
    shown = dict(row)
    for name, dtype in columns.items():
        value = shown.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                shown[name] = iso_timestamp(value) if dtype == "TIMESTAMP" else iso_date(value)
            except (OverflowError, ValueError):
                pass
    return shown


def leaderboard_entries(row: dict) -> list[dict]:
    """A leaderboard row in the seed's service shape (TOPK entries are (score, *columns))."""
    return [
        {"playerId": player_id, "productId": product_id, "playerName": player_name, "gameName": game_name,
         "score": int(score) if float(score).is_integer() else score}
        for score, player_id, product_id, player_name, game_name in row["top3"]
    ]
