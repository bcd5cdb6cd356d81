"""`statetable stack up | down | status | restart-broker | restart-engine` for the local stack
(Kafka, Airflow, and the Spark Connect server every job runs on).

`status` prints one line per component, `NAME ADDRESS up|down`; scripts parse
that format, so keep it stable.
"""
from __future__ import annotations

import json
import os
import time

from deploy import (airflow_server, batch_server, cdc, connect_server, kafka_server, object_store, postgres_server,
                    schema_registry, spark_cluster)
from catalog.settings import StackSettings, cluster_env_file, kafka_layout
from state.kafka_config import CONFIG_ENV
from deploy.processes import write_private
from catalog.errors import UserError
from deploy.errors import CdcUnavailable


def up(settings: StackSettings, workers: int = 0, brokers: int | None = None, secure: bool = False,
       registry: bool = False, cdc_pipeline: bool = False) -> None:
    started = time.monotonic()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    settings.state_dir.chmod(0o700)       # the stack's data, logs and secrets: its owner's alone
    if workers < 0:
        raise UserError(f"stack up --workers {workers}: give 0 (no cluster, jobs run local[*]) or more workers")
    running = spark_cluster.size(settings)
    if running != workers and any(p.is_running() for p in [connect_server.process(settings)]
                                  + spark_cluster.processes(settings)):
        raise UserError(f"the stack runs with {running} Spark workers; `statetable stack down` first to bring "
                         f"it up with {workers}")
    kafka_server.configure(settings, brokers, secure)
    if kafka_layout(settings)["secure"]:
        # The stack's processes (Connect server, its executors, Airflow) use the stack's client config.
        os.environ[CONFIG_ENV] = str(settings.kafka_client_properties)
    kafka_server.start(settings)
    if workers:
        _start_cluster(settings, workers, started)
        os.environ.update(object_store.client_env(settings))     # for the Connect server and Airflow below
    else:
        spark_cluster.stop(settings)
        cluster_env_file(settings).unlink(missing_ok=True)
        (settings.cluster_dir / "cluster.json").unlink(missing_ok=True)
    if registry:
        schema_registry.app(), schema_registry.java()      # fail before anything starts if it cannot run
    if cdc_pipeline:
        cdc.check_supported(settings)         # fail before anything starts if it cannot run
    connect_server.start(settings)
    airflow_server.start(settings)
    if registry:
        schema_registry.start(settings)       # after Airflow's start: its schemas live in the stack's PostgreSQL
    if cdc_pipeline:
        try:
            cdc.start(settings)               # after Airflow's start: it reads the stack's PostgreSQL
        except CdcUnavailable as exc:         # the rest of the stack is worth having: say why, go on
            print(f"WARNING: {exc}", flush=True)
            cdc_pipeline = False
    kafka_server.wait_healthy(settings)
    for line in _kafka_lines(settings):
        print(f"{line} ({time.monotonic() - started:.1f}s)", flush=True)
    connect_server.wait_healthy(settings)
    print(f"spark-connect {settings.connect_url} answers ({time.monotonic() - started:.1f}s)", flush=True)
    print(f"{connect_server.warm(settings)} ({time.monotonic() - started:.1f}s)", flush=True)
    print(f"{postgres_server.status_line(settings)} (Airflow's metadata database; "
          f"{time.monotonic() - started:.1f}s)", flush=True)
    airflow_server.wait_healthy(settings)
    print(f"airflow {settings.airflow_url} up ({time.monotonic() - started:.1f}s)", flush=True)
    print(f"{batch_server.status_line(settings)}: Airflow's tasks hand their runs to it "
          f"({time.monotonic() - started:.1f}s)", flush=True)
    if registry:
        schema_registry.wait_healthy(settings)
        print(f"registry {schema_registry.url(settings)} up (Apicurio, Confluent's API; "
              f"{time.monotonic() - started:.1f}s)", flush=True)
    if cdc_pipeline:
        cdc.wait_healthy(settings)
        print(f"kafka-connect {settings.cdc_url} up (Debezium's PostgreSQL connector; the example database "
              f"`shop` is ready: `statetable cdc add shop public.customers public.orders`; "
              f"{time.monotonic() - started:.1f}s)", flush=True)
    print(
        f"\nAirflow UI:  {settings.airflow_url}  (user: {airflow_server.ADMIN_USER}, password: "
        f"`statetable stack password`)\n"
        f"Kafka:       {settings.kafka_bootstrap}\n"
        f"Spark:       {settings.connect_url} (Spark Connect; token in {settings.connect_dir / '.token'})\n"
        f"Logs:        {settings.state_dir}/*/*.log\n"
        f"Stop with:   statetable stack down"
    )


