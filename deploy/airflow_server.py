"""Airflow 3.3 for the local stack: api-server, scheduler, dag-processor and
triggerer as four processes, each stopped by its own pid.

`airflow standalone` is not used: it does not stop its children on SIGTERM.
One environment (airflow_env) is shared by the servers, the CLI wrapper and
the tests, so `dags test`, `backfill create` and the scheduler all see the
same database, DAG folder and connections.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy import batch_server, postgres_server
from deploy.processes import ManagedProcess, made_secret, require_free_ports, wait_ready, write_private
from catalog.listeners import ForeignListener, check_ours, listener_uids
from catalog.settings import PROJECT_ROOT, StackSettings
from deploy.errors import AirflowRefused, CommandFailed, NoAnswer, UnexpectedOutput
from state.errors import BadSetting

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
EXECUTOR_ENV = "STATETABLE_AIRFLOW_EXECUTOR"
CELERY_DATABASE = "celery"


def executor() -> str:
    """`local` (LocalExecutor, the default) or `celery`: CeleryExecutor with one worker process,
    its broker and results in the stack's PostgreSQL (kombu's SQLAlchemy transport), the shape
    of a deployment whose tasks run on other machines."""
    value = os.environ.get(EXECUTOR_ENV, "local")
    if value not in ("local", "celery"):
        raise BadSetting(f"{EXECUTOR_ENV}={value!r} is not an executor of the local stack; use local "
                         f"(LocalExecutor) or celery (CeleryExecutor with a worker process)")
    return value


def components() -> tuple[str, ...]:
    return COMPONENTS + (("celery-worker",) if executor() == "celery" else ())
ADMIN_USER = "admin"
#: The user a table's run sends its Asset event as, from the triggerer (statetable_airflow.triggers):
#: Airflow's `op` role, enough to send Asset events, never to change users or connections.
RUNS_USER = "statetable-runs"
VENV_BIN = Path(sys.executable).parent


def _secret(settings: StackSettings, name: str) -> str:
    """A per-stack random secret kept under the git-ignored state folder."""
    return made_secret(settings.airflow_home / f".{name}")


def connections(settings: StackSettings) -> dict[str, str]:
    """Airflow connections, given to Airflow through the environment."""
    spark = {
        "conn_type": "spark",
        "host": os.environ.get("STATETABLE_SPARK_MASTER", "local[*]"),
        "extra": {"spark-binary": "spark-submit", "deploy-mode": "client"},
    }
    kafka = {
        "conn_type": "kafka",
        "extra": {"bootstrap.servers": settings.kafka_bootstrap, **_public_kafka_settings()},
    }
    from deploy import connect_server

    # The provider's Spark Connect connection: the token is the password (the hook sends it as a
    # bearer token), the host `localhost`, to which pyspark sends a token without TLS.
    spark_connect = {
        "conn_type": "spark_connect",
        "host": "localhost" if settings.host in ("127.0.0.1", "localhost") else settings.host,
        "port": settings.connect_port,
        "password": connect_server.token(settings),
    }
    return {
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(spark_connect),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(kafka),
    }


def _public_kafka_settings() -> dict[str, str]:
    """The shared client config's settings that are no secret (protocol, mechanism, user, CA
    path), for the kafka_default connection: the provider's own hooks then reach the same
    brokers the same way, while the password stays in the mode-600 file, not the environment."""
    from state.kafka_config import CONFIG_ENV, SECRET_WORDS, file_config

    return {name: value for name, value in file_config(os.environ.get(CONFIG_ENV, ""))
            if name != "bootstrap.servers" and not any(word in name for word in SECRET_WORDS)}


def parallelism() -> int:
    return max(4, 4 * (os.cpu_count() or 1))


def airflow_env(settings: StackSettings) -> dict[str, str]:
    home = settings.airflow_home
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        # statetable's plugin comes through its `airflow.plugins` entry point, as from any installed
        # provider; the plugins folder stays empty (the same plugin found twice is an import error).
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # Task processes mostly wait on the Spark Connect server, so four per core; a deployment's
        # own setting wins.
        "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM", str(parallelism())),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin,{RUNS_USER}:op",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{settings.airflow_url}/execution/",
        # psycopg 3 for the async engine too (Airflow would pick asyncpg for `postgresql`).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_server.url(settings),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": postgres_server.url(settings),
        "AIRFLOW__API__HOST": settings.host,
        "AIRFLOW__API__PORT": str(settings.airflow_port),
        "AIRFLOW__API__BASE_URL": settings.airflow_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": _secret(settings, "api_secret_key"),
        "AIRFLOW__API_AUTH__JWT_SECRET": _secret(settings, "jwt_secret"),
        # A task's supervisor waits this long for the API server before a retry (Airflow's 5 s by
        # default): on a loaded 2-core host (a clean-clone suite, 2026-12-05) one API server took
        # longer four times over and the supervisor SIGKILLed a restore drill's task before it
        # started, "no error recorded". A deployment's own setting wins.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": os.environ.get("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT", "30"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        # Parse the DAG files when a table file changed, not on a clock: the batch service touches
        # them then (ops.table_files), and Airflow parses at once a file modified after its last
        # parse in this sort mode (its default, set here because the watch relies on it). The
        # clock stays as a backstop for a watch that cannot touch them (it warns), every 30
        # minutes: each parse costs 5-6 CPU s at 100 tables, 10.7-11.7 of a wave's ~120 CPU s on
        # two cores at the 30 s it was, and at 5 minutes one 100-table wave in five still paid
        # one. (Set as `[scheduler]`'s, Airflow 2's name, the interval was silently ignored;
        # tests/unit/deploy checks every option here is one Airflow reads.) A deployment's own
        # setting wins.
        "AIRFLOW__DAG_PROCESSOR__FILE_PARSING_SORT_MODE": "modified_time",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL":
            os.environ.get("AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL", "1800"),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        # Task logs hold table names, keys and values: their owner's alone (Airflow's own defaults
        # are 775 and 664, applied whatever the umask).
        "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FOLDER_PERMISSIONS": "0o700",
        "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FILE_PERMISSIONS": "0o600",
        "STATETABLE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STATETABLE_DATA_DIR": str(settings.data_dir),
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "NO_PROXY": "*",
    })
    env.update(postgres_server.client_env(settings))
    env.update(connections(settings))
    env.update(batch_server.connection(settings))
    env.update(api_connection(settings))
    if executor() == "celery":
        env.update({
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": "sqla+" + postgres_server.url(settings, CELERY_DATABASE),
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + postgres_server.url(settings, CELERY_DATABASE),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(parallelism()),
        })
    return env


def airflow_cli(settings: StackSettings, *args: str, check: bool = True, capture: bool = False):
    """Run the `airflow` CLI against this stack's database and DAG folder."""
    return subprocess.run(
        [str(VENV_BIN / "airflow"), *args], env=airflow_env(settings), check=check,
        capture_output=capture, text=True,
    )


