"""One way to build a SparkSession for every statetable job.

Jars come from the project's cache as local files (spark.jars), never from a
network resolve at job start, so jobs run offline and start the same way under
spark-submit, Airflow and tests.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from catalog.priority import batch_niceness, yield_cpu_to_queries
from catalog.settings import JARS_DIR
from spark_jobs.errors import EngineUnavailable
from catalog.errors import NotInstalled, UserError
from catalog.listeners import check_ours

log = logging.getLogger("statetable.session")

REMOTE_ENV = "STATETABLE_SPARK_REMOTE"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"      # pyspark's own: the client sends it as a bearer token

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_jars() -> list[Path]:
    """Local jar files for Spark's `spark.jars`: Kafka source and Delta Lake."""
    found = sorted((JARS_DIR / "spark").glob("*.jar"))
    if not any(p.name.startswith("spark-sql-kafka") for p in found):
        raise NotInstalled(f"Spark's Kafka source jar is missing from {JARS_DIR / 'spark'}; run `make setup`")
    if os.environ.get("STATETABLE_STORE_URI"):
        s3 = sorted((JARS_DIR / "s3").glob("*.jar"))
        if not any(p.name.startswith("hadoop-aws") for p in s3):
            raise NotInstalled(f"STATETABLE_STORE_URI is set but Hadoop's s3a jars are missing from {JARS_DIR / 's3'}; "
                             f"run `make setup`")
        found += s3
    return found


def s3a_conf() -> dict[str, str]:
    """Spark's view of the object store named by the AWS_* environment (the one boto3, pyarrow
    and delta-rs read). Credentials stay in the environment (Hadoop's default chain reads it):
    a --conf on a command line is readable by every local user."""
    if not os.environ.get("STATETABLE_STORE_URI"):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    conf = {"spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.endpoint.region": os.environ.get("AWS_REGION", "us-east-1"),
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
            # Delta's default S3 log store: correct with one writer per table at a time, which
            # the batch log's fencing guarantees (see catalog.batch_log).
            "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https")).lower()
    return conf


V1_SOURCES = "avro,csv,json,orc,parquet,text"     # Spark's default list without kafka
# Every statetable session's SQL semantics, also on a Connect server statetable did not start:
# ANSI off, so an overflow or a bad cast in a batch's Spark SQL is NULL (as catalog.expressions
# evaluates rows), never an error that fails the batch on every re-run.
#
# VACUUM lists a table's folders in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks,
# 10,000 by default: on a table of one folder that was 25-30 s of two cores per maintenance run for
# ten-thousand empty tasks (16: 2 s). A table's Delta tables have few folders each.
#
# Times in UTC, as statetable reads and shows them: DATE_FORMAT, HOUR and the like in a key give
# the same groups on every machine and in both passes (the Arrow pass formats in UTC), whatever
# the JVM's own zone.
SESSION_CONFS = {"spark.sql.ansi.enabled": "false", "spark.sql.session.timeZone": "UTC",
                 "spark.sql.sources.parallelPartitionDiscovery.parallelism": "16"}

SPARK_CONF_ENV = "STATETABLE_SPARK_CONF"
# What a deployment's own Spark settings may not change: the semantics every batch, rebuild and
# verify must share (a verify under other SQL semantics would compare two different tables), and
# the options statetable composes from several parts (the JVM options have variables of their own).
FIXED_CONFS = {*SESSION_CONFS, *DELTA_CONF, "spark.jars", "spark.master", "spark.app.name",
               "spark.driver.extraClassPath", "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
               "spark.sql.sources.useV1SourceList", "spark.python.daemon.module"}


def deployment_conf() -> dict[str, str]:
    """A deployment's own Spark settings, `key=value` pairs separated by spaces in
    STATETABLE_SPARK_CONF, for every driver statetable starts (sessions, jobs, spark-submit tasks,
    the Spark Connect server): the tuning a machine needs without a release of statetable. The
    test suite runs its Spark SQL interpreted with it (tests/conftest.py)."""
    conf = {}
    for item in os.environ.get(SPARK_CONF_ENV, "").split():
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise UserError(f"{SPARK_CONF_ENV}: {item!r} is not a Spark setting; write key=value pairs separated by "
                            f"spaces, e.g. {SPARK_CONF_ENV}='spark.sql.shuffle.partitions=8'")
        if key in FIXED_CONFS:
            raise UserError(f"{SPARK_CONF_ENV}: {key} is statetable's to set (every batch, rebuild and verify must "
                            f"share it); remove it from {SPARK_CONF_ENV}")
        conf[key] = value
    return conf


