"""The rules of a windowed join of two streams (Flink's interval join, ksqlDB's JOIN ... WITHIN,
Kafka Streams' KStream-KStream join): which records pair, how long a record waits for a partner,
and what a batch changes. Pure: the merge task (spark_jobs/steps/stream_join.py) reads what waits
from the state and writes back what `step` says, so the rules are tested without Kafka or Spark.

A record of `a` with event time t and window end u (u = t, or a column such as an auction's
`expires`) pairs with a record of `b` with time s and the same join key when
`t + lower <= s <= u + upper`. The watermark is the newest event time of the streams' partitions
(the oldest of those still behind: watermark_after) less the grace; a record older than the
watermark a batch starts with is late (a dead letter, counted).
So no `b` to come can pair with an `a` once the watermark passes u + upper, nor any `a` with a
`b` once it passes s - lower: each record waits in the state until then, and leaves it then.
An outer side's record that found no partner becomes a row with NULLs when it leaves, never
before: a row once written is final (Kafka Streams 3.1's KIP-633 made left and outer joins
wait for the window to close, instead of emitting a NULL row that a match retracts later).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Waiting", "Window", "Outcome", "advanced", "pair_position", "step", "watermark_after", "WAITING", "EXPIRY"]

WAITING = "w"      # state keys (WAITING, side, join key, position) -> (time, until, matched, row)
EXPIRY = "x"       # state keys (EXPIRY, leaves at, side, join key, position) -> (): the records by leaving time


class Waiting(NamedTuple):
    side: str              # "a" or "b"
    key: object            # the join key
    position: str          # the record's "partition:offset" in its topic
    time: int              # event time, epoch ms
    until: int             # a: the window's upper column (epoch ms); b: its time
    matched: bool
    row: tuple             # the record's fields, as the state stores them

    def state_key(self) -> tuple:
        return WAITING, self.side, self.key, self.position

    def expiry_key(self, window: "Window") -> tuple:
        return EXPIRY, window.leaves_at(self), self.side, self.key, self.position

    def state_value(self) -> tuple:
        return self.time, self.until, self.matched, self.row

    @classmethod
    def of(cls, key: tuple, value: tuple) -> "Waiting":
        _, side, join_key, position = key
        time, until, matched, row = value
        return cls(side, join_key, position, time, until, matched, tuple(row))


@dataclass(frozen=True)
class Window:
    lower_ms: int
    upper_ms: int
    kind: str = "inner"     # "inner" | "left" | "full": which sides' unmatched records become rows

    def pairs(self, a: Waiting, b: Waiting) -> bool:
        return a.key == b.key and a.time + self.lower_ms <= b.time <= a.until + self.upper_ms

    def leaves_at(self, record: Waiting) -> int:
        """The watermark past which no partner of `record` can come."""
        return record.until + self.upper_ms if record.side == "a" else record.time - self.lower_ms

    def keeps_unmatched(self, side: str) -> bool:
        return self.kind == "full" or self.kind == "left" and side == "a"


def watermark_after(before: int | None, frontiers: dict[str, int], behind: set[str], grace_ms: int) -> int | None:
    """The watermark a batch leaves, from each input partition's newest accepted event time
    (`frontiers`, "a:0" -> ms): the oldest of the partitions still `behind` (their batch did
    not reach the end they had when it was planned), else the newest of all, less the grace;
    never back. Kafka's partitions are not aligned in time: a partition read ahead of another
    (a backlog read in shares, a producer that filled one partition first) must not make the
    other's records late, as Flink takes the smallest of its sources' watermarks; a partition
    with nothing left to read holds nothing back (Flink's idle source)."""
    if not frontiers:
        return before
    lagging = [t for p, t in frontiers.items() if p in behind]
    moved = (min(lagging) if lagging else max(frontiers.values())) - grace_ms
    return moved if before is None else max(before, moved)


def advanced(frontiers: dict[str, int], newest: dict[str, int]) -> dict[str, int]:
    """Each partition's newest accepted event time after a batch that accepted `newest`."""
    out = dict(frontiers)
    for partition, t in newest.items():
        out[partition] = t if partition not in out else max(out[partition], t)
    return out


def pair_position(a: Waiting | None, b: Waiting | None) -> str:
    """A joined row's name: both records' positions ("p:o|p:o"; an unmatched side is empty)."""
    return f"{'' if a is None else a.position}|{'' if b is None else b.position}"


@dataclass
class Outcome:
    pairs: list = field(default_factory=list)        # (a, b) that pair, each once
    unmatched: list = field(default_factory=list)    # an outer side's records that leave without a partner
    puts: list = field(default_factory=list)         # Waiting records to store (new, or newly matched)
    drops: list = field(default_factory=list)        # Waiting records that leave the state


def _first(item: tuple):
    return item[0]


def step(window: Window, new: list[Waiting], waiting: dict[tuple, list[Waiting]], leaving: list[Waiting],
         watermark: int | None) -> Outcome:
    """One batch of one state partition. `new`: its accepted records; `waiting`: the stored records
    of the same join keys, by (side, key); `leaving`: the stored records whose time to leave is
    before `watermark` (the batch's new watermark). Pairs are found before anything leaves, so a
    record pairs with a partner that came in the same batch as its window closed."""
    out = Outcome()
    matched: set[tuple] = set()
    new_by = {}
    for record in new:
        new_by.setdefault((record.side, record.key), []).append(record)
    # Partners are looked up by their join key, so only the times are compared (Window.pairs's
    # rule, inline: Nexmark q4 pairs 460,000 bids a task). Only an outer side's records need to
    # know they matched (an inner join's unmatched leave without a row), so an inner join keeps
    # no marks: its stored records stay as they came.
    lower, upper, outer = window.lower_ms, window.upper_ms, window.kind != "inner"
    pairs, seen = out.pairs.append, matched.add
    for a in (r for r in new if r.side == "a"):
        low, high = a.time + lower, a.until + upper
        for partners in (waiting.get(("b", a.key), ()), new_by.get(("b", a.key), ())):
            for b in partners:
                if low <= b.time <= high:
                    pairs((a, b))
                    if outer:
                        seen(("a", a.position))
                        seen(("b", b.position))
    for b in (r for r in new if r.side == "b"):
        t = b.time
        for a in waiting.get(("a", b.key), ()):
            if a.time + lower <= t <= a.until + upper:
                pairs((a, b))
                if outer:
                    seen(("a", a.position))
                    seen(("b", b.position))

    def gone(record: Waiting) -> bool:
        return watermark is not None and window.leaves_at(record) < watermark

    left_now = {(r.side, r.position): r for r in leaving}
    left_now.update(((r.side, r.position), r) for r in new if gone(r))
    for (side, position), record in sorted(left_now.items(), key=_first):
        if not (record.matched or (side, position) in matched) and window.keeps_unmatched(side):
            out.unmatched.append(record)
    out.drops = list(leaving)
    for record in new:
        if not gone(record):
            out.puts.append(record._replace(matched=True) if (record.side, record.position) in matched else record)
    if not matched:
        return out
    stored_left = {(r.side, r.position) for r in leaving}
    for records in waiting.values():
        for record in records:
            if not record.matched and (record.side, record.position) in matched \
                    and (record.side, record.position) not in stored_left:
                out.puts.append(record._replace(matched=True))
    return out
