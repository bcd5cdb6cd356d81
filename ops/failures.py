"""Failures injected for real, and the recovery path that must undo them.

restore-and-verify runs one of these against a live table, runs `recover`,
then compares the table with a batch recomputation (spark_jobs.recompute.verify).
Each failure is what happens in production, not a simulation of it: a job
SIGKILLed with its whole process tree mid-merge, a lost disk, a snapshot
with a flipped byte, a snapshot store emptied, the broker restarted.

The drills that destroy snapshots never touch the table's own snapshot store:
they copy it to a scratch store (`<snapshot uri>/_drills/<table>`), damage
the copy, and `recover` restores from that copy, then deletes it. Anyone who
may trigger the DAG can run them on a production table, so only the local
store, a cache rebuilt from the changelog, is ever lost for real.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import asdict, dataclass, field

from state import faults
from spark_jobs import jobs
from catalog.batch_log import BatchLog
from catalog.runtime import Runtime
from ops.errors import DrillFailed, NothingToInject
from catalog.errors import UserError

log = logging.getLogger("statetable.failures")

FAILURES = {
    "none": "nothing: verify the table as it is",
    "kill_mid_batch": "SIGKILL a micro-batch's process tree after partition 0 committed, others maybe not",
    "wipe_local_store": "delete every local RocksDB partition (a lost disk or a new machine; on a cluster, "
                        "every worker's copy too)",
    "corrupt_latest_snapshot": "flip a byte in the newest snapshot of every partition (in a scratch copy of the "
                               "snapshot store), then lose the local store",
    "lose_all_snapshots": "delete every snapshot (in a scratch copy of the snapshot store), then lose the local "
                          "store (restore from the changelog alone)",
    "broker_restart": "stop and restart the Kafka broker, then lose the local store (the changelog must survive)",
    "kill_engine": "SIGKILL the Spark Connect server (and its Python workers) mid-batch, while a merge task holds "
                   "after partition 0 committed; the deployment starts it again and the next run finishes the batch",
    "kill_worker": "SIGKILL one Spark worker (its JVM, executor and Python workers) in the middle of a merge task, "
                   "after the partition's changelog commit; Spark reruns the task on another worker, and the "
                   "deployment starts the worker again",
}
KILL_POINT = "batch.mid_merge"
BROKER_RESTART_ENV = "STATETABLE_BROKER_RESTART"
ENGINE_RESTART_ENV = "STATETABLE_ENGINE_RESTART"
ENGINE_KILL_ENV = "STATETABLE_ENGINE_KILL"
WORKER_RESTART_ENV = "STATETABLE_WORKER_RESTART"
WORKER_WIPE_ENV = "STATETABLE_WORKER_WIPE"
WORKER_KILL_POINT = "commit.after_changelog"
CLIENT_GRACE_SECONDS = 10.0
# A restart is the deployment's own work: a Spark Connect server starts and runs its warm-up batch,
# 37 s on an idle 2-core machine and well past the old 180 s limit beside other work (CI at
# 372b9d5 failed the cluster's kill_engine drill there). The limit only stops a command that hangs.
DEPLOYMENT_COMMAND_SECONDS = 900.0
SNAPSHOT_DRILLS = ("corrupt_latest_snapshot", "lose_all_snapshots")
KILLS = ("kill_mid_batch", "kill_engine", "kill_worker")     # these make the batch they kill


@dataclass
class Injection:
    table: str
    failure: str
    detail: str
    seconds: float
    facts: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def validate(failure: str, table: str = "") -> None:
    if failure not in FAILURES:
        raise UserError(f"table {table!r}: failure {failure!r} is not known; use one of {sorted(FAILURES)}")


def inject(name: str, failure: str, rt: Runtime | None = None) -> Injection:
    validate(failure, name)
    rt = rt or Runtime.from_env()
    table, _ = jobs.load_table(name, rt)
    started = time.monotonic()
    facts: dict = {}
    if failure not in KILLS and BatchLog(rt.batch_dir(name)).last_commit() is None:
        # A verify of a table without a batch compares nothing with nothing: shown as proof, it
        # would be a false one. The drill is skipped and the table stays "not verified yet".
        raise NothingToInject(f"table {name!r} has no committed batch yet, so there is nothing to restore or "
                              f"verify; the drill proves the table once its first batch commits")
    if failure == "none":
        detail = "no failure injected"
    elif failure == "kill_mid_batch":
        detail = _kill_mid_batch(name, rt, facts)
    elif failure == "kill_engine":
        detail = _kill_engine(name, rt, facts)
    elif failure == "kill_worker":
        detail = _kill_worker(name, rt, facts)
    elif failure == "wipe_local_store":
        detail = _wipe(name, table, rt)
    elif failure in SNAPSHOT_DRILLS:
        scratch = _scratch_copy(name, table, rt, facts)
        damage = _corrupt_latest_snapshots if failure == "corrupt_latest_snapshot" else _lose_snapshots
        detail = damage(name, table, scratch, facts) + "; " + _wipe(name, table, rt)
    else:
        detail = _restart_broker(facts) + "; " + _wipe(name, table, rt)
    injected = Injection(name, failure, detail, round(time.monotonic() - started, 3), facts)
    log.info("%s: injected %s: %s (%.1fs)", name, failure, detail, injected.seconds)
    return injected


def _kill_mid_batch(name: str, rt: Runtime, facts: dict) -> str:
    """A batch run in a child process dies at KILL_POINT with its process group."""
    batch_log = _require_input(name, rt, "there is no batch to kill")
    code, stderr = _OneBatch(name, rt, KILL_POINT, "group", once=False).finish()
    facts["exit_code"] = code
    pending = batch_log.pending_plan()
    if code == 0 or pending is None:
        raise DrillFailed(f"table {name!r}: the batch was meant to die at {KILL_POINT} but exited "
                           f"{code} with pending plan {pending}; stderr tail:\n{stderr}")
    facts["killed_batch"] = pending.batch_id
    return f"batch {pending.batch_id} killed at {KILL_POINT} (exit {code})"


def _kill_engine(name: str, rt: Runtime, facts: dict) -> str:
    """The first merge task to reach KILL_POINT holds there (fault scope `hold`) while the
    deployment SIGKILLs the Spark Connect server with its whole process session
    (STATETABLE_ENGINE_KILL, by default the local stack's `statetable stack kill-engine`), then
    starts it again (STATETABLE_ENGINE_RESTART, `statetable stack restart-engine`). The kill comes
    from outside: on a cluster the task runs on a worker, far from the server's processes."""
    from spark_jobs.engine.session import answers, engine

    url, why = engine()
    if url is None:
        raise NothingToInject(f"table {name!r}: jobs run in a local Spark session here ({why}), so there is no "
                              f"Spark Connect server to kill; start one (`statetable stack up`)")
    address = url.split(";")[0]
    batch_log = _require_input(name, rt, "there is no batch to kill")
    child = _OneBatch(name, rt, KILL_POINT, "hold")
    try:
        if not child.reached():
            code, stderr = child.finish()
            raise DrillFailed(f"table {name!r}: the batch exited {code} before a merge task reached {KILL_POINT}; "
                               f"stderr tail:\n{stderr}")
        killed = _run_deployment_command("kill_engine", ENGINE_KILL_ENV, "kill-engine", "Spark Connect server")
        # The client retries a server that is gone with a growing backoff; its batch is lost
        # either way, so it gets a while to fail on its own, then dies as a timed-out task would.
        code, stderr = child.finish(timeout=CLIENT_GRACE_SECONDS)
    finally:
        child.abandon()
    facts["exit_code"], facts["engine_was_down"] = code, not answers(url)
    pending = batch_log.pending_plan()
    if code == 0 or pending is None or not facts["engine_was_down"]:
        raise DrillFailed(f"table {name!r}: after `{killed[1]}` the batch exited {code} with pending plan "
                           f"{pending}, and the server at {address} {'still' if answers(url) else 'no longer'} "
                           f"answers; stderr tail:\n{stderr}")
    facts["killed_batch"] = pending.batch_id
    restart = _run_deployment_command("kill_engine", ENGINE_RESTART_ENV, "restart-engine", "Spark Connect server")
    facts["engine_restart_seconds"] = restart[0]
    return f"batch {pending.batch_id} held at {KILL_POINT} while Spark Connect server {address} was SIGKILLed " \
           f"by `{killed[1]}` (the batch exited {code}); started again in {restart[0]}s by `{restart[1]}`"


def _kill_worker(name: str, rt: Runtime, facts: dict) -> str:
    """A batch's first merge task to reach WORKER_KILL_POINT SIGKILLs its worker's whole process
    session (fault scope `worker@FILE`: one task fires, the others pass). The batch must still
    commit: Spark reruns the lost tasks on the workers left, which restore the partition from
    the store and find the batch in the changelog. Then the deployment restarts the worker
    (STATETABLE_WORKER_RESTART, by default the local stack's `statetable stack restart-workers`)."""
    from spark_jobs.engine.session import engine

    url, why = engine()
    if url is None:
        raise NothingToInject(f"table {name!r}: jobs run in a local Spark session here ({why}), so there is no "
                              f"Spark worker to kill; start a cluster (`statetable stack up --workers 2`)")
    _require_input(name, rt, "no merge runs to kill a worker in")
    child = _OneBatch(name, rt, WORKER_KILL_POINT, "worker")
    code, stderr = child.finish()
    facts["exit_code"] = code
    if child.fired is None:
        raise NothingToInject(f"table {name!r}: no merge task of a cluster worker reached {WORKER_KILL_POINT} "
                              f"(exit {code}): the Spark Connect server {url.split(';')[0]} runs local[*], with no "
                              f"worker to lose; start a cluster (`statetable stack up --workers 2`). stderr tail:\n"
                              f"{stderr[-1000:]}")
    facts["killed_worker"] = child.fired or "?"
    if code != 0:
        raise DrillFailed(f"table {name!r}: the batch failed when {facts['killed_worker']} died (exit {code}); "
                           f"Spark should have rerun its task elsewhere; stderr tail:\n{stderr}")
    restart = _run_deployment_command("kill_worker", WORKER_RESTART_ENV, "restart-workers", "Spark workers")
    facts["worker_restart_seconds"] = restart[0]
    return f"{facts['killed_worker']} SIGKILLed at {WORKER_KILL_POINT} mid-merge; the batch committed on the " \
           f"workers left; the worker started again in {restart[0]}s by `{restart[1]}`"


def _require_input(name: str, rt: Runtime, why: str) -> BatchLog:
    from spark_jobs.batches.planning import lag

    batch_log = BatchLog(rt.batch_dir(name))
    if batch_log.pending_plan() is None and lag(name, rt) == 0:
        raise NothingToInject(f"table {name!r} has no unread input, so {why}; produce events to its topic first")
    return batch_log


class _OneBatch:
    """One micro-batch in a child process (its own session) with a fault point armed, with `once`
    for the first process to reach it only (`scope@FILE`; without, a task Spark retries dies
    again each time); stderr goes to a file, so a child left waiting never blocks on a full pipe."""

    def __init__(self, name: str, rt: Runtime, point: str, scope: str, once: bool = True):
        import tempfile

        from catalog import scratch, settings

        # In this process's scratch folder: removed by `finish`, swept if this process dies first.
        self.folder = Path(tempfile.mkdtemp(prefix=f"drill-{name}-", dir=scratch.for_process(settings.load().state_dir)))
        self.once, self.err = self.folder / "fired", open(self.folder / "stderr", "w+")
        env = {**os.environ, **rt.as_env(), faults.ENV: point,
               faults.SCOPE_ENV: f"{scope}@{self.once}" if once else scope}
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.submit", "run", name, "--max-batches", "1",
                                      "--no-snapshot"], env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=self.err, text=True)

    def reached(self, timeout: float = 600) -> bool:
        """Wait until a process reached the point (True) or the batch ended first (False)."""
        deadline = time.monotonic() + timeout
        while not self.once.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.once.exists()

    def finish(self, timeout: float = 900) -> tuple[int, str]:
        """(exit code, stderr tail); a child still running after `timeout` is killed (-9)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.abandon()
        with open(self.err.name) as err:
            tail = err.read()[-2000:]
        # What the fault point wrote when it fired (who it killed), kept before the folder goes.
        self.fired = self.once.read_text() if self.once.exists() else None
        self.err.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.proc.returncode, tail

    def abandon(self) -> None:
        if self.proc.poll() is None:
            faults.kill_session(self.proc.pid)
            self.proc.wait(timeout=60)
        self.err.close()


def _wipe(name: str, table, rt: Runtime) -> str:
    with jobs.table_lock(name, rt):
        for st in jobs.stage_tables(table, rt):     # a table of tables' rows stage is local state too
            try:
                st.wipe_local()
            finally:
                st.close()
    return f"local store of {table.partitions} partitions deleted" + _wipe_workers(name)


def _wipe_workers(name: str) -> str:
    """On a cluster every worker keeps its own copy: the drill's lost disks are theirs too. The
    deployment's command STATETABLE_WORKER_WIPE (the table's name appended) deletes them, by
    default the local stack's `statetable stack wipe-workers --table` when it runs a cluster."""
    from catalog import settings

    if not os.environ.get(WORKER_WIPE_ENV) and not settings.cluster_env_file(settings.load()).exists():
        return ""
    _, command = _run_deployment_command("wipe_local_store", WORKER_WIPE_ENV, "wipe-workers", "Spark workers", name)
    return f", and on every Spark worker by `{command}`"


