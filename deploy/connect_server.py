"""The stack's Spark Connect server: one warm engine that every job and Airflow task uses.

A task that spark-submits pays a JVM start and Spark's cold start per run (25 s of a 36 s DAG
run); a client of a warm server pays neither. The server is pyspark's own SparkConnectServer,
started with spark-submit from the venv: local[*], the project's jars (Kafka source, Delta) on
the driver's classpath, the Delta extensions, and the venv's Python for its workers, so a job's
mapInArrow imports state/ and spark_jobs/ as a local session's would.

It binds the stack's host only and takes a bearer token kept in its folder (mode 600): a server
that runs its clients' Python must not serve every local user. The token reaches the server
through its environment, never its command line (which every user can read).
"""
from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from catalog.priority import batch_niceness
from catalog.settings import StackSettings, adopt_cluster_env, connect_token
from deploy import spark_cluster
from deploy.processes import ManagedProcess, require_free_ports, wait_port_free, wait_ready, write_private

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
VENV_BIN = Path(sys.executable).parent


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("spark-connect", settings.connect_dir)


def token(settings: StackSettings) -> str:
    """The server's token, made on first use."""
    existing = connect_token(settings)
    if existing:
        return existing
    made = secrets.token_urlsafe(32)
    write_private(settings.connect_dir / ".token", made)
    return made


def server_conf(settings: StackSettings, host: str | None = None) -> dict[str, str]:
    from spark_jobs.session import spark_conf

    workers = spark_cluster.size(settings)
    if workers:
        adopt_cluster_env(settings)        # the store's address, for the s3a jars and conf below
    conf = spark_conf("statetable-connect", settings.master_url if workers else
                      os.environ.get("STATETABLE_SPARK_MASTER", "local[*]"))
    if workers:
        # One executor per worker, one core each: tasks spread over the workers as over machines.
        conf.update({"spark.executor.cores": "1", "spark.cores.max": str(workers),
                     "spark.executor.memory": os.environ.get("STATETABLE_SPARK_EXECUTOR_MEMORY", "1g")})
    conf.update({
        "spark.connect.grpc.binding.address": host or settings.host,
        "spark.connect.grpc.binding.port": str(settings.connect_port),
        # A client killed mid-batch (an Airflow task) leaves its operation running; the server
        # interrupts it soon after, so the next run's merge tasks find the partitions free.
        "spark.connect.execute.manager.detachedTimeout": os.environ.get("STATETABLE_CONNECT_DETACHED_TIMEOUT",
                                                                        "20s"),
        "spark.connect.session.manager.defaultSessionTimeout": "7d",     # one shared session (see session_id)
        # Python workers stay up between batches. The server keys its worker daemons by client
        # session (artifact isolation or not), so every job attaches to one shared session
        # (spark_jobs.session.session_id). Clients add no artifacts; their code is the
        # project's, which every worker imports from PYTHONPATH.
        "spark.python.worker.reuse": "true",
        # Each session's daemon imports the Arrow pass before it forks: workers that Spark stopped
        # after a minute idle come back warm (spark_jobs/worker_daemon.py).
        "spark.python.daemon.module": "spark_jobs.worker_daemon",
    })
    return conf


def command(settings: StackSettings, host: str | None = None) -> list[str]:
    conf = server_conf(settings, host)
    cmd = ["nice", "-n", str(batch_niceness()), str(VENV_BIN / "spark-submit"), "--class", SERVER_CLASS,
           "--master", conf.pop("spark.master"), "--name", conf.pop("spark.app.name"), "--jars", conf.pop("spark.jars")]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + ["spark-internal"]


def environment(settings: StackSettings, with_token: bool = True) -> dict[str, str]:
    return spark_cluster.spark_env(settings, {"SPARK_CONNECT_AUTHENTICATE_TOKEN": token(settings)} if with_token else {})


def start(settings: StackSettings) -> None:
    if process(settings).is_running():
        return
    require_free_ports("spark-connect", settings.host, settings.connect_port)
    settings.connect_dir.mkdir(parents=True, exist_ok=True)
    process(settings).start(command(settings), env=environment(settings), cwd=settings.connect_dir)


def foreground(settings: StackSettings, host: str) -> None:
    """Become the server (a container's command): against STATETABLE_SPARK_MASTER, bound to
    `host`, with the token in SPARK_CONNECT_AUTHENTICATE_TOKEN when the environment has one."""
    env = environment(settings, with_token=False)
    cmd = command(settings, host)[3:]        # no `nice`: the container's scheduler decides
    os.execvpe(cmd[0], cmd, env)


def is_healthy(settings: StackSettings) -> bool:
    """The gRPC port answers (the server opens it once its SparkContext is up)."""
    from spark_jobs.session import answers

    return process(settings).is_running() and answers(settings.connect_url, timeout=1.0)


def wait_healthy(settings: StackSettings, timeout: float = 120.0) -> None:
    from spark_jobs.session import answers

    wait_ready([process(settings)], lambda: answers(settings.connect_url, timeout=1.0), timeout,
               what=f"Spark Connect at {settings.connect_url}")


def stop(settings: StackSettings) -> bool:
    """Stop the server by its pid; returns once its port is free again (a JVM lets go of its
    listening socket a moment after its process group is gone)."""
    was_running = process(settings).stop(timeout=20)
    wait_port_free(settings.host, settings.connect_port, "the Spark Connect server")
    return was_running