def _start_cluster(settings: StackSettings, workers: int, started: float) -> None:
    """The S3 store, a standalone master and its workers; every later component (the Connect
    server, Airflow, this process's clients) gets the store's address through the environment."""
    object_store.start(settings)
    object_store.wait_healthy(settings)
    write_private(cluster_env_file(settings), json.dumps(object_store.client_env(settings)))
    print(f"s3 {settings.s3_url} up ({time.monotonic() - started:.1f}s)", flush=True)
    print(f"WARNING: the S3 server at {settings.s3_url} is moto, a test server: it accepts any access key, and anyone "
          f"who reaches its port can reset it (delete every bucket). It is bound to {settings.host} for tests on "
          f"this machine only; a real cluster uses a real object store (STATETABLE_STORE_URI).", flush=True)
    spark_cluster.start(settings, workers)
    spark_cluster.wait_healthy(settings)
    print(f"spark-master {settings.master_url} up with {workers} workers ({time.monotonic() - started:.1f}s)",
          flush=True)


def down(settings: StackSettings) -> None:
    started = time.monotonic()
    cdc.stop(settings)                       # before Airflow's stop takes its PostgreSQL down
    schema_registry.stop(settings)
    airflow_server.stop(settings)
    connect_server.stop(settings)
    spark_cluster.stop(settings)
    object_store.stop(settings)
    cluster_env_file(settings).unlink(missing_ok=True)
    kafka_server.stop(settings)
    print(f"stack stopped in {time.monotonic() - started:.1f}s")


def restart_broker(settings: StackSettings, broker: int = 1) -> float:
    """Stop one of the stack's brokers by its pid and start it again on the same data (the
    failure drill `broker_restart` asks for this); seconds it was down."""
    brokers = kafka_layout(settings)["brokers"]
    if not 1 <= broker <= brokers:
        raise UserError(f"stack restart-broker {broker}: the stack runs brokers 1..{brokers}")
    proc = kafka_server.process(settings, broker)
    if not proc.is_running():
        raise UserError(f"the local stack's broker {broker} is not running (pid file {proc.pid_file}): there is "
                         f"no broker here to restart; start the stack with `statetable stack up`")
    started = time.monotonic()
    proc.stop(timeout=30)
    kafka_server.start(settings, broker)
    kafka_server.wait_healthy(settings)
    down_seconds = time.monotonic() - started
    print(f"kafka {kafka_server.address(settings, broker)} restarted in {down_seconds:.1f}s", flush=True)
    return down_seconds


def restart_engine(settings: StackSettings) -> float:
    """Start the Spark Connect server again after it died (the `kill_engine` drill, or a crash);
    seconds until it answers. A server still running is left alone."""
    started = time.monotonic()
    connect_server.start(settings)
    connect_server.wait_healthy(settings)
    print(f"spark-connect {settings.connect_url} answers in {time.monotonic() - started:.1f}s", flush=True)
    print(connect_server.warm(settings), flush=True)
    seconds = time.monotonic() - started
    print(f"spark-connect {settings.connect_url} up in {seconds:.1f}s", flush=True)
    return seconds


def kill_engine(settings: StackSettings) -> None:
    """SIGKILL the Spark Connect server with every process of its session (the `kill_engine`
    drill; `restart-engine` starts it again)."""
    proc = connect_server.process(settings)
    if not proc.kill():
        raise UserError(f"the local stack's Spark Connect server is not running (pid file {proc.pid_file}): "
                         f"there is no engine here to kill; start the stack with `statetable stack up`")
    print(f"spark-connect {settings.connect_url} killed", flush=True)


