"""The stack's batch service (ops/batch_service.py), started and stopped with Airflow: its
incremental tasks hand their runs to it (statetable_airflow.triggers).

Bound to the stack's host; it takes a bearer token kept in its folder (mode 600), which reaches
the service through a file named in its environment and Airflow through its connection
`statetable_batches`, never a command line.
"""
from __future__ import annotations

import json
import sys
import urllib.request

from catalog.settings import PROJECT_ROOT, StackSettings
from deploy.processes import ManagedProcess, made_secret, require_free_ports, stop_server, wait_ready

CONN_ENV = "AIRFLOW_CONN_STATETABLE_BATCHES"
#: Airflow's tasks use the service when this is "on" (the stack sets it with the connection).
USE_ENV = "STATETABLE_BATCH_SERVICE"


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("batches", settings.batch_dir)


def token(settings: StackSettings) -> str:
    return made_secret(settings.batch_dir / ".token")


def connection(settings: StackSettings) -> dict[str, str]:
    """The Airflow connection (and the switch) that send a table's runs to this stack's service."""
    return {CONN_ENV: json.dumps({"conn_type": "http", "host": settings.host, "port": settings.batch_port,
                                  "schema": "http", "password": token(settings)}),
            USE_ENV: "on"}


def start(settings: StackSettings, env: dict[str, str]) -> None:
    """Start the service with Airflow's environment (its Kafka, data folder and Spark Connect
    server are the tasks'), unless it runs. It also tells Airflow's dag-processor when a table
    file changed (ops.table_files), so Airflow parses the DAG files only then."""
    if process(settings).is_running():
        return
    require_free_ports("the batch service", settings.host, settings.batch_port)
    settings.batch_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    token(settings)
    from catalog.settings import connect_token
    from ops.batch_service import TOKEN_FILE_ENV
    from spark_jobs.engine.session import REMOTE_ENV, TOKEN_ENV

    # The stack's Connect server, as the tasks' connection names it (a test's STATETABLE_SPARK_REMOTE=local
    # is for the jobs it starts itself).
    env = {**env, TOKEN_FILE_ENV: str(settings.batch_dir / ".token"), REMOTE_ENV: settings.connect_url,
           TOKEN_ENV: connect_token(settings) or "", "PYTHONPATH": str(PROJECT_ROOT)}
    env.pop(CONN_ENV, None)
    process(settings).start([sys.executable, "-m", "ops.batch_service", "--host", settings.host,
                             "--port", str(settings.batch_port),
                             "--dags-folder", env["AIRFLOW__CORE__DAGS_FOLDER"]], env=env, cwd=PROJECT_ROOT)


def health(settings: StackSettings, timeout: float = 2.0) -> dict:
    from catalog.listeners import check_ours

    check_ours(settings.host, settings.batch_port, "the batch service")     # before its token is sent
    request = urllib.request.Request(f"{settings.batch_url}/health",
                                     headers={"Authorization": f"Bearer {token(settings)}"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.load(answer)


def is_healthy(settings: StackSettings) -> bool:
    try:
        return health(settings).get("status") == "ok" and process(settings).is_running()
    except (OSError, ValueError):         # ForeignListener is a PermissionError: not ours, not healthy
        return False


def wait_healthy(settings: StackSettings, timeout: float = 120.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout,
               what=f"the batch service at {settings.batch_url}", interval=0.3)


def stop(settings: StackSettings) -> bool:
    return stop_server(process(settings), settings.host, settings.batch_port, "the batch service")


def status_line(settings: StackSettings) -> str:
    try:
        state = health(settings)
        busy = f"{len(state['running'])} running, {state['queued']} queued" if state["running"] or state["queued"] \
            else "idle"
        return f"batches {settings.batch_url} up ({state['slots']} slots, {busy})"
    except (OSError, ValueError, KeyError):
        return f"batches {settings.batch_url} down"

