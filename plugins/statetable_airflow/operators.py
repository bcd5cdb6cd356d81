"""Operators: one table task each. The work itself lives in spark_jobs; these
only bind it to Airflow (connections, XCom, skips, logs)."""
from __future__ import annotations

import dataclasses
import functools
import json
from datetime import timedelta
from pathlib import Path

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException
from airflow.triggers.base import StartTriggerArgs

from statetable_airflow.hooks import KAFKA_CONN_ID, StateTableHook
from statetable_airflow.errors import DrillNotExact, JobFailed, JobLeftNoResult

SPARK_CONN_ID = "spark_default"
SPARK_CONNECT_CONN_ID = "spark_connect_default"
MODE_ENV = "STATETABLE_SPARK_MODE"
#: "worker": a run that committed batches resumes on a worker even where the triggerer could end it
#: (statetable_airflow.triggers), to measure the two side by side or where a listener must see it.
RUN_END_ENV = "STATETABLE_RUN_END"
API_CONN_ENV = "AIRFLOW_CONN_STATETABLE_AIRFLOW_API"
BOOTSTRAP_TEMPLATE = "{{ conn.%s.extra_dejson['bootstrap.servers'] }}"


def result_file(table: str, task_id: str) -> str:
    """Where a table job leaves its outcome for the next task (templated by run)."""
    from catalog.runtime import Runtime

    return str(Runtime.from_env().data_dir / "runs" / table / "{{ dag.dag_id }}" /
               ("{{ run_id | replace(':', '_') | replace('+', '_') }}." + task_id + ".json"))


ERROR_KEY = "error"


def reporting(execute):
    """Pushes a failing task's error, as one line, to XCom under `error`, so the drill's
    `record_result` can quote the cause instead of pointing at a log it is not in; a skip's
    reason goes the same way. The task fails or skips as it would have."""

    @functools.wraps(execute)
    def run(self, context):
        try:
            return execute(self, context)
        except Exception as exc:
            from catalog.messages import one_line

            try:
                text = str(exc) if isinstance(exc, AirflowSkipException) else one_line(exc)
                context["ti"].xcom_push(key=ERROR_KEY, value=text[:2000])
            except Exception as push:     # noqa: BLE001 - the task's own error is the one to raise
                self.log.warning("could not record the error for the drill's record: %s", push)
            raise

    return run


def spark_mode() -> str:
    """How this deployment runs table jobs: `connect` (default) as a thin client of the Spark
    Connect server, or `submit` with spark-submit, for clusters without a Connect server."""
    import os

    mode = os.environ.get(MODE_ENV, "connect")
    if mode not in ("connect", "submit"):
        from catalog.errors import UserError
        raise UserError(f"{MODE_ENV}={mode!r} is not a way to run table jobs; use connect (a Spark Connect "
                        f"server, connection {SPARK_CONNECT_CONN_ID!r}) or submit (spark-submit, {SPARK_CONN_ID!r})")
    return mode


def spark_job(task_id: str, action: str, table: str, *args: str, kafka_config_id: str = KAFKA_CONN_ID,
              **kwargs) -> BaseOperator:
    """`spark_jobs.jobs <action> <table>`, Kafka from the Airflow connection (see `spark_task`)."""
    from spark_jobs import submit

    return spark_task(task_id, "spark_jobs.jobs", submit.__file__, f"statetable-{action}-{table}",
                      [action, table, "--bootstrap", BOOTSTRAP_TEMPLATE % kafka_config_id,
                       "--result-file", result_file(table, task_id), *args], **kwargs)


def spark_task(task_id: str, entry: str, application: str, app_name: str, application_args: list[str],
               **kwargs) -> BaseOperator:
    """A task running `entry.main(application_args)`: over Spark Connect (no JVM in the task
    process), or spark-submitted as the file `application` (see `spark_mode`)."""
    if spark_mode() == "connect":
        return SparkConnectJobOperator(task_id=task_id, entry=entry, application_args=application_args, **kwargs)
    from spark_jobs.engine import session
    from statetable_airflow.spark_submit import PrivateConfSparkSubmitOperator

    return PrivateConfSparkSubmitOperator(task_id=task_id, application=application, conn_id=SPARK_CONN_ID,
                                          **session.submit_options(app_name), application_args=application_args,
                                          **kwargs)


