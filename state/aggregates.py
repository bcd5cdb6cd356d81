"""Aggregate codecs: how a partial aggregate is combined into a stored one.

Every aggregate state is a plain value the codec module can encode (ints,
floats, strings, tuples). `merge` is associative and commutative over
partials, so Spark can pre-aggregate a batch in any grouping and the state
store folds the partials in without reading events twice.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

__all__ = ["AGGREGATES", "Aggregate", "Avg", "Count", "CountDistinct", "LatestByOffset", "LatestKeepingNulls",
           "Max", "Min", "OFFSET_BITS", "RETRACTING", "ROWS", "RetractingAggregator", "RetractingAvg",
           "RetractingCount", "RetractingCountDistinct", "RetractingMax", "RetractingMin", "RetractingSum",
           "RetractingTopN", "RowAggregator", "Sum", "TopN", "event_order", "ranked"]


OFFSET_BITS = 40       # source offsets below 2**40; batch ids below 2**23


def event_order(batch_id: int, offset: int) -> int:
    """An event's place in its table's history, for LATEST_BY_OFFSET and TOPK's ties: by batch,
    then by source offset. Offsets alone do not order one key's events when they came through
    different partitions (an unkeyed topic grouped by a column), and every event of a later batch
    arrived after the earlier batch was planned, so the batch comes first."""
    return (batch_id << OFFSET_BITS) | offset


class Aggregate:
    """One aggregate column. Subclasses define the state and how it folds."""

    name = "aggregate"

    def lift(self, value, order=0):
        """The partial state of a single event (`order` ranks events: `event_order`)."""
        raise NotImplementedError

    def merge(self, stored, partial):
        raise NotImplementedError

    def result(self, state):
        return state

    def spec(self) -> tuple:
        """A value that identifies this aggregate's definition (for compatibility checks)."""
        return (self.name,)


class Count(Aggregate):
    """COUNT(col): events whose value is not null."""

    name = "count"

    def lift(self, value, order=0):
        return 0 if value is None else 1

    def merge(self, stored, partial):
        return (stored or 0) + (partial or 0)


class _NullIgnoring(Aggregate):
    """SUM, MIN, MAX: nulls are skipped; all-null stays null, as in SQL."""

    combine = staticmethod(lambda a, b: a)

    def lift(self, value, order=0):
        return value

    def merge(self, stored, partial):
        if stored is None:
            return partial
        if partial is None:
            return stored
        return self.combine(stored, partial)


class Sum(_NullIgnoring):
    name = "sum"
    combine = staticmethod(operator.add)


class Min(_NullIgnoring):
    name = "min"
    combine = staticmethod(min)


class Max(_NullIgnoring):
    name = "max"
    combine = staticmethod(max)


class Avg(Aggregate):
    """AVG as (sum, count), so partial averages combine exactly."""

    name = "avg"

    def lift(self, value, order=0):
        return (0, 0) if value is None else (value, 1)

    def merge(self, stored, partial):
        if stored is None:
            return partial
        if partial is None:
            return stored
        return (stored[0] + partial[0], stored[1] + partial[1])

    def result(self, state):
        if not state or state[1] == 0:
            return None
        return state[0] / state[1]


class LatestByOffset(Aggregate):
    """The value of the event with the highest order (offset) among those whose value is not
    null, as ksqlDB's LATEST_BY_OFFSET(x) ignores nulls; state is (order, value)."""

    name = "latest_by_offset"

    def lift(self, value, order=0):
        return None if value is None else (order, value)

    def merge(self, stored, partial):
        if stored is None:
            return partial
        if partial is None:
            return stored
        return partial if partial[0] >= stored[0] else stored

    def result(self, state):
        return None if state is None else state[1]


class LatestKeepingNulls(LatestByOffset):
    """ksqlDB's LATEST_BY_OFFSET(x, false): the value of the event with the highest order, NULL
    when that event's value is NULL; state is (order, value)."""

    name = "latest_keeping_nulls"

    def lift(self, value, order=0):
        return (order, value)


