"""Table jobs as functions: run, restore, query, verify, rebuild.

The CLI, spark-submit entry points (`python -m spark_jobs.jobs ...`) and
Airflow tasks all call these, so each behaviour exists once.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from state import faults
from state.errors import StateError
from state.table import StateTable
from spark_jobs.compile import row_of, state_spec
from spark_jobs.definitions import DefinitionError, TableDefinition, load_all
from spark_jobs.runtime import Runtime

log = logging.getLogger("statetable.jobs")


def load_table(name: str, rt: Runtime) -> tuple[TableDefinition, dict[str, TableDefinition]]:
    tables = load_all(rt.tables_dir)
    if name not in tables:
        raise DefinitionError(f"no table {name!r} in {rt.tables_dir}; defined tables: {sorted(tables)}")
    return tables[name], tables


def state_table(table: TableDefinition, rt: Runtime) -> StateTable:
    return StateTable(state_spec(table, rt.namespace), rt.state_dir, bootstrap=rt.bootstrap,
                      snapshot_uri=rt.snapshot_uri)


def run(name: str, max_batches: int | None = None, until_caught_up: bool = False, spark=None,
        rt: Runtime | None = None, max_records_per_batch: int | None = None):
    from spark_jobs import session
    from spark_jobs.microbatch import MicroBatchRunner

    faults.validate(os.environ.get(faults.ENV))
    rt = rt or Runtime.from_env()
    table, tables = load_table(name, rt)
    if max_records_per_batch:
        table.max_records_per_batch = max_records_per_batch
    spark = spark or session.get_or_create(f"statetable-{name}")
    runner = MicroBatchRunner(spark, table, tables, rt)
    started = time.monotonic()
    commits = runner.run(max_batches=max_batches, until_caught_up=until_caught_up)
    read = sum(c.counts["read"] for c in commits)
    elapsed = time.monotonic() - started
    log.info("%s: %d batches, %d records in %.1fs (%.0f records/s), lag now %d", name, len(commits), read,
             elapsed, read / max(elapsed, 1e-6), runner.lag())
    return commits


def restore(name: str, batch: int | None = None, rt: Runtime | None = None) -> list:
    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    st = state_table(table, rt)
    try:
        return [st.restore(p, batch) for p in range(table.partitions)]
    finally:
        st.close()


def readonly_partitions(table: TableDefinition, rt: Runtime):
    """Each local partition of `table` that has state, opened read-only (no writer, no catch-up)."""
    st = state_table(table, rt)
    try:
        for p in range(table.partitions):
            if (st.partition_dir(p) / "CURRENT").exists():
                part = st.open_readonly(p)
                try:
                    yield part
                finally:
                    part.close()
    finally:
        st.close()


def state_rows(name: str, rt: Runtime | None = None) -> dict[tuple, object]:
    """Every key's committed state value."""
    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    return {key: value for part in readonly_partitions(table, rt) for key, value in part.items()}


def query(name: str, key: tuple, rt: Runtime | None = None) -> dict | None:
    """One row from committed state (read-only: never takes the writer's lock)."""
    from state import codec
    from state.backends import RocksBackend
    from state.table import partition_of

    rt = rt or Runtime.from_env()
    table, _ = load_table(name, rt)
    key = coerce_key(table, key)
    p = partition_of(codec.encode_key(key), table.partitions)
    path = rt.state_dir / table.name / f"p{p:04d}"
    if not (path / "CURRENT").exists():
        raise StateError(f"table {name!r} partition {p} has no local state at {path}; run or restore the table")
    backend = RocksBackend(path, read_only=True)
    try:
        raw = backend.get(codec.encode_key(key))
        return None if raw is None else row_of(table, key, codec.decode_value(raw))
    finally:
        backend.close()


def coerce_key(table: TableDefinition, key: tuple) -> tuple:
    """CLI/HTTP keys arrive as strings; give each component its declared type."""
    types = dict(table.schema)
    out = []
    for name, value in zip(table.key_columns, key):
        dtype = types.get(name.split(".")[-1], "STRING")
        if isinstance(value, str) and dtype in ("BIGINT", "INT", "LONG"):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"table {table.name}: key {name} is {dtype}, not {value!r}") from None
        elif isinstance(value, str) and dtype in ("DOUBLE", "FLOAT"):
            value = float(value)
        out.append(value)
    return tuple(out) + tuple(key[len(out):])


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: python -m spark_jobs.jobs run TABLE [--until-caught-up]."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="spark_jobs.jobs")
    parser.add_argument("action", choices=["run"])
    parser.add_argument("table")
    parser.add_argument("--max-batches", type=int)
    parser.add_argument("--until-caught-up", action="store_true")
    args = parser.parse_args(argv)
    commits = run(args.table, args.max_batches, args.until_caught_up)
    print("STATETABLE_RESULT " + json.dumps({"batches": [c.batch_id for c in commits],
                                              "read": sum(c.counts["read"] for c in commits)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