def spark_conf(app_name: str, master: str | None = None, scratch: Path | None = None) -> dict[str, str]:
    """The configuration of a driver statetable starts. Its scratch files go to `scratch`, by
    default a folder of this process under the stack's folder (see catalog.scratch)."""
    from catalog import scratch as scratch_dirs
    from catalog import settings
    from spark_jobs.engine import arrow_batches

    jar_paths = [str(p) for p in spark_jars()]
    scratch = scratch or scratch_dirs.for_process(settings.load().state_dir)
    conf = {
        "spark.app.name": app_name,
        "spark.jars": ",".join(jar_paths),
        # Also on the driver's own classpath: in local mode the Kafka source and Delta then load once,
        # from the application class loader, instead of again in the executor's loader for spark.jars,
        # with their JIT warm-up paid twice (a cold 1M-record batch: 18.0 -> 12.8 s).
        "spark.driver.extraClassPath": os.pathsep.join(jar_paths),
        # 1g as Spark's own default: the driver holds per-batch stats and small partials, not the
        # batch, and a 2g heap only grew the JVM's peak RSS (a 5M-event batch: 1347 -> 877-992 MB).
        "spark.driver.memory": os.environ.get("STATETABLE_SPARK_DRIVER_MEMORY", "1g"),
        "spark.sql.shuffle.partitions": os.environ.get("STATETABLE_SHUFFLE_PARTITIONS", "4"),
        **SESSION_CONFS,
        "spark.ui.enabled": os.environ.get("STATETABLE_SPARK_UI", "false"),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.databricks.delta.snapshotPartitions": "2",
        # The Arrow pass pre-aggregates per Arrow batch: bigger batches, fewer partial rows to shuffle.
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(arrow_batches.max_records()),
        # Kafka batch reads through Spark's DataSource V2 scan (KafkaScan), as streaming reads already
        # go: the V1 relation turns every record into an external Row and back (a 5M-record raw read:
        # 2.2 -> 1.5 s, 4.2 -> 2.8 s of JVM CPU). Same options, offsets and pooled consumers.
        "spark.sql.sources.useV1SourceList": V1_SOURCES,
        # The Kafka source keeps each pooled consumer's last fetched records for a read that starts
        # where it ended, 5 minutes by default: on a server shared by tables on */5 schedules that
        # held every table's last batch (100 tables of 10,000 records: 1.02M ConsumerRecords, ~300
        # MB of a 1 GB heap's 477 MB live), so the heap grew with tables and batch size and G1
        # collected all the time. A run's next batch comes within seconds; another run's, minutes later.
        "spark.kafka.consumer.fetchedData.cache.timeout": "20s",
        "spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval": "10s",
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # Each session's worker daemon imports the Arrow pass and the state library before it forks:
        # workers Spark stopped after a minute idle come back warm (spark_jobs/worker_daemon.py).
        "spark.python.daemon.module": "spark_jobs.worker_daemon",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG} "
                                         f"{scratch_dirs.java_options(scratch)}",   # Spark's local dirs too
        **DELTA_CONF,
        # Hadoop's local filesystem sets each file's mode itself (umask 022 by default), whatever
        # the process's umask: Delta tables hold the table's events, so their owner's alone.
        "spark.hadoop.fs.permissions.umask-mode": "077",
        **s3a_conf(),
        **deployment_conf(),
    }
    # Under spark-submit the master comes from the command line (the Airflow
    # Spark connection); a direct Python session defaults to local mode.
    if master or not os.environ.get("SPARK_ENV_LOADED"):
        conf["spark.master"] = master or os.environ.get("STATETABLE_SPARK_MASTER", "local[*]")
    return conf


def job_conf(conf: dict[str, str]) -> dict[str, str]:
    """`conf` for the driver of a job, which lives for one run: with the job JVM options
    (catalog.settings.job_jvm_options), which long-lived servers do not take, and the class-data
    archive `make setup` built for its jars (spark_jobs.engine.jvm_archive)."""
    from catalog import settings
    from spark_jobs.engine import jvm_archive

    extra = f"{jvm_archive.conf_java_options(conf)} {settings.job_jvm_options()}".strip()
    if extra:
        conf = {**conf, "spark.driver.extraJavaOptions": f"{conf.get('spark.driver.extraJavaOptions', '')} {extra}".strip()}
    return conf


