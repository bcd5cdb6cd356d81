"""Hooks: the only place the Airflow side reads connections."""
from __future__ import annotations

from airflow.sdk import BaseHook
from statetable_airflow.errors import ConnectionMisconfigured

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
        """The connection's settings; its security settings must agree with the shared client
        config (STATETABLE_KAFKA_CONFIG), which wins: see state.kafka_config."""
        from state.kafka_config import connection_mismatch

        extra = self.get_connection(self.kafka_config_id).extra_dejson
        if "bootstrap.servers" not in extra:
            raise ConnectionMisconfigured(
                f"Airflow connection {self.kafka_config_id!r} has no 'bootstrap.servers' in its extra; "
                'set it, e.g. {"bootstrap.servers": "127.0.0.1:19092"}'
            )
        mismatch = connection_mismatch(self.kafka_config_id, extra)
        if mismatch:
            raise ConnectionMisconfigured(mismatch)
        return {str(k): str(v) for k, v in extra.items()}

    def bootstrap_servers(self) -> str:
        return self.client_config()["bootstrap.servers"]


class StateTableHook(BaseHook):
    """A deployment's state tables, with Kafka settings from an Airflow connection.

    Everything else (state folder, snapshot store, table definitions) comes
    from the environment through catalog.runtime, which spark-submitted
    jobs read too, so a task and the Spark job it starts agree on where
    things are.
    """

    hook_name = "statetable"

    def __init__(self, kafka_config_id: str = KAFKA_CONN_ID) -> None:
        super().__init__()
        self.kafka_config_id = kafka_config_id

    def runtime(self):
        import dataclasses

        from catalog.runtime import Runtime

        bootstrap = KafkaConnectionHook(self.kafka_config_id).bootstrap_servers()
        return dataclasses.replace(Runtime.from_env(), bootstrap=bootstrap)

    def table(self, name: str):
        from spark_jobs import jobs

        return jobs.load_table(name, self.runtime())[0]

    def lag(self, name: str) -> int:
        from spark_jobs.batches.planning import lag

        return lag(name, self.runtime())

    def status(self, name: str) -> dict:
        from ops import status

        return status.table_status(self.table(name), self.runtime())


class StatetableApiHook(BaseHook):
    """A statetable query API (`statetable serve`, or Airflow's api-server at /statetable) as an
    Airflow connection of type `statetable`: host, port, schema `http`/`https`, the bearer token
    as the password; `extra` may hold {"path": "/statetable"} for the Airflow-mounted API.

    For a user's own tasks that read a table's committed rows (each answer names its batch)."""

    conn_name_attr = "statetable_conn_id"
    default_conn_name = "statetable_default"
    conn_type = "statetable"
    hook_name = "statetable query API"

    def __init__(self, statetable_conn_id: str = "statetable_default") -> None:
        super().__init__()
        self.statetable_conn_id = statetable_conn_id

    def _get(self, *segments: str) -> dict:
        """GET the path of `segments`, each quoted whole: a key holding / ? = & or # is one
        segment, not a path, a query or a fragment of its own."""
        import json
        import urllib.parse
        import urllib.request

        conn = self.get_connection(self.statetable_conn_id)
        base = f"{conn.schema or 'http'}://{conn.host}:{conn.port or 8080}{conn.extra_dejson.get('path', '')}"
        path = "".join("/" + urllib.parse.quote(segment, safe="") for segment in segments)
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {conn.password}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    def row(self, table: str, key: str) -> dict:
        """One row and the batch it comes from."""
        return self._get("tables", table, "rows", key)

    def tables(self) -> list[dict]:
        return self._get("tables")["tables"]