def scratch_uri(rt: Runtime) -> str:
    """Where snapshot drills keep their copy: beside the tables, under a name no table can have."""
    return rt.snapshot_uri.rstrip("/") + "/_drills"


def _scratch_copy(name: str, table, rt: Runtime, facts: dict):
    from state.snapshots import SnapshotStore

    live = SnapshotStore(rt.snapshot_uri)
    if any(not live.list(name, p) for p in range(table.partitions)):
        jobs.snapshot_if_due(name, rt)   # a partition without snapshots gets one, so there is one to damage
    scratch = SnapshotStore(scratch_uri(rt))
    scratch.delete_table(name)
    copied = sum(live.copy_to(scratch, name, p) for p in range(table.partitions))
    facts["snapshot_uri"], facts["snapshots_copied"] = scratch.uri, copied
    return scratch


def _corrupt_latest_snapshots(name: str, table, store, facts: dict) -> str:
    flipped = []
    for p in range(table.partitions):
        snapshots = store.list(name, p)
        newest = snapshots[0]
        # The newest snapshot's own largest file: an SST it shares with older snapshots would
        # take them down too, and the drill is about losing the newest one.
        older = {store.file_path(m, n) for m in snapshots[1:] for n in m.files}
        own = [f for f in newest.files if store.file_path(newest, f) not in older] or list(newest.files)
        victim = max(own, key=lambda f: newest.files[f]["size"])
        path = store.file_path(newest, victim)
        with store.fs.open_input_stream(path) as src:
            data = bytearray(src.read())
        data[len(data) // 2] ^= 0xFF
        with store.fs.open_output_stream(path) as out:
            out.write(bytes(data))
        flipped.append(f"p{p}@{newest.batch_id}:{victim}")
    facts["corrupted"] = flipped
    return f"flipped a byte in {', '.join(flipped)} (scratch copy {store.uri})"


def _lose_snapshots(name: str, table, store, facts: dict) -> str:
    lost = sum(len(store.list(name, p)) for p in range(table.partitions))
    for p in range(table.partitions):
        store.delete_all(name, p)
    return f"{lost} snapshots deleted (scratch copy {store.uri})"


def _restart_broker(facts: dict) -> str:
    """The deployment restarts its broker: the drill runs STATETABLE_BROKER_RESTART (a command line;
    e.g. `docker compose restart kafka`), by default the local stack's `statetable stack
    restart-broker`, so job code never reaches into the stack launcher."""
    seconds, command = _run_deployment_command("broker_restart", BROKER_RESTART_ENV, "restart-broker", "broker")
    facts["broker_down_seconds"] = seconds
    return f"broker restarted in {seconds}s by `{command}`"


def _run_deployment_command(drill: str, env_name: str, stack_action: str, what: str,
                            table: str | None = None) -> tuple[float, str]:
    """Run the deployment's command in `env_name` (default: `statetable stack <stack_action>`),
    with `table`, if given, as its last argument; (seconds it took, the command)."""
    own = shlex.split(os.environ.get(env_name, ""))
    command = own or [sys.executable, "-m", "deploy.cli", "stack", stack_action] + (["--table"] if table else [])
    command += [table] if table else []
    shown = shlex.join(command)
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DEPLOYMENT_COMMAND_SECONDS)
    except subprocess.TimeoutExpired as exc:
        said = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        said = " ".join(said.split())[-300:]
        raise DrillFailed(f"{drill}: `{shown}` had not finished after {DEPLOYMENT_COMMAND_SECONDS:.0f}s "
                           f"(it said: {said or 'nothing'}); find why this deployment's {what} hangs there, or set "
                           f"{env_name} to the command this deployment uses") from None
    if done.returncode != 0:
        raise DrillFailed(f"{drill}: `{shown}` failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-500:]}; set {env_name} to the "
                           f"command that restarts this deployment's {what}")
    return round(time.monotonic() - started, 3), shown