@dataclass(frozen=True)
class TopN(Aggregate):
    """The N entries with the highest score; state is a tuple of (score, order, row).

    Ties on score go to the earlier event (lower order), so the result does
    not depend on how partials were grouped. With `distinct_by` set, each
    identity (e.g. a player) keeps only its best entry, as a leaderboard does.
    """

    n: int
    distinct_by: int | None = None  # index into row that identifies an entry's owner
    name = "topn"

    def lift(self, value, order=0):
        score, row = value
        if score is None:
            return ()
        return ((score, order, row),)

    def merge(self, stored, partial):
        entries = ranked(list(stored or ()) + list(partial or ()))
        if self.distinct_by is not None:
            seen, unique = set(), []
            for entry in entries:
                owner = entry[2][self.distinct_by]
                if owner not in seen:
                    seen.add(owner)
                    unique.append(entry)
            entries = unique
        return tuple(entries[: self.n])

    def result(self, state):
        """Entries as (score, *row), best first: what TOPK(n, score, cols...) lists."""
        return [(entry[0], *entry[2]) for entry in state or ()]

    def spec(self) -> tuple:
        return (self.name, self.n, self.distinct_by)


def ranked(entries: list) -> list:
    """TOPK entries (score, order, row) best first: score descending, ties to the earlier event.
    Two stable sorts rather than one on (-score, order), so a score may be any ordered value
    (a string, as ksqlDB's TOPK orders them, or a time as epoch milliseconds)."""
    entries.sort(key=lambda e: e[1])
    entries.sort(key=lambda e: e[0], reverse=True)
    return entries


class CountDistinct(Aggregate):
    """COUNT(DISTINCT col), exact: the state is the sorted set of values seen."""

    name = "count_distinct"

    def lift(self, value, order=0):
        return () if value is None else (value,)

    def merge(self, stored, partial):
        if not stored:
            return tuple(partial or ())
        if not partial:
            return stored
        return tuple(sorted(set(stored) | set(partial), key=_sort_key))

    def result(self, state):
        return len(state or ())


def _sort_key(value):
    return (type(value).__name__, value)


AGGREGATES = {
    "count": Count, "sum": Sum, "min": Min, "max": Max, "avg": Avg,
    "latest_by_offset": LatestByOffset, "latest_keeping_nulls": LatestKeepingNulls, "count_distinct": CountDistinct,
}


class RowAggregator:
    """The value of an aggregate table: one state per aggregate column, as a tuple."""

    def __init__(self, columns: dict[str, Aggregate]) -> None:
        self.columns = dict(columns)
        self._aggs = tuple(self.columns.values())
        self.merge = self._compile_merge()
        # Every column adds (COUNT, SUM): int states merge by addition, so a commit may add
        # straight on the stored bytes (codec.add_ints) instead of decode-merge-encode.
        self.additive = all(type(agg) in (Count, Sum) for agg in self._aggs)

    def _compile_merge(self):
        """A merge function specialised to the column count: this is the hot
        path of every commit, so it avoids a generator per row."""
        merges = tuple(agg.merge for agg in self._aggs)
        if len(merges) == 1:
            (m0,) = merges

            def merge(stored, partial):
                if stored is None:
                    return partial
                if partial is None:
                    return stored
                return (m0(stored[0], partial[0]),)
        elif len(merges) == 2:
            m0, m1 = merges

            def merge(stored, partial):
                if stored is None:
                    return partial
                if partial is None:
                    return stored
                return (m0(stored[0], partial[0]), m1(stored[1], partial[1]))
        else:
            def merge(stored, partial):
                if stored is None:
                    return partial
                if partial is None:
                    return stored
                return tuple(m(s, p) for m, s, p in zip(merges, stored, partial))
        return merge

    def lift(self, values: tuple, order=0) -> tuple:
        return tuple(agg.lift(v, order) for agg, v in zip(self._aggs, values))

    def result(self, state: tuple | None) -> dict | None:
        if state is None:
            return None
        return {name: agg.result(s) for (name, agg), s in zip(self.columns.items(), state)}

    def spec(self) -> tuple:
        return tuple((name, agg.spec()) for name, agg in self.columns.items())


# --------------------------------------------------------------- retracting
# An aggregate over a table (`FROM some_table GROUP BY ...`): a changed input row takes its old
# contribution out of its old group and puts its new one into its new group, as Kafka Streams'
# KTable.groupBy(...).aggregate(adder, subtractor) does. A partial is a signed contribution, and
# merging stays associative and commutative, so one group's deltas of a batch fold in any order.


class RetractingCount(Aggregate):
    """COUNT(col) or COUNT(*) (`col` None) over a table's rows: +1 when a row joins the group, -1 when it leaves."""

    name = "count"

    def lift(self, value, order=0):
        return 0 if value is None else order        # `order` is the sign (+1 or -1) here

    def merge(self, stored, partial):
        return (stored or 0) + (partial or 0)


