"""Three DAGs for every table definition in dags/tables/.

- `<table>__incremental`: micro-batches on the table's schedule.
- `<table>__rebuild`: recompute from bronze history, for manual runs and
  `airflow backfill create`.
- `<table>__restore_verify`: inject a failure, recover, prove the table exact.

The DAG files only call `build_all()`; every task's work is in spark_jobs/
and the operators here.
"""
from __future__ import annotations

import functools
from datetime import datetime, timedelta

from airflow.sdk import (DAG, Asset, AssetAny, AssetOrTimeSchedule, CronTriggerTimetable, Param, get_parsing_context,
                         task)

from catalog.definitions import TableDefinition
from statetable_airflow.operators import (
    BatchStatsOperator, InjectFailureOperator, RecordVerifyOperator, RestoreOperator, SnapshotOperator,
    TableBatchesOperator, result_file, spark_job, spark_mode,
)
from statetable_airflow.sensors import OffsetLagSensor
from statetable_airflow.timetables import BackfillOnlyTimetable, daily_drill, places, spread

START = datetime(2026, 1, 1)

INCREMENTAL_DOC = """
### {table}: incremental micro-batches

Every `{schedule}`, one task, `run_batches`: it skips the run at once when the
topic has nothing new, runs up to {cap} micro-batches of at most {budget}
records each on the Spark Connect server, snapshots partitions every {every}
batches, and logs and returns read, dead-lettered, late, keys changed,
duration and the lag left. (With `STATETABLE_SPARK_MODE=submit` the same steps
are four tasks: `wait_for_offsets` → `run_batches` (spark-submit) →
`snapshot_if_due` → `record_stats`.)

**Retries are safe.** Each batch is planned (exact offsets) before it reads and
is idempotent after that: state partitions skip a batch id they have applied,
Delta writes carry transaction ids, dead letters are keyed by source offset.
A retry, or a run after a killed one, finishes the interrupted batch from its
plan and never counts an event twice.
"""

REBUILD_DOC = """
### {table}: rebuild from history

Recomputes the table from its bronze Delta table (the exact events the
incremental path applied) and commits the result as a new state version,
with changelog records and snapshots. Windowed tables rebuild the windows
that start inside the run's data interval, so
`airflow backfill create --dag-id {table}__rebuild --from-date A --to-date B`
recomputes those days; set params `window_from`/`window_to` for a manual range
or `full` for everything. Tables without windows rebuild in full.
"""

RESTORE_VERIFY_DOC = """
### {table}: restore and verify

Injects the failure named by the `failure` param for real, runs the recovery
path, then compares the table with a batch recomputation: per-partition
digests first, then every key. A difference fails `verify`, whose log names
the keys; `record_result` appends the outcome (failure, restore time, keys
compared, differences) to the table's verify history shown on the statetable
page.

| failure | what happens |
|---|---|
{failures}
"""


def batch_service_on() -> bool:
    """Whether incremental runs go to the stack's batch service (statetable_airflow.triggers):
    the stack sets STATETABLE_BATCH_SERVICE=on beside the `statetable_batches` connection; a
    deployment without the service runs its batches in the task process."""
    import os

    return os.environ.get("STATETABLE_BATCH_SERVICE") == "on"


def table_asset(name: str) -> Asset:
    """The Airflow Asset a table's committed batches update: `run_batches` emits an event when it
    succeeds (a run with nothing to read is skipped and emits none)."""
    return Asset(name=f"statetable_{name}", uri=f"statetable://tables/{name}", group="statetable")


def upstream_tables(table: TableDefinition, tables: dict[str, TableDefinition]) -> list[str]:
    """The tables whose change topic (`output_topic`) is `table`'s input, and the tables a join of
    tables joins (their commits change its rows)."""
    joined = {j.table for j in table.joins} if table.table_join else set()
    return sorted(u.name for u in tables.values() if (u.output_topic and u.output_topic == table.topic
                                                       or u.name in joined) and u.name != table.name)


def incremental_schedule(table: TableDefinition, tables: dict[str, TableDefinition],
                         minute_places: dict[str, int] | None = None):
    """The table's cron, and for a table on other tables, also each commit of theirs: a chain
    settles in one pass instead of one schedule per link (Airflow's AssetOrTimeSchedule).
    `minute_places` (timetables.places over every table) balances the `*/N` minutes; a task's
    parse of its one table has none and never schedules, so a hash will do there."""
    upstream = upstream_tables(table, tables)
    cron = spread(table.schedule, table.name, (minute_places or {}).get(table.name))
    if not upstream:
        return cron
    assets = AssetAny(*[table_asset(u) for u in upstream])
    if cron is None:
        return assets
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=assets)


