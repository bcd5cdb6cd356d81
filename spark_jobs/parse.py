"""Parse raw Kafka records into typed events, and classify the bad ones.

Every record ends up in exactly one of two places: the parsed events, or the
dead letters with a reason. Nothing is dropped silently:

  too_large      value over the size limit (not parsed at all)
  malformed_json value is not a JSON object
  wrong_type     a declared field is present but does not have its type
  missing_key    a key column is null or absent
  late           (windowed tables) every window of the event had closed
"""
from __future__ import annotations

from spark_jobs.definitions import TableDefinition

MAX_VALUE_BYTES = 1 << 20
CORRUPT = "_corrupt_record"


def schema_ddl(table: TableDefinition) -> str:
    return ", ".join(f"`{name}` {dtype}" for name, dtype in table.schema)


def classify(raw, table: TableDefinition, key_fields: list[str], max_value_bytes: int = MAX_VALUE_BYTES):
    """`raw` is Spark's Kafka source frame; returns a frame with the parsed
    fields, the source coordinates and a `reason` column (null for good rows)."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    schema = schema_ddl(table) + f", `{CORRUPT}` STRING"
    parsed = raw.select(
        F.col("partition").alias("_partition"), F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"), F.col("key").alias("_key"), F.col("value").alias("_value"),
        F.length("value").alias("_size"),
        F.when(F.length("value") <= max_value_bytes,
               F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
        .alias("_parsed"),
    )
    # Only for records the typed parse rejected: every declared field as text, which tells a
    # syntax error (corrupt even here) from a wrong type, and a wrong type from an absent field.
    parsed = parsed.withColumn("_present", F.when(
        F.col(f"_parsed.`{CORRUPT}`").isNotNull(),
        F.from_json(F.col("_value").cast("string"),
                    ", ".join(f"`{n}` STRING" for n, _ in table.schema) + f", `{CORRUPT}` STRING",
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})))
    wrong_type = F.lit(False)
    for name, _ in table.schema:
        wrong_type = wrong_type | (F.col(f"_present.`{name}`").isNotNull() & F.col(f"_parsed.`{name}`").isNull())
    missing_key = F.lit(False)
    for name in key_fields:
        missing_key = missing_key | F.col(f"_parsed.`{name}`").isNull()
    corrupt = F.col(f"_parsed.`{CORRUPT}`").isNotNull()
    reason = (
        F.when(F.col("_value").isNull() | (F.col("_size") > max_value_bytes), F.lit("too_large"))
        .when(F.col("_parsed").isNull() | corrupt & (F.col("_present").isNull()
                                                     | F.col(f"_present.`{CORRUPT}`").isNotNull()),
              F.lit("malformed_json"))
        .when(wrong_type, F.lit("wrong_type"))
        .when(missing_key, F.lit("missing_key"))
    )
    # A null value is a tombstone, not an oversize record.
    reason = F.when(F.col("_value").isNull(), F.lit("null_value")).otherwise(reason)
    # Keep what later steps need: the raw bytes only of rejected records.
    return parsed.withColumn("reason", reason).select(
        "_partition", "_offset", "_timestamp", "_key", "_size", "_parsed", "reason",
        F.when(F.col("reason").isNotNull(), F.col("_value")).alias("_value"))


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

    return frame.select(
        F.concat_ws("/", F.lit(topic), partition.cast("string"), offset.cast("string")).cast("binary").alias("key"),
        value.cast("binary").alias("value"),
        F.array(header("reason", reason), header("source_topic", F.lit(topic)), header("source_partition", partition),
                header("source_offset", offset), header("size", size)).alias("headers"),
        reason.alias("reason"), partition.alias("source_partition"), offset.alias("source_offset"),
    )


def dead_letters(classified, topic: str):
    """Rejected records, truncated to 1 KiB when oversize (the size header keeps the real size)."""
    from pyspark.sql import functions as F

    value = F.when(F.col("_size") > MAX_VALUE_BYTES, F.substring(F.col("_value"), 1, 1024)).otherwise(F.col("_value"))
    return dead_letter_records(classified.where(F.col("reason").isNotNull()), topic, value, F.col("reason"),
                               F.col("_partition"), F.col("_offset"), F.col("_size"))
