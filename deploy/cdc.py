"""The stack's change-data pipeline, for `stack up --cdc`: Kafka Connect with Debezium's
PostgreSQL connector, reading databases on the stack's PostgreSQL into Kafka topics that
`-- format: debezium-json` tables read.

How it runs here, and why:
- One Kafka Connect worker in distributed mode (`ConnectDistributed`), so its source offsets,
  connector configs and statuses live in Kafka topics, not on its disk: a worker killed and
  started again resumes from its last committed offset (and re-sends what came after it, which
  the tables' upserts by key absorb).
- connect-runtime 4.3.2 beside the 4.4 broker: Debezium 3.6.1 is built against Kafka 4.3 (see
  deploy/maven/kafka-connect.pom.xml). Connectors are found on the classpath; no plugin folder.
- JsonConverter without embedded schemas: the events are the `{before, after, op, source}` the
  tables read, keys `{"id": 1}`. Timestamps as Kafka Connect's (epoch milliseconds,
  `time.precision.mode=connect`) and decimals as doubles, the values a column holds.
- Debezium logs in as its own role (`postgres_server.CDC_USER`: REPLICATION, and SELECT on the
  tables a connector captures, granted by their owner). Its password is never in a connector's
  config, which Connect's REST API and config topic show to anyone: the config names it as
  `${file:...}`, which the worker resolves from a mode-600 file in its folder.
- The publication a connector reads is made by the tables' owner, the stack's user (Debezium's
  own would need a superuser to publish every table); the replication slot by Debezium.
  `cdc remove` drops both: a slot nobody reads holds the write-ahead log without end (the
  stack's PostgreSQL caps that at `max_slot_wal_keep_size`, then the slot is invalidated).
- The REST API binds the stack's host only. It has no authentication of its own: whoever can
  reach it can add a connector, as with every loopback-only server of the stack.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from catalog import scratch
from catalog.errors import NotInstalled, UserError
from catalog.messages import one_line
from catalog.settings import PROJECT_ROOT, StackSettings, kafka_layout
from deploy import jars, kafka_server, postgres_server
from deploy.errors import CdcUnavailable, CommandFailed, NoAnswer
from deploy.processes import ManagedProcess, require_free_ports, stop_server, wait_ready, write_private

MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
GROUP = "statetable-cdc"
EXAMPLE = PROJECT_ROOT / "examples" / "shop"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TABLE = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")


def _replication(settings: StackSettings) -> int:
    return min(3, kafka_layout(settings)["brokers"])


def slot_name(database: str) -> str:
    """The replication slot and the publication of a database's connector."""
    return f"statetable_{database}"


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("kafka-connect", settings.cdc_dir)


def _secrets_file(settings: StackSettings) -> Path:
    return settings.cdc_dir / "secrets.properties"


def worker_properties(settings: StackSettings) -> str:
    replication = _replication(settings)
    return "\n".join([
        f"bootstrap.servers={settings.kafka_bootstrap}",
        f"group.id={GROUP}",
        "key.converter=org.apache.kafka.connect.json.JsonConverter",
        "value.converter=org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable=false",
        "value.converter.schemas.enable=false",
        f"offset.storage.topic=_{GROUP}-offsets",
        f"config.storage.topic=_{GROUP}-configs",
        f"status.storage.topic=_{GROUP}-status",
        f"offset.storage.replication.factor={replication}",
        f"config.storage.replication.factor={replication}",
        f"status.storage.replication.factor={replication}",
        # Source offsets committed every 5 s (Connect's default is 60): what a killed worker sends
        # again is at most that much.
        "offset.flush.interval.ms=5000",
        f"listeners=http://{settings.host}:{settings.cdc_port}",
        f"rest.advertised.host.name={settings.host}",
        f"rest.advertised.port={settings.cdc_port}",
        "plugin.discovery=service_load",         # every plugin here has its manifest: no class scan
        "config.providers=file",
        "config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider",
        f"config.providers.file.param.allowed.paths={settings.cdc_dir}",
        "",
    ])


def check_supported(settings: StackSettings) -> None:
    if kafka_layout(settings)["secure"]:
        raise UserError("stack up --cdc: the Kafka Connect worker does not speak the secure stack's SASL_SSL yet; "
                        "run --cdc on a stack made without --secure")
    if not jars.jars("cdc"):
        raise NotInstalled("cdc: the Kafka Connect and Debezium jars are missing from .cache/jars/cdc; run "
                           "`.venv/bin/python -m deploy.jars fetch cdc` (or `make setup`)")


