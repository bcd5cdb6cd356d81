"""The stack's batch service: Airflow's tasks hand it their table's run and await the answer.

A task that ran its own batches paid, on every run and before its first record: a process
start with Airflow's imports, pyspark's, a Spark Connect client and its session, and Kafka
clients for the lag check. At 100 tables on two cores that was 1.25 CPU s per run in task
processes, more than the Connect server spent on the batch (docs/benchmarks/tables_per_stack.json).
The service keeps all of it warm across runs and tables, and bounds how many batches run at
once (`slots`, from the machine's cores), so a hundred due tables queue here, in order, instead
of a hundred processes contending for two cores.

Nothing about a run changes: `run_table` is the same steps the task ran (lag check, batches
until caught up, due snapshots, lag left), in the same order, under the same table lock, so a
run interrupted anywhere is finished from its plan by the next one, wherever that runs. One run
per table at a time (a second waits for the first: it then finds nothing, or what came since).
A run's own log lines go back in its answer, so the task's log shows them as before.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from pydantic import BaseModel, Field

from catalog.runtime import Runtime
from ops.capacity import CapacityLog, interval_seconds
from ops.capacity import read as capacity_state, warning as capacity_warning

log = logging.getLogger("statetable.batch_service")

TOKEN_FILE_ENV = "STATETABLE_BATCH_SERVICE_TOKEN_FILE"
SLOTS_ENV = "STATETABLE_BATCH_SLOTS"
MAX_LOG_LINES = 2000


def slots() -> int:
    """Batches at once: one per core, at least two (a batch also waits on Kafka and Spark's
    scheduling, so two keep a single core busy). STATETABLE_BATCH_SLOTS overrides it."""
    from catalog.errors import UserError

    raw = os.environ.get(SLOTS_ENV)
    if raw is None:
        return max(2, os.cpu_count() or 1)
    if not raw.isdigit() or int(raw) < 1:
        raise UserError(f"{SLOTS_ENV}={raw!r}: give the number of batches the service runs at once, e.g. 2")
    return int(raw)


def run_table(name: str, max_batches: int, rt: Runtime, spark=None) -> dict:
    """A table's incremental run: nothing new (skipped, no Spark touched), else its batches
    until caught up, the snapshots due, and the lag left. The answer a task turns into its stats,
    Asset event and XCom (statetable_airflow.operators.TableBatchesOperator)."""
    from spark_jobs import jobs
    from spark_jobs.batches.planning import lag

    phases: dict[str, float] = {}
    clock = time.monotonic()

    def mark(phase: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[phase] = round(now - clock, 3)
        clock = now

    waiting = lag(name, rt)
    mark("lag_check")
    if waiting < 1:
        return {"outcome": "skipped", "reason": f"{name}: nothing new in its topic since the last batch",
                "phases": phases}
    log.info("%s: %d records to read", name, waiting)
    if spark is None:
        from spark_jobs.engine import session

        spark = session.get_or_create(f"statetable-{name}")
    mark("session")
    started = time.monotonic()
    commits = jobs.run(name, max_batches, until_caught_up=True, rt=rt, snapshots=False, spark=spark)
    mark("batches")
    result = {"table": name, "batches": [jobs.commit_summary(c) for c in commits],
              "read": sum(c.counts["read"] for c in commits), "seconds": round(time.monotonic() - started, 3)}
    snapshot = jobs.snapshot_if_due(name, rt)
    mark("snapshot")
    left = lag(name, rt)
    mark("lag_after")
    return {"outcome": "done", "result": result, "snapshot": snapshot, "lag": left,
            "durations": [c.seconds for c in commits], "phases": phases}


class _RunLogs(logging.Handler):
    """Each run's own log lines, told apart by the thread that runs it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        self.lines: dict[int, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        lines = self.lines.get(record.thread)
        if lines is not None and len(lines) < MAX_LOG_LINES:
            try:
                lines.append(self.format(record))
            except Exception:       # noqa: BLE001 - a record that does not format is not worth a run
                pass


