"""`-- format: debezium-json`: a database table's change events, as Debezium writes them through
Kafka Connect's JsonConverter, with embedded schemas (`{"schema": ..., "payload": {...}}`) or
without.

A source table over them holds the database table: an event with op c (insert), u (update) or r
(a snapshot's read) upserts its `after` row; op d deletes the row its Kafka key names, as the
tombstone Debezium sends after it does (the two are one delete: deleting twice is deleting). A
primary-key change arrives as a delete of the old key and an insert of the new one. Debezium is
at-least-once: after a connector restart it sends events again, and an upsert or a delete by key
applied twice leaves the table as applying it once did.

With embedded schemas, Debezium's time types are read by their semantic names: MicroTimestamp and
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

import json

from catalog.definitions import TableDefinition
from spark_jobs.frames.formats.avro import iso_day

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
