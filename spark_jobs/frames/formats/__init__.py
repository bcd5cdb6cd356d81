"""A topic's values in the format they were written in, as the JSON both passes already type.

A table declares `-- format:`; JSON is read as it is. Any other format is a `Format` here that
transcodes each record into one canonical JSON object, and from there the one JSON reader of
each pass (arrow_values for the Arrow pass, parse.classify for Spark SQL) types it. So both
passes, and a verify or a rebuild reading history, apply the same typing rules and give the same
dead letters: a record a format cannot read is a dead letter with that format's reason, before
any JSON rule.

  format           module        values                                       its reasons
  avro             avro          Avro, the writer schema from -- value_schema  malformed_avro
  avro-confluent   avro          Confluent's wire format: magic byte 0, the    not_wire_format,
                                 4-byte schema id, Avro; the writer schema     unknown_schema_id,
                                 from the registry by id                       malformed_avro,
                                                                               schema_incompatible
  json-confluent   json_schema   the wire format around JSON, a JSON Schema    the same, with
                                 by id                                          malformed_json
  protobuf-        protobuf      the wire format, a message index path, one    the same, with
  confluent                      Protobuf message; its .proto by id             malformed_protobuf
  debezium-json    debezium      a database row's change event (JSON,          malformed_json,
                                 embedded schemas or not): `after` is the      not_a_change_event,
                                 row, op "d" deletes the key                   truncate_not_applied
  debezium-avro-   debezium      the same event in the wire format (Confluent's  the wire format's, with
  confluent                      AvroConverter), its Envelope schema by id       malformed_avro

A source table's Kafka key may be in the wire format too (`-- key_format: avro-confluent`, ...;
Debezium's with AvroConverter): it is read by the same formats into the JSON object a
`key_format: json` key is, and a key that cannot be read is a dead letter `key_<reason>`.

Every format reads by name: a record's field goes to the column of its name, a column the record
lacks is null (as an absent JSON field is), a field no column names is ignored. A new writer
schema mid-topic is resolved against the table's columns by the format's own rules (Avro's
schema resolution; JSON Schema's property types), once per schema id; a writer schema the
columns cannot hold makes each of its records a dead letter `schema_incompatible`, and the
table goes on.

Pure pyarrow and fastavro, handed its schema lookup (wire.Schemas): it runs in Spark's Python workers,
over Spark Connect too.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import REGISTRY_FORMATS, DefinitionError, TableDefinition
from spark_jobs.frames.formats.debezium import DELETE  # noqa: F401 - a record that deletes its key (not a dead letter)
from spark_jobs.frames.formats.wire import HEADER, Schemas, framed

JSON_COLUMN = "_json"              # parse.classify's name for the transcoded value
REASON_COLUMN = "_format_reason"   # and for a record the format could not read
KEY_REASON_COLUMN = "_key_reason"  # and for a record whose key (in the wire format) could not be read
SCHEMA_ID = "_schema_id"           # and for its writer schema id (Confluent's wire format)


class Format(Protocol):
    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        """(the record as canonical JSON bytes, None) or (None, the dead-letter reason)."""


def format_for(table: TableDefinition, schemas: Schemas | None = None) -> Format:
    """The one place that asks a table's format; `schemas` looks a registry's ids up (the steps
    hand in spark_jobs.steps.schemas.RegistrySchemas)."""
    if table.format in REGISTRY_FORMATS and schemas is None:
        raise DefinitionError(f"table {table.name!r}: format {table.format} reads schema ids, and no registry "
                              f"lookup was handed to the pass")
    if table.format == "avro":
        from spark_jobs.frames.formats.avro import FileAvro
        return FileAvro(table)
    if table.format == "avro-confluent":
        from spark_jobs.frames.formats.avro import RegistryAvro
        return RegistryAvro(table, schemas)
    if table.format == "json-confluent":
        from spark_jobs.frames.formats.json_schema import RegistryJson
        return RegistryJson(table, schemas)
    if table.format == "debezium-json":
        from spark_jobs.frames.formats.debezium import DebeziumJson
        return DebeziumJson(table)
    if table.format == "debezium-avro-confluent":
        from spark_jobs.frames.formats.debezium import DebeziumAvro
        return DebeziumAvro(table, schemas)
    if table.format == "protobuf-confluent":
        from spark_jobs.frames.formats.protobuf import RegistryProtobuf
        return RegistryProtobuf(table, schemas)
    raise DefinitionError(f"table {table.name!r}: no reader for format {table.format!r}")


def transcodes(table: TableDefinition) -> bool:
    return table.format != "json" or reads_keys(table)


def reads_keys(table: TableDefinition) -> bool:
    """Whether the table's Kafka keys are in a registry's wire format, read here into JSON objects."""
    return table.key_format in REGISTRY_FORMATS


def key_table(table: TableDefinition) -> TableDefinition:
    """The table as its keys read: the key's columns, in its key format."""
    columns = dict(table.schema)
    return replace(table, format=table.key_format, schema=[(k, columns[k]) for k in table.key_columns],
                   value_schema=None, key_format="plain")