class BatchService:
    """Runs tables' runs on `slots` threads, one run per table at a time, sharing one warm
    Spark Connect client; keeps the last runs' timings for /health and the capacity signal."""

    def __init__(self, rt: Runtime, slots: int, spark=None) -> None:
        self.rt, self.slots, self.spark = rt, slots, spark
        self.pool = ThreadPoolExecutor(slots, thread_name_prefix="batch")
        self.table_locks: dict[str, threading.Lock] = {}
        self.guard = threading.Lock()
        self.session_lock = threading.Lock()
        self.running: dict[str, float] = {}
        self.queued = 0
        self.answered = 0
        self.logs = _RunLogs()
        logging.getLogger().addHandler(self.logs)
        self.capacity = CapacityLog(rt, slots)

    def session(self):
        """The one Spark Connect client every run shares, made on first use (its own lock: a
        server still starting must not hold up /health)."""
        with self.session_lock:
            if self.spark is not None and getattr(getattr(self.spark, "client", None), "is_closed", False):
                self.spark = None       # the Connect server restarted: its sessions are gone (a drill, a crash)
            if self.spark is None:
                from spark_jobs.engine import session

                self.spark = session.get_or_create("statetable-batch-service")
            return self.spark

    def warm(self, patience: float = 600.0) -> None:
        """Make the client before the first run, once the Connect server answers: `stack up`
        starts the service beside a server that is still starting. A run that comes first makes
        it itself, or fails in one line if the server is down."""
        deadline, problem = time.monotonic() + patience, None
        while time.monotonic() < deadline:
            try:
                self.session()
                for module in ("spark_jobs.jobs", "spark_jobs.batches.microbatch", "spark_jobs.batches.planning"):
                    __import__(module)
                return
            except Exception as exc:        # noqa: BLE001 - not up yet; a run says it, with its table's name
                problem = exc
                time.sleep(1.0)
        log.warning("the Spark Connect client is not warm after %.0fs: %s", patience, problem)

    def submit(self, table: str, max_batches: int) -> Future:
        with self.guard:
            self.queued += 1
        return self.pool.submit(self._run, table, max_batches, time.monotonic())

    def _run(self, table: str, max_batches: int, submitted: float) -> dict:
        from catalog.messages import one_line

        with self.guard:
            self.queued -= 1
            lock = self.table_locks.setdefault(table, threading.Lock())
        me = threading.get_ident()
        self.logs.lines[me] = lines = []
        with lock:
            started = time.monotonic()
            with self.guard:
                self.running[table] = time.time()
            try:
                try:
                    answer = run_table(table, max_batches, self.rt, self.session())
                except Exception:
                    if not self._client_lost():
                        raise
                    # The Connect server restarted during or before this run: a new client, and the
                    # run again (a planned batch finishes from its plan, so nothing is applied twice).
                    log.warning("%s: the Spark Connect server restarted; running again with a new client", table)
                    answer = run_table(table, max_batches, self.rt, self.session())
            except Exception as exc:        # noqa: BLE001 - the task fails with it, in one line
                log.warning("%s: run failed: %s", table, exc, exc_info=True)
                answer = {"outcome": "failed", "error": one_line(exc), "type": type(exc).__name__}
            finally:
                with self.guard:
                    self.running.pop(table, None)
                self.logs.lines.pop(me, None)
        answer["log"] = lines
        answer.setdefault("phases", {})["service_queue"] = round(started - submitted, 3)
        answer["phases"]["service_run"] = round(time.monotonic() - started, 3)
        with self.guard:
            self.answered += 1
        self.capacity.record(table, arrived=time.time() - (time.monotonic() - submitted), ended=time.time(),
                             queued_s=started - submitted, interval_s=self._interval(table))
        return answer

    def _client_lost(self) -> bool:
        """Whether a client this process holds (the run's, or an Arrow pass's sibling) was closed
        by a server restart; those are forgotten, so the next call makes new ones."""
        from spark_jobs.engine import session

        with self.session_lock:
            lost = session.drop_closed()
            client = getattr(self.spark, "client", None)
            if lost or getattr(client, "is_closed", False):
                self.spark = None
                return True
        return False

    def _interval(self, table: str) -> float | None:
        from catalog.registry import loaded_definitions

        definition = loaded_definitions(self.rt.tables_dir)[0].get(table)
        return interval_seconds(definition.schedule) if definition is not None else None

    def health(self) -> dict:
        with self.guard:
            return {"status": "ok", "slots": self.slots, "queued": self.queued,
                    "running": sorted(self.running), "runs_answered": self.answered,
                    "over_capacity": capacity_warning(capacity_state(self.rt))}


class RunRequest(BaseModel):
    table: str = Field(min_length=1, max_length=200)
    max_batches: int = Field(ge=1, le=100_000)


def app(service: BatchService, token: str):
    """The service's HTTP API: POST /runs (a table's run, answered when it ends), GET /health.
    Every call carries the stack's token: whoever may run a table's batches may also corrupt
    its timing, so nothing here answers an anonymous caller, /health included."""
    from fastapi import FastAPI, Header, HTTPException

    api = FastAPI(title="statetable batch service", docs_url=None, redoc_url=None, openapi_url=None)

    def authorised(header: str | None) -> None:
        given = (header or "").removeprefix("Bearer ").strip()
        if not given or not hmac.compare_digest(given, token):
            raise HTTPException(401, "the batch service takes the stack's token (Authorization: Bearer ...)")

    @api.post("/runs")
    async def runs(body: RunRequest, authorization: str | None = Header(None)) -> dict:
        authorised(authorization)
        return await asyncio.wrap_future(service.submit(body.table, body.max_batches))

    @api.get("/health")
    async def health(authorization: str | None = Header(None)) -> dict:
        authorised(authorization)
        return service.health()

    return api


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m ops.batch_service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dags-folder", help="touch this folder's table DAG files when a table file changes "
                                              "(ops.table_files)")
    args = parser.parse_args(argv)
    # Each run's INFO lines go back to its task's log (_RunLogs); the service's own log file
    # takes warnings only, so it grows with problems, not with runs.
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        from catalog.errors import UserError

        raise UserError(f"{TOKEN_FILE_ENV} is not set: name the file holding the service's token (`statetable "
                        f"stack up` starts the service with it)")
    with open(path) as f:
        token = f.read().strip()
    service = BatchService(Runtime.from_env(), slots())
    threading.Thread(target=service.warm, name="warm", daemon=True).start()
    if args.dags_folder:
        from ops.table_files import TableFilesWatch, dag_files

        TableFilesWatch(service.rt.tables_dir, dag_files(args.dags_folder)).start()
    log.warning("batch service on %s:%d, %d slots", args.host, args.port, service.slots)
    uvicorn.run(app(service, token), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