def incremental_dag(table: TableDefinition, tables: dict[str, TableDefinition] | None = None,
                    minute_places: dict[str, int] | None = None) -> DAG:
    t = table.name
    upstream = upstream_tables(table, tables or {})
    with DAG(
        dag_id=f"{t}__incremental",
        schedule=incremental_schedule(table, tables or {}, minute_places),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=15)},
        tags=["statetable", t, "incremental"],
        doc_md=INCREMENTAL_DOC.format(table=t, schedule=table.schedule, cap=table.max_batches_per_run,
                                      budget=table.max_records_per_batch, every=table.snapshot_every)
        + (f"\nAlso runs when {', '.join(upstream)} commits (its change topic is this table's input).\n"
           if upstream else ""),
    ) as dag:
        if spark_mode() == "connect":
            TableBatchesOperator(task_id="run_batches", table=t, max_batches=table.max_batches_per_run,
                                 outlets=[table_asset(t)], service=batch_service_on())
            return dag
        wait = OffsetLagSensor(task_id="wait_for_offsets", table=t, timeout=0, poke_interval=5, soft_fail=True,
                               retries=0)
        run = spark_job("run_batches", "run", t, "--until-caught-up", "--max-batches",
                        str(table.max_batches_per_run), "--no-snapshot", outlets=[table_asset(t)])
        snapshot = SnapshotOperator(task_id="snapshot_if_due", table=t)
        stats = BatchStatsOperator(task_id="record_stats", table=t, result_path=result_file(t, "run_batches"))
        wait >> run >> snapshot >> stats
    return dag


def rebuild_dag(table: TableDefinition) -> DAG:
    t = table.name
    with DAG(
        dag_id=f"{t}__rebuild",
        # Day-long data intervals for backfills; the scheduler never starts a rebuild by itself.
        schedule=BackfillOnlyTimetable("0 0 * * *", timezone="UTC"),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=15)},
        tags=["statetable", t, "rebuild"],
        doc_md=REBUILD_DOC.format(table=t),
        params={
            "window_from": Param(None, type=["null", "string"], description="ISO date or time; with window_to"),
            "window_to": Param(None, type=["null", "string"], description="ISO date or time, exclusive"),
            "full": Param(False, type="boolean", description="rebuild every window"),
        },
    ) as dag:

        @task(retries=0)
        def plan_rebuild(params=None, data_interval_start=None, data_interval_end=None, dag_run=None) -> str:
            """Validate the params and pick the window range before any Spark work."""
            from spark_jobs.recompute.rebuild import rebuild_window

            window = rebuild_window(table, params["window_from"], params["window_to"], params["full"],
                                    (data_interval_start, data_interval_end))
            run_type = getattr(dag_run, "run_type", None)
            if window is None and str(getattr(run_type, "value", run_type)) == "backfill":
                # Every day of a backfill means the same full rebuild for a table without windows;
                # Airflow runs the days side by side, so the rebuild decides under the table's lock.
                print(f"{t}: full rebuild, once per backfill (the table has no windows)")
                return "once"
            if window is None:
                print(f"{t}: full rebuild" + ("" if table.window else " (the table has no windows)"))
                return ""
            print(f"{t}: rebuild windows starting in [{window[0]}, {window[1]}) ms")
            return f"{window[0]}:{window[1]}"

        window = plan_rebuild()
        rebuild = spark_job("rebuild", "rebuild", t, "--window", "{{ ti.xcom_pull(task_ids='plan_rebuild') }}")
        window >> rebuild
    return dag


def restore_verify_dag(table: TableDefinition) -> DAG:
    from ops.failures import FAILURES

    t = table.name
    rows = "\n".join(f"| `{name}` | {what} |" for name, what in FAILURES.items())
    with DAG(
        dag_id=f"{t}__restore_verify",
        schedule=daily_drill(t),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0},
        tags=["statetable", t, "restore-verify"],
        doc_md=RESTORE_VERIFY_DOC.format(table=t, failures=rows),
        params={"failure": Param("none", type="string", enum=list(FAILURES),
                                 description="the failure to inject before restoring and verifying")},
    ) as dag:
        inject = InjectFailureOperator(task_id="inject_failure", table=t, failure="{{ params.failure }}")
        restore = RestoreOperator(task_id="restore", table=t)
        verify = spark_job("verify", "verify", t, "--finish-pending")
        record = RecordVerifyOperator(task_id="record_result", table=t, failure="{{ params.failure }}",
                                      result_path=result_file(t, "verify"), inject_task="inject_failure",
                                      restore_task="restore")
        inject >> restore >> verify >> record
    return dag


