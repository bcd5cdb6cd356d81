"""A deterministic workload for state tests, shared by test processes and the
crash subprocess, with an independent plain-dict reference."""
from __future__ import annotations

import random

from state.aggregates import Count, RowAggregator, Sum
from state.table import StateTable, TableSpec

PARTITIONS = 3


def spec(name: str) -> TableSpec:
    return TableSpec(name, PARTITIONS, RowAggregator({"n": Count(), "s": Sum()}), snapshot_keep=3)


def batch_events(batch_id: int, keys: int = 40, events: int = 120) -> list[tuple[tuple, int]]:
    rng = random.Random(batch_id * 7919)
    return [((f"key{rng.randrange(keys)}",), rng.randint(-50, 500)) for _ in range(events)]


def deleted_in(batch_id: int) -> list[tuple]:
    return [(f"key{batch_id % 40}",)] if batch_id % 4 == 3 else []


def apply_batch(table: StateTable, batch_id: int, partitions=None) -> None:
    partitions = range(PARTITIONS) if partitions is None else partitions
    for p in partitions:
        part = table.open(p)
        with part.begin(batch_id) as tx:
            for key, value in batch_events(batch_id):
                if table.partition_of(key) == p:
                    tx.merge(key, (1, value))
            for key in deleted_in(batch_id):
                if table.partition_of(key) == p:
                    tx.delete(key)


def reference(upto_batch: int) -> dict:
    """The table after batches 0..upto_batch, without the project's code."""
    state: dict = {}
    for b in range(upto_batch + 1):
        for key, value in batch_events(b):
            n, s = state.get(key, (0, 0))
            state[key] = (n + 1, s + value)
        for key in deleted_in(b):
            state.pop(key, None)
    return state


def contents(table: StateTable, readonly: bool = False) -> dict:
    out = {}
    for p in range(PARTITIONS):
        part = table.open_readonly(p) if readonly else table.open(p)
        out.update(dict(part.items()))
        if readonly:
            part.close()
    return out