def submit_options(app_name: str) -> dict:
    """Arguments for SparkSubmitOperator / spark-submit.

    The driver JVM exists before the Python job runs under spark-submit, so
    the jars must be on its command line; setting spark.jars later only
    reaches executors.
    """
    conf = job_conf(spark_conf(app_name))
    jars_csv = conf.pop("spark.jars")
    conf.pop("spark.app.name")
    conf.pop("spark.master", None)
    return {"jars": jars_csv, "conf": conf, "name": app_name}


def java_properties(conf: dict[str, str]) -> str:
    """`conf` in java.util.Properties' text form (what spark-submit's --properties-file reads)."""
    def escaped(text: str, key: bool = False) -> str:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return text.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ") if key else text
    return "".join(f"{escaped(k, key=True)}={escaped(v)}\n" for k, v in conf.items())


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect client session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


_STRUCTS: dict[str, object] = {}
_MAX_STRUCTS = 256          # distinct output schemas a process has seen; edited definitions add more


def struct(spark, ddl: str):
    """`ddl` ("name TYPE, ...") as the schema to hand a DataFrame: a Connect client sends a DDL
    string to its server to parse on every use (an AnalyzePlan round trip, two a batch), so a
    Connect session gets the StructType parsed once per process; a classic one parses it in
    its own JVM and takes the string."""
    if not is_connect(spark):
        return ddl
    found = _STRUCTS.get(ddl)
    if found is None:
        if len(_STRUCTS) >= _MAX_STRUCTS:
            _STRUCTS.clear()
        found = _STRUCTS[ddl] = spark._parse_ddl(ddl)      # pyspark's own parse (pinned in uv.lock)
    return found


def _host_port(url: str) -> tuple[str, int]:
    """Host and port of an sc:// URL (its ;params left out)."""
    parsed = urlparse(url.partition(";")[0].replace("sc://", "http://", 1))
    return parsed.hostname, parsed.port or 15002


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether something accepts connections at the sc:// URL's host and port."""
    try:
        socket.create_connection(_host_port(url), timeout=timeout).close()
        return True
    except OSError:
        return False


def client_url(url: str, token: str | None) -> str:
    """`url` with `token` added (unless it has one). pyspark sends a token without TLS only to the
    host name `localhost` (a local channel), so a loopback address is spelled that way; a token for
    another host needs use_ssl=true in the URL."""
    host, port = _host_port(url)
    host = "localhost" if host in ("127.0.0.1", "::1") else host
    options = [p for p in url.partition(";")[2].split(";") if p]
    if token and not any(p.startswith("token=") for p in options):
        options.append(f"token={token}")
    return f"sc://{host}:{port}/" + "".join(f";{p}" for p in options)


def engine() -> tuple[str | None, str]:
    """(sc:// URL with its token, or None for a local session; how it was chosen).

    STATETABLE_SPARK_REMOTE=sc://HOST:PORT must answer, or the job fails now and says how to start
    the server; =local always starts a local session; unset, the local stack's server is used
    when it is up, and a local session started when it is not."""
    from catalog import settings

    raw = os.environ.get(REMOTE_ENV, "").strip()
    if raw == "local":
        return None, f"{REMOTE_ENV}=local"
    if raw:
        if not raw.startswith("sc://"):
            raise UserError(f"{REMOTE_ENV}={raw!r} is neither an sc://HOST:PORT address of a Spark Connect server "
                            f"nor 'local'; set one of them, or unset it to use the local stack's server when it is up")
        if not answers(raw):
            raise EngineUnavailable(
                f"the Spark Connect server at {raw.partition(';')[0]} ({REMOTE_ENV}) does not answer; start it with "
                f"`statetable stack up` (or your cluster's Connect server), or set {REMOTE_ENV}=local to run "
                f"a local Spark session in this process")
        return client_url(raw, os.environ.get(TOKEN_ENV)), f"{REMOTE_ENV}={raw.partition(';')[0]}"   # no token
    stack = settings.load()
    if answers(stack.connect_url, timeout=0.5):
        return client_url(stack.connect_url, settings.connect_token(stack)), "the local stack's server is up"
    return None, f"no Spark Connect server answers at {stack.connect_url}"


