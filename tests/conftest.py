"""Fixtures that start the real stack (Kafka KRaft, Airflow) for the tests.

Tests get their own state folder and ports, so a developer's running stack
(default ports) is never touched, and every process started here is stopped
by pid at the end of the session.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

_TEST_ROOT = Path(tempfile.mkdtemp(prefix="statetable-test-"))
# Who owns it: a session's folder is swept (pytest_sessionfinish) only once its session is gone.
from catalog.batch_log import start_ticks  # noqa: E402

(_TEST_ROOT / "owner").write_text(f"{os.getpid()} {start_ticks(os.getpid())}")
# `make test` runs the suite in three pytest-xdist workers, each with a stack of its own: worker
# k's ports are the tests' own (26000-29130; tests with ports of their own use
# tests.table_env.port) moved by PORT_OFFSETS[k]. Each window is clear of the others, of a
# developer's running stack (15002-19130: 15002, 15432, 17077, 18080, 18081, 18091, 19000, 19092 and the
# ports derived from them) and of Linux's ephemeral range (32768 up, where a client's socket may
# hold one): 26000-29130, 22000-25130, 29200-32330, and 11000-14130 for a run beside the suite.
PORT_OFFSETS = (0, -4000, 3200, -15000)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if _WORKER >= len(PORT_OFFSETS):
    raise pytest.UsageError(f"tests/conftest.py: pytest-xdist worker gw{_WORKER} has no port window of its own; "
                            f"run at most {len(PORT_OFFSETS)} workers (-n {len(PORT_OFFSETS)})")
os.environ["STATETABLE_TEST_PORT_OFFSET"] = str(PORT_OFFSETS[_WORKER])


from tests.table_env import port  # noqa: E402  (reads the offset just set)


def _port(variable: str, default: int) -> str:
    return str(port(int(os.environ.get(variable, default))))


TEST_GC = "-XX:+UseSerialGC"
INTERPRETED_SQL = "spark.sql.codegen.wholeStage=false spark.sql.codegen.factoryMode=NO_CODEGEN"

os.environ.update({
    "STATETABLE_STACK_DIR": str(_TEST_ROOT / "stack"),
    "STATETABLE_KAFKA_PORT": _port("STATETABLE_TEST_KAFKA_PORT", 29092),
    "STATETABLE_KAFKA_CONTROLLER_PORT": _port("STATETABLE_TEST_KAFKA_CONTROLLER_PORT", 29093),
    "STATETABLE_AIRFLOW_PORT": _port("STATETABLE_TEST_AIRFLOW_PORT", 28080),
    "STATETABLE_SPARK_CONNECT_PORT": _port("STATETABLE_TEST_SPARK_CONNECT_PORT", 28002),
    "STATETABLE_S3_PORT": _port("STATETABLE_TEST_S3_PORT", 28900),
    "STATETABLE_SPARK_MASTER_PORT": _port("STATETABLE_TEST_SPARK_MASTER_PORT", 28077),
    "STATETABLE_POSTGRES_PORT": _port("STATETABLE_TEST_POSTGRES_PORT", 28432),
    "STATETABLE_REGISTRY_PORT": _port("STATETABLE_TEST_REGISTRY_PORT", 28091),
    "STATETABLE_CDC_PORT": _port("STATETABLE_TEST_CDC_PORT", 28083),
    "STATETABLE_BATCH_PORT": _port("STATETABLE_TEST_BATCH_PORT", 28084),
    # Jobs a test starts run in a local session unless the test asks for the Spark Connect
    # server (the `engine` fixture); Airflow's tasks use it through their connection.
    "STATETABLE_SPARK_REMOTE": "local",
    # Hundreds of short-lived job JVMs (a driver per CLI job): C1 alone compiles what they run, at
    # less CPU per job (catalog.settings.job_jvm_options); the suite is CPU-bound on 2 cores.
    # The serial collector too: G1's concurrent marking, refinement and barriers buy short pauses
    # on big heaps, and cost CPU the suite's small heaps do not need (a CLI-job-heavy test
    # 86 -> 80 CPU s; the joins of tables and the engine warm-up 196 -> 178, two runs each).
    "STATETABLE_JOB_JVM_OPTIONS": os.environ.get("STATETABLE_JOB_JVM_OPTIONS", f"-XX:TieredStopAtLevel=1 {TEST_GC}"),
    # The same for the servers the tests start and kill (Connect servers, brokers): each lives
    # minutes, not the days C2's compiling pays off in (catalog.settings.server_jvm_options).
    "STATETABLE_SERVER_JVM_OPTIONS": os.environ.get("STATETABLE_SERVER_JVM_OPTIONS",
                                                    f"-XX:TieredStopAtLevel=1 {TEST_GC}"),
    # The Spark Connect servers (and a cluster's executors) compile new generated code for every
    # query: at C1's default thresholds its compiler and code sweeper threads were 30% of the
    # server's CPU. Five times them: 138 -> 103 CPU s over five engine-heavy modules (a broker,
    # running the same request code throughout, gained nothing; nor did the jobs' short drivers).
    "STATETABLE_CONNECT_JVM_OPTIONS": os.environ.get(
        "STATETABLE_CONNECT_JVM_OPTIONS", "-XX:Tier3InvocationThreshold=1000 -XX:Tier3MinInvocationThreshold=500 "
                                          "-XX:Tier3CompileThreshold=10000 -XX:Tier3BackEdgeThreshold=300000"),
    # Spark SQL interpreted, not compiled, in every Spark driver the suite starts (its sessions,
    # CLI jobs, spark-submit tasks, Connect servers): a test's batches are hundreds of rows, each
    # query a new plan, and Janino's compiling of its generated classes, then the JIT's of those
    # classes, cost more than the rows (18 Spark-heavy modules on three workers: 1,262 -> 1,114
    # CPU s; ksqlDB's cases alone 331 -> 286). Both modes are Spark's own, held equal by Spark's
    # tests; the first hour runs a user's defaults (compiled) end to end, and the expressions'
    # fuzz test compares with compiled Spark SQL.
    "STATETABLE_SPARK_CONF": os.environ.get("STATETABLE_SPARK_CONF", INTERPRETED_SQL),
    # Every Spark Connect server the suite starts (the session's, a cluster's, a secure stack's,
    # each kill_engine drill's restart) warms itself before it reports up. 100,000 records is the
    # product's default, for a user's first batch; 5,000 touch the same steps (the warm-up test
    # proves a batch after them finds no cold worker) at a fraction of the CPU. The first hour
    # runs a user's defaults.
    "STATETABLE_ENGINE_WARMUP_RECORDS": os.environ.get("STATETABLE_ENGINE_WARMUP_RECORDS", "5000"),
    # Airflow's metrics to a UDP port a test may listen on (tests/test_airflow_smoke.py).
    "AIRFLOW__METRICS__STATSD_ON": "True",
    "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
    "AIRFLOW__METRICS__STATSD_PORT": _port("STATETABLE_TEST_STATSD_PORT", 28125),
    # OpenLineage events of every task to a file (tests/test_airflow_smoke.py reads it).
    "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "append": True,
                                                   "log_file_path": str(_TEST_ROOT / "openlineage.jsonl")}),
    "AIRFLOW__OPENLINEAGE__NAMESPACE": "statetable-tests",
    # Tests trigger every run they check; scheduled runs would race them for the same tables.
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
    # The suite's Airflows (the session's, the cluster's, the secure stack's, Celery's) parse their
    # DAG files when they start and never see them change; re-parsing every 30 s and looping every
    # second while idle were most of an idle Airflow's CPU: 25.2 -> 8.7 CPU s per 3 idle minutes
    # with these two (bench: /proc of every process, two Airflows on one machine one after the
    # other). A scheduler with work does not sleep. The first hour runs a user's defaults (the
    # same 300 s since the batch service's watch tells Airflow of a table file's change, and 1 s),
    # and proves a new table's DAGs appear within a minute with them.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "300",
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "2",
})

# py4j logs from __del__ at interpreter exit, after pytest closed the stream it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)

from deploy import airflow_server, connect_server, kafka_server  # noqa: E402
from catalog import settings as stack_settings


@pytest.fixture(scope="session")
def stack_settings_():
    return stack_settings.load()


@pytest.fixture(scope="session")
def kafka(stack_settings_):
    """A real single-node KRaft broker; yields its bootstrap address."""
    kafka_server.start(stack_settings_)
    try:
        kafka_server.wait_healthy(stack_settings_)
        yield stack_settings_.kafka_bootstrap
    finally:
        kafka_server.process(stack_settings_).stop(timeout=25)


@pytest.fixture(scope="session")
def engine(stack_settings_):
    """The stack's Spark Connect server; yields its address with the token (a client URL)."""
    from spark_jobs.engine.session import client_url

    connect_server.start(stack_settings_)
    try:
        connect_server.wait_healthy(stack_settings_)
        yield client_url(stack_settings_.connect_url, connect_server.token(stack_settings_))
    finally:
        connect_server.stop(stack_settings_)