@dataclass
class Recovery:
    table: str
    restored_partitions: list[int]
    replayed_records: int
    corrupt_snapshots: list[str]
    restore_seconds: float


def recover(name: str, rt: Runtime | None = None, snapshot_uri: str | None = None) -> Recovery:
    """Restore every partition that lost its local store. An interrupted batch is
    finished afterwards by the verify job (it needs Spark), from its plan.

    `snapshot_uri`: a snapshot drill's scratch copy (its injection's facts), restored from and
    then deleted; any other store is refused, so a drill's input can never redirect a restore."""
    from dataclasses import replace

    from state.snapshots import SnapshotStore

    rt = rt or Runtime.from_env()
    if snapshot_uri is not None and snapshot_uri != scratch_uri(rt):
        raise UserError(f"table {name!r}: a drill restores only from its scratch store {scratch_uri(rt)!r}, "
                        f"not {snapshot_uri!r}")
    started = time.monotonic()
    try:
        reports = jobs.restore(name, rt=replace(rt, snapshot_uri=snapshot_uri) if snapshot_uri else rt,
                               missing_only=True)
    finally:
        if snapshot_uri:
            SnapshotStore(snapshot_uri).delete_table(name)
    recovery = Recovery(
        name, [r.partition for r in reports], sum(r.replayed_records for r in reports),
        [c for r in reports for c in r.corrupt_snapshots], round(time.monotonic() - started, 3),
    )
    log.info("%s: restored partitions %s (%d changelog records replayed, %d corrupt snapshots skipped) in %.2fs",
             name, recovery.restored_partitions, recovery.replayed_records, len(recovery.corrupt_snapshots),
             recovery.restore_seconds)
    return recovery