def _wanted_dag_ids() -> set[str] | None:
    """The DAGs this parse is for, or None for all of them (the dag-processor's parse)."""
    wanted = get_parsing_context().dag_id
    return {wanted} if wanted is not None else _callback_dag_ids()


def _callback_dag_ids() -> set[str] | None:
    """The DAGs a dag-processor parse runs callbacks for; None for a parse that serialises DAGs.

    A run that ends in the triggerer with success makes Airflow (3.3) send its task's callback to
    the dag-processor, which parses this whole file to run it, whether the task has a callback
    or not (a success callback is never run there). At 100 tables a parse builds 300 DAGs in
    ~5 CPU s: measured, 42-95 CPU s of a 100-run wave. Airflow names no parsing context for that
    parse, so its request is found on the stack, in `_parse_file`'s message; anything unexpected
    there (another Airflow) falls back to building every DAG, which is always correct."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_parse_file" and "airflow" in frame.f_code.co_filename:
            requests = getattr(frame.f_locals.get("msg"), "callback_requests", None)
            if not requests:
                return None
            ids = {getattr(getattr(r, "ti", None), "dag_id", None) or getattr(r, "dag_id", None) for r in requests}
            return None if None in ids else ids
        frame = frame.f_back
    return None


def build_all(tables_dir=None, broken: dict[str, str] | None = None) -> dict[str, DAG]:
    """Every table's three DAGs, by dag_id; a table whose definition is broken gets none, and goes
    into `broken` (see `definition_errors`), so it cannot take the other tables down. An aggregate
    table without bronze (`-- bronze: off`) gets no rebuild or restore-verify DAG: both recompute
    it from bronze. Tables of tables recompute from their input topic, which compaction keeps."""
    from catalog.definitions import load_all
    from catalog.runtime import Runtime

    folder = tables_dir or Runtime.from_env().tables_dir
    # A task process parses this file to find its one task: building every table's three DAGs
    # there cost 0.4 CPU s per task at 100 tables, and parsing every definition 0.1 more, both
    # growing with every table added. Airflow names the DAG it parses for (get_parsing_context),
    # and the dag-processor's parse for a task's callback names it in its request: each builds
    # only the DAGs it is for, from their table's file alone when the table stands alone (one on
    # other tables, which this cannot load, takes the full parse).
    wanted = _wanted_dag_ids()
    tables = {}
    names = {dag_id.rsplit("__", 1)[0] for dag_id in wanted or ()}
    if len(names) == 1 and broken is None:
        (name,) = names
        tables = load_all(folder, broken={}, only=name)
        tables = tables if name in tables else {}
    if not tables:
        tables = load_all(folder, broken={} if broken is None else broken)
    dags = {}
    minute_places = places({t.name: t.schedule for t in tables.values()}) if len(tables) > 1 else None
    for table in tables.values():
        recomputable = table.bronze or table.kind == "source" or table.over_table   # the last two: from their topic
        builds = [functools.partial(incremental_dag, tables=tables, minute_places=minute_places)]
        builds += [rebuild_dag, restore_verify_dag] if recomputable else []
        for build, suffix in zip(builds, ("incremental", "rebuild", "restore_verify")):
            if wanted is None or f"{table.name}__{suffix}" in wanted:
                dag = build(table)
                dags[dag.dag_id] = dag
    return dags


def definition_errors(tables_dir=None) -> None:
    """Raise, naming every broken table and why: the DAG file that calls this shows it as an
    import error in Airflow, while the good tables' DAGs come from their own file."""
    from catalog.definitions import DefinitionError, load_all
    from catalog.runtime import Runtime

    broken: dict[str, str] = {}
    load_all(tables_dir or Runtime.from_env().tables_dir, broken=broken)
    if broken:
        raise DefinitionError("table definitions that do not load (their DAGs are missing until fixed):\n"
                              + "\n".join(f"- {name}: {reason}" for name, reason in sorted(broken.items())))
