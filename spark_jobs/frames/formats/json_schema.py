"""`-- format: json-confluent`: JSON values framed with the id of their JSON Schema in a registry.

The payload is JSON, typed by the table's columns as any JSON value is. The writer's schema
decides whether its records can be read at all, once per id: a property whose declared type
no column of that name can hold (a string where a BIGINT column reads; an object anywhere) makes
every record of that schema `schema_incompatible`. A property without a type, one no column
names, or a column the schema lacks is fine: JSON reads by name, absent is null.
"""
from __future__ import annotations

import json

from catalog.definitions import TableDefinition
from spark_jobs.frames.formats.wire import RegistryFormat, Refused

# The JSON Schema types a column of each type can hold ("null" always: a nullable property).
_HOLDS = {"STRING": {"string"}, "BIGINT": {"integer"}, "LONG": {"integer"}, "INT": {"integer"},
          "DOUBLE": {"integer", "number"}, "FLOAT": {"integer", "number"}, "DECIMAL": {"integer", "number"},
          "BOOLEAN": {"boolean"}, "TIMESTAMP": {"integer", "string"}, "DATE": {"string", "integer"}}


def compatible(table: TableDefinition, schema: dict) -> bool:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return isinstance(schema, dict) and schema.get("type") in (None, "object")
    for name, dtype in table.schema:
        declared = properties.get(name)
        if not isinstance(declared, dict) or "type" not in declared:
            continue
        types = declared["type"] if isinstance(declared["type"], list) else [declared["type"]]
        if not set(types) - {"null"} <= _HOLDS[dtype.split("(")[0]]:
            return False
    return True


class RegistryJson(RegistryFormat):
    schema_type = "JSON"

    def prepare(self, text: str):
        try:
            schema = json.loads(text)
        except ValueError:
            return Refused("schema_incompatible")
        return True if compatible(self.table, schema) else Refused("schema_incompatible")

    def read(self, payload: bytes, prepared) -> tuple[bytes | None, str | None]:
        return payload, None           # JSON: the passes' own reader types it