_remote_sessions: dict[str, object] = {}
SESSION_GENERATIONS = 1000


@atexit.register
def _close_remote_sessions() -> None:
    """Close this process's Connect clients while the interpreter is whole: a second client's
    gRPC channel closed from `SparkSession.__del__` at interpreter teardown waits forever, and
    the process never exits. The Arrow sessions first, then the shared one; the server's
    sessions stay open for the next run."""
    for held in sorted(_remote_sessions, key=lambda h: "#" not in h):
        try:
            _remote_sessions.pop(held).client.close()
        except Exception as exc:       # noqa: BLE001 - a server already gone has nothing to close
            log.debug("closing the Spark Connect client %s: %s", held.split(";")[0], exc)


def session_id(generation: int = 0, purpose: str = "jobs") -> str:
    """The one server-side session every statetable job attaches to. The server starts a Python
    worker daemon per session and never stops it, so a session per run would leave a daemon
    behind each time and import the Arrow pass anew; a session per table would keep a daemon per
    table. Jobs of different tables share it and run at once (nothing they keep in it, a temp
    view or a conf, is shared by name). A session the server closed (idle past its timeout) is
    never reopened under its id: the next generation's id takes over."""
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"statetable:{purpose}#{generation}"))


def remote_session(url: str, purpose: str = "jobs", confs: dict[str, str] | None = None):
    """A client of the shared server session, one per process. Never `stop()` it: that closes the
    server's session for every job. Another `purpose` is another server session; its `confs` are
    set when the client is made, always to the same values, and never changed after (a session's
    confs are shared by every job that uses it)."""
    from pyspark.errors.exceptions.connect import SparkConnectException
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    held = url if purpose == "jobs" else f"{url}#{purpose}"
    if held in _remote_sessions:
        if not _remote_sessions[held].client.is_closed:
            return _remote_sessions[held]
        # The server restarted under a long-lived client (the batch service's): pyspark closed it
        # when the server's session id changed, and every call would fail. A new client, then.
        _remote_sessions.pop(held)
    guard = None
    if ";token=" in url:                # the token goes only to our own server (catalog.listeners)
        # A server not up yet is waited for by the client's retries, as before: none listens,
        # so none receives the token. Another user's listener is refused at once.
        check_ours(*_host_port(url), f"the Spark Connect server at {url.partition(';')[0]}", absent_ok=True)
        guard = _listener_guard(url)
    for generation in range(SESSION_GENERATIONS):
        target = f"{url};session_id={session_id(generation, purpose)}"
        if guard is None:
            spark = SparkSession.builder.remote(target).create()
        else:
            channel = DefaultChannelBuilder(target)
            channel.add_interceptor(guard)
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"      # as SparkSession.builder.remote().create() marks it
            spark = ConnectSession.builder.channelBuilder(channel).create()
        # pyspark retries an unreachable server for 10 minutes, also while exiting (releasing its
        # operations): a run whose engine died would hang that long. A server back within ~15 s
        # is waited for; after that the run fails and its plan waits for the next one.
        spark.client.set_retry_policies([DefaultPolicy(max_retries=6, backoff_multiplier=2.0, initial_backoff=250,
                                                       max_backoff=4000)])
        try:
            spark.conf.get("spark.sql.shuffle.partitions")
        except SparkConnectException as exc:
            if "SESSION_CLOSED" not in str(exc):
                raise
            spark.client.close()
            continue
        for key, value in {**SESSION_CONFS, **(confs or {})}.items():
            spark.conf.set(key, value)
        _remote_sessions[held] = spark
        return spark
    raise EngineUnavailable(f"the Spark Connect server at {url.split(';')[0]} has closed {SESSION_GENERATIONS} "
                            f"statetable sessions; restart it (`statetable stack restart-engine` after `down`)")