def process(settings: StackSettings, component: str) -> ManagedProcess:
    return ManagedProcess(f"airflow-{component}", settings.airflow_home)


def start(settings: StackSettings) -> None:
    if not process(settings, "api-server").is_running():
        require_free_ports("airflow api-server", settings.host, settings.airflow_port)
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    postgres_server.start(settings, (postgres_server.DATABASE,) + ((CELERY_DATABASE,) if executor() == "celery"
                                                                  else ()))
    migrated = airflow_cli(settings, "db", "migrate", capture=True, check=False)
    if migrated.returncode != 0:
        raise CommandFailed(f"airflow db migrate against {postgres_server.url(settings)} failed: "
                         f"{(migrated.stderr.strip().splitlines() or ['no output'])[-1]}")
    ensure_admin_password(settings)
    write_local_settings(settings)
    env = airflow_env(settings)
    batch_server.start(settings, {k: v for k, v in env.items() if k != API_CONN_ENV})    # the triggerer's secret
    for component in components():
        args = component.split("-", 1) if component == "celery-worker" else [component]
        if component == "api-server":
            args += ["--host", settings.host, "--port", str(settings.airflow_port)]
        elif component in ("scheduler", "triggerer", "celery-worker"):
            # Their log servers bind every interface on fixed ports (8793/8794), so a second
            # stack on the machine cannot start one; the API server reads task logs from the
            # shared local folder anyway.
            args += ["--skip-serve-logs"]
        process(settings, component).start([str(VENV_BIN / "airflow"), *args], env=env, cwd=settings.airflow_home)


