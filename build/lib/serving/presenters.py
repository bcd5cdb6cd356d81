"""Answers in the shapes a seed's service promised, built from the table's rows.

The query API serves rows as the table stores them; a presenter turns one into
the shape an existing client expects (the video-game leaderboard's top-3 list),
so that shape lives in one place for the API, the CLI and the demo.
"""
from __future__ import annotations


def leaderboard_entries(row: dict) -> list[dict]:
    """A leaderboard row in the seed's service shape (TOPK entries are (score, *columns))."""
    return [
        {"playerId": player_id, "productId": product_id, "playerName": player_name, "gameName": game_name,
         "score": int(score) if float(score).is_integer() else score}
        for score, player_id, product_id, player_name, game_name in row["top3"]
    ]
