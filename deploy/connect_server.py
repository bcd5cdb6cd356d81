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
import sys
from pathlib import Path

from catalog import scratch
from catalog.priority import batch_niceness
from catalog.settings import StackSettings, adopt_cluster_env, connect_jvm_options, connect_token
from spark_jobs.engine.session import java_properties
from deploy import spark_cluster
from deploy.processes import (ManagedProcess, made_secret, require_free_ports, wait_port_free, wait_ready, wait_until,
                              write_private)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
VENV_BIN = Path(sys.executable).parent
TOKEN_FILE_ENV = "STATETABLE_SPARK_CONNECT_TOKEN_FILE"


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("spark-connect", settings.connect_dir)


def token(settings: StackSettings) -> str:
    """The server's token, made on first use (`connect_token` reads it without making one)."""
    return made_secret(settings.connect_dir / ".token")


def server_conf(settings: StackSettings, host: str | None = None) -> dict[str, str]:
    from spark_jobs.engine import jvm_archive
    from spark_jobs.engine.session import spark_conf

    workers = spark_cluster.size(settings)
    if workers:
        adopt_cluster_env(settings)        # the store's address, for the s3a jars and conf below
    conf = spark_conf("statetable-connect", settings.master_url if workers else
                      os.environ.get("STATETABLE_SPARK_MASTER", "local[*]"), scratch=scratch_dir(settings))
    if workers:
        # One executor per worker, one core each: tasks spread over the workers as over machines.
        conf.update({"spark.executor.cores": "1", "spark.cores.max": str(workers),
                     "spark.authenticate": "true", "spark.ui.killEnabled": "false",    # secret: command()
                     "spark.executor.memory": os.environ.get("STATETABLE_SPARK_EXECUTOR_MEMORY", "1g"),
                     # The stack's workers share this host: their executors' codec libraries go
                     # with the server's scratch (emptied when it starts), not to /tmp.
                     "spark.executor.extraJavaOptions": scratch.java_options(scratch_dir(settings) / "executors")})
    if extra := connect_jvm_options():      # a cluster's executors (set above) live as long as the server
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            if key in conf:
                conf[key] += f" {extra}"
    # The jobs' class-data archive, where `make test` or `make jvm-archive` built one for these
    # jars: the server's driver has the jobs' classpath and maps Spark's, Delta's and the Kafka
    # source's classes instead of loading them (start and warm-up batch: 16-20 -> 10.5-12 CPU s).
    if archived := jvm_archive.conf_java_options(conf):
        conf["spark.driver.extraJavaOptions"] += f" {archived}"
    if workers:
        # The jars on the executors' own classpath, from where they lie on this host, not shipped as
        # spark.jars: each executor copied every jar of spark.jars into its work folder, the s3a
        # set's 690 MB AWS bundle included, and kept them there, so a test's cluster stack left
        # 6.8 GB behind after a few engine restarts (a CI run ran out of disk).
        conf["spark.executor.extraClassPath"] = conf["spark.driver.extraClassPath"]
        conf["spark.jars"] = ""
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
        # (spark_jobs.engine.session.session_id). Clients add no artifacts; their code is the
        # project's, which every worker imports from PYTHONPATH.
        "spark.python.worker.reuse": "true",
    })
    return conf


def scratch_dir(settings: StackSettings) -> Path:
    """The server's Spark local dirs and java.io.tmpdir (see catalog.scratch); emptied by `start`."""
    return scratch.root(settings.state_dir) / "spark-connect"


def command(settings: StackSettings, host: str | None = None) -> list[str]:
    conf = server_conf(settings, host)
    cmd = ["nice", "-n", str(batch_niceness()), str(VENV_BIN / "spark-submit"), "--class", SERVER_CLASS,
           "--master", conf.pop("spark.master"), "--name", conf.pop("spark.app.name")]
    if jars := conf.pop("spark.jars"):
        cmd += ["--jars", jars]
    if conf.get("spark.authenticate") == "true":       # Spark wants a standalone driver's secret in its conf
        conf["spark.authenticate.secret"] = spark_cluster.auth_secret(settings)
    # The conf goes in a private file, not `--conf` on a command line every local user reads:
    # STATETABLE_SPARK_CONF may carry a deployment's credentials, and the cluster's secret is here.
    properties = settings.connect_dir / "server.properties"
    write_private(properties, java_properties(conf))
    return cmd + ["--properties-file", str(properties), "spark-internal"]


def environment(settings: StackSettings, with_token: bool = True) -> dict[str, str]:
    return spark_cluster.spark_env(settings, {"SPARK_CONNECT_AUTHENTICATE_TOKEN": token(settings)} if with_token else {})


def start(settings: StackSettings) -> None:
    if process(settings).is_running():
        return
    require_free_ports("spark-connect", settings.host, settings.connect_port)
    settings.connect_dir.mkdir(parents=True, exist_ok=True)
    (scratch.for_server(settings.state_dir, scratch_dir(settings).name) / "executors").mkdir()
    process(settings).start(command(settings), env=environment(settings), cwd=settings.connect_dir)


