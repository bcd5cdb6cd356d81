"""A single-node Apache Kafka broker in KRaft mode, run from the cached jars.

The broker is both controller and broker. Its log directory is formatted once
(StorageTool) and then reused, so topics survive `stack down` / `stack up`.
The log cleaner runs often so compaction is observable in tests within
seconds rather than the production default of minutes.
"""
from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from deploy import jars
from deploy.processes import ManagedProcess, require_free_ports, wait_ready
from catalog.settings import PROJECT_ROOT, StackSettings
from state.kafka_config import client_config

LOG4J_CONFIG = PROJECT_ROOT / "deploy" / "kafka" / "log4j2.properties"
JVM_HEAP = os.environ.get("STATETABLE_KAFKA_HEAP", "-Xms256m -Xmx1g").split()


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("kafka", settings.kafka_dir)


def server_properties(settings: StackSettings) -> str:
    host, port, cport = settings.host, settings.kafka_port, settings.kafka_controller_port
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{cport}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={settings.kafka_dir / 'data'}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "log.cleaner.backoff.ms=500",
        "log.retention.check.interval.ms=5000",
        "message.max.bytes=8388608",
        "replica.fetch.max.bytes=8388608",
        "",
    ])


def _java(settings: StackSettings, main: str, *args: str) -> list[str]:
    return [
        "java", *JVM_HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp", jars.kafka_classpath(), main, *args,
    ]


def _format_storage(settings: StackSettings, config: Path) -> None:
    if (settings.kafka_dir / "data" / "meta.properties").exists():
        return
    done = subprocess.run(
        _java(settings, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config)),
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"formatting the broker's storage in {settings.kafka_dir / 'data'} failed "
                           f"(exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def new_cluster_id() -> str:
    """A KRaft cluster id: 22 url-safe base64 characters that never start with '-', which the
    storage tool would read as an option (one id in 64 did, and failed a CI run's broker)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def start(settings: StackSettings) -> None:
    if process(settings).is_running():
        return
    require_free_ports("kafka", settings.host, settings.kafka_port, settings.kafka_controller_port)
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    config = settings.kafka_dir / "server.properties"
    config.write_text(server_properties(settings))
    _format_storage(settings, config)
    process(settings).start(_java(settings, "kafka.Kafka", str(config)), env=dict(os.environ))


def is_healthy(settings: StackSettings, timeout: float = 3.0) -> bool:
    """The port accepts connections and the broker answers a metadata request."""
    import socket

    from confluent_kafka.admin import AdminClient

    try:
        socket.create_connection((settings.host, settings.kafka_port), timeout=timeout).close()
    except OSError:
        return False
    admin = AdminClient(client_config(settings.kafka_bootstrap, log_level=0))
    metadata = admin.list_topics(timeout=timeout)
    return bool(metadata.brokers)


def wait_healthy(settings: StackSettings, timeout: float = 90.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout,
               what=f"kafka metadata at {settings.kafka_bootstrap}")
