"""A follower's batch event is sent in pieces as the changelog is read (issue 66: a `/changes`
follower held a whole batch's changes in memory): the pieces join to the one event a client
parses, and none holds more than CHANGES_PER_PIECE changes."""
from __future__ import annotations

import json
from types import SimpleNamespace

from serving import changes


def test_the_pieces_join_to_one_event_and_each_is_bounded():
    table = SimpleNamespace(name="t")
    commit = SimpleNamespace(batch_id=7, committed_at="2026-12-01T00:00:00Z")
    rows = ({"key": {"k": f"k{i}"}, "row": None if i % 3 == 0 else {"k": f"k{i}", "n": i}} for i in range(2500))
    pieces = list(changes._event(table, commit, rows))
    assert len(pieces) == 3 and all(p.count('"key"') <= changes.CHANGES_PER_PIECE for p in pieces)
    text = "".join(pieces)
    assert text.startswith("id: 7\nevent: batch\ndata: ") and text.endswith("\n\n") and text.count("\n") == 4
    body = json.loads(text.split("data: ", 1)[1])
    assert body["table"] == "t" and body["batch"] == 7 and len(body["changes"]) == 2500
    assert body["changes"][3] == {"key": {"k": "k3"}, "row": None}


def test_a_batch_without_changes_is_one_event_with_an_empty_list():
    (piece,) = changes._event(SimpleNamespace(name="t"), SimpleNamespace(batch_id=0, committed_at=None), iter(()))
    assert json.loads(piece.split("data: ", 1)[1]) == {"table": "t", "batch": 0, "committed_at": None, "changes": []}
