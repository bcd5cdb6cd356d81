"""Parse raw Kafka records into typed events, and classify the bad ones.

Every record ends up in exactly one of two places: the parsed events, or the
dead letters with a reason. Nothing is dropped silently:

  too_large          value over the size limit (not parsed at all)
  invalid_unicode    value is not valid UTF-8, or escapes a lone UTF-16 surrogate (`"\\ud800"`):
                     text that no state key, Arrow column or JSON answer can hold
  malformed_json     value is not a JSON object
  malformed_avro     (format avro) the value is not one datum of the writer schema; every other
                     format's records are read as the JSON it is transcoded to (frames/formats.py)
  wrong_type         a declared field is present but does not have its type; NaN and
                     infinities are not numbers here (they break MAX, TOPK and JSON answers)
  missing_key        a key column is null or absent
  missing_event_time (windowed and TTL tables) the event-time field is null or absent
  future_event_time  (windowed and TTL tables) the event time is past the batch's clock plus the
                     table's event_time_skew: one such record would move the watermark
                     and make every later event late
  late               (windowed tables) every window of the event had closed
  key_mismatch       (source tables) the Kafka key is not the JSON primary key: puts and
                     deletes must address the same row
  tombstone_without_key / bad_tombstone_key
                     (source tables) a null value whose Kafka key is absent or is not of
                     the primary key's type: a delete of nothing in particular

A TIMESTAMP field accepts an ISO-8601 string (no offset means UTC) or whole epoch
milliseconds, as a JSON number or a string of ASCII digits, within years 1-9999. Spark's own JSON reader takes a
number as epoch *seconds*, which puts millisecond times in the year ~58,700.
The batch's clock is its plan's creation time, so a re-run classifies alike.
"""
from __future__ import annotations

from catalog.definitions import REGISTRY_FORMATS, TableDefinition
from spark_jobs.frames.formats import (DELETE, JSON_COLUMN, KEY_REASON_COLUMN, REASON_COLUMN, SCHEMA_ID, reads_keys,
                                       transcode_batches, transcodes)

MAX_VALUE_BYTES = 1 << 20
# A dead letter's value, at most: its key and headers must still fit the producer's 1 MiB
# max.request.size, or one rejected record just under MAX_VALUE_BYTES fails its batch on every
# re-run. Longer values keep their first KiB, and the `truncated` header says so.
DEAD_LETTER_VALUE_BYTES = MAX_VALUE_BYTES - (64 << 10)
CORRUPT = "_corrupt_record"
# TIMESTAMP's range, years 1 to 9999 (what Spark and Python both hold); epochs outside it are
# wrong_type on both passes rather than wrapped or overflowed.
MIN_EPOCH_MS, MAX_EPOCH_MS = -62135596800000, 253402300799999
# DATE's, the same years as days since 1970: Spark's reader takes "0000-01-01" and "+10000-01-01",
# which no Python date (the query API, the change topic) can hold.
MIN_DATE_DAYS, MAX_DATE_DAYS = -719162, 2932896
DATE_TEXT = r"^[ \t\n\r]*[0-9]{4}-[0-9]{2}-[0-9]{2}[ \t\n\r]*$"
# A JSON \u escape of a UTF-16 surrogate with no partner (an even run of backslashes before it
# is text, not an escape). Python's and Java's regex read it alike: both engines use it.
LONE_SURROGATE = (r"(?<!\\)(?:\\\\)*(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                  r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})")


def schema_ddl(table: TableDefinition) -> str:
    return ", ".join(f"`{name}` {dtype}" for name, dtype in table.schema)


def kafka_key_text(table: TableDefinition):
    """A source table's primary key as its records' Kafka key spells it: the key itself, or with
    `key_format: json` the primary key's field of a JSON object (a change topic's key); a key in a
    registry's wire format is that object once read (frames/formats)."""
    from pyspark.sql import functions as F

    text = F.col("_key").cast("string")
    if table.key_format != "plain":
        # Kafka Connect's JsonConverter with schemas.enable wraps the key: {"schema":..., "payload": {...}}
        return F.coalesce(F.get_json_object(text, f"$.{table.key_columns[0]}"),
                          F.get_json_object(text, f"$.payload.{table.key_columns[0]}"))
    return text