@pytest.fixture(scope="session")
def s3(stack_settings_):
    """The stack's S3-compatible store (moto's server); yields the environment its clients need."""
    from deploy import object_store

    object_store.start(stack_settings_)
    try:
        object_store.wait_healthy(stack_settings_)
        yield object_store.client_env(stack_settings_)
    finally:
        object_store.stop(stack_settings_)


@pytest.fixture(scope="session")
def registry(stack_settings_):
    """The stack's schema registry (Apicurio, on the stack's PostgreSQL); yields its URL."""
    from deploy import postgres_server, schema_registry

    had_postgres = postgres_server.process(stack_settings_).is_running()
    schema_registry.start(stack_settings_)
    try:
        schema_registry.wait_healthy(stack_settings_)
        yield schema_registry.url(stack_settings_)
    finally:
        schema_registry.stop(stack_settings_)
        if not had_postgres:
            postgres_server.stop(stack_settings_)


@pytest.fixture(scope="session")
def airflow(stack_settings_, kafka, engine):
    """Airflow's four processes against the test broker and Spark Connect server; yields the settings."""
    airflow_server.start(stack_settings_)
    try:
        airflow_server.wait_healthy(stack_settings_)
        yield stack_settings_
    finally:
        airflow_server.stop(stack_settings_)


