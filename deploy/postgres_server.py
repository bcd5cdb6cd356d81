"""Airflow's metadata database for the local stack: a PostgreSQL cluster of the stack's own.

SQLite has one writer; on two busy cores the scheduler, the API server's XCom writes and a
CLI call queued behind each other until one gave up ("database is locked", XCom pushes timing
out). Airflow's documentation calls SQLite fit for trying it out only, and docker-compose
runs PostgreSQL, so the local stack runs the same major version from the machine's own
binaries: `initdb` into `.stack/postgres`, `postgres` bound to the stack's host (127.0.0.1)
with TCP only, scram-sha-256 for every connection, and a generated password that lives in
two files of mode 600 (initdb's password file and libpq's passfile). Clients find it through
PGPASSFILE, so no connection string, command line or log holds it.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
from pathlib import Path

from catalog.listeners import check_ours
from catalog.settings import StackSettings
from deploy.processes import ManagedProcess, made_secret, require_free_ports, wait_ready, write_private
from catalog.errors import NotInstalled
from deploy.errors import CommandFailed, HostUnsuitable

USER = "statetable"               # Airflow's role: owns its databases, may create them, no superuser
ADMIN = "statetable_admin"        # initdb's superuser: its password is forgotten once USER exists
CDC_USER = "statetable_cdc"       # Debezium's role (`stack up --cdc`): REPLICATION, SELECT on what it captures
DATABASE = "airflow"
MAJOR = 15           # docker-compose's image is postgres:15 too (tests/test_compose.py holds them equal)
BINARIES = ("initdb", "postgres")


def binary(name: str) -> str:
    """A server binary from PATH or Debian's versioned folder; one line saying how to get it if
    neither has it."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)),
                                       None)
    if not found:
        raise NotInstalled(f"PostgreSQL's `{name}` is not on PATH nor in /usr/lib/postgresql/*/bin: the local stack "
                         f"keeps Airflow's metadata in PostgreSQL {MAJOR}; install it with "
                         f"`apt-get install -y postgresql-{MAJOR}` (or put its bin folder on PATH)")
    return found


def _unprivileged(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root. As root (CI's containers, this machine) the server runs
    in a user namespace where it is an ordinary user that owns the stack's files: no system user
    is needed and the stack's folders stay mode 700 (a real `postgres` user could not enter them)."""
    if os.geteuid() != 0:
        return cmd
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "--user", "--map-user=1000", "--map-group=1000", "true"],
                           capture_output=True, text=True) if unshare else None
    if probe is None or probe.returncode != 0:
        raise HostUnsuitable("postgres: PostgreSQL refuses to run as root, and this machine allows no user namespace "
                         "(`unshare --user` failed) to run it as an ordinary user; run `statetable stack up` as a "
                         "non-root user")
    return [unshare, "--user", "--map-user=1000", "--map-group=1000", *cmd]


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("postgres", settings.postgres_dir)


def data_dir(settings: StackSettings) -> Path:
    return settings.postgres_dir / "data"


def passfile(settings: StackSettings) -> Path:
    return settings.postgres_dir / ".pgpass"


def password(settings: StackSettings) -> str:
    return made_secret(settings.postgres_dir / ".password")


def cdc_password(settings: StackSettings) -> str:
    return made_secret(settings.postgres_dir / ".cdc_password")


def has_cdc_role(settings: StackSettings) -> bool:
    with connect(settings, "postgres") as conn:
        return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s AND rolreplication",
                            (CDC_USER,)).fetchone() is not None


def _write_passfile(settings: StackSettings) -> None:
    """libpq's passfile for the stack's user on the stack's host, any port (a test's second stack
    moves the port); libpq ignores a passfile that others can read, so mode 600 is required."""
    write_private(passfile(settings), f"{settings.host}:*:*:{USER}:{password(settings)}\n")


def client_env(settings: StackSettings) -> dict[str, str]:
    """What every Airflow process needs to reach the database without a password in sight."""
    return {"PGPASSFILE": str(passfile(settings))}


def url(settings: StackSettings, database: str = DATABASE) -> str:
    """SQLAlchemy's URL for Airflow: psycopg 3, sync and async alike; no password in it."""
    return f"postgresql+psycopg://{USER}@{settings.host}:{settings.postgres_port}/{database}?require_auth=scram-sha-256"


