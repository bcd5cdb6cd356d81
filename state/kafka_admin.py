"""Topic administration through confluent-kafka's AdminClient, and the metadata clients that
plans and partition opens share."""
from __future__ import annotations

import logging
import os
import threading
import time

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from state import kafka_errors
from state.kafka_config import REPLICATION_ENV, client_config, min_insync_replicas, replication_factor
from state.errors import TopicMismatch, TopicNotReady

__all__ = ["WANTED_TTL", "admin", "delete_topic", "ensure_topic", "group_committer", "metadata_consumer",
           "partition_watermarks", "replication_warnings", "topic_metadata", "wanted_replication"]

log = logging.getLogger(__name__)

_clients: dict[tuple, object] = {}
_guard = threading.Lock()


def _cached(kind, bootstrap: str, make):
    """One client per process, kind and broker: a new one costs ~50-60 ms of connecting, and a
    batch asks for topics, watermarks and bounds a dozen times. Keyed by pid, since a forked
    child cannot use its parent's client. Quiet (critical only): a broker gone for good would
    otherwise log a failed reconnect every backoff for the life of the process; a failing call
    still raises."""
    key = (os.getpid(), kind, bootstrap)
    with _guard:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = make(client_config(bootstrap, log_level=2,
                                                         error_cb=kafka_errors.recorder(bootstrap)))
        return client


def topic_metadata(client, bootstrap: str, topic: str, operation: str = "describe", timeout: float = 10,
                   patience: float = 10.0):
    """`topic`'s metadata, or None when it does not exist. A broker that does not answer, or
    refuses the login or the topic, raises KafkaAccessError naming the broker, the principal
    and the fix (`operation`: what the caller needs the topic for).

    librdkafka asks one broker for metadata and reports that broker's lost connection as the
    call's error. Of several brokers, one dying or restarting is what a cluster survives: the
    call is asked again (another broker answers) for `patience` seconds; a client of the wrong
    security.protocol hears the same error after it. The secure stack's
    broker kills found this: a merge task's changelog catch-up asked the broker that was just
    starting again, and the batch stopped while two brokers were up."""
    try:
        meta = _asked_again(lambda: client.list_topics(topic, timeout=timeout).topics.get(topic),
                            lambda error: _another_broker_may_answer(error, bootstrap), patience, 0.5)
    except KafkaException as exc:
        if kafka_errors.is_connection_failure(exc.args[0]):
            raise kafka_errors.connection_error(bootstrap, client, f"reading topic {topic!r}") from None
        raise
    if meta is not None and meta.error is not None and meta.error.name() in kafka_errors.AUTHORIZATION_ERRORS:
        raise kafka_errors.denied(bootstrap, meta.error.name(), operation, topic)
    return None if meta is None or meta.error is not None else meta


def _asked_again(call, transient, patience: float, pause: float):
    """`call()`, asked again every `pause` seconds for `patience` seconds while it raises a Kafka
    error that `transient(error)` calls passing (a leader moving, one broker of several lost)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not transient(exc.args[0]) or time.monotonic() > deadline:
                raise
            time.sleep(pause)


def _another_broker_may_answer(error, bootstrap: str) -> bool:
    """A connection lost to one of several brokers, not a refusal (a wrong password or CA is
    final, and said at once), nor a single broker's (nothing else to ask)."""
    return (error.name() in kafka_errors.UNREACHABLE and "," in bootstrap
            and not kafka_errors.refused(bootstrap))


def partition_watermarks(consumer, bootstrap: str, partition, timeout: float = 10.0, patience: float = 30.0) -> tuple[int, int]:
    """A partition's (low, high) watermarks. While its leader dies and another takes over (a
    broker lost, restarting, or electing) the question goes again for `patience` seconds, as
    Kafka's own clients retry a NOT_LEADER answer; a refused login is not retried."""
    return _asked_again(lambda: consumer.get_watermark_offsets(partition, timeout=min(timeout, 5.0)),
                        lambda error: error.name() in kafka_errors.LEADER_MOVING and not kafka_errors.refused(bootstrap),
                        max(timeout, patience), 0.2)


def admin(bootstrap: str) -> AdminClient:
    return _cached("admin", bootstrap, AdminClient)