class _Lineage:
    """OpenLineage datasets for Airflow's OpenLineage provider (see statetable_airflow.lineage)."""

    lineage_kind = "none"

    def lineage_table(self) -> str:
        return self.table

    def get_openlineage_facets_on_complete(self, task_instance):
        from statetable_airflow.lineage import operator_lineage

        return operator_lineage(self.lineage_table(), self.lineage_kind)


class SparkConnectJobOperator(_Lineage, BaseOperator):
    """Runs a job's `main(argv)` (spark_jobs.jobs by default, the file spark-submit would run) in
    the task process, as a client of the Spark Connect server of the provider's connection: the
    task starts no JVM, and the server's warm session does the Spark work. A non-zero exit code
    fails the task."""

    template_fields = ("application_args",)
    ui_color = "#fde9d9"

    def __init__(self, *, application_args: list[str], entry: str = "spark_jobs.jobs",
                 conn_id: str = SPARK_CONNECT_CONN_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.application_args = application_args
        self.entry = entry
        self.conn_id = conn_id

    @reporting
    def execute(self, context) -> None:
        import importlib

        use_spark_connect(self.conn_id)
        argv = [str(a) for a in self.application_args]
        code = importlib.import_module(self.entry).main(argv)
        if code:
            what = {1: "found differences", 2: "refused its arguments or the definition"}.get(code, f"exited {code}")
            raise JobFailed(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} {what} (exit {code}); "
                               f"its log holds the detail")

    @property
    def lineage_kind(self) -> str:
        action = str(self.application_args[0]) if self.application_args else ""
        return action if action in ("run", "verify", "rebuild") else "none"

    def lineage_table(self) -> str:
        return str(self.application_args[1]) if len(self.application_args) > 1 else ""

    def on_kill(self) -> None:
        """Airflow stops the task (timeout, marked failed): interrupt its operations on the server,
        rather than leave them running detached. The batch's plan stays; the next run finishes it."""
        from spark_jobs.engine import session

        session.interrupt_all()


def use_spark_connect(conn_id: str = SPARK_CONNECT_CONN_ID) -> str:
    """Point this task process (and the jobs it starts) at the connection's server."""
    import os

    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from spark_jobs.engine.session import REMOTE_ENV

    url = SparkConnectHook(conn_id).get_connection_url()
    os.environ[REMOTE_ENV] = url
    return url


def read_result(path: str) -> dict:
    target = Path(path)
    if not target.exists():
        raise JobLeftNoResult(f"the job left no result at {target}; see the log of the task before this one")
    return json.loads(target.read_text())