def _timestamp(text):
    """A TIMESTAMP field's JSON text as a timestamp (see the module docstring), null if it is neither
    form or falls outside years 1-9999 (MIN_EPOCH_MS..MAX_EPOCH_MS, both engines' rule)."""
    from pyspark.sql import functions as F

    millis = text.try_cast("bigint")
    stamp = F.when(text.rlike(r"^-?[0-9]{1,18}$"),
                   F.when(millis.between(MIN_EPOCH_MS, MAX_EPOCH_MS), F.timestamp_millis(millis))) \
        .otherwise(F.try_to_timestamp(text))
    micros = F.unix_micros(stamp)
    return F.when(micros.between(MIN_EPOCH_MS * 1000, MAX_EPOCH_MS * 1000 + 999), stamp)


def _date(text):
    """A DATE field's JSON text as a date: YYYY-MM-DD in ASCII digits, ASCII blanks around it
    allowed, years 1-9999; null otherwise. Spark's reader would also take "20240101" (as that
    many days), "2024", "2024-1-1" and year 0; the Arrow pass's `_date` holds the same rule."""
    from pyspark.sql import functions as F

    day = F.try_to_date(F.trim(text, F.lit(" \t\n\r")), "yyyy-MM-dd")
    return F.when(text.rlike(DATE_TEXT) & F.unix_date(day).between(MIN_DATE_DAYS, MAX_DATE_DAYS), day)