SESSION_JIT = os.environ.get("STATETABLE_TEST_SESSION_JVM_OPTIONS", "-XX:Tier4InvocationThreshold=50000 "
                             f"-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=400000 {TEST_GC}")


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.engine import session

    # One session for each worker's whole run: C2 pays off on what is hot. (C1 alone only saved CPU
    # in its first minutes and lost it over a whole run: the joins of tables 180 -> 263 s.) But
    # C2's compiler threads were 56% of this JVM's CPU through 16 warm conformance cases: each
    # test's queries are new code paths, compiled at C2 once warm enough for C2's default
    # thresholds. Ten times those thresholds: the session's JVM 50 -> 35 CPU s there.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STATETABLE_JOB_JVM_OPTIONS", SESSION_JIT)
        spark = session.get_or_create("statetable-tests")
    yield spark
    spark.stop()


@pytest.fixture
def topic_name():
    """A fresh topic name per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


def pytest_report_header(config):
    """How fast this machine's CPU is, at the top of every run's log: the suite is CPU-bound, so
    a CI run that ran long says whether the code or the machine got slower (0.34-0.57 s on the
    2-core machine of 2026-12-05, where the whole suite took 72 minutes, not its usual 20)."""
    import time

    started = time.process_time()
    total = 0
    for i in range(5_000_000):
        total += i
    return f"machine: a 5M-step Python loop in {time.process_time() - started:.2f} CPU s, {os.cpu_count()} cores"


# The longest modules of the last clean-clone run, longest first. pytest-xdist hands out whole
# modules (`--dist loadfile`) in collection order, so these go first and the short ones fill in
# behind them; a long module drawn last would leave the other worker idle while it runs.
LONGEST_FIRST = ("test_exactly_once", "test_cluster", "test_first_hour", "test_secure_kafka",
                 "test_delta_maintenance", "test_table_aggregates", "test_dags", "test_ksqldb_conformance",
                 "test_microbatch", "test_table_joins")    # the other Airflow modules go with test_dags


# The modules that use the `airflow` fixture run on one worker, one after the other, and Airflow
# stops after the last of them: started on both workers it idled through the whole run
# (0.06 CPU s a second each: scheduler, dag processor, triggerer, API server, Postgres).
AIRFLOW_MODULES = ("test_dags", "test_install", "test_airflow_smoke", "test_query_api")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class AirflowModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "the airflow modules" if Path(scope).stem in AIRFLOW_MODULES else scope

    return AirflowModulesTogether(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop Airflow once the next test does not use it; a later test that does starts it again
    (the fixture's cache is cleared with its teardown)."""
    if nextitem is None or "airflow" not in item.fixturenames or "airflow" in nextitem.fixturenames:
        return
    for fixturedef in item._fixtureinfo.name2fixturedefs.get("airflow", ()):
        fixturedef.finish(item._request)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def order(item) -> tuple:
        stem = item.path.stem
        if stem not in AIRFLOW_MODULES:
            return rank.get(stem, len(rank)), 0, False
        # One run of tests that use Airflow: the first module's other tests before them, the
        # last module's after them.
        uses = "airflow" in item.fixturenames
        after = {AIRFLOW_MODULES[0]: uses, AIRFLOW_MODULES[-1]: not uses}.get(stem, False)
        return rank.get(AIRFLOW_MODULES[0], len(rank)), AIRFLOW_MODULES.index(stem), after

    items.sort(key=order)


