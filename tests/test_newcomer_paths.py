"""The shipped tables as a new user runs them: a table before the tables it joins, reference
tables with several batches, updates and deletes between batches, then a wiped store. Every
answer is checked against pandas over the records produced (the as-of-batch join), not the
project's own code."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from confluent_kafka import Producer

from catalog.batch_log import BatchLog
from ops import failures
from serving.query import lookup
from spark_jobs.recompute.verify import verify
from spark_jobs import jobs
from state.kafka_admin import ensure_topic
from tests.table_env import isolated_runtime


@pytest.fixture
def env(kafka, tmp_path):
    return isolated_runtime(kafka, tmp_path)


class _Reference:
    """A keyed reference topic and its state as pandas sees it (last value per key, tombstones delete)."""

    def __init__(self, producer: Producer, topic: str):
        self.producer, self.topic, self.rows = producer, topic, {}

    def put(self, key: int, name: str) -> None:
        self.producer.produce(self.topic, json.dumps({"id": key, "name": name}).encode(), key=str(key).encode())
        self.rows[key] = name

    def delete(self, key: int) -> None:
        self.producer.produce(self.topic, None, key=str(key).encode())
        self.rows.pop(key, None)

    def frame(self, prefix: str) -> pd.DataFrame:
        return pd.DataFrame({"id": list(self.rows), f"{prefix}_name": list(self.rows.values())},
                            columns=["id", f"{prefix}_name"])


def _expected_board(joined: pd.DataFrame) -> dict:
    """Top 3 per game by score (ties: the earlier event first), as the API presents them."""
    board = {}
    for product, rows in joined.sort_values(["score", "seq"], ascending=[False, True]).groupby("product_id"):
        board[str(int(product))] = [
            {"playerId": int(r.player_id), "productId": int(r.product_id), "playerName": r.player_name,
             "gameName": r.game_name, "score": r.score} for r in rows.head(3).itertuples()]
    return board


def test_the_leaderboard_equals_the_as_of_batch_join_in_every_order_a_user_runs_it(env, spark):
    from deploy.cli import present

    rt, suffix = env
    for base in ("players", "products", "score-events"):
        ensure_topic(rt.bootstrap, base + suffix, 2)
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    players = _Reference(producer, "players" + suffix)
    products = _Reference(producer, "products" + suffix)
    scores, joined = [], []

    def score(player: int, product: int, value: float) -> None:
        producer.produce("score-events" + suffix,
                         json.dumps({"score": value, "product_id": product, "player_id": player}).encode())
        scores.append((player, product, value))

    def leaderboard_batch() -> None:
        """Run the leaderboard over the scores produced since its last batch; pandas joins them with
        the reference tables as they stand now (each has committed everything produced to it)."""
        assert producer.flush(10) == 0
        new = pd.DataFrame(scores, columns=["player_id", "product_id", "score"])
        new["seq"] = range(sum(len(j) for j in joined), sum(len(j) for j in joined) + len(new))
        scores.clear()
        part = new.merge(players.frame("player"), left_on="player_id", right_on="id") \
            .drop(columns="id").merge(products.frame("game"), left_on="product_id", right_on="id").drop(columns="id")
        commits = jobs.run("leaderboard", until_caught_up=True, spark=spark, rt=rt)
        assert sum(c.counts["join_unmatched"] for c in commits) == len(new) - len(part)
        joined.append(part)

    def board() -> dict:
        rows = jobs.state_rows("leaderboard", rt)
        return {str(key[0]): present("leaderboard", lookup("leaderboard", (str(key[0]),), rt=rt)) for key in rows}

    def run(name: str) -> None:
        assert producer.flush(10) == 0
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)

    # 1. The leaderboard before its reference tables ever ran: every score is unmatched.
    score(1, 1, 1000.0)
    score(2, 1, 2000.0)
    leaderboard_batch()
    assert board() == {}

    # 2. Players in three batches (an update among them) before products ever ran.
    # More than a handful of rows each: larger blocks take the JSON reader's path, not row by row.
    extras = {key: f"Player {key}" for key in range(10, 30)}
    for batch_players in ({1: "Elyse", 2: "Mitch", **dict(list(extras.items())[:10])},
                          {3: "Isabelle", 4: "Sammy", **dict(list(extras.items())[10:])}, {2: "Mitchell"}):
        for key, name in batch_players.items():
            players.put(key, name)
        run("players")
    assert BatchLog(rt.batch_dir("players")).last_commit().batch_id == 2
    score(3, 1, 4000.0)
    leaderboard_batch()                     # products has not run: still nothing matches
    assert board() == {}

    products.put(1, "Super Smash Bros")
    products.put(6, "Mario Kart")
    run("products")
    for player, product, value in ((1, 1, 500.0), (2, 1, 2500.0), (3, 6, 9000.0), (404, 1, 99999.0), (4, 6, 200.0)):
        score(player, product, value)
    leaderboard_batch()
    expected = _expected_board(pd.concat(joined))
    assert board() == expected and expected["1"][0]["playerName"] == "Mitchell"

    # 3. Between leaderboard batches a player is renamed, another deleted, a game renamed; two
    # more player batches. Earlier entries keep the names their batch joined.
    players.put(1, "Elyse B")
    run("players")
    players.delete(4)
    players.put(5, "Newcomer")
    run("players")
    products.put(6, "Mario Kart 8")
    run("products")
    for player, product, value in ((4, 6, 8000.0), (5, 6, 7000.0), (1, 1, 3000.0), (1, 6, 100.0)):
        score(player, product, value)
    leaderboard_batch()
    expected = _expected_board(pd.concat(joined))
    assert board() == expected
    assert [e["playerName"] for e in expected["6"]] == ["Isabelle", "Newcomer", "Sammy"]

    # 4. A reference table whose committed rows are all deleted joins as an empty table.
    products.delete(1)
    products.delete(6)
    run("products")
    score(1, 1, 123456.0)
    leaderboard_batch()
    assert board() == expected

    # 5. A lost disk: restore, then verify recomputes from bronze with each batch's pinned joins.
    failures.inject("leaderboard", "wipe_local_store", rt)
    done = _cli(rt, "query", "leaderboard", "1")          # as a user would, before restoring
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("statetable query leaderboard: ")] \
        and "statetable restore leaderboard" in done.stderr, done.stderr[-2000:]
    jobs.restore("leaderboard", rt=rt)
    assert board() == expected
    result = verify("leaderboard", spark=spark, rt=rt)
    assert result.ok, result.summary()


def _cli(rt, *args: str, extra_env: dict | None = None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, **rt.as_env(), **(extra_env or {})}
    env.pop("STATETABLE_DEBUG", None)
    return subprocess.run([str(Path(sys.executable).parent / "statetable"), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_failures_a_newcomer_meets_are_one_line_without_a_traceback(env):
    """Ordinary conditions on a fresh data folder, through the CLI as a user types it: each exits
    non-zero with one line that names the command, the table, the cause and what to do."""
    rt, suffix = env
    (rt.tables_dir / "broken.sql").write_text(
        "-- topic: b\n-- schema: k STRING, v BIGINT\nCREATE TABLE broken AS SELECT k, MEDIAN(v) AS m FROM s GROUP BY k")
    cases = [
        (("query", "leaderboard", "1"), "statetable query leaderboard: ", "no row"),      # nothing committed yet
        (("run", "broken"), "statetable run broken: ", "broken.sql:3:"),                 # refused definition
        (("run", "nosuch"), "statetable run nosuch: ", "nosuch"),                         # no such table
        (("restore", "nosuch"), "statetable restore nosuch: ", "nosuch"),
        (("accept-offsets", "players"), "statetable accept-offsets players: ", "no committed batch"),
    ]
    for args, prefix, detail in cases:
        done = _cli(rt, *args)
        output = done.stdout + done.stderr
        assert "Traceback" not in output, (args, output[-3000:])
        assert done.returncode != 0, (args, output[-2000:])
        errors = [line for line in done.stderr.splitlines() if line.startswith("statetable ")]
        assert len(errors) == 1 and errors[0].startswith(prefix) and detail in errors[0], (args, done.stderr[-2000:])


def test_the_issue_order_through_the_cli_on_the_stacks_engine(kafka, engine, tmp_path):
    """The order that broke for a new user, typed at the CLI against the stack's Spark Connect
    server: the leaderboard before its reference tables ever ran, then players in two batches of
    four, products, and the leaderboard again; every command exits 0 without a traceback and the
    board equals pandas' join of the scores with the reference tables."""
    rt, suffix = isolated_runtime(kafka, tmp_path)
    remote = {"STATETABLE_SPARK_REMOTE": engine}
    for base in ("players", "products", "score-events"):
        ensure_topic(rt.bootstrap, base + suffix, 2)
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    players = _Reference(producer, "players" + suffix)
    products = _Reference(producer, "products" + suffix)
    scores = [(1, 1, 10.0), (2, 1, 30.0), (5, 1, 20.0), (6, 2, 50.0), (7, 1, 5.0)]

    def cli(*args: str) -> str:
        assert producer.flush(10) == 0
        done = _cli(rt, *args, extra_env=remote)
        assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, (args, done.stderr[-3000:])
        return done.stdout

    for player, product, value in scores[:2]:
        producer.produce("score-events" + suffix,
                         json.dumps({"score": value, "product_id": product, "player_id": player}).encode())
    assert json.loads(cli("run", "leaderboard", "--until-caught-up").splitlines()[0])["join_unmatched"] == 2
    for group in ((1, 2, 3, 4), (5, 6, 7, 8)):
        for key in group:
            players.put(key, f"P{key}")
        cli("run", "players")
    products.put(1, "Pong")
    products.put(2, "Tetris")
    cli("run", "products")
    for player, product, value in scores[2:]:
        producer.produce("score-events" + suffix,
                         json.dumps({"score": value, "product_id": product, "player_id": player}).encode())
    cli("run", "leaderboard", "--until-caught-up")
    board = json.loads(cli("query", "leaderboard", "1"))
    assert [(e["playerName"], e["gameName"], e["score"]) for e in board] == [("P5", "Pong", 20.0), ("P7", "Pong", 5.0)]