def classify(raw, table: TableDefinition, key_fields: list[str], max_value_bytes: int = MAX_VALUE_BYTES,
             now_ms: int | None = None, rows: bool = False, schemas=None):
    """`raw` is Spark's Kafka source frame; returns a frame with the parsed
    fields, the source coordinates and a `reason` column (null for good rows).
    `now_ms` is the batch's clock for future event times (None: no such check).
    `rows`: the records are a table's rows (Pass.rows): the Kafka key must name the row's key,
    and a null value deletes it (a tombstone); a stream's records (catalog.definitions.stream_side)
    are rows keyed by their position, whatever their Kafka key, and a null value is a dead letter.
    `schemas`: a registry's schemas by id, for a table in Confluent's wire format (frames/formats)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    if transcodes(table):           # Avro and the like, as the JSON the rules below read (frames/formats.py)
        columns = StructType(list(raw.schema.fields) + [StructField(JSON_COLUMN, BinaryType()),
                                                        StructField(REASON_COLUMN, StringType())]
                             + ([StructField(KEY_REASON_COLUMN, StringType())] if reads_keys(table) else []))
        raw = raw.mapInArrow(transcode_batches(table, schemas), columns)
        json_value, unread = F.col(JSON_COLUMN), F.col(REASON_COLUMN)
    else:
        json_value, unread = F.col("value"), F.lit(None).cast("string")
    key_unread = F.col(KEY_REASON_COLUMN) if reads_keys(table) else F.lit(None).cast("string")
    text = json_value.cast("string")
    timestamps = [name for name, dtype in table.schema if dtype in ("TIMESTAMP", "DATE")]
    schema = ", ".join(f"`{name}` {'STRING' if name in timestamps else dtype}" for name, dtype in table.schema) \
        + f", `{CORRUPT}` STRING"
    parsed = raw.select(
        F.col("partition").alias("_partition"), F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"), F.col("key").alias("_key"), F.col("value").alias("_value"),
        F.length("value").alias("_size"), json_value.alias("_json"), unread.alias("_unread"),
        key_unread.alias("_key_unread"),
        F.when(F.length("value") <= max_value_bytes,
               F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
        .alias("_parsed"),
    )
    # Only for records the typed parse rejected: every declared field as text, which tells a
    # syntax error (corrupt even here) from a wrong type, and a wrong type from an absent field.
    parsed = parsed.withColumn("_present", F.when(
        F.col(f"_parsed.`{CORRUPT}`").isNotNull(),
        F.from_json(F.col("_json").cast("string"),
                    ", ".join(f"`{n}` STRING" for n, _ in table.schema) + f", `{CORRUPT}` STRING",
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})))
    # A field that failed to type marks the record corrupt even when a duplicate of it before did
    # type (from_json keeps partial results): the record is then wrong_type, as alone it is.
    wrong_type = F.col(f"_parsed.`{CORRUPT}`").isNotNull() & F.col("_present").isNotNull() \
        & F.col(f"_present.`{CORRUPT}`").isNull()
    for name, _ in table.schema:
        wrong_type = wrong_type | (F.col(f"_present.`{name}`").isNotNull() & F.col(f"_parsed.`{name}`").isNull())
    if timestamps:
        # Judge each timestamp's and date's text, then put the value in its place.
        kinds = dict(table.schema)
        stamps = {name: (_timestamp if kinds[name] == "TIMESTAMP" else _date)(F.col(f"_parsed.`{name}`"))
                  for name in timestamps}
        bad = F.lit(False)
        for name, stamp in stamps.items():
            bad = bad | F.coalesce(F.col(f"_parsed.`{name}`").isNotNull() & stamp.isNull(), F.lit(False))
        parsed = parsed.withColumn("_bad_time", bad)
        for name, stamp in stamps.items():
            parsed = parsed.withColumn("_parsed", F.col("_parsed").withField(f"`{name}`", stamp))
        wrong_type = wrong_type | F.col("_bad_time")
    for name, dtype in table.schema:
        if dtype in ("DOUBLE", "FLOAT"):
            value = F.col(f"_parsed.`{name}`")
            wrong_type = wrong_type | F.coalesce(F.isnan(value) | (F.abs(value) == float("inf")), F.lit(False))
    missing_key = F.lit(False)
    for name in key_fields:
        missing_key = missing_key | F.col(f"_parsed.`{name}`").isNull()
    corrupt = F.col(f"_parsed.`{CORRUPT}`").isNotNull()
    reason = (
        F.when(F.col("_value").isNull() | (F.col("_size") > max_value_bytes), F.lit("too_large"))
        .when(F.col("_unread").isNotNull(), F.col("_unread"))
        .when(~F.is_valid_utf8(F.col("_json").cast("string")) | F.col("_json").cast("string").rlike(LONE_SURROGATE),
              F.lit("invalid_unicode"))
        .when(F.col("_parsed").isNull() | corrupt & (F.col("_present").isNull()
                                                     | F.col(f"_present.`{CORRUPT}`").isNotNull()),
              F.lit("malformed_json"))
        # from_json reads the first JSON value and ignores what follows: `{...}{...}` must be
        # malformed here too, as the Arrow pass judges it. Inside brackets, a second value is a
        # syntax error.
        .when(F.coalesce(F.size(F.from_json(F.concat(F.lit("["), F.col("_json").cast("string"), F.lit("]")),
                                            "ARRAY<STRING>")), F.lit(-1)) != 1,
              F.lit("malformed_json"))
        .when(wrong_type, F.lit("wrong_type"))
        .when(missing_key, F.lit("missing_key"))
    )
    if table.timed:
        event_time = F.col(f"_parsed.`{table.event_time}`")
        reason = reason.when(event_time.isNull(), F.lit("missing_event_time"))
        if now_ms is not None:
            reason = reason.when(F.unix_millis(event_time) > F.lit(now_ms + table.event_time_skew_ms),
                                 F.lit("future_event_time"))
    if rows and not table.stream:
        pk, pk_type = table.key_columns[0], dict(table.schema)[table.key_columns[0]]
        kafka_key = kafka_key_text(table)
        # A key in the wire format that could not be read (key_unknown_schema_id, ...): the record
        # names no row the table can trust.
        reason = reason.when(F.col("_key_unread").isNotNull(), F.col("_key_unread"))
        reason = reason.when(kafka_key.isNotNull() & ~F.coalesce(
            kafka_key.try_cast(pk_type) == F.col(f"_parsed.`{pk}`"), F.lit(False)), F.lit("key_mismatch"))
        tombstone = (F.when(F.col("_key_unread").isNotNull(), F.col("_key_unread"))
                     .when(kafka_key.isNull(), F.lit("tombstone_without_key"))
                     .when(kafka_key.try_cast(pk_type).isNull(), F.lit("bad_tombstone_key"))
                     .otherwise(F.lit("null_value")))
    else:
        tombstone = F.lit("null_value")
    # A null value is a tombstone (a delete in source tables), not an oversize record; so is a
    # change event that deletes its row (frames/formats/debezium.py).
    reason = F.when(F.col("_value").isNull() | F.coalesce(F.col("_unread") == DELETE, F.lit(False)), tombstone) \
        .otherwise(reason)
    # Keep what later steps need: the raw bytes only of rejected records.
    # A table in Confluent's wire format: each record's writer schema id (the batch records them).
    schema_id = [F.when((F.length("_value") >= 5) & (F.hex(F.substring("_value", 1, 1)) == "00"),
                        F.conv(F.hex(F.substring("_value", 2, 4)), 16, 10).cast("bigint")).alias(SCHEMA_ID)] \
        if table.format in REGISTRY_FORMATS else []
    return parsed.withColumn("reason", reason).select(
        "_partition", "_offset", "_timestamp", "_key", "_size", "_parsed", "reason",
        F.when(F.col("reason").isNotNull(), F.col("_value")).alias("_value"), *schema_id)


def bronze_ddl(table: TableDefinition) -> str:
    """Bronze's columns: the parsed fields, their source coordinates and the batch."""
    return (schema_ddl(table) + ", source_partition INT, source_offset BIGINT, source_timestamp TIMESTAMP, "
            "batch_id BIGINT")