# Seconds per module and the worker that ran it, summed from every phase's report: what
# LONGEST_FIRST is ordered by, printed at the end of a run so the next ordering is measured.
_MODULE_SECONDS: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    key = (worker, report.nodeid.split("::", 1)[0])
    _MODULE_SECONDS[key] = _MODULE_SECONDS.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _MODULE_SECONDS:
        return
    by_worker: dict[str, float] = {}
    for (worker, _), seconds in _MODULE_SECONDS.items():
        by_worker[worker] = by_worker.get(worker, 0.0) + seconds
    terminalreporter.write_sep("=", "seconds per module, by worker (tests/conftest.py LONGEST_FIRST)")
    for worker in sorted(by_worker):
        terminalreporter.write_line(f"{worker}: {by_worker[worker]:.0f} s")
        for (w, module), seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
            if w == worker and seconds >= float(os.environ.get("STATETABLE_MODULE_SECONDS_MIN", "20")):
                terminalreporter.write_line(f"  {seconds:7.0f}  {module}")


def pytest_sessionfinish(session, exitstatus):
    """Keep the stack folder (broker and Airflow logs) only when something failed, and only the
    newest three failed sessions' (pytest's own tmp_path retention, for the stack's folder)."""
    if exitstatus == 0:
        shutil.rmtree(_TEST_ROOT, ignore_errors=True)
    def gone(root: Path) -> bool:
        """Its session ended: a running session's folder holds its broker's data (sweeping one
        took a running suite's Kafka down)."""
        try:
            pid, started = (root / "owner").read_text().split()
        except (OSError, ValueError):
            return False               # no owner file: left alone
        return start_ticks(int(pid)) != started

    ended = [p for p in _TEST_ROOT.parent.glob("statetable-test-*") if p != _TEST_ROOT and gone(p)]
    for old in sorted(ended, key=lambda p: p.stat().st_mtime, reverse=True)[2:]:
        shutil.rmtree(old, ignore_errors=True)
