"""A Spark standalone cluster on loopback, from the pyspark wheel: one master and N workers.

Each worker gets folders of its own, as a separate machine has a disk of its
own: Spark's work dir, its scratch dirs, and the statetable state cache its
tasks open partitions in (STATETABLE_WORKER_STATE_DIR). Nothing is shared
between workers but the object store and Kafka, so a partition that moves to
another worker is restored there from snapshots plus the changelog.

The master, the workers and the Connect server's driver share a secret (`spark.authenticate`):
without it any local user could submit an application, which runs code as the stack's user. It
reaches the daemons through their environment (`_SPARK_AUTH_SECRET`, readable by the owner
only) and the driver through a private properties file, never a command line. The master's UI
cannot kill applications (`spark.ui.killEnabled=false`).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

from catalog.runtime import WORKER_STATE_ENV
from catalog.settings import PROJECT_ROOT, StackSettings
from deploy import object_store
from state import faults
from deploy.processes import ManagedProcess, made_secret, require_free_ports, wait_ready

VENV_BIN = Path(sys.executable).parent
WORKER_MEMORY = os.environ.get("STATETABLE_SPARK_WORKER_MEMORY", "2g")


def master(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("spark-master", settings.cluster_dir / "master")


def worker(settings: StackSettings, index: int) -> ManagedProcess:
    return ManagedProcess(f"spark-worker-{index}", worker_dir(settings, index))


def worker_dir(settings: StackSettings, index: int) -> Path:
    return settings.cluster_dir / f"worker-{index}"


def worker_state_dir(settings: StackSettings, index: int) -> Path:
    """The statetable cache the worker's tasks open partitions in (STATETABLE_WORKER_STATE_DIR)."""
    return worker_dir(settings, index) / "state"


def worker_port(settings: StackSettings, index: int) -> int:
    return settings.master_port + 10 + index


def master_ui_port(settings: StackSettings) -> int:
    return settings.master_port + 1


def size(settings: StackSettings) -> int:
    """How many workers the stack was brought up with (0: no cluster, jobs run local[*])."""
    try:
        return int(json.loads((settings.cluster_dir / "cluster.json").read_text())["workers"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def spark_env(settings: StackSettings, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a Spark JVM the stack starts (Connect server, master, worker): the venv's
    Python and the checkout on its path for the Python workers, loopback only, no armed fault."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATETABLE_FAULT")}
    env.update({
        "SPARK_LOCAL_IP": settings.host, "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "NO_PROXY": "*", **extra,
    })
    return env


SECURITY_OPTS = "-Dspark.authenticate=true -Dspark.ui.killEnabled=false"      # no secret in these
# A worker's folder per finished application (its executors' logs and files) has a retention: a
# day after the application ends, checked every half hour.
WORKER_CLEANUP = ("-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=1800 "
                  "-Dspark.worker.cleanup.appDataTtl=86400")


def auth_secret(settings: StackSettings) -> str:
    """The cluster's shared secret (mode 600 in the cluster's folder)."""
    return made_secret(settings.cluster_dir / ".auth_secret")


def _env(settings: StackSettings, extra: dict[str, str]) -> dict[str, str]:
    return spark_env(settings, {**object_store.client_env(settings), "_SPARK_AUTH_SECRET": auth_secret(settings),
                                "SPARK_MASTER_OPTS": SECURITY_OPTS, "SPARK_WORKER_OPTS": f"{SECURITY_OPTS} {WORKER_CLEANUP}",
                                **extra})


def start(settings: StackSettings, workers: int) -> None:
    settings.cluster_dir.mkdir(parents=True, exist_ok=True)
    (settings.cluster_dir / "cluster.json").write_text(json.dumps({"workers": workers}))
    spark_class = str(VENV_BIN / "spark-class")
    if not master(settings).is_running():
        require_free_ports("spark-master", settings.host, settings.master_port, master_ui_port(settings))
        master(settings).start(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", settings.host,
             "--port", str(settings.master_port), "--webui-port", str(master_ui_port(settings))],
            env=_env(settings, {}), cwd=master(settings).run_dir)
    for index in range(1, workers + 1):
        start_worker(settings, index)
    supervisor(settings).start([sys.executable, "-m", "deploy.cli", "stack", "supervise-workers"],
                               env={**os.environ, **settings.as_env()}, cwd=settings.cluster_dir)