def good_events(classified, table: TableDefinition):
    """The parsed fields of good rows, flattened, with their source coordinates."""
    from pyspark.sql import functions as F

    fields = [F.col(f"_parsed.`{name}`").alias(name) for name, _ in table.schema]
    return classified.where(F.col("reason").isNull()).select(
        *fields, F.col("_partition").alias("source_partition"), F.col("_offset").alias("source_offset"),
        F.col("_timestamp").alias("source_timestamp"),
    )


def dead_letter_records(frame, topic: str, value, reason, partition, offset, size):
    """Rows shaped for Spark's Kafka sink: the record's bytes, the reason and source in
    headers, keyed by source coordinates so a re-run overwrites rather than duplicates."""
    from pyspark.sql import functions as F

    def header(name, column):
        return F.struct(F.lit(name).alias("key"), column.cast("string").cast("binary").alias("value"))

    value = value.cast("binary")
    cut = F.coalesce(F.length(value) > F.lit(DEAD_LETTER_VALUE_BYTES), F.lit(False))
    return frame.select(
        F.concat_ws("/", F.lit(topic), partition.cast("string"), offset.cast("string")).cast("binary").alias("key"),
        F.when(cut, F.substring(value, 1, 1024)).otherwise(value).alias("value"),
        F.array(header("reason", reason), header("source_topic", F.lit(topic)), header("source_partition", partition),
                header("source_offset", offset), header("size", size),
                header("truncated", (cut | F.coalesce(size > F.length(value), F.lit(False))).cast("string")))
        .alias("headers"),
        reason.alias("reason"), partition.alias("source_partition"), offset.alias("source_offset"),
    )


def pass_dead_letters(out, topic: str):
    """An Arrow pass's refused records (rows with a `reason` and their `value`, `size` and source
    coordinates: arrow_pass.run's, arrow_rows.run's) as dead_letter_records."""
    from pyspark.sql import functions as F

    return dead_letter_records(out.where(F.col("reason").isNotNull()), topic, F.col("value"), F.col("reason"),
                               F.col("source_partition"), F.col("source_offset"), F.col("size"))


def dead_letters(classified, topic: str):
    """Rejected records, truncated to 1 KiB when oversize (the size header keeps the real size)."""
    from pyspark.sql import functions as F

    value = F.when(F.col("_size") > MAX_VALUE_BYTES, F.substring(F.col("_value"), 1, 1024)).otherwise(F.col("_value"))
    return dead_letter_records(classified.where(F.col("reason").isNotNull()), topic, value, F.col("reason"),
                               F.col("_partition"), F.col("_offset"), F.col("_size"))
