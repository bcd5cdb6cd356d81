"""`-- format: debezium-json`: a database table's change events, as Debezium writes them through
Kafka Connect's JsonConverter, with embedded schemas (`{"schema": ..., "payload": {...}}`) or
without; `-- format: debezium-avro-confluent`: the same events through Confluent's AvroConverter
(the wire format, the Envelope schema by id; keys too, `key_format` avro-confluent by default).

A source table over them holds the database table: an event with op c (insert), u (update) or r
(a snapshot's read) upserts its `after` row; op d deletes the row its Kafka key names, as the
tombstone Debezium sends after it does (the two are one delete: deleting twice is deleting). A
primary-key change arrives as a delete of the old key and an insert of the new one. Debezium is
at-least-once: after a connector restart it sends events again, and an upsert or a delete by key
applied twice leaves the table as applying it once did.

With embedded schemas (and always in Avro, where each field's schema names its Connect type as
`connect.name`, or an Avro logical type), Debezium's time types are read by their semantic names: MicroTimestamp and
NanoTimestamp to epoch milliseconds, Date (days) to YYYY-MM-DD, ZonedTimestamp as the ISO text it
is; without them a number in a TIMESTAMP column is epoch milliseconds, so the connector wants
`time.precision.mode=connect`. NUMERIC columns want `decimal.handling.mode=double` (or string):
Debezium's default writes them as base64 bytes.

  malformed_json        the value is not one JSON object
  not_a_change_event    no op c/u/r/d, or no `after` object for c/u/r
  truncate_not_applied  op t (a TRUNCATE): every row is gone from the database, and statetable
                        cannot delete keys it is not told; the table keeps them (a rebuild after
                        the topic holds the deletes is the fix)
"""
from __future__ import annotations

import io
import json

from catalog.definitions import TableDefinition
from spark_jobs.frames.formats.avro import READ_ERRORS, iso_day, parsed, plain
from spark_jobs.frames.formats.wire import RegistryFormat, Refused

DELETE = "_delete"          # a format's verdict that the record deletes its key: a tombstone, not a dead letter
_SCALES = {"io.debezium.time.MicroTimestamp": 1000, "io.debezium.time.NanoTimestamp": 1_000_000,
           "io.debezium.time.Timestamp": 1, "org.apache.kafka.connect.data.Timestamp": 1}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")


def _semantics(schema) -> dict[str, str]:
    """The `after` struct's fields with a time type: name -> Connect's semantic type name."""
    if not isinstance(schema, dict):
        return {}
    for part in schema.get("fields") or []:
        if isinstance(part, dict) and part.get("field") == "after":
            return {f["field"]: f["name"] for f in part.get("fields") or []
                    if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("field"), str)}
    return {}


def _convert(row: dict, semantics: dict[str, str]) -> dict:
    for name, kind in semantics.items():
        value = row.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if kind in _SCALES:
            row[name] = value // _SCALES[kind]
        elif kind in _DATES:
            row[name] = iso_day(value)
    return row


def _change(event, semantics: dict[str, str]) -> tuple[bytes | None, str | None]:
    """An envelope's verdict: the row to upsert as canonical JSON, a delete, or a reason."""
    if not isinstance(event, dict):
        return None, "not_a_change_event"
    op = event.get("op")
    if op == "d":
        return None, DELETE
    if op == "t":
        return None, "truncate_not_applied"
    after = event.get("after")
    if op not in ("c", "u", "r") or not isinstance(after, dict):
        return None, "not_a_change_event"
    return json.dumps(_convert(after, semantics), ensure_ascii=False, separators=(",", ":")).encode(), None


class DebeziumJson:
    def __init__(self, table: TableDefinition) -> None:
        self.table = table

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None, "malformed_json"
        semantics = {}
        if isinstance(event, dict) and "payload" in event and "schema" in event:
            semantics, event = _semantics(event["schema"]), event["payload"]
        return _change(event, semantics)


# Avro's logical types, as the Connect types they stand for.
_LOGICAL = {"timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
            "timestamp-micros": "io.debezium.time.MicroTimestamp", "date": "org.apache.kafka.connect.data.Date"}


def _avro_semantics(envelope: dict) -> dict[str, str]:
    """The row record's fields with a time type (`connect.name`, else an Avro logical type)."""
    for field in envelope.get("fields") or []:
        if field.get("name") not in ("before", "after"):
            continue
        for branch in field["type"] if isinstance(field["type"], list) else [field["type"]]:
            if isinstance(branch, dict) and branch.get("type") == "record":
                out = {}
                for column in branch.get("fields") or []:
                    for kind in column["type"] if isinstance(column["type"], list) else [column["type"]]:
                        if isinstance(kind, dict):
                            name = kind.get("connect.name") or _LOGICAL.get(kind.get("logicalType"))
                            if name:
                                out[column["name"]] = name
                return out
    return {}


class DebeziumAvro(RegistryFormat):
    """The envelope read with its writer schema as registered (no reader: the row's fields are
    typed by the table's columns, by name, as the JSON form's are)."""

    schema_type = "AVRO"

    def prepare(self, text: str):
        try:
            envelope = json.loads(text)
            writer = parsed(text)[0]
        except Exception:                     # noqa: BLE001 - a registered schema fastavro cannot parse
            return Refused("schema_incompatible")
        if not isinstance(envelope, dict) or not {"op", "after"} <= {f.get("name") for f in envelope.get("fields", [])}:
            return Refused("not_a_change_event")
        return writer, _avro_semantics(envelope)

    def read(self, payload: bytes, prepared) -> tuple[bytes | None, str | None]:
        import fastavro

        stream = io.BytesIO(payload)
        try:
            event = fastavro.schemaless_reader(stream, prepared[0], None)
        except READ_ERRORS:
            return None, "malformed_avro"
        if stream.tell() != len(payload):
            return None, "malformed_avro"
        return _change(plain(event), prepared[1])
