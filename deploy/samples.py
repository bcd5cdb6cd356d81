"""Sample data for the shipped tables: `statetable produce-sample NAME [--events N]`.

The leaderboard sample reproduces the seed's example: its expected answer
for game 1 is Isabelle 4000, Mitch 2000, Elyse 1000, and Isabelle 9000 leads
Mario Kart (game 6).
"""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

from confluent_kafka import Producer

from state.kafka_admin import ensure_topic
from state.kafka_config import client_config
from ops.errors import ProduceIncomplete
from catalog.errors import UserError

TITLES = ["Die Hard", "Toy Story", "The Matrix", "Alien", "Up", "Heat", "Fargo", "Vertigo", "Jaws", "Psycho"]
GENRES = {"Die Hard": "action", "Toy Story": "animation", "The Matrix": "sci-fi", "Alien": "sci-fi", "Up": "animation",
          "Heat": "crime", "Fargo": "crime", "Vertigo": "thriller", "Jaws": "thriller"}   # Psycho: not catalogued
PLAYERS = {1: "Elyse", 2: "Mitch", 3: "Isabelle", 4: "Sammy"}
PRODUCTS = {1: "Super Smash Bros", 6: "Mario Kart"}
SEED_SCORES = [  # (player, product, score)
    (1, 1, 1000), (2, 1, 2000), (3, 1, 4000), (4, 1, 800), (1, 1, 500),
    (3, 6, 9000), (2, 6, 8000), (1, 6, 7000), (4, 6, 200), (3, 6, 50),
]


def producer_for(bootstrap: str) -> Producer:
    return Producer(client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 20, "log_level": 2,
                                                 "queue.buffering.max.messages": 1000000}))


def send_records(producer: Producer, topic: str, records) -> int:
    sent = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
        if sent % 20000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise ProduceIncomplete(f"could not deliver every sample record to {topic}")
    return sent


def movie_ticket_sales(n: int, seed: int = 1):
    rng = random.Random(seed)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for i in range(n):
        ts = start + timedelta(seconds=i * 7)
        yield None, json.dumps({"title": rng.choice(TITLES), "ticket_total_value": round(rng.uniform(5, 30), 2),
                                "sale_ts": ts.isoformat()}).encode()


def payments(n: int, seed: int = 2):
    rng = random.Random(seed)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for i in range(n):
        customer = f"c{rng.randrange(1000):04d}"
        yield customer.encode(), json.dumps({"customer_id": customer, "amount": round(rng.uniform(1, 500), 2),
                                             "payment_ts": (start + timedelta(seconds=i)).isoformat()}).encode()


def produce_payments(bootstrap: str, topic: str, events: int, seed: int = 2) -> int:
    """`events` sample payments into a topic of one's own (benchmarks with many payment tables)."""
    return send_records(producer_for(bootstrap), topic, payments(events, seed))


def produce_scores(bootstrap: str, suffix: str = "", partitions: int = 4) -> dict[str, int]:
    """The leaderboard's score events. A stream-table join joins each event with the joined
    tables' rows as committed when its batch runs, so the demo sends these after players and
    products committed, as the seed's story does."""
    ensure_topic(bootstrap, "score-events" + suffix, partitions)
    scores = [(None, json.dumps({"score": s, "product_id": g, "player_id": p}).encode()) for p, g, s in SEED_SCORES]
    # A score of an unknown player: the inner join drops it and counts it.
    scores.append((None, json.dumps({"score": 99999, "product_id": 1, "player_id": 404}).encode()))
    return {"score-events": send_records(producer_for(bootstrap), "score-events" + suffix, scores)}


def produce_movies(bootstrap: str, topic: str) -> int:
    """The movies sample (title -> genre) into a topic of one's own."""
    ensure_topic(bootstrap, topic, 2)
    return send_records(producer_for(bootstrap), topic, ((t.encode(), json.dumps({"title": t, "genre": g}).encode())
                                               for t, g in GENRES.items()))


def produce(name: str, bootstrap: str, events: int | None = None, partitions: int = 4,
            suffix: str = "", scores: bool = True) -> dict[str, int]:
    """Produce a table's sample; `suffix` renames the topics (tests keep their topics apart).
    `scores=False` leaves out the leaderboard's score events (see `produce_scores`)."""
    producer = producer_for(bootstrap)

    def topic(base: str) -> str:
        ensure_topic(bootstrap, base + suffix, partitions)
        return base + suffix

    if name == "movie_tickets_sold":
        return {"movie_ticket_sales": send_records(producer, topic("movie_ticket_sales"), movie_ticket_sales(events or 10000))}
    if name == "movies":
        return {"movies": send_records(producer, topic("movies"), ((t.encode(), json.dumps({"title": t, "genre": g}).encode())
                                                           for t, g in GENRES.items()))}
    if name == "payments_per_customer":
        return {"payments": send_records(producer, topic("payments"), payments(events or 10000))}
    if name in ("leaderboard", "players", "products"):
        sent = {
            "players": send_records(producer, topic("players"), ((str(i).encode(), json.dumps({"id": i, "name": n}).encode())
                                                          for i, n in PLAYERS.items())),
            "products": send_records(producer, topic("products"),
                              ((str(i).encode(), json.dumps({"id": i, "name": n}).encode()) for i, n in PRODUCTS.items())),
        }
        if scores:
            sent.update(produce_scores(bootstrap, suffix, partitions))
        return sent
    raise UserError(f"no sample for {name!r}; samples exist for movie_tickets_sold, movies, payments_per_customer, "
                     f"leaderboard")