def _init(settings: StackSettings) -> None:
    folder = data_dir(settings)
    if (folder / "PG_VERSION").exists():
        return
    settings.postgres_dir.mkdir(parents=True, exist_ok=True)
    settings.postgres_dir.chmod(0o700)
    pwfile = _admin_password_file(settings)
    pwfile.unlink(missing_ok=True)            # an initdb killed halfway: a new cluster, a new password
    made_secret(pwfile)
    if folder.exists():            # an initdb killed halfway: start over, nothing in it was used
        shutil.rmtree(folder)
    done = subprocess.run(
        _unprivileged([binary("initdb"), "-D", str(folder), "-U", ADMIN, f"--pwfile={pwfile}", "--auth=scram-sha-256",
         "--encoding=UTF8", "--locale=C", "--no-instructions"]),
        capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
    )
    if done.returncode != 0:
        raise CommandFailed(f"postgres: initdb into {folder} failed: "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")


def _admin_password_file(settings: StackSettings) -> Path:
    return settings.postgres_dir / ".admin_password"


def _make_user(settings: StackSettings) -> None:
    """On a cluster this stack's initdb made: USER, a role that may log in and create databases
    but is no superuser, with the stack's password; then the superuser's password is deleted.
    A superuser can run programs on the host (COPY ... TO PROGRAM), as the server's user, which
    the user namespace maps to the stack's (root, in CI): whoever learns the password Airflow
    uses must not get that. Done once; a crash before the delete is finished by the next start."""
    import psycopg
    from psycopg import sql

    admin = _admin_password_file(settings)
    if not admin.exists():
        return
    check_ours(settings.host, settings.postgres_port, "the stack's PostgreSQL")
    with psycopg.connect(host=settings.host, port=settings.postgres_port, user=ADMIN, dbname="postgres",
                         password=admin.read_text().strip(), require_auth="scram-sha-256", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (USER,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                sql.Identifier(USER), sql.Literal(password(settings))))
        # Debezium reads the write-ahead log through a replication slot, which takes the
        # REPLICATION attribute; only a superuser can grant it, and this is the last moment one
        # is at hand. The role reads no table until USER, their owner, grants it one.
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (CDC_USER,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(CDC_USER), sql.Literal(cdc_password(settings))))
    admin.unlink()


def _answers(settings: StackSettings) -> bool:
    """Whether the server takes connections (a login it refuses still answers)."""
    import psycopg

    try:
        connect(settings, "postgres", timeout=2).close()
    except psycopg.OperationalError as exc:
        return "authentication failed" in str(exc) or "does not exist" in str(exc)
    except Exception:      # noqa: BLE001 - not up, or not ours
        return False
    return True


def start(settings: StackSettings, databases: tuple[str, ...] = (DATABASE,)) -> None:
    """Start the cluster (initialising it on first use) and make the databases; idempotent."""
    proc = process(settings)
    if not proc.is_running():
        require_free_ports("postgres", settings.host, settings.postgres_port)
        _init(settings)
        _write_passfile(settings)
        version = (data_dir(settings) / "PG_VERSION").read_text().strip()
        if version != str(MAJOR):
            print(f"warning: postgres: {data_dir(settings)} holds a PostgreSQL {version} cluster; the stack "
                  f"expects {MAJOR} (docker-compose's version)", flush=True)
        proc.start(_unprivileged([binary("postgres"), "-D", str(data_dir(settings)),
                                  "-p", str(settings.postgres_port), "-c", f"listen_addresses={settings.host}",
                                  "-c", "unix_socket_directories=", "-c", "max_connections=200",
                                  # logical decoding for Debezium (`stack up --cdc`); set from the first
                                  # start, as changing it takes a restart of Airflow's database
                                  "-c", "wal_level=logical",
                                  # a slot nobody reads holds the WAL only this far, then is given up
                                  "-c", "max_slot_wal_keep_size=2GB"]),
                   env={**os.environ, "LC_ALL": "C"}, cwd=settings.postgres_dir)
    if _admin_password_file(settings).exists():
        wait_ready([proc], lambda: _answers(settings), 60.0,
                   what=f"postgres at {settings.host}:{settings.postgres_port}", interval=0.2)
        _make_user(settings)
    wait_healthy(settings)
    for database in databases:
        _create_database(settings, database)


def connect(settings: StackSettings, dbname: str = DATABASE, timeout: float = 5.0, user: str = USER):
    """A session as the stack's user (or as CDC_USER, Debezium's role). The password never leaves
    this process: the listener must be this user's (catalog.listeners), and libpq may only
    authenticate by SCRAM, which proves the password without sending it (libpq would answer a fake
    server's cleartext request)."""
    import psycopg

    check_ours(settings.host, settings.postgres_port, "the stack's PostgreSQL")
    credentials = {"passfile": str(passfile(settings))} if user == USER else {"password": cdc_password(settings)}
    return psycopg.connect(host=settings.host, port=settings.postgres_port, user=user, dbname=dbname,
                           connect_timeout=max(1, int(timeout)), autocommit=True, require_auth="scram-sha-256",
                           **credentials)


def is_healthy(settings: StackSettings) -> bool:
    try:
        with connect(settings, "postgres", timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except Exception:      # noqa: BLE001 - any failure to answer is "down"
        return False


def wait_healthy(settings: StackSettings, timeout: float = 60.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout,
               what=f"postgres at {settings.host}:{settings.postgres_port}", interval=0.2)


def _create_database(settings: StackSettings, database: str) -> None:
    with connect(settings, "postgres") as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{database}"')


def stop(settings: StackSettings) -> None:
    """A fast shutdown (SIGINT): open sessions are rolled back rather than waited for."""
    process(settings).stop(timeout=30, sig=signal.SIGINT)


def status_line(settings: StackSettings) -> str:
    up = process(settings).is_running() and is_healthy(settings)
    return f"postgres {settings.host}:{settings.postgres_port} {'up' if up else 'down'}"