class RetractingSum(Aggregate):
    """SUM as (sum, values counted), so a group whose every value left shows NULL again, as SQL's
    SUM of no values is. A DOUBLE sum that had values taken out may differ from one summed afresh
    in its last bits (floating point); integers and DECIMALs stay exact."""

    name = "sum"

    def lift(self, value, order=0):
        return (0, 0) if value is None else (value if order > 0 else -value, order)

    def merge(self, stored, partial):
        if not stored:
            return partial
        if not partial:
            return stored
        return (stored[0] + partial[0], stored[1] + partial[1])

    def result(self, state):
        return None if not state or state[1] == 0 else state[0]


class RetractingAvg(RetractingSum):
    name = "avg"

    def result(self, state):
        return None if not state or state[1] == 0 else state[0] / state[1]


class _Multiset(Aggregate):
    """The group's values with their counts, sorted: what MIN, MAX, COUNT(DISTINCT) and TOPK must
    keep, since taking out the extreme value needs the next one. Bounded by the size of one
    state value (state.changelog.VALUE_LIMIT): a group past it fails its batch, naming it."""

    def entry(self, value):
        return value

    def lift(self, value, order=0):
        entry = self.entry(value)
        return () if entry is None else ((entry, order),)

    def merge(self, stored, partial):
        if not stored:
            return tuple(e for e in partial or () if e[1])
        if not partial:
            return stored
        counts = dict(stored)
        for entry, n in partial:
            counts[entry] = counts.get(entry, 0) + n
        return tuple(sorted(((e, n) for e, n in counts.items() if n), key=lambda en: _total_key(en[0])))


class RetractingMin(_Multiset):
    name = "min"

    def result(self, state):
        return state[0][0] if state else None


class RetractingMax(_Multiset):
    name = "max"

    def result(self, state):
        return state[-1][0] if state else None


class RetractingCountDistinct(_Multiset):
    name = "count_distinct"

    def result(self, state):
        return len(state or ())


@dataclass(frozen=True)
class RetractingTopN(_Multiset):
    """TOPK(n, score, cols...) over a table's rows: every (score, row) of the group is kept, and the
    n best are listed, score descending; a table's rows have no arrival order, so ties go to the
    smaller row (its columns compared in order)."""

    n: int
    name = "topn"

    def entry(self, value):
        score, row = value
        return None if score is None else (score, tuple(row))

    def result(self, state):
        entries = [entry for entry, n in state or () for _ in range(n)]
        entries.sort(key=lambda e: _total_key(e[1]))
        entries.sort(key=lambda e: e[0], reverse=True)
        return [(score, *row) for score, row in entries[: self.n]]

    def spec(self) -> tuple:
        return (self.name, self.n, "retracting")


RETRACTING = {
    "count": RetractingCount, "sum": RetractingSum, "avg": RetractingAvg, "min": RetractingMin,
    "max": RetractingMax, "count_distinct": RetractingCountDistinct,
}


class RetractingAggregator(RowAggregator):
    """The value of an aggregate over a table: the group's row count first (hidden: at zero the
    group is deleted, not shown as zeros), then one state per column. `lift(values, sign)` is a
    row's contribution (+1) or its retraction (-1)."""

    def __init__(self, columns: dict[str, Aggregate]) -> None:
        super().__init__({ROWS: RetractingCount(), **columns})
        self.additive = False        # a merge may empty a group: never add on the stored bytes

    def lift(self, values: tuple, order=0) -> tuple:
        return (order,) + tuple(agg.lift(v, order) for agg, v in zip(self._aggs[1:], values))

    def merge_or_delete(self, stored, partial):
        """The merged state, or None when the group has no rows left."""
        merged = self.merge(stored, partial)
        return None if merged is None or merged[0] <= 0 else merged

    def result(self, state: tuple | None) -> dict | None:
        row = super().result(state)
        if row is not None:
            row.pop(ROWS)
        return row

    def spec(self) -> tuple:
        return ("retracting",) + super().spec()


ROWS = "_rows"       # RetractingAggregator's hidden row count


def _total_key(value):
    """An order over any stored value, NULLs first (a row may hold them; None < str fails)."""
    if isinstance(value, tuple):
        return (1, "tuple", tuple(_total_key(v) for v in value))
    return (0,) if value is None else (1, type(value).__name__, value)