def start(settings: StackSettings) -> None:
    """The example database, then the worker; idempotent."""
    check_supported(settings)
    postgres_server.start(settings, ("shop",))
    if not postgres_server.has_cdc_role(settings):
        raise CdcUnavailable(f"stack up --cdc: this stack's PostgreSQL ({settings.postgres_dir}) was made before CDC and "
                        f"has no replication role {postgres_server.CDC_USER}; only its first start can make one: "
                        f"`statetable stack down`, move that folder away (Airflow's run history goes with it), "
                        f"and `stack up --cdc` again")
    create_example(settings)
    proc = process(settings)
    if proc.is_running():
        return
    classpath = jars.jars("cdc")
    require_free_ports("kafka-connect", settings.host, settings.cdc_port)
    settings.cdc_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(_secrets_file(settings), f"postgres.password={postgres_server.cdc_password(settings)}\n")
    config = settings.cdc_dir / "worker.properties"
    config.write_text(worker_properties(settings))
    # Its scratch (the codecs' native libraries) in the stack's folder, as every JVM of the stack.
    tmp = scratch.for_server(settings.state_dir, "kafka-connect")
    proc.start(["java", "-Xmx384m", *kafka_server.collector_options(), "-Djava.awt.headless=true",
                scratch.java_options(tmp),
                *os.environ.get("STATETABLE_SERVER_JVM_OPTIONS", "").split(),
                # Warnings and errors only: Debezium's progress lines at info come every minute
                # while it streams, and this log has no rotation (its size grows with problems,
                # not with time). Connect's REST API answers what runs (`statetable cdc list`).
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-cp", str(classpath[0].parent / "*"), MAIN, str(config)],
               env=dict(os.environ), cwd=settings.cdc_dir)


def _request(settings: StackSettings, method: str, path: str, body: dict | None = None,
             timeout: float = 30.0) -> tuple[int, dict | list | None]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{settings.cdc_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:          # Connect's refusal: its status and JSON `message`
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"message": text.decode(errors="replace")}
    except urllib.error.URLError as exc:
        raise NoAnswer(f"Kafka Connect at {settings.cdc_url} does not answer ({exc.reason}); start it with "
                       f"`statetable stack up --cdc`") from None


def is_healthy(settings: StackSettings) -> bool:
    try:
        status, _ = _request(settings, "GET", "/connectors", timeout=2.0)
    except (OSError, NoAnswer):
        return False
    return status == 200 and process(settings).is_running()


def wait_healthy(settings: StackSettings, timeout: float = 180.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout,
               what=f"Kafka Connect at {settings.cdc_url}", interval=1.0)


def stop(settings: StackSettings) -> bool:
    return stop_server(process(settings), settings.host, settings.cdc_port, "Kafka Connect", timeout=30)


def kill(settings: StackSettings) -> bool:
    """SIGKILL the worker (a failure drill): it commits nothing more, and sends again on its next
    start what came after its last committed offset."""
    return process(settings).kill()


def status_line(settings: StackSettings) -> str:
    up = is_healthy(settings)
    names = connectors(settings) if up else []
    return f"kafka-connect {settings.cdc_url} {'up' if up else 'down'}" + (
        f" (connectors: {', '.join(names)})" if names else "")


def connectors(settings: StackSettings) -> list[str]:
    status, names = _request(settings, "GET", "/connectors")
    return sorted(names) if status == 200 and isinstance(names, list) else []


def create_example(settings: StackSettings) -> None:
    """The shipped `shop` database (customers, orders) with its first rows, once."""
    with postgres_server.connect(settings, "shop") as conn:
        if conn.execute("SELECT to_regclass('public.orders')").fetchone()[0] is None:
            conn.execute((EXAMPLE / "database.sql").read_text())


def connector_config(settings: StackSettings, database: str, tables: list[str], partitions: int) -> dict:
    name = slot_name(database)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": settings.host, "database.port": str(settings.postgres_port),
        "database.user": postgres_server.CDC_USER,
        "database.password": f"${{file:{_secrets_file(settings)}:postgres.password}}",
        "database.dbname": database,
        "topic.prefix": database,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",
        "slot.name": name, "publication.name": name, "publication.autocreate.mode": "disabled",
        "decimal.handling.mode": "double",
        "time.precision.mode": "connect",
        "topic.creation.default.replication.factor": str(_replication(settings)),
        "topic.creation.default.partitions": str(partitions),
        "topic.creation.default.cleanup.policy": "compact",
    }