def _listener_guard(url: str):
    """A gRPC interceptor that checks, before every call, that the server's port is still held by
    this user: a client reconnects by itself after an engine restart (`restart-engine`, a
    `kill_engine` drill), and gRPC attaches the token to each call, so without this a process of
    another user that took the port in the gap would receive it."""
    import grpc

    host, port = _host_port(url)
    what = f"the Spark Connect server at {url.partition(';')[0]}"

    class Guard(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def _checked(self, continuation, details, request):
            check_ours(host, port, what, absent_ok=True)
            return continuation(details, request)

        intercept_unary_unary = intercept_unary_stream = _checked
        intercept_stream_unary = intercept_stream_stream = _checked

    return Guard()


def drop_closed() -> bool:
    """Forget this process's Connect clients once pyspark closed one of them (its server restarted:
    the session ids changed); True if it had. Every client goes, not only the closed one: all of
    them held sessions of the old server, and each would fail on its next call. A long-lived
    process (the batch service) then makes new ones, where a task process would have ended."""
    if not any(spark.client.is_closed for spark in _remote_sessions.values()):
        return False
    for held in list(_remote_sessions):
        spark = _remote_sessions.pop(held)
        try:
            spark.client.close()
        except Exception as exc:       # noqa: BLE001 - a client of a gone server has nothing to close
            log.debug("closing the Spark Connect client %s: %s", held.split(";")[0], exc)
    return True


def interrupt_all() -> None:
    """Interrupt every operation this process's Connect clients have running on their server."""
    for spark in list(_remote_sessions.values()):
        try:
            spark.interruptAll()
        except Exception as exc:       # the server may be gone already: nothing left to interrupt
            log.warning("interrupting the Spark Connect session's operations failed: %s", exc)


def sibling_session(spark, purpose: str, confs: dict[str, str]):
    """Another server session on the Connect server `spark` is a client of (remote_session)."""
    url = next(u for u, held in _remote_sessions.items() if held is spark)
    return remote_session(url, purpose, confs)


def arrow_session(spark, records: int | None):
    """The session a batch's Arrow step runs in. On a Spark Connect server every table's jobs
    share one session, so no job may change its confs: a batch with a record cap runs in a
    session of its own cap (`arrow-<cap>`), whose confs are set once, when it is made, and never
    touched again. A local session belongs to its one process: the caller sizes it around the
    job (arrow_batches.sized)."""
    from spark_jobs.engine import arrow_batches

    if records is None or not is_connect(spark):
        return spark
    return sibling_session(spark, f"arrow-{records}", {arrow_batches.MAX_BYTES_CONF: arrow_batches.NO_BYTE_CHECK,
                                                        arrow_batches.MAX_RECORDS_CONF: str(records)})


def done(spark) -> None:
    """End a job's use of `spark`: a local session stops; a Connect client lets go of its channel
    and leaves the server's session (and its warm Python workers) to the table's next run."""
    if is_connect(spark):
        spark.client.close()
        for url in [u for u, held in _remote_sessions.items() if held is spark]:
            del _remote_sessions[url]
            for other in [u for u in _remote_sessions if u.startswith(f"{url}#")]:      # its Arrow sessions
                _remote_sessions.pop(other).client.close()
    else:
        spark.stop()


def get_or_create(app_name: str, master: str | None = None, extra_conf: dict[str, str] | None = None,
                  local: bool = False):
    """A Spark Connect session on the chosen server (see `engine`), else a local SparkSession with
    the Kafka source and Delta Lake on its classpath. Logs which one, and why. A master, extra
    configuration or `local` (a benchmark peer measuring Spark itself) ask for a local session."""
    from pyspark.sql import SparkSession

    if master or extra_conf or local:
        url, why = None, "a local session was asked for"
    elif os.environ.get("SPARK_ENV_LOADED"):
        url, why = None, "spark-submit started this driver"
    else:
        url, why = engine()
    if url is not None:
        spark = remote_session(url)
        log.info("engine: Spark Connect server %s (%s)", url.split(";")[0], why)
        return spark
    conf = job_conf({**spark_conf(app_name, master), **(extra_conf or {})})
    log.info("engine: local Spark session, %s (%s)", conf.get("spark.master", "spark-submit"), why)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the venv's interpreter (state/, confluent-kafka, rocksdict live there).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    batch_niceness()      # a bad STATETABLE_BATCH_NICE fails here, before a JVM starts
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("STATETABLE_SPARK_LOG_LEVEL", "WARN"))
    gateway = getattr(spark.sparkContext._gateway, "proc", None)
    if gateway is not None:     # the JVM this process started (local mode); its Python workers inherit
        yield_cpu_to_queries(gateway.pid)
    return spark
