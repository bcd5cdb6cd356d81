"""The schema registry, as the passes of a table in Confluent's wire format look schemas up.

confluent-kafka's registry client, built from the one client config (`schema.registry.*` in
STATETABLE_KAFKA_CONFIG; STATETABLE_SCHEMA_REGISTRY_URL; else the local stack's registry), once
per process: a Spark Python worker builds its own on first use, so what travels to the
executors is a `RegistrySchemas()` with no state (and no secret) in it. An id names one schema
forever, so the client's cache by id never goes stale.

A registry that does not answer is not the records' fault: the batch fails with one line naming
the registry and the fix, nothing is committed, and the next run reads the same offsets. An id
the registry does not know (deleted, or another registry's) is the record's: the format
dead-letters it as unknown_schema_id.
"""
from __future__ import annotations

import threading
from functools import lru_cache

from catalog.definitions import TableDefinition, reads_registry
from catalog.settings import load
from spark_jobs.errors import RegistryUnreachable
from spark_jobs.frames.formats.wire import Registered
from state.kafka_config import CONFIG_ENV, registry_config


class RegistrySchemas:
    """Picklable: the client is this process's (see the module docstring)."""

    def __call__(self, schema_id: int) -> Registered | None:
        return _client().schema(schema_id)


def schemas_for(table: TableDefinition) -> RegistrySchemas | None:
    return RegistrySchemas() if reads_registry(table) else None


class _Client:
    def __init__(self) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.conf = registry_config(default_url=load().registry_url)
        # The client waits forever by default: a registry that accepts the connection and never
        # answers would hold the batch, and its Airflow slot, with it.
        self.conf.setdefault("timeout", 30)
        self.client = SchemaRegistryClient(dict(self.conf))
        self._lock = threading.Lock()

    def schema(self, schema_id: int) -> Registered | None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            with self._lock:
                found = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise RegistryUnreachable(f"the schema registry at {self.conf['url']} refused schema id {schema_id}: "
                                      f"HTTP {exc.http_status_code} {exc.error_message}; check "
                                      f"schema.registry.* in {CONFIG_ENV}") from None
        except Exception as exc:    # noqa: BLE001 - httpx's connect and timeout errors and the like
            detail = str(exc).splitlines()[0][:160] if str(exc) else "no detail"
            raise RegistryUnreachable(
                f"the schema registry at {self.conf['url']} did not answer ({type(exc).__name__}: {detail}): start "
                f"it (`statetable stack up --registry` for the local stack) or set schema.registry.url in "
                f"{CONFIG_ENV}") from None
        return Registered((found.schema_type or "AVRO").upper(), found.schema_str)


@lru_cache(maxsize=1)
def _client() -> _Client:
    return _Client()