def writer_schema_ids(values: pa.Array, table: TableDefinition) -> dict[int, int]:
    """Records per writer schema id, for a table in Confluent's wire format: what a batch records,
    so `statetable tables` and /metrics show a producer's new schema the batch it arrives."""
    if table.format not in REGISTRY_FORMATS:
        return {}
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    ids = pc.value_counts(pc.binary_slice(pc.filter(values, framed(values)), 1, HEADER))
    return {int.from_bytes(pair["values"].as_py(), "big"): pair["counts"].as_py() for pair in ids}


def transcode(values: pa.Array, table: TableDefinition, schemas: Schemas | None = None
              ) -> tuple[pa.Array, pa.Array]:
    """(the values as JSON bytes, each record's dead-letter reason): a null value stays null with
    no reason (a tombstone, or null_value: the passes judge it), a record the format cannot read
    is null with its reason."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    reader = format_for(table, schemas)
    # A format may read many records in one pass (Avro: avro_block); what it leaves, and every
    # record of the others, is read one by one.
    parts = reader.decode_many(values) if hasattr(reader, "decode_many") and len(values) else []
    if not parts:
        return _one_by_one(reader, values.to_pylist())
    done = np.zeros(len(values), dtype=bool)
    for indexes, _ in parts:
        done[indexes] = True
    rest = np.nonzero(~done)[0]
    rest_json, rest_reasons = _one_by_one(reader, values.take(rest).to_pylist())
    order = np.argsort(np.concatenate([indexes for indexes, _ in parts] + [rest]), kind="stable")
    json_values = pa.concat_arrays([decoded for _, decoded in parts] + [rest_json]).take(order)
    reasons = pa.concat_arrays([pa.nulls(len(decoded), pa.string()) for _, decoded in parts] + [rest_reasons])
    return json_values, reasons.take(order)


def _one_by_one(reader: Format, raws: list) -> tuple[pa.Array, pa.Array]:
    out, reasons = [], []
    for raw in raws:
        record, reason = (None, None) if raw is None else reader.decode(raw)
        out.append(record)
        reasons.append(reason)
    return pa.array(out, pa.binary()), pa.array(reasons, pa.string())


def transcode_batches(table: TableDefinition, schemas: Schemas | None = None):
    """For Spark's mapInArrow over a Kafka source frame: each batch with `_json` and
    `_format_reason` beside its columns (parse.classify reads them); with keys in the wire format,
    `key` replaced by its JSON object and `_key_reason` added."""
    keys = key_table(table) if reads_keys(table) else None

    def run(batches):
        for batch in batches:
            if table.format == "json":
                json_values, reasons = batch.column("value"), pa.nulls(batch.num_rows, pa.string())
            else:
                json_values, reasons = transcode(batch.column("value"), table, schemas)
            columns, names = list(batch.columns) + [json_values, reasons], \
                list(batch.schema.names) + [JSON_COLUMN, REASON_COLUMN]
            if keys is not None:
                key_json, key_reasons = transcode(batch.column("key"), keys, schemas)
                columns[names.index("key")] = key_json
                columns.append(pc.binary_join_element_wise(pa.scalar("key_"), key_reasons, ""))
                names.append(KEY_REASON_COLUMN)
            yield pa.RecordBatch.from_arrays(columns, names=names)
    return run