def foreground_environment(settings: StackSettings) -> dict[str, str]:
    """The container's server environment: its token from the file STATETABLE_SPARK_CONNECT_TOKEN_FILE
    names (a compose secret: a file, never a command line), else SPARK_CONNECT_AUTHENTICATE_TOKEN
    when the environment has one."""
    env = environment(settings, with_token=False)
    if token_file := os.environ.get(TOKEN_FILE_ENV):
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = Path(token_file).read_text().strip()
    return env


def foreground(settings: StackSettings, host: str) -> None:
    """Run the server (a container's command): against STATETABLE_SPARK_MASTER, bound to `host`,
    with the token read from the file STATETABLE_SPARK_CONNECT_TOKEN_FILE names, or in
    SPARK_CONNECT_AUTHENTICATE_TOKEN when the environment has one. It is warmed
    once it answers (see `warm`), and the container lives as long as the server; a stop signal
    reaches the server."""
    import signal
    import subprocess

    env = foreground_environment(settings)
    (scratch.for_server(settings.state_dir, scratch_dir(settings).name) / "executors").mkdir()
    cmd = command(settings, host)[3:]        # no `nice`: the container's scheduler decides
    server = subprocess.Popen(cmd, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: server.send_signal(signum))
    from spark_jobs.engine.session import answers

    wait_until(lambda: server.poll() is not None or answers(settings.connect_url, timeout=1.0), 180.0,
               what=f"Spark Connect at {settings.connect_url}")
    if server.poll() is None:
        print(warm(settings, env.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")), flush=True)
    sys.exit(server.wait())


CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


def warm(settings: StackSettings, token: str | None = None) -> str:
    """Run the warm-up batch on the server that just came up (spark_jobs/warmup.py), before it is
    reported up; one line saying what it took. A warm-up that fails leaves a working, cold server:
    the line says why, `stack status` repeats it, and the first batch pays the warm-up instead."""
    import time

    from catalog.runtime import Runtime
    from spark_jobs.engine import session
    from spark_jobs import warmup

    count = warmup.records()
    folder = settings.connect_dir / "warmup"
    if not count:
        return f"spark-connect not warmed ({warmup.RECORDS_ENV}=0): the first batch pays the engine's warm-up"
    started = time.monotonic()
    # pyspark marks a process that made a Connect client as one for good (in its environment, which
    # children inherit): the caller's later local sessions and child processes must not be.
    mode = os.environ.get(CONNECT_MODE_ENV)
    try:
        spark = session.remote_session(session.client_url(settings.connect_url, token or connect_token(settings)))
        try:
            report = warmup.warm(spark, Runtime.from_env(), folder, count)
        finally:
            session.done(spark)
            if mode is None:
                os.environ.pop(CONNECT_MODE_ENV, None)
            else:
                os.environ[CONNECT_MODE_ENV] = mode
    except Exception as exc:            # the server still serves; its first batch will be cold
        cause = " ".join(str(exc).split())[:300]
        warmup.record(folder, {"finished_at": time.time(), "error": cause})
        return (f"spark-connect warm-up failed after {time.monotonic() - started:.1f}s, the server is up but cold "
                f"(its first batch pays the warm-up): {type(exc).__name__}: {cause}")
    return (f"spark-connect warmed in {report['seconds']:.1f}s: {report['read']:,} records through "
            f"{warmup.WARMUP_TABLE} (batch {', '.join(map(str, report['batches']))})")


def warmup_line(settings: StackSettings) -> str | None:
    """What the running server's last warm-up did, for `stack status`; None before any."""
    import json

    from spark_jobs import warmup

    path = settings.connect_dir / "warmup" / warmup.REPORT
    proc = process(settings)
    if not path.exists() or not proc.is_running():
        return None
    report = json.loads(path.read_text())
    if report.get("error"):
        return f"spark-connect warm-up failed: {report['error']}"
    if report["finished_at"] < proc.pid_file.stat().st_mtime:
        return "spark-connect not warmed since it started: its first batch pays the warm-up"
    return f"spark-connect warmed in {report['seconds']:.1f}s ({report['read']:,} records)"


def is_healthy(settings: StackSettings) -> bool:
    """The gRPC port answers (the server opens it once its SparkContext is up)."""
    from spark_jobs.engine.session import answers

    return process(settings).is_running() and answers(settings.connect_url, timeout=1.0)


def wait_healthy(settings: StackSettings, timeout: float = 120.0) -> None:
    from spark_jobs.engine.session import answers

    wait_ready([process(settings)], lambda: answers(settings.connect_url, timeout=1.0), timeout,
               what=f"Spark Connect at {settings.connect_url}")


def stop(settings: StackSettings) -> bool:
    """Stop the server by its pid; returns once its port is free again (a JVM lets go of its
    listening socket a moment after its process group is gone)."""
    was_running = process(settings).stop(timeout=20)
    wait_port_free(settings.host, settings.connect_port, "the Spark Connect server")
    return was_running