def wipe_workers(settings: StackSettings, table: str) -> list[str]:
    """Delete `table`'s local state on every worker of the stack's cluster (the `wipe_local_store`
    drill on a cluster: every worker loses its disk); the folders deleted."""
    import shutil

    workers = spark_cluster.size(settings)
    if not workers:
        raise UserError("the local stack runs no Spark cluster, so no worker has state to wipe; start one with "
                         "`statetable stack up --workers 2`")
    wiped = []
    for index in range(1, workers + 1):
        folder = spark_cluster.worker_state_dir(settings, index) / table
        if folder.exists():
            shutil.rmtree(folder)
            wiped.append(str(folder))
    print(f"{table}: local state wiped on {workers} workers ({len(wiped)} held a copy)", flush=True)
    return wiped


def restart_workers(settings: StackSettings) -> float:
    """Start every dead worker of the stack's cluster again (the `kill_worker` drill, or a crash);
    seconds until all are registered with the master."""
    workers = spark_cluster.size(settings)
    if not workers or not spark_cluster.master(settings).is_running():
        raise UserError("the local stack runs no Spark cluster; start one with `statetable stack up --workers 2`")
    started = time.monotonic()
    for index in range(1, workers + 1):
        spark_cluster.start_worker(settings, index)
    spark_cluster.wait_healthy(settings)
    seconds = time.monotonic() - started
    print(f"{workers} Spark workers up in {seconds:.1f}s", flush=True)
    return seconds


def _kafka_lines(settings: StackSettings) -> list[str]:
    """`kafka ADDRESS up` for the one-broker stack; `kafka-N ADDRESS up` per broker and the
    client config's path for a cluster or a secure stack."""
    layout = kafka_layout(settings)
    if layout["brokers"] == 1 and not layout["secure"]:
        up_ = kafka_server.process(settings).is_running() and _safe(kafka_server.is_healthy, settings)
        return [f"kafka {settings.kafka_bootstrap} {'up' if up_ else 'down'}"]
    lines = []
    for b in range(1, layout["brokers"] + 1):
        up_ = kafka_server.process(settings, b).is_running() and \
            _safe(lambda s: kafka_server.is_healthy(s, broker=b), settings)
        lines.append(f"kafka-{b} {kafka_server.address(settings, b)} {'up' if up_ else 'down'}")
    if layout["secure"]:
        lines.append(f"kafka-client-config {settings.kafka_client_properties}")
    return lines


def status_lines(settings: StackSettings) -> list[str]:
    cluster = spark_cluster.status_lines(settings)
    if cluster:
        cluster.append(f"s3 {settings.s3_url} {'up' if object_store.is_healthy(settings) else 'down'}")
    kafka = _kafka_lines(settings)
    return [
        *kafka,
        *_durability_lines(settings, kafka),
        *cluster,
        f"spark-connect {settings.connect_url} {'up' if connect_server.is_healthy(settings) else 'down'}",
        *filter(None, [connect_server.warmup_line(settings)]),
        postgres_server.status_line(settings),
        *([schema_registry.status_line(settings)] if settings.registry_dir.exists() else []),
        *([cdc.status_line(settings)] if settings.cdc_dir.exists() else []),
        airflow_server.status_line(settings),
        *([batch_server.status_line(settings)] if settings.batch_dir.exists() else []),
    ]


def is_down(line: str) -> bool:
    """A status line that says `down`, bare or followed by its cause in brackets."""
    return line.endswith(" down") or " down (" in line


def _safe(check, settings: StackSettings) -> bool:
    try:
        return bool(check(settings))
    except Exception:
        return False


def _durability_lines(settings: StackSettings, kafka: list[str]) -> list[str]:
    """The replication warnings while a broker is up; a check that fails then says so, as a
    warning, rather than pass for a clean bill (with every broker down there is nothing to check)."""
    if not any(line.startswith("kafka") and line.endswith(" up") for line in kafka):
        return []
    try:
        return list(kafka_server.durability_warnings(settings))
    except Exception as exc:        # noqa: BLE001 - status must print whatever the brokers answer
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [f"kafka-warning replication not checked: {cause}"]


def running_pids(settings: StackSettings) -> dict[str, int]:
    """Pids of the stack's own processes that are still alive."""
    procs = [*kafka_server.processes(settings), connect_server.process(settings), object_store.process(settings),
             *spark_cluster.all_processes(settings), postgres_server.process(settings),
             schema_registry.process(settings), cdc.process(settings), batch_server.process(settings)] + [
        airflow_server.process(settings, c) for c in airflow_server.COMPONENTS + ("celery-worker",)
    ]
    return {p.name: pid for p in procs if (pid := p.pid()) is not None}