LOCAL_SETTINGS = '''"""Written by `statetable stack up` (deploy/airflow_server.py), each start: statetable's fix
to this Airflow's dag-processor (statetable_airflow.airflow_fixes says what and why)."""
from statetable_airflow.airflow_fixes import apply as _apply

__all__: list = []          # nothing here is an Airflow setting or policy
_apply()
'''


def write_local_settings(settings: StackSettings) -> None:
    """The stack's `airflow_local_settings.py`, in `$AIRFLOW_HOME/config`, which Airflow puts on
    its path and imports in each of its processes."""
    path = settings.airflow_home / "config" / "airflow_local_settings.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != LOCAL_SETTINGS:
        path.write_text(LOCAL_SETTINGS)


def stop(settings: StackSettings) -> None:
    for component in reversed(COMPONENTS + ("celery-worker",)):
        process(settings, component).stop(timeout=15)
    batch_server.stop(settings)
    postgres_server.stop(settings)


def health(settings: StackSettings, timeout: float = 3.0) -> dict:
    with urllib.request.urlopen(f"{settings.airflow_url}/api/v2/monitor/health", timeout=timeout) as resp:
        return json.load(resp)


HEALTH_PARTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def _not_healthy(report: dict) -> list[str]:
    return [p for p in HEALTH_PARTS if (report.get(p) or {}).get("status") != "healthy"]


def is_healthy(settings: StackSettings) -> bool:
    try:
        return not _not_healthy(health(settings))
    except OSError:
        return False


def status_line(settings: StackSettings, timeout: float = 10.0) -> str:
    """`airflow URL up`, or `down` with what is not: a busy machine can keep the API server
    from answering within wait_healthy's 3 s, and a user asking once deserves the wait and
    the cause rather than a bare `down`."""
    try:
        sick = _not_healthy(health(settings, timeout))
    except OSError as exc:
        if not any(process(settings, c).is_running() for c in components()):
            return f"airflow {settings.airflow_url} down"
        return f"airflow {settings.airflow_url} down (the API server did not answer in {timeout:.0f} s: {exc})"
    if not sick:
        return f"airflow {settings.airflow_url} up"
    return f"airflow {settings.airflow_url} down ({', '.join(p.replace('_', '-') for p in sick)} not healthy)"


def wait_healthy(settings: StackSettings, timeout: float = 180.0) -> None:
    wait_ready([process(settings, c) for c in components()], lambda: is_healthy(settings), timeout,
               what=f"airflow health at {settings.airflow_url}", interval=1.0)
    batch_server.wait_healthy(settings, timeout)


def _passwords_file(settings: StackSettings) -> Path:
    return settings.airflow_home / "simple_auth_manager_passwords.json.generated"


def ensure_admin_password(settings: StackSettings) -> None:
    """The stack's users' passwords (the admin's, and the runs' user's), generated by the stack
    into a mode-600 file before the API server starts: Airflow's simple auth manager generates
    one only for users missing from the file, and prints it to its log (0644, read by anyone on
    the machine) when it does."""
    path = _passwords_file(settings)
    known = json.loads(path.read_text() or "{}") if path.exists() else {}
    if all(user in known for user in (ADMIN_USER, RUNS_USER)):
        path.chmod(0o600)
        return
    missing = {user: secrets.token_urlsafe(16) for user in (ADMIN_USER, RUNS_USER) if user not in known}
    write_private(path, json.dumps({**known, **missing}) + "\n")


