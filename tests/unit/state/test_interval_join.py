"""state/interval_join.py's rules, replayed over random streams cut into random batches, against
a plain recomputation: every pair of records with equal keys whose times fall in the window, and
for an outer side each record without one whose window has closed. With nothing late, the answer
cannot depend on where the batches were cut; a record behind the watermark its batch started with
is late and takes no part."""
from __future__ import annotations

import random

import pytest

from state.interval_join import Waiting, Window, advanced, pair_position, step, watermark_after


def _run(window: Window, batches: list[list[Waiting]], grace: int) -> tuple[set, set, list]:
    """The rules applied batch after batch, with the state as a dict: (pairs, unmatched, late)."""
    waiting: dict[tuple, Waiting] = {}
    pairs, unmatched, late, watermark, frontiers = set(), set(), [], None, {}
    for batch in batches:
        new = [r for r in batch if watermark is None or r.time >= watermark]
        late += [r for r in batch if r not in new]
        frontiers = advanced(frontiers, {r.side: max(x.time for x in new if x.side == r.side) for r in new})
        after = watermark_after(watermark, frontiers, set(), grace)
        partners = {}
        for r in waiting.values():
            partners.setdefault((r.side, r.key), []).append(r)
        leaving = [r for r in waiting.values() if after is not None and window.leaves_at(r) < after]
        outcome = step(window, new, partners, leaving, after)
        pairs |= {pair_position(a, b) for a, b in outcome.pairs}
        unmatched |= {(r.side, r.position) for r in outcome.unmatched}
        for r in outcome.drops:
            del waiting[(r.side, r.position)]
        for r in outcome.puts:
            waiting[(r.side, r.position)] = r
        watermark = after
    assert len(pairs) == sum(1 for _ in pairs)
    return pairs, unmatched, late


def _expected(window: Window, records: list[Waiting], watermark: int) -> tuple[set, set]:
    a_side = [r for r in records if r.side == "a"]
    b_side = [r for r in records if r.side == "b"]
    pairs = {pair_position(a, b) for a in a_side for b in b_side if window.pairs(a, b)}
    paired = {p for pair in pairs for p in pair.split("|")}
    unmatched = {(r.side, r.position) for r in records if r.position not in paired
                 and window.keeps_unmatched(r.side) and window.leaves_at(r) < watermark}
    return pairs, unmatched


def _records(rng: random.Random, n: int, disorder: int, until: bool) -> list[Waiting]:
    out = []
    for i in range(n):
        side = rng.choice("ab")
        t = i * 100 + rng.randrange(disorder)
        out.append(Waiting(side, rng.randrange(40), f"{'01'[side == 'b']}:{i}", t,
                           t + (rng.randrange(3_000) if until and side == "a" else 0), False, (i,)))
    return out


@pytest.mark.parametrize("kind", ["inner", "left", "full"])
@pytest.mark.parametrize("seed", range(6))
def test_batches_cut_anywhere_give_the_plain_interval_join(kind, seed):
    rng = random.Random(seed)
    window = Window(rng.choice([-2_000, 0, 500]), rng.choice([0, 1_000, 3_000]), kind)
    if window.upper_ms < window.lower_ms:
        window = Window(window.upper_ms, window.lower_ms, kind)
    grace = 2_000
    records = _records(rng, 300, 1_500, until=seed % 2 == 0)      # disorder within the grace: nothing late
    cuts = sorted(rng.sample(range(1, len(records)), rng.randrange(1, 40)))
    batches = [records[i:j] for i, j in zip([0, *cuts], [*cuts, len(records)])]
    pairs, unmatched, late = _run(window, batches, grace)
    assert late == []
    want_pairs, want_unmatched = _expected(window, records, max(r.time for r in records) - grace)
    assert pairs == want_pairs and pairs
    assert unmatched == want_unmatched
    assert (unmatched != set()) == (kind != "inner")


def test_a_record_behind_the_watermark_is_late_and_pairs_with_nothing():
    window = Window(0, 1_000, "full")
    first = [Waiting("a", 1, "0:0", 10_000, 10_000, False, ()), Waiting("b", 1, "1:0", 10_500, 10_500, False, ())]
    second = [Waiting("b", 1, "1:1", 8_999, 8_999, False, ()),          # behind 10_500 - 1_500: late
              Waiting("a", 2, "0:1", 20_000, 20_000, False, ())]
    pairs, unmatched, late = _run(window, [first, second], 1_500)
    assert pairs == {"0:0|1:0"} and [r.position for r in late] == ["1:1"]
    assert unmatched == set()          # 0:1's window (to 21_000) is open at watermark 18_500


def test_a_record_pairs_with_a_partner_in_the_batch_that_closes_its_window():
    window = Window(0, 1_000, "left")
    a = Waiting("a", 7, "0:0", 1_000, 1_000, False, ())
    b = Waiting("b", 7, "1:0", 2_000, 2_000, False, ())
    far = Waiting("b", 8, "1:1", 9_000, 9_000, False, ())
    pairs, unmatched, _ = _run(window, [[a], [b, far]], 0)
    assert pairs == {"0:0|1:0"} and unmatched == set()
    pairs, unmatched, _ = _run(window, [[a], [far], [b]], 0)       # b came after a's window closed: late
    assert pairs == set() and unmatched == {("a", "0:0")}


def test_a_partition_read_ahead_of_another_does_not_make_the_others_records_late():
    """Kafka's partitions are not aligned in time: while partition a:1 still has records to read
    (it is behind), its newest event time bounds the watermark, not a:0's."""
    frontiers = advanced({}, {"a:0": 100_000, "a:1": 10_000, "b:0": 50_000})
    assert watermark_after(None, frontiers, {"a:1"}, 1_000) == 9_000
    assert watermark_after(None, frontiers, set(), 1_000) == 99_000          # every partition read to its end
    assert watermark_after(99_000, frontiers, {"a:1"}, 1_000) == 99_000       # never back
    assert advanced(frontiers, {"a:1": 5_000, "b:1": 7}) == {"a:0": 100_000, "a:1": 10_000, "b:0": 50_000, "b:1": 7}
    assert watermark_after(5, {}, set(), 1_000) == 5
