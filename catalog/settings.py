"""Where the local stack lives and which ports it uses.

Every value can be overridden from the environment so that two checkouts (or a
developer's stack and a test run) never collide. Defaults stay off the common
ports (9092, 8080) that other local services tend to hold.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from state.errors import BadSetting

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = PROJECT_ROOT / ".cache"      # fetched once by `make setup` (deploy/jars.py), then read offline
JARS_DIR = CACHE_DIR / "jars"


JOB_JVM_OPTIONS_ENV = "STATETABLE_JOB_JVM_OPTIONS"


def job_jvm_options() -> str:
    """Extra options for the driver JVM of a job (a CLI run, restore or verify; a spark-submit
    task), not of the long-lived servers. The test suite starts hundreds of such jobs and sets
    `-XX:TieredStopAtLevel=1`: C2's compiling is much of a short job's CPU (a 20 s Spark job:
    44 -> 26 CPU s) and pays off only in long runs (in a 5-minute session it did not)."""
    return os.environ.get(JOB_JVM_OPTIONS_ENV, "").strip()


SERVER_JVM_OPTIONS_ENV = "STATETABLE_SERVER_JVM_OPTIONS"


def server_jvm_options() -> str:
    """Extra options for the JVMs of the stack's long-lived servers (the Spark Connect server and a
    cluster's executors, the Kafka brokers), as `job_jvm_options` is for jobs. None by default: a
    server runs for days and C2 pays off. The test suite starts and kills dozens of them within
    minutes each and sets `-XX:TieredStopAtLevel=1`."""
    return os.environ.get(SERVER_JVM_OPTIONS_ENV, "").strip()


CONNECT_JVM_OPTIONS_ENV = "STATETABLE_CONNECT_JVM_OPTIONS"


def connect_jvm_options() -> str:
    """`server_jvm_options`, then options for the Spark Connect server's JVM (and a cluster's
    executors) alone. The brokers and the Connect server differ in what they compile: a broker
    runs the same request code all day, the server new generated code for every query, so JIT
    settings that suit one may cost the other (the test suite raises C1's thresholds here)."""
    return f"{server_jvm_options()} {os.environ.get(CONNECT_JVM_OPTIONS_ENV, '')}".strip()


def _port(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        port = int(raw)
    except ValueError:
        raise BadSetting(f"{name}={raw!r} is not a port number; set it to an integer such as {default}") from None
    if not 1 <= port <= 65535:
        raise BadSetting(f"{name}={port} is out of range; use 1..65535, e.g. {default}")
    low, high = ephemeral_port_range()
    if low <= port <= high:
        print(f"warning: {name}={port} is in the kernel's ephemeral port range {low}-{high}: an outgoing "
              f"connection can hold it and the server then fails to bind; prefer a port below {low}",
              file=sys.stderr)
    return port


@functools.cache
def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections. A listener inside that range
    can find its port taken by some client socket (a CI run once lost a broker to it)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999         # Linux's default


@dataclass(frozen=True)
class StackSettings:
    """Addresses and folders of one local stack."""

    host: str
    kafka_port: int
    kafka_controller_port: int
    airflow_port: int
    state_dir: Path
    connect_port: int = 15002
    s3_port: int = 19000
    master_port: int = 17077
    postgres_port: int = 15432
    registry_port: int = 18091
    cdc_port: int = 18083
    batch_port: int = 18084

    def as_env(self) -> dict[str, str]:
        """The environment that makes `load()` in a child process return these settings."""
        return {"STATETABLE_HOST": self.host, "STATETABLE_STACK_DIR": str(self.state_dir),
                "STATETABLE_KAFKA_PORT": str(self.kafka_port),
                "STATETABLE_KAFKA_CONTROLLER_PORT": str(self.kafka_controller_port),
                "STATETABLE_AIRFLOW_PORT": str(self.airflow_port),
                "STATETABLE_SPARK_CONNECT_PORT": str(self.connect_port), "STATETABLE_S3_PORT": str(self.s3_port),
                "STATETABLE_SPARK_MASTER_PORT": str(self.master_port),
                "STATETABLE_POSTGRES_PORT": str(self.postgres_port),
                "STATETABLE_REGISTRY_PORT": str(self.registry_port), "STATETABLE_CDC_PORT": str(self.cdc_port),
                "STATETABLE_BATCH_PORT": str(self.batch_port)}

    @property
    def s3_url(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def s3_dir(self) -> Path:
        return self.state_dir / "s3"

    @property
    def store_prefix(self) -> str:
        """The cluster's folder in the stack's bucket (STATETABLE_NAMESPACE keeps deployments apart)."""
        return (os.environ.get("STATETABLE_NAMESPACE", "").strip(".-_") or "data")

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def cluster_dir(self) -> Path:
        """The standalone master's and workers' folders: each worker's work and state dir apart,
        as separate machines would have."""
        return self.state_dir / "cluster"

    @property
    def connect_url(self) -> str:
        """The stack's Spark Connect server, without its token (see `connect_token`)."""
        return f"sc://{self.host}:{self.connect_port}"

    @property
    def connect_dir(self) -> Path:
        return self.state_dir / "spark-connect"

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker of the stack (`stack up --brokers N` records how many)."""
        return ",".join(f"{self.host}:{port}" for port in self.broker_ports(kafka_layout(self)["brokers"]))

    def broker_ports(self, brokers: int) -> list[int]:
        """Client ports of brokers 1..N: the configured port, then every tenth above it (each
        broker's controller and internal listeners sit in between, see deploy.kafka_server)."""
        return [self.kafka_port + 10 * index for index in range(brokers)]

    @property
    def kafka_client_properties(self) -> Path:
        """The client config `stack up --secure` writes (mode 600) for the stack's own processes."""
        return self.kafka_dir / "client.properties"

    @property
    def airflow_url(self) -> str:
        return f"http://{self.host}:{self.airflow_port}"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def airflow_home(self) -> Path:
        return self.state_dir / "airflow"

    @property
    def postgres_dir(self) -> Path:
        """Airflow's metadata database: a PostgreSQL cluster of the stack's own."""
        return self.state_dir / "postgres"

    @property
    def registry_url(self) -> str:
        """The stack's registry as Confluent's clients address it (Apicurio serves that API here)."""
        return f"http://{self.host}:{self.registry_port}/apis/ccompat/v7"

    @property
    def registry_dir(self) -> Path:
        """The schema registry's log and pid (`stack up --registry`); its schemas are in PostgreSQL."""
        return self.state_dir / "registry"

    @property
    def cdc_url(self) -> str:
        """The stack's Kafka Connect worker (`stack up --cdc`): its REST API."""
        return f"http://{self.host}:{self.cdc_port}"

    @property
    def cdc_dir(self) -> Path:
        """The Kafka Connect worker's config, secrets file, log and pid; its offsets and connector
        configs live in Kafka topics."""
        return self.state_dir / "cdc"

    @property
    def batch_url(self) -> str:
        """The stack's batch service (ops/batch_service.py): Airflow's tasks hand it their runs."""
        return f"http://{self.host}:{self.batch_port}"

    @property
    def batch_dir(self) -> Path:
        """The batch service's token, log and pid."""
        return self.state_dir / "batches"

    @property
    def data_dir(self) -> Path:
        """Table state, snapshots and Delta tables of the local deployment."""
        return self.state_dir / "data"


def load() -> StackSettings:
    state_dir = Path(os.environ.get("STATETABLE_STACK_DIR", PROJECT_ROOT / ".stack")).resolve()
    return StackSettings(
        host=os.environ.get("STATETABLE_HOST", "127.0.0.1"),
        kafka_port=_port("STATETABLE_KAFKA_PORT", 19092),
        kafka_controller_port=_port("STATETABLE_KAFKA_CONTROLLER_PORT", 19093),
        airflow_port=_port("STATETABLE_AIRFLOW_PORT", 18080),
        connect_port=_port("STATETABLE_SPARK_CONNECT_PORT", 15002),
        s3_port=_port("STATETABLE_S3_PORT", 19000),
        master_port=_port("STATETABLE_SPARK_MASTER_PORT", 17077),
        postgres_port=_port("STATETABLE_POSTGRES_PORT", 15432),
        registry_port=_port("STATETABLE_REGISTRY_PORT", 18091),
        cdc_port=_port("STATETABLE_CDC_PORT", 18083),
        batch_port=_port("STATETABLE_BATCH_PORT", 18084),
        state_dir=state_dir,
    )


def connect_token(settings: StackSettings) -> str | None:
    """The bearer token of the stack's Spark Connect server (made by `stack up`, readable by its
    owner only): a server that runs any client's Python must not serve every local user."""
    try:
        return (settings.connect_dir / ".token").read_text().strip() or None
    except FileNotFoundError:
        return None


def kafka_layout(settings: StackSettings) -> dict:
    """How many brokers the stack runs and whether they speak SASL_SSL, as `stack up` recorded
    it (a stack never brought up with --brokers/--secure: one plaintext broker)."""
    import json

    try:
        recorded = json.loads((settings.kafka_dir / "layout.json").read_text())
    except (FileNotFoundError, ValueError):
        recorded = {}
    return {"brokers": int(recorded.get("brokers", 1)), "secure": bool(recorded.get("secure", False))}


def adopt_kafka_env(settings: StackSettings | None = None) -> bool:
    """A client of a stack brought up with `--secure` uses the stack's client config (its
    processes get it from `stack up`; the CLI and other clients here), unless the environment
    already names one. True if adopted."""
    settings = settings or load()
    if os.environ.get("STATETABLE_KAFKA_CONFIG") or not kafka_layout(settings)["secure"]:
        return False
    if not settings.kafka_client_properties.exists():
        return False
    os.environ["STATETABLE_KAFKA_CONFIG"] = str(settings.kafka_client_properties)
    return True


def cluster_env_file(settings: StackSettings) -> Path:
    return settings.cluster_dir / ".client-env.json"


def adopt_cluster_env(settings: StackSettings | None = None) -> bool:
    """A client of a stack brought up with workers (`stack up --workers N`) uses that stack's
    object store: its address and credentials, recorded by `stack up` (mode 600), go into this
    process's environment unless the environment already names a store. True if adopted."""
    import json

    if os.environ.get("STATETABLE_STORE_URI"):
        return False
    settings = settings or load()
    try:
        recorded = json.loads(cluster_env_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return False
    for key, value in recorded.items():
        os.environ.setdefault(key, value)
    return True