def admin_password(settings: StackSettings) -> str:
    return json.loads(_passwords_file(settings).read_text())[ADMIN_USER]


API_CONN_ENV = "AIRFLOW_CONN_STATETABLE_AIRFLOW_API"


def api_connection(settings: StackSettings) -> dict[str, str]:
    """The connection a run's trigger sends its Asset event through (Airflow's REST API as
    RUNS_USER): with it, a run that committed batches ends in the triggerer, without a worker."""
    ensure_admin_password(settings)
    password = json.loads(_passwords_file(settings).read_text())[RUNS_USER]
    return {API_CONN_ENV: json.dumps({"conn_type": "http", "host": settings.host, "port": settings.airflow_port,
                                      "schema": "http", "login": RUNS_USER, "password": password})}


def http_json(url: str, *, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
              patience: float = 60.0, retry_unanswered: bool = True):
    """One JSON call to the stack's Airflow, asked again with backoff for `patience` seconds while
    the server does not answer (refused, reset, timed out, 5xx: a busy 2-core stack still
    starting). `retry_unanswered=False` (a call that must not happen twice) retries only a
    refused connection. A 4xx is the caller's to read (HTTPError)."""
    deadline, pause, tries = time.monotonic() + patience, 1.0, 0
    while True:
        tries += 1
        req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or not retry_unanswered:
                raise
            last = f"HTTP {exc.code}"
        except (OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            if not retry_unanswered and not isinstance(reason, ConnectionRefusedError):
                raise NoAnswer(f"{method} {url}: no answer ({reason})") from None
            last = str(reason) or type(exc).__name__
        if time.monotonic() + pause > deadline:
            raise NoAnswer(f"{method} {url}: no answer in {patience:.0f}s ({tries} tries, last: {last})")
        time.sleep(pause)
        pause = min(pause * 2, 10.0)


def _wait_ours(settings: StackSettings, patience: float) -> None:
    """Wait (within `patience`) until the API port's listener is this user's: the password goes
    to no other process. Nothing listening yet is waited for; another user's listener is refused."""
    deadline = time.monotonic() + patience
    while True:
        try:
            check_ours(settings.host, settings.airflow_port, "the stack's Airflow API server")
            return
        except ForeignListener:
            if listener_uids(settings.airflow_port) or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def api_token(settings: StackSettings, patience: float = 120.0) -> str:
    """A bearer token for the REST API, from the admin password. The API server answers slowly
    while a 2-core stack starts (its first call timed out after 10 s and failed `make run`), so
    the call is retried with backoff for `patience` seconds, and a final failure names what was
    waited for and where its log is."""
    url = f"{settings.airflow_url}/auth/token"
    _wait_ours(settings, patience)
    body = json.dumps({"username": ADMIN_USER, "password": admin_password(settings)}).encode()
    try:
        return http_json(url, method="POST", body=body, headers={"Content-Type": "application/json"},
                         patience=patience)["access_token"]
    except urllib.error.HTTPError as exc:
        raise AirflowRefused(f"the Airflow API refused the stack's admin login at {url}: {exc.code}; "
                           f"was {_passwords_file(settings)} replaced after Airflow started?") from None
    except NoAnswer as exc:
        raise NoAnswer(f"{exc}; see {process(settings, 'api-server').log_file}") from None


def airflow_json(settings: StackSettings, *args: str):
    """Run an `airflow ... -o json` command and parse its JSON.

    Airflow prints warnings on stdout before the JSON, so the JSON is taken
    from the last line that starts a JSON value.
    """
    out = airflow_cli(settings, *args, "-o", "json", capture=True).stdout
    for line in reversed(out.splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise UnexpectedOutput(f"`airflow {' '.join(args)}` printed no JSON:\n{out[-2000:]}")
