"""Nexmark's events (Person, Auction, Bid of an online auction), written from the benchmark's
specification, as JSON into Kafka: the same events for every system the run compares.

    .venv/bin/python -m bench.nexmark.generator --bootstrap 127.0.0.1:19092 --events 2000000

The specification's shape, which the queries' answers depend on:
- **Mix:** of every 50 events, 1 is a new person, 3 are new auctions and 46 are bids, in that
  order within the 50 (an event's kind is a function of its number, so any slice of the stream
  has the mix).
- **Ids:** persons and auctions are numbered from 1000 in the order they are made; categories
  are 10-14.
- **Hot keys:** a bid goes to the hot auction (the newest whose base-0 number is a multiple of
  2) with probability 1/2, else to one of the 100 newest (in flight); its bidder is the hot
  person (the newest whose base-0 number is 1 mod 4) with probability 3/4, else one of the
  1,000 newest (active); an auction's seller is chosen the same way.
- **Prices:** 10^(6u) cents for u uniform in [0, 1) (mostly small, a long tail); an auction's
  reserve is its initial bid plus another such price.
- **Event time:** one event every `1 / rate` seconds of event time from `start_ms`, so windows
  of event time fill at the rate the queries were written for. An auction is open for one to
  two spans, a span being the event time the stream takes to open 100 more auctions: bids,
  which go to the newest auctions, mostly find theirs open, and the windowed joins (q4, q6, q8,
  q9) have closed auctions to expire.
- **Seeded:** the same seed and counts give the same bytes.

Each kind goes to its own topic (`<prefix>person`, `<prefix>auction`, `<prefix>bid`), keyed by
its id (a bid by its auction), JSON with `dateTime` as ISO 8601 UTC text, the form Flink SQL's
JSON format and statetable's TIMESTAMP columns both read.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID = 1000, 1000, 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS = 1000, 100
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
             "Kent", "Cheyenne")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")


@dataclass
class Config:
    events: int = 2_000_000
    rate: int = 10_000_000           # events per second of event time (Nexmark's default first rate)
    start_ms: int = 1_796_000_000_000
    seed: int = 68


def kind_of(number: int) -> str:
    """The kind of event `number` (0-based): the mix is a function of the number."""
    rest = number % PROPORTION_DENOMINATOR
    if rest < PERSON_PROPORTION:
        return "person"
    return "auction" if rest < PERSON_PROPORTION + AUCTION_PROPORTION else "bid"


def _made_before(number: int, proportion: int, offset: int) -> int:
    """How many events of a kind (its `proportion` of each 50, starting `offset` into them) come
    before event `number`: the ids that exist when it is made."""
    rounds, rest = divmod(number, PROPORTION_DENOMINATOR)
    return rounds * proportion + min(max(rest - offset, 0), proportion)


def people_before(number: int) -> int:
    return _made_before(number, PERSON_PROPORTION, 0)


def auctions_before(number: int) -> int:
    return _made_before(number, AUCTION_PROPORTION, PERSON_PROPORTION)


def _price(rng: random.Random) -> int:
    return round(10.0 ** (rng.random() * 6.0) * 100.0)


_LETTERS = "abcdefghijklmnopqrstuvwxyz "


def _string(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(_LETTERS, k=length)).strip() or "x"


@lru_cache(maxsize=4096)
def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _person_id(rng: random.Random, people: int, hot_ratio: int) -> int:
    """A hot person (the newest whose id is 1 mod the ratio) most of the time, else one of the active."""
    if people == 0:
        return FIRST_PERSON_ID
    if rng.randrange(hot_ratio) > 0:
        newest = people - 1
        return FIRST_PERSON_ID + (newest // hot_ratio) * hot_ratio + (1 if newest % hot_ratio >= 1 else 0)
    active = min(people, NUM_ACTIVE_PEOPLE)
    return FIRST_PERSON_ID + people - 1 - rng.randrange(active)


def _auction_id(rng: random.Random, auctions: int) -> int:
    if auctions == 0:
        return FIRST_AUCTION_ID
    if rng.randrange(HOT_AUCTION_RATIO) > 0:
        return FIRST_AUCTION_ID + ((auctions - 1) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    return FIRST_AUCTION_ID + auctions - 1 - rng.randrange(min(auctions, NUM_IN_FLIGHT_AUCTIONS))


def events(config: Config) -> Iterator[tuple[str, int, dict]]:
    """(kind, key, event) for each event number in order."""
    rng = random.Random(config.seed)
    step_us = 1_000_000 / config.rate
    # An auction is open about as long as it takes the stream to open NUM_IN_FLIGHT_AUCTIONS more,
    # so that bids, which go to the newest auctions, find theirs open.
    auction_span_ms = max(1, round(NUM_IN_FLIGHT_AUCTIONS * PROPORTION_DENOMINATOR / AUCTION_PROPORTION
                                   * step_us / 1000))
    for number in range(config.events):
        at = config.start_ms + int(number * step_us // 1000)
        kind = kind_of(number)
        if kind == "person":
            person = FIRST_PERSON_ID + people_before(number)
            yield kind, person, {
                "id": person, "name": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
                "emailAddress": f"{_string(rng, 7)}@{_string(rng, 5)}.com",
                "creditCard": " ".join(f"{rng.randrange(10000):04d}" for _ in range(4)),
                "city": rng.choice(US_CITIES), "state": rng.choice(US_STATES),
                "dateTime": _iso(at), "extra": _string(rng, rng.randrange(10, 30))}
        elif kind == "auction":
            auction = FIRST_AUCTION_ID + auctions_before(number)
            initial = _price(rng)
            yield kind, auction, {
                "id": auction, "itemName": _string(rng, rng.randrange(5, 20)),
                "description": _string(rng, rng.randrange(10, 40)), "initialBid": initial,
                "reserve": initial + _price(rng), "dateTime": _iso(at),
                "expires": _iso(at + auction_span_ms + rng.randrange(auction_span_ms)),
                "seller": _person_id(rng, people_before(number), HOT_SELLER_RATIO),
                "category": FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES), "extra": _string(rng, 20)}
        else:
            auction = _auction_id(rng, auctions_before(number))
            channel = rng.choice(CHANNELS)
            yield kind, auction, {
                "auction": auction, "bidder": _person_id(rng, people_before(number), HOT_BIDDER_RATIO),
                "price": _price(rng), "channel": channel,
                "url": f"https://www.nexmark.com/{_string(rng, 5)}/item.htm?query=1&channel_id={rng.randrange(10000)}",
                "dateTime": _iso(at), "extra": _string(rng, rng.randrange(0, 10))}


def produce(bootstrap: str, config: Config, prefix: str = "nexmark-", partitions: int = 4) -> dict:
    """Every event into its kind's topic; counts, bytes and seconds per kind."""
    from bench.workload import _producer
    from state.kafka_admin import ensure_topic

    topics = {kind: f"{prefix}{kind}" for kind in ("person", "auction", "bid")}
    for topic in topics.values():
        ensure_topic(bootstrap, topic, partitions)
    producer, counts, sizes = _producer(bootstrap), dict.fromkeys(topics, 0), dict.fromkeys(topics, 0)
    started = time.monotonic()
    for kind, key, event in events(config):
        value = json.dumps(event, separators=(",", ":")).encode()
        while True:
            try:
                producer.produce(topics[kind], value, key=str(key).encode())
                break
            except BufferError:
                producer.poll(0.05)
        counts[kind] += 1
        sizes[kind] += len(value)
        if sum(counts.values()) % 50_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise SystemExit("nexmark: the broker did not take every event")
    seconds = time.monotonic() - started
    return {"events": config.events, "seed": config.seed, "rate_per_event_s": config.rate, "seconds": round(seconds, 1),
            "events_per_s": round(config.events / seconds), "topics": topics, "counts": counts,
            "bytes": sizes, "avg_bytes": {k: round(sizes[k] / counts[k], 1) for k in counts if counts[k]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rate", type=int, default=10_000_000, help="events per second of event time")
    parser.add_argument("--seed", type=int, default=68)
    parser.add_argument("--prefix", default="nexmark-")
    args = parser.parse_args()
    print(json.dumps(produce(args.bootstrap, Config(args.events, args.rate, seed=args.seed), args.prefix), indent=1))


if __name__ == "__main__":
    main()