class _TableOperator(_Lineage, BaseOperator):
    template_fields = ("table",)
    ui_color = "#e8f1fb"

    def __init__(self, *, table: str, kafka_config_id: str = KAFKA_CONN_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.kafka_config_id = kafka_config_id

    @property
    def hook(self) -> StateTableHook:
        return StateTableHook(self.kafka_config_id)


class SnapshotOperator(_TableOperator):
    """Snapshots the partitions that are due (catalog.registry.due_snapshots: each table at its phase)."""

    def execute(self, context) -> dict:
        from spark_jobs import jobs

        done = jobs.snapshot_if_due(self.table, self.hook.runtime())
        if done["partitions"]:
            self.log.info("%s: snapshot of partitions %s at batch %s in %.2fs", self.table, done["partitions"],
                          done["batch"], done["seconds"])
        else:
            self.log.info("%s: no partition is due for a snapshot at batch %s", self.table, done["batch"])
        return done


def batch_stats(log, table: str, result: dict, lag: int) -> dict:
    """Log and return what a run's micro-batches did: read, dead-lettered, late, keys changed,
    duration and rate per batch, and the lag left."""
    for b in result["batches"]:
        log.info("%s batch %d: read %d, dead-lettered %d, late %d, keys changed %d, %.1fs (%.0f records/s)",
                 table, b["batch"], b["read"], b.get("dead_lettered", 0), b.get("late", 0),
                 b.get("keys_changed", 0), b["seconds"], b["read"] / max(b["seconds"], 1e-6))
    stats = {
        "batches": len(result["batches"]), "read": result["read"],
        "dead_lettered": sum(b.get("dead_lettered", 0) for b in result["batches"]),
        "late": sum(b.get("late", 0) for b in result["batches"]),
        "keys_changed": sum(b.get("keys_changed", 0) for b in result["batches"]),
        "seconds": result["seconds"], "lag": lag,
        "last_batch": result["batches"][-1]["batch"] if result["batches"] else None,
    }
    log.info("%s: %d batches, %d records in %.1fs (%.0f records/s), lag now %d", table, stats["batches"],
             stats["read"], stats["seconds"], stats["read"] / max(stats["seconds"], 1e-6), stats["lag"])
    return stats


def run_facts(table: str, result: dict, stats: dict) -> dict:
    """The Asset event's facts: what the batches did, so a downstream DAG (or a user reading the
    Assets page) sees batch ids and counts without opening the task's log."""
    return {"table": table, "first_batch": result["batches"][0]["batch"] if result["batches"] else None,
            **{k: stats[k] for k in ("last_batch", "batches", "read", "dead_lettered", "late", "keys_changed",
                                     "lag", "seconds")}}


def ends_in_triggerer() -> bool:
    """Whether a run that committed batches ends in the triggerer: where the deployment gave the
    triggerer a way to send its Asset event (the stack's `statetable_airflow_api` connection)."""
    import os

    return os.environ.get(RUN_END_ENV, "trigger") != "worker" and API_CONN_ENV in os.environ


def emit_stats(table: str, stats: dict, durations: list[float]) -> None:
    """The run's numbers through Airflow's own metrics (StatsD or OpenTelemetry, whichever the
    deployment configured for Airflow; nothing when neither is on): `statetable.<table>.*`, also
    tagged with the table for backends that keep tags."""
    from airflow.sdk.observability.stats import Stats

    tags = {"table": table}
    for name in ("batches", "read", "dead_lettered", "late", "keys_changed"):
        Stats.incr(f"statetable.{table}.{name}", count=stats[name], tags=tags)
    Stats.gauge(f"statetable.{table}.lag_records", stats["lag"], tags=tags)
    for seconds in durations:
        Stats.timing(f"statetable.{table}.batch_duration", seconds * 1000.0, tags=tags)


class BatchStatsOperator(_TableOperator):
    """The last task of a spark-submit incremental run: the job's result file, as stats."""

    template_fields = ("table", "result_path")

    def __init__(self, *, result_path: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.result_path = result_path

    def execute(self, context) -> dict:
        result = read_result(self.result_path)
        stats = batch_stats(self.log, self.table, result, self.hook.lag(self.table))
        emit_stats(self.table, stats, [b["seconds"] for b in result["batches"]])
        return stats


class TableBatchesOperator(_TableOperator):
    """A whole incremental run in one task: the lag check, the batches until caught up, the due
    snapshots and the stats (ops.batch_service.run_table).

    With the stack's batch service (`service=True`, the default where the stack runs one), the
    task starts in the triggerer: statetable_airflow.triggers.TableRunTrigger hands the run to the
    service and awaits it holding no worker slot; a run with nothing new ends skipped there, a
    failed one fails there (and is retried as any failure), and one that committed batches ends
    there too on the stack, with its Asset event, lineage, XCom and metrics, or resumes here, in
    `execute_complete`, where the triggerer cannot send its Asset event. Without
    it, `execute` runs the same steps in this task process, as a client of the Spark Connect
    server. Either way a retry is as safe as before: a planned batch finishes from its plan. A
    run with nothing to read is skipped at once and emits no Asset event.
    """

    template_fields = ("table",)
    ui_color = "#fde9d9"
    lineage_kind = "run"
    start_trigger_args = StartTriggerArgs(trigger_cls="statetable_airflow.triggers.TableRunTrigger",
                                          next_method="execute_complete", timeout=timedelta(hours=6))
    start_from_trigger = False

    def __init__(self, *, max_batches: int, conn_id: str = SPARK_CONNECT_CONN_ID, service: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_batches = max_batches
        self.conn_id = conn_id
        self.service = service
        if service:
            # Replaced, not mutated: start_trigger_args is the class's, shared by every table.
            self.start_from_trigger = True
            outlets = [o.uri for o in self.outlets or () if getattr(o, "uri", None)]
            self.start_trigger_args = dataclasses.replace(
                self.start_trigger_args, trigger_kwargs={"table": self.table, "max_batches": max_batches,
                                                         "end_here": ends_in_triggerer(), "outlets": outlets})

    def execute(self, context) -> dict:
        import os

        from ops.batch_service import run_table

        phases = RunPhases()
        rt = self.hook.runtime()
        os.environ["STATETABLE_KAFKA_BOOTSTRAP"] = rt.bootstrap     # as `--bootstrap` sets it for a job
        use_spark_connect(self.conn_id)
        outcome = run_table(self.table, self.max_batches, rt)
        phases.mark("run")
        if outcome["outcome"] == "skipped":
            raise AirflowSkipException(outcome["reason"])
        return self._finish(context, outcome, phases)

    def execute_complete(self, context, event: dict) -> dict:
        """The service's answer for a run that committed batches (the trigger ended the others)."""
        return self._finish(context, event, RunPhases())

    def _finish(self, context, outcome: dict, phases: "RunPhases") -> dict:
        result, snapshot = outcome["result"], outcome["snapshot"]
        phases.add(outcome.get("phases", {}))
        if snapshot["partitions"]:
            self.log.info("%s: snapshot of partitions %s at batch %s in %.2fs", self.table, snapshot["partitions"],
                          snapshot["batch"], snapshot["seconds"])
        stats = batch_stats(self.log, self.table, result, outcome["lag"])
        emit_stats(self.table, stats, outcome["durations"])
        phases.mark("stats")
        facts = run_facts(self.table, result, stats)
        for outlet in self.outlets or ():
            context["outlet_events"][outlet].extra = facts
        self.log.info("%s: where the task's seconds went: %s", self.table, phases.line())
        return {**stats, "snapshot_partitions": snapshot["partitions"], "phases": phases.as_dict()}


class RunPhases:
    """Where a run's seconds go inside its task: from the task process's start (the DAG file
    parsed and the operator imported before `execute`) through each step, so a slow run says
    whether Airflow's way in or the batch took the time (bench/tables_per_stack prints them)."""

    def __init__(self) -> None:
        import time

        import psutil

        self.process_started = psutil.Process().create_time()
        self.execute_at = time.time()
        self.stamps = [("process_to_execute", self.execute_at)]
        self._last = self.execute_at
        self.measured: dict = {}

    def add(self, measured: dict) -> None:
        """Phases measured elsewhere (the run's steps, in this process or the batch service)."""
        self.measured = dict(measured)

    def mark(self, phase: str) -> None:
        import time

        now = time.time()
        self.stamps.append((phase, now))
        self._last = now

    def as_dict(self) -> dict:
        out = {"process_started": round(self.process_started, 3), "execute_at": round(self.execute_at, 3),
               "process_to_execute": round(self.execute_at - self.process_started, 3)}
        out.update(self.measured)
        for (_, before), (phase, at) in zip(self.stamps, self.stamps[1:]):
            out[phase] = round(at - before, 3)
        out["returned_at"] = round(self._last, 3)
        return out

    def line(self) -> str:
        d = self.as_dict()
        return ", ".join(f"{k} {v:.2f}s" for k, v in d.items() if k not in ("process_started", "execute_at",
                                                                              "returned_at"))


class InjectFailureOperator(_TableOperator):
    """Injects one of ops.failures.FAILURES into the live table."""

    template_fields = ("table", "failure")

    def __init__(self, *, failure: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.failure = failure

    @reporting
    def execute(self, context) -> dict:
        from ops import failures

        if spark_mode() == "connect":
            use_spark_connect()     # a killed batch, or the killed engine, is the server the jobs use
        try:
            return failures.inject(self.table, self.failure, self.hook.runtime()).to_json()
        except failures.NothingToInject as exc:
            raise AirflowSkipException(str(exc)) from None


class RestoreOperator(_TableOperator):
    """Restores every partition that has no local store, and times it; after a snapshot drill,
    from the drill's scratch copy of the snapshot store."""

    lineage_kind = "restore"

    def __init__(self, *, inject_task: str = "inject_failure", **kwargs) -> None:
        super().__init__(**kwargs)
        self.inject_task = inject_task

    @reporting
    def execute(self, context) -> dict:
        from dataclasses import asdict

        from ops import failures

        injected = context["ti"].xcom_pull(task_ids=self.inject_task) or {}
        scratch = injected.get("facts", {}).get("snapshot_uri")
        return asdict(failures.recover(self.table, self.hook.runtime(), snapshot_uri=scratch))


class RecordVerifyOperator(_TableOperator):
    """Records a restore-and-verify outcome (also when a step before failed), then passes or fails with it."""

    template_fields = ("table", "failure", "result_path")

    def __init__(self, *, failure: str, result_path: str, inject_task: str, restore_task: str, **kwargs) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.failure = failure
        self.result_path = result_path
        self.inject_task = inject_task
        self.restore_task = restore_task

    def execute(self, context) -> dict:
        from ops import status

        ti = context["ti"]
        tasks = [self.inject_task, self.restore_task, "verify"]
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=tasks, run_ids=[ti.run_id]).get(ti.run_id, {})
        errors = {task: ti.xcom_pull(task_ids=task, key=ERROR_KEY) for task in tasks if states.get(task) in
                  ("failed", "skipped", "upstream_failed")}
        if states.get(self.inject_task) == "skipped":
            reason = errors.get(self.inject_task) or f"{self.failure} could not be injected"
            status.record_verify(self.hook.runtime(), self.table, {
                "run_id": context["run_id"], "failure": self.failure, "ok": None, "skipped": True, "reason": reason})
            raise AirflowSkipException(f"{self.table}: not verified: {reason}")
        injected = ti.xcom_pull(task_ids=self.inject_task)
        recovered = ti.xcom_pull(task_ids=self.restore_task) or {}
        verified = read_result(self.result_path) if Path(self.result_path).exists() else {}
        ok = bool(verified.get("ok"))
        record = {
            "run_id": context["run_id"], "failure": self.failure, "ok": ok, "injected": injected,
            "restore_seconds": recovered.get("restore_seconds"),
            "restored_partitions": recovered.get("restored_partitions"),
            "corrupt_snapshots": len(recovered.get("corrupt_snapshots") or []), **status.verify_fields(verified),
        }
        if not verified:
            failed = next((t for t in tasks if states.get(t) == "failed"), None)
            cause = errors.get(failed) if failed else None
            record["drill_failed"] = (f"{failed}: {cause}" if cause else
                                      f"{failed}: no error was recorded; open that task's log" if failed else
                                      "the verify left no result")
        status.record_verify(self.hook.runtime(), self.table, record)
        self.log.info("%s restore-verify after %s: %s", self.table, self.failure, status.verify_verdict(record)[0])
        for example in record["examples"]:
            self.log.error("  key %s: state=%r recomputed=%r", example["key"], example["state"],
                           example["recomputed"])
        if not ok:
            raise DrillNotExact(f"{self.table}: restore-verify after {self.failure!r}: "
                               + (f"drill failed at {record['drill_failed']}" if not verified else
                                  f"{record['differences']} of {record['keys_compared']} keys differ"))
        return record