def add(settings: StackSettings, database: str, tables: list[str], partitions: int = 2,
        timeout: float = 120.0) -> dict:
    """Capture `tables` (schema.table) of `database` on the stack's PostgreSQL into the topics
    `<database>.<schema>.<table>`: the publication and grants as the tables' owner, then the
    connector; waits until its task runs. Adding tables to a database's connector replaces its list."""
    from psycopg import errors, sql

    if not _NAME.match(database):
        raise UserError(f"cdc add: database {database!r} is not a plain lower-case name; give it as PostgreSQL "
                        f"lists it (e.g. shop)")
    bad = [t for t in tables if not _TABLE.match(t)]
    if bad or not tables:
        raise UserError(f"cdc add {database}: name each table as schema.table in lower case (e.g. public.orders); "
                        f"got {bad or 'none'}")
    name = slot_name(database)
    try:
        with postgres_server.connect(settings, database) as conn:
            listed = sql.SQL(", ").join(sql.Identifier(*t.split(".")) for t in tables)
            for table in tables:
                schema = table.split(".")[0]
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(postgres_server.CDC_USER)))
                conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
                    sql.Identifier(*table.split(".")), sql.Identifier(postgres_server.CDC_USER)))
            exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
            verb = "ALTER PUBLICATION {} SET TABLE {}" if exists else "CREATE PUBLICATION {} FOR TABLE {}"
            conn.execute(sql.SQL(verb).format(sql.Identifier(name), listed))
    except errors.UndefinedTable as exc:
        raise UserError(f"cdc add {database}: {one_line(exc)}; create the table first, or name it as schema.table")
    except errors.InsufficientPrivilege as exc:
        raise UserError(f"cdc add {database}: {one_line(exc)}; the stack's user ({postgres_server.USER}) must own the "
                        f"tables it publishes")
    except Exception as exc:   # noqa: BLE001 - psycopg's missing database and the like, in one line
        if "does not exist" in str(exc):
            raise UserError(f"cdc add: {one_line(exc)} on the stack's PostgreSQL; create it (the stack's user "
                            f"may: `createdb`) or use the example database `shop`")
        raise
    snapshot = _topics_first_made(settings, database, tables, partitions)
    status, answer = _request(settings, "PUT", f"/connectors/{database}/config",
                              connector_config(settings, database, tables, partitions))
    if status not in (200, 201):
        raise CommandFailed(f"cdc add {database}: Kafka Connect refused the connector ({status}): "
                            f"{one_line((answer or {}).get('message', ''))}")
    state = wait_running(settings, database, timeout)
    _wait_snapshot(settings, snapshot, timeout)
    return state


def _topics_first_made(settings: StackSettings, database: str, tables: list[str], partitions: int) -> dict[str, int]:
    """Each table's topic, made now (compacted, as Connect would make it) so that a table reading it
    finds it even while its database table is empty; {topic: rows the snapshot will write} for the
    topics that were empty, so `add` returns once a table reading them would see the snapshot."""
    from psycopg import sql

    from spark_jobs.steps.offsets import watermarks
    from state.kafka_admin import ensure_topic

    expected = {}
    with postgres_server.connect(settings, database) as conn:
        for table in tables:
            topic = f"{database}.{table}"
            ensure_topic(settings.kafka_bootstrap, topic, partitions, {"cleanup.policy": "compact"})
            if not any(high for _, high in watermarks(settings.kafka_bootstrap, topic).values()):
                expected[topic] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(*table.split(".")))).fetchone()[0]
    return expected


def _wait_snapshot(settings: StackSettings, expected: dict[str, int], timeout: float) -> None:
    from spark_jobs.steps.offsets import watermarks

    started = time.monotonic()
    for topic, rows in expected.items():
        while sum(high for _, high in watermarks(settings.kafka_bootstrap, topic).values()) < rows:
            if time.monotonic() - started > timeout:
                raise CommandFailed(f"cdc: the connector's snapshot of {topic} did not reach {rows} rows in "
                                    f"{timeout:.0f}s; see {process(settings).log_file}")
            time.sleep(0.5)
        print(f"{topic}: snapshot of {rows} rows in Kafka ({time.monotonic() - started:.1f}s)", flush=True)


def wait_running(settings: StackSettings, connector: str, timeout: float = 120.0) -> dict:
    """The connector's status once it and its task run; a failed task's first line, as an error."""
    deadline, state = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        status, state = _request(settings, "GET", f"/connectors/{connector}/status")
        tasks = (state or {}).get("tasks", []) if status == 200 else []
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if failed:
            raise CommandFailed(f"cdc: connector {connector}'s task failed: {one_line(failed[0].get('trace', ''))}; "
                                f"the worker's log is {process(settings).log_file}")
        if status == 200 and state["connector"]["state"] == "RUNNING" and tasks and \
                all(t.get("state") == "RUNNING" for t in tasks):
            return state
        time.sleep(1.0)
    raise CommandFailed(f"cdc: connector {connector} was not running after {timeout:.0f}s (last status {state}); "
                        f"see {process(settings).log_file}")


def remove(settings: StackSettings, database: str) -> None:
    """The connector, then its replication slot and publication: nothing left holding the WAL."""
    from psycopg import sql

    status, answer = _request(settings, "DELETE", f"/connectors/{database}")
    if status not in (204, 404):
        raise CommandFailed(f"cdc remove {database}: Kafka Connect answered {status}: "
                            f"{one_line((answer or {}).get('message', ''))}")
    name = slot_name(database)
    deadline = time.monotonic() + 30
    with postgres_server.connect(settings, database) as conn:
        while time.monotonic() < deadline:
            slot = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)).fetchone()
            if slot is None:
                break
            if not slot[0]:
                # The stack's user is no replication role: the slot's own role drops it.
                with postgres_server.connect(settings, database, user=postgres_server.CDC_USER) as cdc:
                    cdc.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                break
            time.sleep(0.5)
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
