"""The Nexmark generator's shape, which every query's answer depends on (bench/nexmark)."""
from __future__ import annotations

from collections import Counter

from bench.nexmark.generator import Config, events, kind_of


def test_the_mix_ids_hot_keys_and_event_time_follow_the_specification():
    config = Config(events=50_000, rate=1_000_000, seed=3)
    made = list(events(config))
    kinds = Counter(kind for kind, _, _ in made)
    assert kinds == {"person": 1_000, "auction": 3_000, "bid": 46_000}
    assert [kind_of(n) for n in range(50)] == ["person"] + ["auction"] * 3 + ["bid"] * 46
    persons = [e["id"] for k, _, e in made if k == "person"]
    auctions = [e["id"] for k, _, e in made if k == "auction"]
    assert persons == list(range(1000, 2000)) and auctions == list(range(1000, 4000))
    seen_people, seen_auctions = set(), set()
    bids_to_hot = 0
    for kind, key, event in made:
        if kind == "person":
            seen_people.add(event["id"])
        elif kind == "auction":
            seen_auctions.add(event["id"])
            assert event["seller"] in seen_people and 10 <= event["category"] <= 14
            assert event["reserve"] > event["initialBid"] > 0 and event["expires"] > event["dateTime"]
        else:
            # A bid names an auction and a bidder that exist when it is made.
            assert key == event["auction"] and event["auction"] in seen_auctions and event["bidder"] in seen_people
            bids_to_hot += (event["auction"] - 1000) % 2 == 0
    assert 0.70 < bids_to_hot / kinds["bid"] < 0.80          # 1/2 hot + half of the rest even
    times = [event["dateTime"] for _, _, event in made]
    assert times == sorted(times) and times[0] == "2026-11-30T00:53:20.000Z" and times[-1] == "2026-11-30T00:53:20.049Z"


def test_the_same_seed_gives_the_same_events_and_another_seed_others():
    first = list(events(Config(events=2_000, seed=9)))
    assert first == list(events(Config(events=2_000, seed=9)))
    assert first != list(events(Config(events=2_000, seed=10)))
