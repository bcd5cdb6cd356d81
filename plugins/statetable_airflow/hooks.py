"""Hooks: the only place the Airflow side reads connections."""
from __future__ import annotations

from airflow.sdk import BaseHook

KAFKA_CONN_ID = "kafka_default"


class KafkaConnectionHook(BaseHook):
    """Kafka client settings from an Airflow connection of the Kafka provider's type.

    The provider's own hooks build confluent-kafka clients from the same
    `extra` JSON; statetable needs the settings themselves to hand them to
    Spark and to its state library.
    """

    conn_name_attr = "kafka_config_id"
    default_conn_name = KAFKA_CONN_ID
    conn_type = "kafka"
    hook_name = "statetable Kafka"

    def __init__(self, kafka_config_id: str = KAFKA_CONN_ID) -> None:
        super().__init__()
        self.kafka_config_id = kafka_config_id

    def client_config(self) -> dict[str, str]:
        extra = self.get_connection(self.kafka_config_id).extra_dejson
        if "bootstrap.servers" not in extra:
            raise ValueError(
                f"Airflow connection {self.kafka_config_id!r} has no 'bootstrap.servers' in its extra; "
                'set it, e.g. {"bootstrap.servers": "127.0.0.1:19092"}'
            )
        return {str(k): str(v) for k, v in extra.items()}

    def bootstrap_servers(self) -> str:
        return self.client_config()["bootstrap.servers"]
