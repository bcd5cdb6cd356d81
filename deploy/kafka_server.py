"""The stack's Apache Kafka brokers in KRaft mode, run from the cached jars.

One broker by default, both controller and broker. `stack up --brokers N` runs N such nodes on
loopback, all voters of one controller quorum, with the replication a production cluster has
(default replication factor min(N, 3), min.insync.replicas one less); `--secure` makes them speak
SASL_SSL to clients and mutual TLS among themselves (deploy.kafka_security). Log directories are
formatted once (StorageTool) and then reused, so topics survive `stack down` / `stack up`.
The log cleaner and the retention check keep Kafka's own defaults (a 15 s cleaner backoff, a
5-minute retention check): every table adds compacted changelog partitions, and a cleaner that
looked every 0.5 s made an idle broker of 2,400 of them spend 0.061 CPU s a second (0.038 with
the defaults), the whole of a test run long. Nothing waits on compaction.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import uuid
from pathlib import Path

from deploy import jars, kafka_security
from deploy.processes import ManagedProcess, require_free_ports, wait_ready, write_private
from catalog import scratch
from catalog.settings import PROJECT_ROOT, StackSettings, kafka_layout, server_jvm_options
from state.kafka_config import client_config, file_config
from deploy.errors import CommandFailed
from catalog.errors import UserError

LOG4J_CONFIG = PROJECT_ROOT / "deploy" / "kafka" / "log4j2.properties"
JVM_HEAP = os.environ.get("STATETABLE_KAFKA_HEAP", "-Xms256m -Xmx1g").split()


def process(settings: StackSettings, broker: int = 1) -> ManagedProcess:
    """Broker 1 keeps the one-broker stack's name and folder; brokers 2..N get their own."""
    return ManagedProcess("kafka", settings.kafka_dir) if broker == 1 else \
        ManagedProcess(f"kafka-{broker}", broker_dir(settings, broker))


def processes(settings: StackSettings) -> list[ManagedProcess]:
    return [process(settings, b) for b in range(1, kafka_layout(settings)["brokers"] + 1)]


def broker_dir(settings: StackSettings, broker: int) -> Path:
    return settings.kafka_dir if broker == 1 else settings.kafka_dir / f"broker-{broker}"


def ports(settings: StackSettings, broker: int) -> tuple[int, int, int]:
    """(client, controller, internal) ports of a broker: the configured ones for broker 1, ten
    higher for each next one; the internal (mutual TLS) listener five above the client's."""
    step = 10 * (broker - 1)
    return settings.kafka_port + step, settings.kafka_controller_port + step, settings.kafka_port + step + 5


def address(settings: StackSettings, broker: int) -> str:
    return f"{settings.host}:{ports(settings, broker)[0]}"


def internal_bootstrap(settings: StackSettings) -> str:
    return ",".join(f"{settings.host}:{ports(settings, b)[2]}"
                    for b in range(1, kafka_layout(settings)["brokers"] + 1))


def server_properties(settings: StackSettings, broker: int = 1) -> str:
    layout = kafka_layout(settings)
    brokers, secure, host = layout["brokers"], layout["secure"], settings.host
    port, cport, iport = ports(settings, broker)
    voters = ",".join(f"{b}@{host}:{ports(settings, b)[1]}" for b in range(1, brokers + 1))
    replicas = min(brokers, 3)
    min_isr = max(1, replicas - 1)
    if secure:
        listeners = [f"listeners=CLIENT://{host}:{port},INTERNAL://{host}:{iport},CONTROLLER://{host}:{cport}",
                     f"advertised.listeners=CLIENT://{host}:{port},INTERNAL://{host}:{iport}",
                     "inter.broker.listener.name=INTERNAL",
                     "listener.security.protocol.map=CONTROLLER:SSL,CLIENT:SASL_SSL,INTERNAL:SSL",
                     *kafka_security.broker_properties(settings)]
    else:
        listeners = [f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
                     f"advertised.listeners=PLAINTEXT://{host}:{port}",
                     "inter.broker.listener.name=PLAINTEXT",
                     "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"]
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={broker}",
        f"controller.quorum.voters={voters}",
        *listeners,
        "controller.listener.names=CONTROLLER",
        f"log.dirs={broker_dir(settings, broker) / 'data'}",
        "num.partitions=1",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        "offsets.topic.num.partitions=4",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        "transaction.state.log.num.partitions=4",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "unclean.leader.election.enable=false",
        "message.max.bytes=8388608",
        "replica.fetch.max.bytes=8388608",
        "",
    ])


def collector_options() -> list[str]:
    """G1, as Kafka's own scripts choose, unless STATETABLE_SERVER_JVM_OPTIONS names a collector: the JVM
    refuses two, and the broker would not start."""
    return [] if re.search(r"-XX:\+Use\w+GC\b", server_jvm_options()) else ["-XX:+UseG1GC"]


def _java(settings: StackSettings, main: str, *args: str, tmp: Path | None = None) -> list[str]:
    return [
        "java", *JVM_HEAP, *collector_options(), "-Djava.awt.headless=true", *server_jvm_options().split(),
        *([scratch.java_options(tmp)] if tmp is not None else []),
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp", jars.kafka_classpath(), main, *args,
    ]


