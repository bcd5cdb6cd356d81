"""How every Airflow process of the local stack talks to its SQLite database.

Airflow reads these objects by import path (see airflow_server.airflow_env), so
the api-server, scheduler, dag-processor, triggerer and each CLI call behave the
same. Postgres (docker-compose) needs none of this.
"""
from __future__ import annotations

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

# SQLite waits 5 s for a lock by default. On two busy cores the scheduler can hold the write
# lock longer, and a concurrent `airflow backfill create` then died with "database is locked"
# (seen in CI). Wait up to a minute instead. Two objects, because Airflow adds
# check_same_thread to the sync engine's dict in place.
CONNECT_ARGS = {"timeout": 60}
ASYNC_CONNECT_ARGS = {"timeout": 60}


def session_maker(engine: Engine) -> sessionmaker:
    """Airflow's own session factory, plus write-locked savepoint transactions on SQLite.

    pysqlite starts a transaction only before a write, except that a SAVEPOINT outside one
    starts a deferred transaction: its first SELECT pins a snapshot, and if any other process
    commits before the following INSERT, SQLite refuses the upgrade at once with "database is
    locked" (SQLITE_BUSY_SNAPSHOT), no matter how long the busy timeout is. Airflow creates
    backfill runs inside such savepoints while the scheduler commits every few seconds; CI
    lost `airflow backfill create` to it. Taking the write lock when the savepoint opens makes
    the savepoint wait its turn like any other write.
    """
    if engine.dialect.name == "sqlite":
        event.listen(engine, "savepoint", _take_write_lock_before_first_savepoint)
    return sessionmaker(engine, autoflush=False, expire_on_commit=False)


def _take_write_lock_before_first_savepoint(connection, name) -> None:
    driver_connection = connection.connection.dbapi_connection
    if not driver_connection.in_transaction:
        driver_connection.execute("BEGIN IMMEDIATE")