def supervisor(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("spark-supervisor", settings.cluster_dir)


def supervise(settings: StackSettings, interval: float = 1.0) -> None:
    """The stack's restart policy for its workers (what `restart: always` is to compose, or a
    cluster manager to a real cluster): a worker whose process died is started again, with
    its folders as they are, while the master runs."""
    import time

    workers = size(settings)
    while master(settings).is_running():
        for index in range(1, workers + 1):
            if not worker(settings, index).is_running():
                print(f"{time.strftime('%H:%M:%S')} spark-worker-{index} is down: starting it again", flush=True)
                try:
                    start_worker(settings, index)
                except (RuntimeError, OSError) as error:       # its port not free yet: the next round
                    print(f"spark-worker-{index} did not start: {error}", flush=True)
        time.sleep(interval)


def start_worker(settings: StackSettings, index: int) -> None:
    """Start worker `index` unless it runs. The supervisor and `stack restart-workers` may both
    come for a dead worker: the check and the start happen under the worker's lock, so only
    one JVM is started and its pid is the one recorded."""
    import fcntl

    proc, folder = worker(settings, index), worker_dir(settings, index)
    for sub in ("work", "tmp", "state"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    with open(folder / ".start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if proc.is_running():
            return
        # A killed worker's executors left their blocks here; nothing of it is in use now.
        shutil.rmtree(folder / "tmp", ignore_errors=True)
        (folder / "tmp").mkdir()
        require_free_ports(proc.name, settings.host, worker_port(settings, index))
        proc.start(
            [str(VENV_BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", settings.master_url,
             "--host", settings.host, "--port", str(worker_port(settings, index)), "--webui-port", "0",
             "--cores", "1", "--memory", WORKER_MEMORY, "--work-dir", str(folder / "work")],
            env=_env(settings, {"SPARK_LOCAL_DIRS": str(folder / "tmp"),
                                WORKER_STATE_ENV: str(worker_state_dir(settings, index)), faults.WORKER_ENV: proc.name}),
            cwd=folder)


def _master_info(settings: StackSettings) -> dict | None:
    """The master's own JSON status (its UI port), or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{settings.host}:{master_ui_port(settings)}/json/", timeout=2) as r:
            return json.load(r)
    except OSError:
        return None


def alive_workers(settings: StackSettings, info: dict | None = None) -> set[int]:
    """Ports of the workers the master sees ALIVE (registered)."""
    info = info if info is not None else _master_info(settings) or {}
    return {w["port"] for w in info.get("workers", []) if w.get("state") == "ALIVE"}


def worker_up(settings: StackSettings, index: int, alive: set[int] | None = None) -> bool:
    alive = alive if alive is not None else alive_workers(settings)
    return worker(settings, index).is_running() and worker_port(settings, index) in alive


def wait_healthy(settings: StackSettings, timeout: float = 90.0) -> None:
    n = size(settings)
    wait_ready(processes(settings), lambda: len(alive_workers(settings) & {worker_port(settings, i)
                                                                       for i in range(1, n + 1)}) == n,
               timeout, what=f"{n} Spark workers at {settings.master_url}")


def status_lines(settings: StackSettings) -> list[str]:
    n = size(settings)
    if not n:
        return []
    info = _master_info(settings) if master(settings).is_running() else None
    alive = alive_workers(settings, info or {})
    return [f"spark-master {settings.master_url} {'up' if info is not None else 'down'}"] + [
        f"spark-worker-{i} spark://{settings.host}:{worker_port(settings, i)} "
        f"{'up' if worker_up(settings, i, alive) else 'down'}" for i in range(1, n + 1)] + [
        f"spark-supervisor restarts dead workers {'up' if supervisor(settings).is_running() else 'down'}"]


def stop(settings: StackSettings) -> None:
    supervisor(settings).stop(timeout=10)       # first, or it starts the workers stopped below
    for index in range(size(settings), 0, -1):
        worker(settings, index).stop(timeout=15)
    master(settings).stop(timeout=15)


def processes(settings: StackSettings) -> list[ManagedProcess]:
    return [master(settings)] + [worker(settings, i) for i in range(1, size(settings) + 1)]


def all_processes(settings: StackSettings) -> list[ManagedProcess]:
    """The cluster's processes with its supervisor (which `processes` leaves out: `wait_healthy`
    waits on workers and their master only)."""
    return processes(settings) + [supervisor(settings)]