def metadata_consumer(bootstrap: str, read_committed: bool = False) -> Consumer:
    """A consumer that never subscribes, for topic metadata and watermarks (read_committed: the
    end is the last stable offset)."""
    return _cached(("consumer", read_committed), bootstrap, lambda conf: Consumer({
        **conf, "group.id": "statetable-metadata", "enable.auto.commit": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted"}))


def ensure_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
    """Create `name` if missing; an existing topic must have `partitions` partitions.

    A silent mismatch would route keys to the wrong partition, so it is an
    error, not a warning.
    """
    client = admin(bootstrap)
    existing = topic_metadata(client, bootstrap, name)
    if existing is not None:
        for warning in replication_warnings(client, bootstrap, [name]):
            log.warning("%s", warning)
        if len(existing.partitions) != partitions:
            raise TopicMismatch(
                f"topic {name!r} has {len(existing.partitions)} partitions but {partitions} are required; "
                f"delete the topic or use {len(existing.partitions)} partitions"
            )
        return
    config = dict(config or {})
    if min_insync_replicas() is not None:
        config.setdefault("min.insync.replicas", str(min_insync_replicas()))
    # -1: the broker's default.replication.factor, as Kafka Streams' replication.factor defaults to
    try:
        _wait(client.create_topics([NewTopic(name, partitions, replication_factor(), config=config)]),
              "TOPIC_ALREADY_EXISTS")
    except KafkaException as exc:
        if exc.args[0].name() in kafka_errors.AUTHORIZATION_ERRORS:
            raise kafka_errors.denied(bootstrap, exc.args[0].name(), "create", name) from None
        raise
    _wait_visible(bootstrap, name, partitions)


_WANTED: dict[str, tuple[float, int]] = {}     # bootstrap -> (when asked, wanted replication factor)
WANTED_TTL = 60.0


def wanted_replication(client, timeout: float = 5, bootstrap: str | None = None) -> int:
    """The replication factor statetable asks for its topics: STATETABLE_TOPIC_REPLICATION_FACTOR,
    else the brokers' default.replication.factor (what a topic created with -1 gets); a client
    that may not read broker configs assumes min(brokers, 3), the production convention. Asked
    once a minute per `bootstrap`: every batch's topic check and every /tables request need it,
    and a broker default hardly ever changes."""
    if replication_factor() > 0:
        return replication_factor()
    known = _WANTED.get(bootstrap) if bootstrap else None
    if known is not None and time.monotonic() - known[0] < WANTED_TTL:
        return known[1]
    from confluent_kafka.admin import ConfigResource

    brokers = client.list_topics(timeout=timeout).brokers
    try:
        resource = ConfigResource("broker", str(min(brokers)))
        configs = next(iter(client.describe_configs([resource]).values())).result(timeout)
        wanted = int(configs["default.replication.factor"].value)
    except (KafkaException, KeyError, ValueError, TimeoutError):
        # TimeoutError: the broker asked died meanwhile (concurrent.futures' timeout is TimeoutError).
        wanted = min(len(brokers), 3)
    if bootstrap:
        _WANTED[bootstrap] = (time.monotonic(), wanted)
    return wanted


def replication_warnings(client, bootstrap: str, topics: list[str] | None = None) -> list[str]:
    """One line per topic (`topics`, or every topic but Kafka's own) whose replication factor is
    below what statetable asks for its topics: its data lives on fewer brokers than the rest, and
    one broker's disk is all that stands between it and loss. Missing topics are not reported."""
    wanted = wanted_replication(client, bootstrap=bootstrap)
    if wanted <= 1:
        return []
    if topics is None:
        found = client.list_topics(timeout=10).topics
        topics = sorted(t for t in found if not t.startswith("__"))
    lines = []
    for name in topics:
        meta = topic_metadata(client, bootstrap, name)
        replicas = min((len(p.replicas) for p in meta.partitions.values()), default=wanted) if meta else wanted
        if replicas < wanted:
            lines.append(f"topic {name} has replication factor {replicas}, below {wanted} ({REPLICATION_ENV} or the "
                         f"brokers' default): its data lives on fewer brokers than the rest; raise it with "
                         f"kafka-reassign-partitions.sh")
    return lines


def _wait_visible(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> None:
    """The controller accepts a topic before the broker's metadata shows it: a watermark read
    straight after creating would find no topic. Wait until every partition has a leader."""
    deadline = time.monotonic() + timeout
    while True:
        topic = topic_metadata(metadata_consumer(bootstrap), bootstrap, name)
        if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())):
            return
        if time.monotonic() > deadline:
            raise TopicNotReady(f"topic {name!r} was created but its {partitions} partitions have no leader "
                               f"after {timeout:.0f} s; check the broker at {bootstrap}")
        time.sleep(0.1)


def delete_topic(bootstrap: str, name: str) -> None:
    client = admin(bootstrap)
    _wait(client.delete_topics([name], operation_timeout=30), "UNKNOWN_TOPIC_OR_PART")


def _wait(futures: dict, tolerated: str) -> None:
    """Wait for admin futures; the one error that means "already so" is not an error."""
    for future in futures.values():
        try:
            future.result(60)
        except KafkaException as exc:
            if exc.args[0].name() != tolerated:
                raise


def group_committer(bootstrap: str, group: str) -> Consumer:
    """A consumer of `group` that only commits offsets (for lag tools), never subscribes."""
    return _cached(("group", group), bootstrap, lambda conf: Consumer({
        **conf, "group.id": group, "enable.auto.commit": False}))