def _format_storage(settings: StackSettings, broker: int, config: Path) -> None:
    data = broker_dir(settings, broker) / "data"
    if (data / "meta.properties").exists():
        return
    done = subprocess.run(
        _java(settings, "kafka.tools.StorageTool", "format", "-t", _cluster_id(settings), "-c", str(config)),
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise CommandFailed(f"formatting the broker's storage in {data} failed "
                           f"(exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _cluster_id(settings: StackSettings) -> str:
    """One id for every broker of the stack, kept beside them."""
    path = settings.kafka_dir / "cluster-id"
    if not path.exists():
        path.write_text(new_cluster_id())
    return path.read_text().strip()


def new_cluster_id() -> str:
    """A KRaft cluster id: 22 url-safe base64 characters that never start with '-', which the
    storage tool would read as an option (one id in 64 did, and failed a CI run's broker)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def configure(settings: StackSettings, brokers: int | None = None, secure: bool = False) -> None:
    """Record the stack's broker layout (no --brokers and no --secure: the one it was made
    with); a stack whose brokers were formatted for another layout must be wiped first, since
    their logs and quorum would not match."""
    if brokers is None and not secure:
        brokers, secure = kafka_layout(settings)["brokers"], kafka_layout(settings)["secure"]
    brokers = brokers or 1
    if brokers < 1:
        raise UserError(f"stack up --brokers {brokers}: give 1 or more brokers")
    wanted = {"brokers": brokers, "secure": secure}
    current = kafka_layout(settings)
    formatted = (settings.kafka_dir / "data" / "meta.properties").exists()
    if formatted and current != wanted:
        raise UserError(f"the stack's Kafka was made with {current['brokers']} broker(s)"
                         f"{', secure' if current['secure'] else ''}; `statetable stack down` and delete "
                         f"{settings.kafka_dir} to bring it up with {brokers}{' secure' if secure else ''}")
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    (settings.kafka_dir / "layout.json").write_text(json.dumps(wanted))
    if secure:
        kafka_security.ensure_certificates(settings)
        kafka_security.write_client_properties(settings)


def start(settings: StackSettings, broker: int | None = None) -> None:
    """Start every broker of the stack (or one) that is not running."""
    for b in [broker] if broker else range(1, kafka_layout(settings)["brokers"] + 1):
        if process(settings, b).is_running():
            continue
        used = ports(settings, b) if kafka_layout(settings)["secure"] else ports(settings, b)[:2]
        require_free_ports(f"kafka-{b}", settings.host, *used)
        folder = broker_dir(settings, b)
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "server.properties"
        write_private(config, server_properties(settings, b))
        _format_storage(settings, b, config)
        # The codecs' native libraries in the broker's own scratch, emptied here: a broker the
        # drills SIGKILL left them in /tmp.
        tmp = scratch.for_server(settings.state_dir, f"kafka-{b}")
        process(settings, b).start(_java(settings, "kafka.Kafka", str(config), tmp=tmp), env=dict(os.environ))


def stop(settings: StackSettings) -> None:
    for proc in reversed(processes(settings)):
        proc.stop(timeout=25)


def client_conf(settings: StackSettings, bootstrap: str | None = None, **overrides) -> dict:
    """statetable's client config against this stack (its own client.properties when secure)."""
    if kafka_layout(settings)["secure"]:
        conf = dict(file_config(str(settings.kafka_client_properties)))
        conf.update({"bootstrap.servers": bootstrap or settings.kafka_bootstrap, **overrides})
        return conf
    return client_config(bootstrap or settings.kafka_bootstrap, **overrides)


def ensure_access(settings: StackSettings) -> None:
    """statetable's user and ACLs on a secure stack (nothing to do on a plaintext one)."""
    if not kafka_layout(settings)["secure"]:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_security.admin_config(settings, internal_bootstrap(settings)))
    kafka_security.ensure_users_and_acls(admin, kafka_security.client_password(settings))


def is_healthy(settings: StackSettings, timeout: float = 3.0, broker: int | None = None) -> bool:
    """The port accepts connections and the broker answers a metadata request (as the stack's
    brokers' own principal when secure: statetable's user may not exist yet). With no broker
    given: every broker is registered."""
    import socket

    from confluent_kafka.admin import AdminClient

    brokers = [broker] if broker else list(range(1, kafka_layout(settings)["brokers"] + 1))
    for b in brokers:
        try:
            socket.create_connection((settings.host, ports(settings, b)[0]), timeout=timeout).close()
        except OSError:
            return False
    if kafka_layout(settings)["secure"]:
        conf = kafka_security.admin_config(settings, ",".join(f"{settings.host}:{ports(settings, b)[2]}"
                                                              for b in brokers))
        conf["log_level"] = 0
    else:
        conf = client_config(",".join(address(settings, b) for b in brokers), log_level=0)
    metadata = AdminClient(conf).list_topics(timeout=timeout)
    return set(metadata.brokers) >= set(brokers)


def durability_warnings(settings: StackSettings) -> list[str]:
    """`kafka-warning ...` for each topic of the stack whose replication factor is below what
    statetable asks for its topics (read as the brokers' own principal when secure)."""
    from confluent_kafka.admin import AdminClient

    from state.kafka_admin import replication_warnings

    secure = kafka_layout(settings)["secure"]
    conf = kafka_security.admin_config(settings, internal_bootstrap(settings)) if secure else \
        client_config(settings.kafka_bootstrap, log_level=0)
    return [f"kafka-warning {line}" for line in replication_warnings(AdminClient(conf), settings.kafka_bootstrap)]


def wait_healthy(settings: StackSettings, timeout: float = 90.0) -> None:
    wait_ready(processes(settings), lambda: is_healthy(settings), timeout,
               what=f"kafka metadata at {settings.kafka_bootstrap}")
    ensure_access(settings)
