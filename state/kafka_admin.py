"""Topic administration through confluent-kafka's AdminClient."""
from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def ensure_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
    """Create `name` if missing; an existing topic must have `partitions` partitions.

    A silent mismatch would route keys to the wrong partition, so it is an
    error, not a warning.
    """
    client = admin(bootstrap)
    existing = client.list_topics(name, timeout=10).topics.get(name)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            raise ValueError(
                f"topic {name!r} has {len(existing.partitions)} partitions but {partitions} are required; "
                f"delete the topic or use {len(existing.partitions)} partitions"
            )
        return
    _wait(client.create_topics([NewTopic(name, partitions, 1, config=config or {})]), "TOPIC_ALREADY_EXISTS")


def delete_topic(bootstrap: str, name: str) -> None:
    client = admin(bootstrap)  # keep it referenced: a collected client fails its futures with _DESTROY
    _wait(client.delete_topics([name], operation_timeout=30), "UNKNOWN_TOPIC_OR_PART")


def _wait(futures: dict, tolerated: str) -> None:
    """Wait for admin futures; the one error that means "already so" is not an error."""
    for future in futures.values():
        try:
            future.result(60)
        except KafkaException as exc:
            if exc.args[0].name() != tolerated:
                raise
