"""Table definitions: one file per table, a header of options plus SQL.

    -- topic: movie_ticket_sales
    -- schema: title STRING, ticket_total_value DOUBLE, sale_ts TIMESTAMP
    -- partitions: 4
    CREATE TABLE movie_tickets_sold AS
    SELECT title, COUNT(ticket_total_value) AS tickets_sold
    FROM movie_ticket_sales GROUP BY title;

The SQL is parsed with sqlglot; anything outside the supported subset fails
here, before any work is done, naming the file, line and column, the
construct, and what is supported.
"""
from __future__ import annotations

import contextvars
import difflib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark

from state.table import definition_fingerprint, meaning_changes  # noqa: F401 (re-exported)
from state.windows import WindowSpec
from catalog.definition_files import check_nesting, definition_files, read_definition
from catalog.errors import DefinitionError, UnsupportedSql
from catalog.errors import UserError

SUPPORTED = (
    "CREATE TABLE t (col TYPE PRIMARY KEY, ...) WITH (topic='...') for source tables; "
    "CREATE TABLE t AS SELECT key, AGG(...) AS name FROM stream [JOIN|LEFT JOIN table ON stream.col = table.key] "
    "[WHERE ...] GROUP BY key [, TUMBLE(ts, size[, grace]) | HOP(ts, size, advance[, grace]) | SESSION(ts, gap[, grace])] "
    "[HAVING ...] with AGG one of "
    "COUNT, SUM, MIN, MAX, AVG, COUNT(DISTINCT x), LATEST_BY_OFFSET(x), TOPK(n, score, col, ...); "
    "over a table's rows: ... FROM source_table GROUP BY col; "
    "a join of tables: SELECT a.col, b.col FROM a [LEFT] JOIN b ON a.col = b.key"
)
HEADER_KEYS = {
    "topic", "schema", "partitions", "schedule", "max_records_per_batch", "snapshot_every", "event_time",
    "key_field", "snapshot_keep", "max_batches_per_run", "event_time_skew", "mirror_every", "bronze",
    "output_topic", "key_format", "emit", "ttl", "maintain_every", "delta_retention", "bronze_retention",
    "format", "value_schema", "window_retention", "snapshot_phase", "join_topic", "join_schema", "join_grace",
    "join_max_window", "output_headers",
}
# A topic's values (spark_jobs/frames/formats/): JSON; Avro by a schema file; Avro, JSON Schema and
# Protobuf in Confluent's wire format, each value's writer schema fetched from a registry by its id.
# debezium-json: a source table over a database table's change events (Kafka Connect's JsonConverter,
# with or without embedded schemas): the row is `after`, an op "d" deletes the key.
# debezium-avro-confluent: the same events written by Confluent's AvroConverter (the wire format).
FORMATS = ("json", "avro", "avro-confluent", "json-confluent", "protobuf-confluent", "debezium-json",
           "debezium-avro-confluent")
REGISTRY_FORMATS = ("avro-confluent", "json-confluent", "protobuf-confluent", "debezium-avro-confluent")
DEBEZIUM_FORMATS = ("debezium-json", "debezium-avro-confluent")
# A source table's Kafka key: the primary key's value (plain), an object holding it (json), or that
# object in a registry's wire format (a Debezium or Kafka Connect producer with a registry converter).
KEY_FORMATS = ("plain", "json", "avro-confluent", "json-confluent", "protobuf-confluent")


def reads_registry(table) -> bool:
    """Whether a batch of this table looks schema ids up: its values', or its keys'."""
    return table.format in REGISTRY_FORMATS or table.key_format in REGISTRY_FORMATS


DEFAULT_EVENT_TIME_SKEW_MS = 3_600_000            # an event time this far past the clock is an error, not data
SPARK_TYPES = {"STRING", "BIGINT", "INT", "DOUBLE", "FLOAT", "BOOLEAN", "TIMESTAMP", "DATE", "LONG", "DECIMAL"}
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")     # Kafka's own rule for topic names
# Also a folder, lock, topic and DAG id: nothing else gets in, and every derived name fits
# (Airflow's dag_id takes 250 characters, Kafka's topic names 249, a folder name 255).
TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,99}\Z")
TOPK_MAX = 1000                                   # a TOPK state is one changelog record: keep it small
TTL_AGGREGATE = "_last_event_ms"                  # a TTL table's hidden MAX of its event time
SESSION_LAST = "window_end"                       # a session's last event time: a MAX the rows show
EVENT_MS = "_event_ms"                            # ... both over this per-event column (event time as epoch ms)
POSITION = "rowposition"                          # a stream's row: its record's "partition:offset" (see stream_side)


class _DefinitionSQL(Spark):
    """Spark SQL with SESSION as a plain name, so `SESSION(ts, gap)` in GROUP BY parses as a call
    (Spark's tokenizer reserves the word for SET SESSION statements, which definitions never use)."""

    class Tokenizer(Spark.Tokenizer):
        KEYWORDS = {word: kind for word, kind in Spark.Tokenizer.KEYWORDS.items() if word != "SESSION"}


@dataclass(frozen=True)
class AggregateColumn:
    name: str
    function: str            # count, sum, min, max, avg, count_distinct, latest_by_offset,
                             # latest_keeping_nulls (LATEST_BY_OFFSET(x, false)), topk
    args: tuple[str, ...]    # input columns (qualified "alias.col" where joins exist)
    n: int | None = None     # TOPK's N
    hidden: bool = False     # kept for a computed column (`SUM(a) / COUNT(*) AS r`), not shown


@dataclass(frozen=True)
class JoinSpec:
    table: str               # a source table definition
    alias: str
    kind: str                # "inner" | "left"
    stream_column: str
    table_column: str


JOIN_MAX_WINDOW_MS = 7 * 86_400_000


@dataclass(frozen=True)
class StreamJoin:
    """A windowed join of two streams (Flink's interval join, ksqlDB's stream-stream JOIN ...
    WITHIN): a row of `a` and a row of `b` with equal join keys pair when
    `a.<time> + lower_ms <= b.<time> <= a.<until> + upper_ms`. Each side's records wait in the
    rows stage until the watermark (the newest event time of both streams, less grace_ms) says
    no partner can come; then they are dropped, and an unmatched one of an outer side becomes
    a row with NULLs (spark_jobs/steps/stream_join.py)."""
    topic: str                        # b's topic (`-- join_topic:`); a's is the table's `topic`
    schema: tuple                     # b's fields (`-- join_schema:`)
    kind: str                         # "inner" | "left" | "full"
    left_alias: str
    right_alias: str
    left_key: str                     # the join columns: a.left_key = b.right_key
    right_key: str
    left_time: str                    # a's event time: the window's lower bound is on it
    left_until: str                   # a's column the upper bound is on (left_time, or e.g. an auction's expires)
    right_time: str                   # b's event time
    lower_ms: int
    upper_ms: int
    grace_ms: int                     # how far behind the newest event time a record may come (`-- join_grace:`)
    # The longest an a-record's own window may stay open (its window column past its time,
    # `-- join_max_window:`): one record with an end in year 9999 would otherwise wait in the
    # state for ever; it is a dead letter (window_too_long) instead.
    max_window_ms: int = JOIN_MAX_WINDOW_MS

    def meaning(self) -> list:
        return [self.topic, [list(c) for c in self.schema], self.kind, self.left_key, self.right_key,
                self.left_time, self.left_until, self.right_time, self.lower_ms, self.upper_ms, self.grace_ms,
                self.max_window_ms]


@dataclass
class TableDefinition:
    name: str
    path: Path
    kind: str                                  # "source" | "aggregate"
    topic: str
    schema: list[tuple[str, str]]
    key_columns: list[str]
    partitions: int = 4
    schedule: str | None = "*/5 * * * *"
    max_records_per_batch: int = 1_000_000
    max_batches_per_run: int = 10              # an Airflow run catches up at most this many batches
    snapshot_every: int = 10
    snapshot_keep: int = 3
    snapshot_phase: int | None = None          # the batch (mod snapshot_every) the table snapshots at; None:
                                               # spread by the table's name (registry.snapshot_phase)
    mirror_every: int = 10                     # the Delta mirror folds its changes after every Nth batch
    bronze: bool = True                        # keep every input record in Delta (verify and rebuild need it)
    maintain_every: int = 288                  # Delta OPTIMIZE and VACUUM after every Nth batch (a day of */5)
    delta_retention_ms: int = 7 * 86_400_000   # VACUUM deletes files the tables dropped longer ago than this
    bronze_retention_ms: int | None = None     # bronze rows of batches committed longer ago are deleted (None:
                                               # kept forever, which verify and rebuild need; see _bronze_retention)
    output_topic: str | None = None            # committed changes as JSON upserts (see spark_jobs/steps/merge_task.py)
    having: str | None = None                  # which rows are shown (catalog/expressions.py); the state keeps all
    derived: dict[str, str] = field(default_factory=dict)    # aggregate arguments that are expressions (_Scope.argument)
    computed: dict[str, str] = field(default_factory=dict)   # SELECT columns over the aggregates, shown not stored
    emit: str = "changes"                      # windowed tables' output_topic: every change, or "final" values
    output_headers: str = "batch"              # output_topic records carry a batch header, or "none"
    ttl_ms: int | None = None                  # keys idle this long in event time are deleted (see _ttl)
    key_types: dict[str, str] = field(default_factory=dict)  # computed GROUP BY keys (in `derived`) -> type
    key_format: str = "plain"                  # source tables: the Kafka key is the key's value, or "json"
                                               # (an object holding the primary key, as change topics write)
    join_columns: list[tuple[str, str]] = field(default_factory=list)   # a table-table join's SELECT:
                                               # (alias.column, output name), in order
    input_table: str | None = None             # an aggregate over this source table's rows (FROM a table):
                                               # a changed row retracts its old contribution (see
                                               # spark_jobs/steps/table_aggregate.py)
    format: str = "json"                       # how the topic's values are written (FORMATS)
    value_schema: str | None = None            # avro: the writer schema (JSON text) from `-- value_schema: <file>`;
                                               # avro-confluent: the reader schema, if one is declared
    event_time: str | None = None
    aggregates: list[AggregateColumn] = field(default_factory=list)
    joins: list[JoinSpec] = field(default_factory=list)
    where: str | None = None                   # a Spark SQL predicate over the stream
    window: WindowSpec | None = None
    stream_alias: str | None = None
    value_columns: list[str] = field(default_factory=list)   # source tables
    event_time_skew_ms: int = DEFAULT_EVENT_TIME_SKEW_MS      # how far ahead of the clock an event time may be
    joined_refs: list[tuple[str, str, str]] = field(default_factory=list, repr=False)
    stream_schema: list[tuple[str, str]] = field(default_factory=list)   # a join whose left side is a stream
                                               # (`-- schema:` fields): its rows are the stream's records
    stream: bool = False                       # stream_side's definition: every record is a row of its own
    stream_join: StreamJoin | None = None      # a windowed join of two streams (StreamJoin); its rows are
                                               # keyed by (join key, "a-position|b-position")

    def meaning(self) -> dict:
        """What the table's rows mean, normalised: two definitions with the same meaning serve the
        same rows from the same state. Operational options (schedule, batch sizes, snapshots) and
        formatting are left out, so changing them never invalidates state."""
        return {
            "kind": self.kind, "topic": self.topic, "schema": [list(c) for c in self.schema],
            "key": list(self.key_columns), "partitions": self.partitions,
            "aggregates": [[a.name, a.function, list(a.args), a.n] for a in self.aggregates],
            "where": self.where, "joins": [[j.table, j.alias, j.kind, j.stream_column, j.table_column]
                                           for j in self.joins],
            "window": None if self.window is None else [self.window.size_ms, self.window.advance,
                                                        self.window.grace_ms] + (["session"] if self.window.session else [])
            # a retention of its own (window_retention), kept out when it is the default: fingerprints stay
            + (["retention", self.window.retention_ms] if self.window.retention_ms != self.window.size_ms else []),
            "event_time": self.event_time, "value_columns": list(self.value_columns),
            **({"key_format": self.key_format} if self.key_format != "plain" else {}),
            **({"format": self.format} if self.format != "json" else {}),
            **({"input_table": self.input_table} if self.input_table else {}),
            **({"join_columns": [list(c) for c in self.join_columns]} if self.join_columns else {}),
            **({"derived": dict(self.derived)} if self.derived else {}),
            **({"ttl_ms": self.ttl_ms} if self.ttl_ms is not None else {}),
            **({"stream_schema": [list(c) for c in self.stream_schema]} if self.stream_schema else {}),
            **({"stream_join": self.stream_join.meaning()} if self.stream_join else {}),
        }

    @property
    def over_table(self) -> bool:
        """An aggregate over a table's rows (spark_jobs/steps/table_aggregate.py)."""
        return self.kind == "aggregate" and self.input_table is not None

    @property
    def table_join(self) -> bool:
        """A join of two tables, keyed by the left one's key (spark_jobs/steps/table_join.py); the
        left one may be a stream, each record a row keyed by its position (stream_side)."""
        return self.kind == "source" and self.stream_join is None and (self.input_table is not None
                                                                      or bool(self.stream_schema))

    @property
    def timed(self) -> bool:
        """Whether the table runs on event time (a window or a TTL): its events need one, and its
        batches keep a watermark."""
        return self.window is not None or self.ttl_ms is not None

    @property
    def event_ms(self) -> bool:
        """Whether the passes add EVENT_MS to each event: the input of a TTL's or a session's MAX."""
        return self.ttl_index is not None or self.session_last_index is not None

    @property
    def stream_key_fields(self) -> list[str]:
        """The key columns an event carries (a null one dead-letters it as missing_key); a
        computed key is not one: a NULL from it is a group, as SQL groups NULLs."""
        return [k.split(".")[-1] for k in self.key_columns if k not in self.key_types]

    @property
    def routing_width(self) -> int | None:
        """How many leading key parts pick the state partition: a session table's key without the
        session start, so all sessions of a key meet in one merge task (None: the whole key)."""
        if self.stream_join is not None:        # a pair's row lives where its join key's records wait
            return 1
        return len(self.key_columns) if self.window is not None and self.window.session else None

    @property
    def session_last_index(self) -> int | None:
        """Which aggregate holds a session's last event time, or None."""
        return self._index_of(SESSION_LAST) if self.window is not None and self.window.session else None

    @property
    def ttl_index(self) -> int | None:
        """Which aggregate holds a TTL table's newest event time (see _ttl), or None."""
        return self._index_of(TTL_AGGREGATE) if self.ttl_ms is not None else None

    def _index_of(self, aggregate: str) -> int:
        return next(i for i, a in enumerate(self.aggregates) if a.name == aggregate)

    @property
    def fingerprint(self) -> str:
        return definition_fingerprint(self.meaning())


def _position(node: exp.Expression | None) -> str:
    """line:col of a node, from the first of its parts that the tokenizer placed."""
    if node is None:
        return "?:?"
    for child in node.walk():
        meta = getattr(child, "meta", None) or {}
        if "line" in meta:
            return f"{meta['line']}:{meta.get('col', '?')}"
    return "?:?"


_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("definition_source", default=None)


def _user_text(node: exp.Expression) -> str | None:
    """The text the user wrote for `node`, from the definition being parsed: sqlglot rewrites some
    calls (COLLECT_LIST(v) becomes ARRAY_AGG(v) FILTER(...)), and a message must quote the user."""
    source = _SOURCE.get()
    spans = [(m["start"], m["end"]) for child in node.walk() if "start" in (m := getattr(child, "meta", None) or {})]
    if not source or not spans:
        return None
    low, high = min(s for s, _ in spans), max(e for _, e in spans) + 1
    if re.match(r"\s*\(", source[high:]) and not source.count("(", low, high):
        high = source.index("(", high)              # a call whose arguments carry no position (RAND())
    depth = source.count("(", low, high) - source.count(")", low, high)
    while (depth > 0 or source[high - 1] == "(") and high < len(source):   # close the call
        depth += (source[high] == "(") - (source[high] == ")")
        high += 1
    text = " ".join(source[low:high].split())
    return text if re.fullmatch(r"\w+\s*\(.*\)", text) and text.count("(") == text.count(")") else None


def _quoted(node: exp.Expression | None, message: str) -> str:
    """`message` with sqlglot's rendering of `node` replaced by the user's own text."""
    if node is None:
        return message
    user = _user_text(node) if isinstance(node, exp.Func) else None   # sqlglot renames calls, not operators
    renderings = {_sql_or_none(node)}
    try:
        renderings.add(node.sql(dialect="spark"))
    except (AttributeError, TypeError, ValueError):
        pass
    for rendering in renderings - {None}:
        if user and rendering != user and rendering in message:
            message = message.replace(rendering, user)
    return message


def _fail(path: Path, node: exp.Expression | None, construct: str, hint: str = SUPPORTED) -> DefinitionError:
    return DefinitionError(f"{path}:{_position(node)}: {_quoted(node, construct)} is not supported. Supported: {hint}")


def _invalid(path: Path, node: exp.Expression | None, problem: str) -> DefinitionError:
    return DefinitionError(f"{path}:{_position(node)}: {_quoted(node, problem)}")


class _Header(dict):
    """Options by name, remembering the line each came from for error messages."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}

    def where(self, path: Path, key: str) -> str:
        return f"{path}:{self.lines.get(key, '?')}:1"


def _parse_header(path: Path, text: str) -> _Header:
    header = _Header()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break
        # `-- word: value` is an option; prose comments have spaces before their colon.
        match = re.match(r"--\s*([A-Za-z_][\w-]*)\s*:(.*)$", stripped)
        if not match:
            continue
        key, value = match.group(1), match.group(2).strip()
        if key not in HEADER_KEYS:
            close = difflib.get_close_matches(key.lower().replace("-", "_"), sorted(HEADER_KEYS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise DefinitionError(f"{path}:{number}:1: unknown option {key!r}; {hint}options are lower case, "
                                  f"one of {sorted(HEADER_KEYS)}")
        if not value:
            raise DefinitionError(f"{path}:{number}:1: option {key!r} has no value")
        if key in header:
            raise DefinitionError(f"{path}:{number}:1: option {key!r} is given twice")
        header[key] = value
        header.lines[key] = number
    return header


def _int_option(path: Path, header: _Header, key: str, default: int, low: int = 1, high: int | None = None) -> int:
    raw = header.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise DefinitionError(f"{header.where(path, key)}: option {key}={raw!r} must be an integer, "
                              f"e.g. {default}") from None
    if value < low or high is not None and value > high:
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise DefinitionError(f"{header.where(path, key)}: option {key}={value} must be {bound}")
    return value


def _snapshot_phase(path: Path, header: _Header) -> int | None:
    """`snapshot_phase: N` pins the table's snapshots to batches N, N + snapshot_every, ...;
    unset, each table gets a phase of its own (registry.snapshot_phase), so tables started
    together do not all snapshot in the same wave."""
    if header.get("snapshot_phase") is None:
        return None
    every = _int_option(path, header, "snapshot_every", 10)
    return _int_option(path, header, "snapshot_phase", 0, low=0, high=every - 1)


def _switch_option(path: Path, header: _Header, key: str, default: bool) -> bool:
    raw = header.get(key)
    if raw is None:
        return default
    if raw.lower() not in ("on", "off"):
        raise DefinitionError(f"{header.where(path, key)}: option {key}={raw!r} must be on or off")
    return raw.lower() == "on"


DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """'90s', '15m', '1h', '30d' as milliseconds; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)\s*", text)
    if not match:
        raise UserError(f"{text!r} is not a duration like 30s, 15m, 1h or 7d")
    return int(match.group(1)) * DURATION_UNITS[match.group(2)]


def _duration_option(path: Path, header: _Header, key: str, default: int | None, table: str | None = None,
                     zero: bool = False) -> int | None:
    """A duration option; with `zero`, 0 (written 0s) is a value of its own (a grace of none)."""
    raw = header.get(key)
    if raw is None:
        return default
    where = header.where(path, key) + (f": table {table!r}" if table else "")
    try:
        value = duration_ms(raw)
    except ValueError as exc:
        raise DefinitionError(f"{where}: option {key}: {exc}") from None
    if value < 0 or value == 0 and not zero:
        raise DefinitionError(f"{where}: option {key}={raw!r} must be positive, e.g. 1h")
    return value


SCHEDULE_PRESETS = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly"}


def _choice_option(path: Path, header: _Header, table: "TableDefinition", option: str, choices: dict[str, str],
                   default: str) -> str:
    """An option that takes one of `choices` (value -> what it means)."""
    raw = header.get(option)
    if raw is None:
        return default
    if raw not in choices:
        meant = " or ".join(f"{value} ({meaning})" for value, meaning in choices.items())
        raise DefinitionError(f"{header.where(path, option)}: table {table.name!r}: option {option}={raw!r} must be "
                              f"{meant}")
    return raw


def _emit(path: Path, header: _Header, table: "TableDefinition") -> str:
    raw = _choice_option(path, header, table, "emit", {"changes": "every committed change",
                                                       "final": "each window once, when it closes"}, "changes")
    if raw == "final" and (table.window is None or table.output_topic is None):
        raise DefinitionError(f"{header.where(path, 'emit')}: table {table.name!r}: emit: final needs a windowed table "
                              f"(GROUP BY ..., TUMBLE, HOP or SESSION) with an output_topic, whose closed windows it emits")
    return raw


def _output_headers(path: Path, header: _Header, table: "TableDefinition") -> str:
    """`-- output_headers: none`: the change topic's records carry no `batch` header, as
    upsert-kafka's and ksqlDB's carry none; they are then produced a batch at a time, which
    librdkafka cannot do with headers (the change topic's publish costs about half)."""
    raw = _choice_option(path, header, table, "output_headers", {"batch": "each record names its batch",
                                                                 "none": "no headers"}, "batch")
    if "output_headers" in header and table.output_topic is None:
        raise DefinitionError(f"{header.where(path, 'output_headers')}: table {table.name!r} has no output_topic, "
                              f"whose records the option sets; add '-- output_topic: <topic>' or remove it")
    return raw


def _ttl(path: Path, header: _Header, table: "TableDefinition") -> None:
    """`-- ttl: 30d`: a key whose newest event is that much older than the table's watermark (the
    newest event time it has read) is deleted, in the batch that moves the watermark there.

    Event time, not the clock: a recomputation from bronze, a restore and a rebuild must delete
    exactly what the batches deleted, and a clock-based expiry would depend on when each batch
    happened to run. The newest event time per key is kept as a hidden MAX aggregate, so the
    changelog, snapshots and restores carry it like any other column."""
    ttl = _duration_option(path, header, "ttl", None, table.name)
    if ttl is None:
        return
    where = header.where(path, "ttl")
    if table.kind != "aggregate":
        raise DefinitionError(f"{where}: table {table.name!r}: ttl is for aggregate tables; a source table's rows "
                              f"go away with a tombstone (a null value for the key) on its topic")
    if table.window is not None:
        raise DefinitionError(f"{where}: table {table.name!r}: a windowed table drops old windows by itself (after "
                              f"size + grace + retention); remove the ttl option, or the window")
    fields = dict(table.schema)
    if table.event_time is None or fields.get(table.event_time) != "TIMESTAMP":
        found = f"event_time {table.event_time!r} is not a TIMESTAMP field of the schema" if table.event_time \
            else "it has no event_time"
        raise DefinitionError(f"{where}: table {table.name!r}: ttl counts in event time, and {found}; add "
                              f"'-- event_time: <field>' naming a TIMESTAMP field of '-- schema:'")
    if any(a.name == TTL_AGGREGATE for a in table.aggregates) or EVENT_MS in fields:
        raise DefinitionError(f"{where}: table {table.name!r}: the names {TTL_AGGREGATE!r} and {EVENT_MS!r} are "
                              f"the ttl's own; rename that column")
    table.ttl_ms = ttl
    table.aggregates.append(AggregateColumn(TTL_AGGREGATE, "max", (EVENT_MS,), hidden=True))


def _window_retention(path: Path, header: _Header, table: "TableDefinition") -> None:
    """`-- window_retention: 1d` (default: the window's size, a session's gap): how long a window
    stays in the table after it closes (its end plus grace), as ksqlDB's RETENTION and Kafka
    Streams' window store retention keep it. Counted in event time, so verify and rebuild purge
    exactly what the batches purged."""
    retention = _duration_option(path, header, "window_retention", None, table.name)
    if retention is None:
        return
    if table.window is None:
        raise DefinitionError(f"{header.where(path, 'window_retention')}: table {table.name!r} has no window; "
                              f"remove window_retention (a key without a window stays until a ttl or a tombstone)")
    table.window = replace(table.window, retention_ms=retention)


def _bronze_retention(path: Path, header: _Header, table: "TableDefinition") -> None:
    """`-- bronze_retention: 90d` (default `forever`): bronze keeps the events of batches committed
    within that long, and every batch after the last verified checkpoint. A verify then goes on
    from checkpoint to checkpoint (spark_jobs.delta.verify_chain), but a full verify and a rebuild,
    which recompute from all of bronze, refuse (spark_jobs.errors.HistoryTrimmed): the option
    trades the weekly proof from the beginning for disk."""
    raw = header.get("bronze_retention")
    if raw is None or raw.strip().lower() == "forever":
        return
    where = header.where(path, "bronze_retention")
    if not table.bronze:
        raise DefinitionError(f"{where}: table {table.name!r} keeps no bronze (bronze: off); remove bronze_retention")
    if table.kind != "aggregate" or table.window is not None or table.ttl_ms is not None or table.input_table:
        raise DefinitionError(f"{where}: table {table.name!r}: bronze_retention is for aggregate tables without "
                              f"windows or a ttl, whose verify goes on from checkpoint to checkpoint; this one "
                              f"recomputes from all of bronze every time, so remove bronze_retention")
    retention = _duration_option(path, header, "bronze_retention", None, table.name)
    if retention < table.delta_retention_ms:
        raise DefinitionError(f"{where}: table {table.name!r}: bronze_retention={raw} is shorter than delta_retention "
                              f"({table.delta_retention_ms // 3_600_000} h), the time dropped files stay for readers; "
                              f"raise bronze_retention or lower delta_retention")
    table.bronze_retention_ms = retention


def _topic_option(path: Path, header: _Header, key: str) -> str | None:
    raw = header.get(key)
    if raw is None:
        return None
    if not _is_topic_name(raw):
        raise DefinitionError(f"{header.where(path, key)}: option {key}={raw!r} is not a Kafka topic name; use "
                              f"1 to 249 of the characters a-z A-Z 0-9 . _ -")
    return raw


def _is_topic_name(raw: str) -> bool:
    return bool(TOPIC_NAME.match(raw)) and raw not in (".", "..")


def _check_names(path: Path, header: "_Header", table: "TableDefinition") -> None:
    """The topic and the column names reach Kafka and the table's own generated SQL (backquoted
    there): a name that is no topic, or that holds a backquote or a control character, would
    break the table at its first batch instead of here."""
    if table.topic is not None and not _is_topic_name(table.topic):
        raise DefinitionError(f"{header.where(path, 'topic')}: table {table.name!r}: topic {table.topic[:80]!r} is not "
                              f"a Kafka topic name; use 1 to 249 of the characters a-z A-Z 0-9 . _ -")
    for column, _ in table.schema:
        if "`" in column or not column.isprintable() or not column.strip() or len(column) > 128:
            raise DefinitionError(f"{header.where(path, 'schema')}: table {table.name!r}: column name {column[:80]!r} "
                                  f"must be 1-128 printable characters without a backquote; rename the field")


def _schedule(path: Path, header: _Header) -> str:
    raw = header.get("schedule")
    if raw is None:
        return "*/5 * * * *"
    from croniter import croniter

    if raw in SCHEDULE_PRESETS or (len(raw.split()) == 5 and croniter.is_valid(raw)):
        return raw
    raise DefinitionError(f"{header.where(path, 'schedule')}: option schedule={raw!r} is not a 5-field cron expression (e.g. '*/5 * * * *') "
                          f"or one of {sorted(SCHEDULE_PRESETS)}")


def _parse_schema(path: Path, raw: str) -> list[tuple[str, str]]:
    columns = []
    for part in re.split(r",(?![^(]*\))", raw):      # DECIMAL(10,2) keeps its comma
        bits = part.split()
        if len(bits) != 2 or bits[1].upper().split("(")[0] not in SPARK_TYPES \
                or not re.fullmatch(r"[A-Za-z_]\w*", bits[0]):
            raise DefinitionError(
                f"{path}: schema entry {part.strip()!r} must be 'name TYPE' with TYPE one of {sorted(SPARK_TYPES)}")
        if any(bits[0] == name for name, _ in columns):
            raise DefinitionError(f"{path}: schema declares field {bits[0]!r} twice")
        columns.append((bits[0], bits[1].upper()))
    return columns


def _check_name(path: Path, name: str, node: exp.Expression | None = None) -> str:
    if not TABLE_NAME.match(name or ""):
        raise _invalid(path, node, f"table name {name[:120]!r} must match [a-z][a-z0-9_]* and have at most 100 "
                                   f"characters (it names folders, locks, topics and DAGs); rename the table")
    return name


def _interval_ms(path: Path, node: exp.Expression, what: str = "window length", zero: bool = False) -> int:
    """An INTERVAL in milliseconds; a grace (`zero`) may be 0, as in Kafka Streams' ofSizeAndGrace."""
    if isinstance(node, exp.Interval):
        try:
            amount = float(node.this.name)
        except ValueError:
            amount = None
        unit = (node.unit.name if node.unit else "SECOND").upper().rstrip("S")
        factor = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}.get(unit)
        if factor and amount is not None:
            if amount < 0 or amount == 0 and not zero:
                raise _invalid(path, node, f"{what} {node.sql()} must be {'zero or ' if zero else ''}positive")
            return int(amount * factor)
    raise _fail(path, node, f"{what} {node.sql()}", "INTERVAL 'n' SECOND|MINUTE|HOUR|DAY")


class _Scope:
    """The names a SELECT can see: the stream's fields under its alias (or bare), and each
    joined table's columns under its alias. Joined tables' columns are only known once every
    file is read, so their references are kept and checked by `load_all`."""

    def __init__(self, path: Path, stream_alias: str, stream_schema: list[tuple[str, str]]) -> None:
        self.path = path
        self.stream_alias = stream_alias
        self.stream_fields = dict(stream_schema)
        self.aliases: dict[str, str] = {stream_alias: ""}
        self.joined_refs: list[tuple[str, str, str]] = []    # (qualified name, joined table, "line:col")
        self.derived: dict[str, str] = {}                     # "_x0" -> an aggregate argument's expression
        self.hidden: dict[str, str] = {}                      # an aggregate's SQL -> its hidden column "_h0"
        self.key_sql: dict[str, str] = {}                     # a computed key's SQL -> its column

    def argument(self, node: exp.Expression) -> str:
        """An aggregate's input: a column, or an expression computed per event before the
        aggregate folds it (named `_x<n>`; the Spark-SQL pass computes it)."""
        if isinstance(node, exp.Column):
            return self.column(node)
        self.check_expression(node)
        _check_functions(self.path, node, "in an aggregate's argument")
        name = f"_x{len(self.derived)}"
        self.derived[name] = _guarded(node).sql(dialect="spark")
        return name

    def column(self, node: exp.Expression, what: str = "an aggregate input") -> str:
        if not isinstance(node, exp.Column):
            raise _fail(self.path, node, f"expression {node.sql()} as {what}", "a plain column")
        table = node.table
        if table and table not in self.aliases:
            raise _fail(self.path, node, f"unknown table alias {table!r}", f"one of {sorted(self.aliases)}")
        if not table or table == self.stream_alias:
            if node.name not in self.stream_fields:
                raise _invalid(self.path, node, f"unknown column {node.sql()}: the stream's fields are "
                                                f"{sorted(self.stream_fields)}; declare it in '-- schema:'")
        else:
            self.joined_refs.append((f"{table}.{node.name}", self.aliases[table], _position(node)))
        return f"{table}.{node.name}" if table else node.name

    def check_expression(self, node: exp.Expression) -> None:
        """Every column an expression reads exists."""
        for column in node.find_all(exp.Column):
            self.column(column)


def _aggregate(scope: _Scope, alias: str, func: exp.Expression) -> AggregateColumn:
    path = scope.path
    if isinstance(func, exp.Count):
        inner = func.this
        if isinstance(inner, exp.Distinct):
            if len(inner.expressions) != 1:
                raise _fail(path, func, f"aggregate {func.sql()} over several columns", "COUNT(DISTINCT col)")
            return AggregateColumn(alias, "count_distinct", (scope.argument(inner.expressions[0]),))
        if isinstance(inner, exp.Star):
            return AggregateColumn(alias, "count", ())
        return AggregateColumn(alias, "count", (scope.argument(inner),))
    simple = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
    for cls, name in simple.items():
        if isinstance(func, cls):
            return AggregateColumn(alias, name, (scope.argument(func.this),))
    if isinstance(func, exp.Anonymous):
        name = func.name.upper()
        args = func.expressions
        if name == "LATEST_BY_OFFSET" and len(args) in (1, 2):
            # ksqlDB's second argument: ignoreNulls, true by default; false keeps a NULL that
            # arrives last as the latest value.
            ignore_nulls = True
            if len(args) == 2:
                if not isinstance(args[1], exp.Boolean):
                    raise _invalid(path, args[1], f"LATEST_BY_OFFSET's second argument {args[1].sql()} must be TRUE "
                                                  f"(skip NULLs, the default) or FALSE (keep them)")
                ignore_nulls = bool(args[1].this)
            return AggregateColumn(alias, "latest_by_offset" if ignore_nulls else "latest_keeping_nulls",
                                   (scope.argument(args[0]),))
        if name == "TOPK" and len(args) >= 2:
            n = args[0]
            if not (isinstance(n, exp.Literal) and not n.is_string and re.fullmatch(r"\d+", n.name)
                    and 1 <= int(n.name) <= TOPK_MAX):
                raise _invalid(path, n, f"TOPK's first argument {n.sql()} must be a whole number from 1 to "
                                        f"{TOPK_MAX}, the entries kept per key")
            return AggregateColumn(alias, "topk", tuple(scope.argument(a) for a in args[1:]), n=int(n.name))
    raise _fail(path, func, f"aggregate {func.sql()}")


def _window(scope: _Scope, node: exp.Anonymous) -> tuple[str, WindowSpec]:
    path = scope.path
    name, args = node.name.upper(), node.expressions
    if name == "TUMBLE" and len(args) in (2, 3):
        size = _interval_ms(path, args[1])
        grace = _interval_ms(path, args[2], "grace", zero=True) if len(args) == 3 else 0
        spec = dict(size_ms=size, grace_ms=grace, retention_ms=size)
    elif name == "HOP" and len(args) in (3, 4):
        size, advance = _interval_ms(path, args[1]), _interval_ms(path, args[2])
        grace = _interval_ms(path, args[3], "grace", zero=True) if len(args) == 4 else 0
        spec = dict(size_ms=size, advance_ms=advance, grace_ms=grace, retention_ms=size)
    elif name == "SESSION" and len(args) in (2, 3):
        gap = _interval_ms(path, args[1])
        grace = _interval_ms(path, args[2], "grace", zero=True) if len(args) == 3 else 0
        spec = dict(size_ms=gap, grace_ms=grace, retention_ms=gap, session=True)
    else:
        raise _fail(path, node, f"GROUP BY {node.sql()}")
    ts = scope.column(args[0], "a window's event time")
    if scope.stream_fields.get(ts.split(".")[-1]) != "TIMESTAMP" or "." in ts and not ts.startswith(
            scope.stream_alias + "."):
        raise _invalid(path, args[0], f"window event time {args[0].sql()} must be a TIMESTAMP field of the stream")
    try:
        return ts.split(".")[-1], WindowSpec(**spec)
    except ValueError as exc:
        raise _fail(path, node, f"window {node.sql()} ({exc})") from None


def _unparsed(path: Path, text: str) -> DefinitionError:
    """sqlglot keeps a CREATE it cannot parse as an opaque command, without saying where: its
    SELECT is parsed alone to find the place (a reserved word used as a name, most often)."""
    match = re.search(r"\bAS\s+(SELECT\b)", text, flags=re.IGNORECASE)
    where, problem = f"{path}", "the CREATE TABLE does not parse"
    if match:
        try:
            sqlglot.parse_one(text[match.start(1):], dialect=_DefinitionSQL)
        except sqlglot.errors.ParseError as exc:
            err = exc.errors[0] if exc.errors else {}
            line = text.count("\n", 0, match.start(1)) + err.get("line", 1)
            col = err.get("col", 0) + (match.start(1) - text.rfind("\n", 0, match.start(1)) - 1
                                       if err.get("line", 1) == 1 else 0)
            where, problem = f"{path}:{line}:{col}", f"SQL does not parse ({err.get('description', exc)})"
    return DefinitionError(f"{where}: {problem}; a word SQL reserves (order, date, set, ...) used as a "
                           f"column or table name must be quoted in backticks, as `order`. Supported: {SUPPORTED}")


def parse(path: Path | str, text: str | None = None) -> TableDefinition:
    path = Path(path)
    text = read_definition(path) if text is None else text
    token = _SOURCE.set(text)
    try:
        return _parse(path, text)
    finally:
        _SOURCE.reset(token)


def _parse(path: Path, text: str) -> TableDefinition:
    header = _parse_header(path, text)
    check_nesting(path, text)
    try:
        statements = [s for s in sqlglot.parse(text, dialect=_DefinitionSQL) if s is not None]
    except sqlglot.errors.ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        raise DefinitionError(f"{path}:{err.get('line', '?')}:{err.get('col', '?')}: SQL does not parse "
                              f"({err.get('description', exc)}). Supported: {SUPPORTED}") from None
    if len(statements) == 1 and isinstance(statements[0], exp.Command):
        raise _unparsed(path, text)
    if len(statements) != 1 or not isinstance(statements[0], exp.Create):
        raise DefinitionError(f"{path}: expected exactly one CREATE TABLE statement. Supported: {SUPPORTED}")
    create = statements[0]
    common = dict(
        partitions=_int_option(path, header, "partitions", 4, high=1024),
        max_records_per_batch=_int_option(path, header, "max_records_per_batch", 1_000_000),
        max_batches_per_run=_int_option(path, header, "max_batches_per_run", 10),
        snapshot_every=_int_option(path, header, "snapshot_every", 10),
        snapshot_keep=_int_option(path, header, "snapshot_keep", 3),
        snapshot_phase=_snapshot_phase(path, header),
        mirror_every=_int_option(path, header, "mirror_every", 10),
        maintain_every=_int_option(path, header, "maintain_every", 288),
        delta_retention_ms=_duration_option(path, header, "delta_retention", 7 * 86_400_000),
        bronze=_switch_option(path, header, "bronze", True),
        output_topic=_topic_option(path, header, "output_topic"),
        schedule=_schedule(path, header),
        event_time=header.get("event_time"),
        event_time_skew_ms=_duration_option(path, header, "event_time_skew", DEFAULT_EVENT_TIME_SKEW_MS),
    )
    table = _source_table(path, create, header, common) if isinstance(create.this, exp.Schema) \
        else _aggregate_table(path, create, header, common)
    table.emit = _emit(path, header, table)
    table.output_headers = _output_headers(path, header, table)
    _value_format(path, header, table)
    _ttl(path, header, table)
    _window_retention(path, header, table)
    if table.delta_retention_ms < 3_600_000:
        raise DefinitionError(f"{header.where(path, 'delta_retention')}: table {table.name!r}: delta_retention must be "
                              f"at least 1h: a batch's files are written before its Delta commit, and a reader may "
                              f"still read files a commit dropped")
    _bronze_retention(path, header, table)
    _check_names(path, header, table)
    if table.output_topic is not None and table.output_topic == table.topic:
        raise DefinitionError(f"{header.where(path, 'output_topic')}: table {table.name!r} would write its changes "
                              f"to its own input topic {table.topic!r}; name another output_topic")
    return table


def _value_format(path: Path, header: _Header, table: TableDefinition) -> None:
    """`-- format:` and, for Avro without a registry, `-- value_schema:` (an .avsc file beside the
    definition): the schema is read here, once, so a batch, a verify and a rebuild decode alike."""
    table.format = header.get("format", "json").lower()
    if table.format not in FORMATS:
        raise DefinitionError(f"{header.where(path, 'format')}: table {table.name!r}: format={table.format!r} is not "
                              f"one of {', '.join(FORMATS)}")
    if table.format == "json":
        if "value_schema" in header:
            raise DefinitionError(f"{header.where(path, 'value_schema')}: table {table.name!r}: value_schema is for "
                                  f"'-- format: avro' or 'avro-confluent'; JSON values are typed by '-- schema:'")
        return
    if table.kind != "source" and (table.input_table or table.joins):
        raise DefinitionError(f"{header.where(path, 'format')}: table {table.name!r}: format is declared on the "
                              f"table that reads the topic, not on one over other tables")
    if table.format in DEBEZIUM_FORMATS:
        if table.kind != "source":
            raise DefinitionError(f"{header.where(path, 'format')}: table {table.name!r}: {table.format} is a database "
                                  f"table's change events: declare it on a source table (CREATE TABLE t (id BIGINT "
                                  f"PRIMARY KEY, ...)) and aggregate over that table")
        if "value_schema" in header:
            raise DefinitionError(f"{header.where(path, 'value_schema')}: table {table.name!r}: value_schema is for "
                                  f"Avro tables; a {table.format} table's columns come from its CREATE TABLE")
        # Debezium keys the topic by the row's primary key, as an object in its converter's format.
        table.key_format = header.get("key_format", "json" if table.format == "debezium-json" else "avro-confluent")
        return
    where = header.where(path, "value_schema")
    if table.format in REGISTRY_FORMATS and "value_schema" not in header:
        return                  # each record's writer schema comes from the registry by its id
    if table.format in ("json-confluent", "protobuf-confluent"):
        raise DefinitionError(f"{where}: table {table.name!r}: value_schema is for Avro; a {table.format} table's "
                              f"columns come from '-- schema:' and each record's schema from the registry")
    if "value_schema" not in header:
        raise DefinitionError(f"{header.where(path, 'format')}: table {table.name!r}: format avro needs its writer "
                              f"schema: add '-- value_schema: <file>.avsc' (a file beside {path.name}), or use "
                              f"'-- format: avro-confluent' for values framed with a schema registry's ids")
    file = path.parent / header["value_schema"]
    try:
        import fastavro

        schema = json.loads(file.read_text())
        fastavro.parse_schema(schema)
    except OSError as exc:
        raise DefinitionError(f"{where}: table {table.name!r}: cannot read value_schema {file}: {exc.strerror}") \
            from None
    except (ValueError, fastavro.schema.SchemaParseException) as exc:
        raise DefinitionError(f"{where}: table {table.name!r}: value_schema {file.name} is not an Avro schema: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise DefinitionError(f"{where}: table {table.name!r}: value_schema {file.name} must be an Avro record; "
                              f"its fields are read into the columns of the same name")
    table.value_schema = json.dumps(schema, sort_keys=True)


def _source_table(path, create: exp.Create, header: dict, common: dict) -> TableDefinition:
    schema_node = create.this
    name = _check_name(path, schema_node.this.name, schema_node)
    columns, keys = [], []
    for col in schema_node.expressions:
        if not isinstance(col, exp.ColumnDef):
            raise _fail(path, col, f"table element {col.sql()}", "column definitions with one PRIMARY KEY")
        if any(col.name == c for c, _ in columns):
            raise _invalid(path, col, f"column {col.name!r} is declared twice")
        columns.append((col.name, col.args["kind"].sql(dialect="spark").upper()))
        if any(isinstance(c.args.get("kind"), exp.PrimaryKeyColumnConstraint) for c in col.constraints or []):
            keys.append(col.name)
    if len(keys) != 1:
        raise DefinitionError(f"{path}: source table {name!r} needs exactly one PRIMARY KEY column, found {keys}")
    topic = header.get("topic")
    props = create.args.get("properties")
    for prop in props.expressions if props else []:
        if prop.name.lower() == "topic":
            topic = prop.args["value"].name
        else:
            raise _fail(path, prop, f"table property {prop.sql()}", "WITH (topic='...')")
    if not topic:
        raise DefinitionError(f"{path}: source table {name!r} needs a topic: WITH (topic='...') or '-- topic: ...'")
    key_format = header.get("key_format", "plain")
    if key_format not in KEY_FORMATS:
        raise DefinitionError(f"{header.where(path, 'key_format')}: option key_format={key_format!r} must be plain "
                              f"(the Kafka key is the primary key's value), json (an object holding it, as a "
                              f"table's output_topic writes) or that object under a schema registry "
                              f"({', '.join(KEY_FORMATS[2:])})")
    return TableDefinition(name=name, path=path, kind="source", topic=topic, schema=columns, key_columns=keys,
                           value_columns=[c for c, _ in columns], key_format=key_format, **common)


def _aggregate_table(path, create: exp.Create, header: dict, common: dict) -> TableDefinition:
    name = _check_name(path, create.this.name, create.this)
    select = create.expression
    if not isinstance(select, exp.Select):
        raise _fail(path, select, "a CREATE TABLE without AS SELECT or a column list")
    for unsupported in ("order", "limit", "distinct", "with"):
        if select.args.get(unsupported):
            raise _fail(path, select.args[unsupported], unsupported.upper())
    source = select.args.get("from") or select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        raise _fail(path, select, "a SELECT without FROM <stream>")
    stream = source.this
    schema_raw = header.get("schema")
    input_table = _INPUT_TABLES.get().get(stream.name) if not schema_raw else None
    if input_table is not None and select.args.get("group") is None and select.args.get("joins"):
        return _join_table(path, header, common, name, select, input_table)
    if "join_topic" in header or "join_schema" in header:
        return _stream_join_table(path, header, common, name, select)
    if schema_raw and select.args.get("group") is None and select.args.get("joins"):
        fields = _parse_schema(header.where(path, "schema"), schema_raw)
        if any(f == POSITION for f, _ in fields):
            raise DefinitionError(f"{header.where(path, 'schema')}: table {name!r}: field {POSITION!r} is the name "
                                  f"of a stream's record position in a join; rename the field")
        left = _stream(stream.name, path, header.get("topic", stream.name), fields)
        return _join_table(path, header, common, name, select, left)
    if input_table is not None:
        _check_over_table(path, header, name, select, input_table)
        schema = list(input_table.schema)
    elif not schema_raw:
        raise _NeedsSchema(f"{path}: table {name!r} reads stream {stream.name!r}; declare its JSON fields "
                           f"with '-- schema: field TYPE, ...', or name a source table in FROM to aggregate "
                           f"its rows", stream.name, f"{path}: table {name!r}")
    else:
        schema = _parse_schema(header.where(path, "schema"), schema_raw)
    stream_alias = stream.alias or stream.name
    scope = _Scope(path, stream_alias, schema)
    joins = []
    for join in select.args.get("joins") or []:
        table = join.this
        if not isinstance(table, exp.Table):
            raise _fail(path, join, f"JOIN {join.this.sql()}", "JOIN <source table> [alias] ON stream.col = table.key")
        kind = (join.side or "").lower() or "inner"
        if kind not in ("inner", "left") or join.kind and join.kind.upper() not in ("INNER", "OUTER"):
            raise _fail(path, join, f"{join.side or ''} {join.kind or ''} JOIN".strip(), "JOIN or LEFT JOIN")
        alias = table.alias or table.name
        if alias in scope.aliases:
            raise _invalid(path, table, f"alias {alias!r} is used twice; give each joined table its own alias")
        scope.aliases[alias] = table.name
        on = join.args.get("on")
        if not isinstance(on, exp.EQ) or not all(isinstance(s, exp.Column) for s in (on.left, on.right)):
            raise _fail(path, on or join, f"join condition {on.sql() if on else '(none)'}", "ON stream.col = table.key")
        left, right = on.left, on.right
        if left.table == alias:
            left, right = right, left
        if right.table != alias:
            raise _fail(path, on, f"join condition {on.sql()}", f"ON stream.col = {alias}.key")
        joins.append(JoinSpec(table.name, alias, kind, scope.column(left, "a join column"),
                              scope.column(right, "a join column").split(".")[-1]))

    group = select.args.get("group")
    if group is None:
        raise _fail(path, select, "an aggregate without GROUP BY")
    keys, window, key_types = [], None, {}
    event_time = common.get("event_time")
    projections = _projections(path, select, schema)
    selected = {p.this.unnest().sql(dialect="spark"): p.alias for p in projections
                if isinstance(p, exp.Alias) and not isinstance(p.this, exp.Column)}
    by_alias = {p.alias: p.this for p in projections if isinstance(p, exp.Alias)}
    # `SELECT data AS new_key ... GROUP BY data` renames the key (ksqlDB's rows show new_key); with
    # data also selected as itself, new_key is a copy of it, computed when a row is shown.
    plain = {p.sql(dialect="spark") for p in projections if isinstance(p, exp.Column)}
    renamed = {p.this.sql(dialect="spark"): p.alias for p in projections if isinstance(p, exp.Alias)
               and isinstance(p.this, exp.Column) and p.alias != p.this.name and p.this.sql(dialect="spark") not in plain}
    for item in (part for listed in group.expressions for part in _grouping_set(listed)):
        item = item.unnest()                    # GROUP BY (a + b) groups by a + b
        if isinstance(item, exp.Column) and not item.table and item.name not in scope.stream_fields \
                and item.name in by_alias and not isinstance(by_alias[item.name], exp.Column):
            item = by_alias[item.name]          # GROUP BY an alias of SELECT: its expression
        if isinstance(item, exp.Anonymous) and item.name.upper() in ("TUMBLE", "HOP", "SESSION"):
            if window is not None:
                raise _invalid(path, item, "a table has at most one window in GROUP BY")
            event_time, window = _window(scope, item)
            continue
        if isinstance(item, exp.Column) and item.sql(dialect="spark") in renamed:
            scope.column(item, "a GROUP BY key")
            key = _computed_key(scope, item, renamed)
            key_types[key] = _key_type(path, item, schema)
        elif isinstance(item, exp.Column):
            key = scope.column(item, "a GROUP BY key")
        elif not _is_aggregate_call(item) and not item.find(exp.AggFunc):
            key = _computed_key(scope, item, selected)
            key_types[key] = _key_type(path, item, schema)
        else:
            raise _fail(path, item, f"GROUP BY {item.sql()}")
        if key in keys:
            raise _invalid(path, item, f"GROUP BY {item.sql()} is listed twice")
        keys.append(key)
    shown_keys = [k.split(".")[-1] for k in keys] + (["window_start"] if window else []) \
        + ([SESSION_LAST] if window and window.session else [])
    key_names = set(shown_keys)
    if len(key_names) != len(shown_keys):
        raise _invalid(path, group, f"GROUP BY keys {keys} share a column name; rows would show one of them")
    aggregates, seen, computed_nodes = [], {}, {}
    for projection in projections:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(projection, exp.Alias) and projection.alias in key_types \
                and scope.derived[projection.alias] == projection.this.unnest().sql(dialect="spark"):
            continue                            # a computed or renamed GROUP BY key
        if isinstance(target, exp.Column) and window is not None and not target.table \
                and target.name in ("window_start", SESSION_LAST) and target.name not in scope.stream_fields:
            alias = projection.alias if isinstance(projection, exp.Alias) else target.name
            if alias != target.name or alias not in key_names:     # renamed, or a TUMBLE/HOP window_end
                computed_nodes[alias] = exp.alias_(target, alias)
            continue
        if isinstance(target, exp.Column):
            if scope.column(target, "a selected column") not in keys:
                raise _fail(path, target, f"column {target.sql()} outside GROUP BY and outside an aggregate")
            if isinstance(projection, exp.Alias) and projection.alias != target.name:
                if projection.alias in key_names or projection.alias in computed_nodes:
                    raise _invalid(path, projection, f"column alias {projection.alias!r} is used twice; rows would "
                                                     f"show only one of them")
                computed_nodes[projection.alias] = projection      # a copy of the key beside it
            continue
        if not isinstance(projection, exp.Alias):
            raise _fail(path, projection, f"aggregate {projection.sql()} without an alias", "AGG(...) AS name")
        alias = projection.alias
        if alias in key_names:
            raise _invalid(path, projection, f"aggregate alias {alias!r} is also a key column; rows would show "
                                             f"only one of them. Rename the aggregate")
        if alias in seen or alias in computed_nodes:
            raise _invalid(path, projection, f"aggregate alias {alias!r} is used twice; rows would show only one "
                                             f"of them. Give each aggregate its own name")
        if _is_aggregate_call(target):
            seen[alias] = projection
            aggregates.append(_aggregate(scope, alias, target))
        else:
            computed_nodes[alias] = projection
    computed = {alias: _computed(scope, projection, key_names, seen, aggregates, window)
                for alias, projection in computed_nodes.items()}
    having = select.args.get("having")
    having_sql = _having(path, having.this, key_names | set(computed), seen, scope, aggregates) \
        if having is not None else None
    if not aggregates:          # GROUP BY alone: the distinct keys, each held by a hidden count
        _hidden_aggregate(scope, exp.Count(this=exp.Star()), aggregates)
    where = select.args.get("where")
    if where is not None:
        scope.check_expression(where.this)
        _check_functions(path, where.this, "in WHERE")
        if where.find(exp.AggFunc):
            raise _fail(path, where, "an aggregate in WHERE", "conditions on event fields")
    common["event_time"] = event_time
    if window is not None and window.session:        # a session ends by its last event: shown as window_end
        aggregates.append(AggregateColumn(SESSION_LAST, "max", (EVENT_MS,)))
    if "key_format" in header:
        raise DefinitionError(f"{header.where(path, 'key_format')}: option key_format is for source tables (CREATE "
                              f"TABLE t (... PRIMARY KEY) WITH (topic=...)); an aggregate table's key comes from "
                              f"its GROUP BY")
    if input_table is not None:
        _check_over_table_select(path, name, window, scope, aggregates, where)
        common["event_time"] = None
        common["bronze"] = False        # verify recomputes from the input topic, whose compaction keeps each key's last row
    return TableDefinition(
        name=name, path=path, kind="aggregate", schema=schema,
        topic=input_table.topic if input_table is not None else header.get("topic", stream.name),
        input_table=input_table.name if input_table is not None else None,
        key_format=input_table.key_format if input_table is not None else "plain",
        key_columns=keys, aggregates=aggregates, joins=joins, window=window, stream_alias=stream_alias,
        where=_guarded(where.this).sql(dialect="spark") if where else None, joined_refs=scope.joined_refs,
        having=having_sql,
        derived=scope.derived, computed=computed, key_types=key_types,
        **common,
    )


def _projections(path: Path, select: exp.Select, schema: list[tuple[str, str]]) -> list[exp.Expression]:
    """SELECT's list with `*` spelled out as the stream's fields (ksqlDB allows `SELECT *, COUNT(*)`
    when every field is in GROUP BY; one that is not fails as any selected column outside it)."""
    projections = []
    for projection in select.expressions:
        if isinstance(projection, exp.Star):
            if select.args.get("joins"):
                raise _fail(path, projection, "SELECT * with a JOIN", "name the columns")
            for name, _ in schema:
                projections.append(exp.column(name))
                projections[-1].meta.update(projection.meta)      # errors point at the *
        else:
            projections.append(projection)
    return projections


def _grouping_set(item: exp.Expression) -> list[exp.Expression]:
    """`GROUP BY (a, b)`, a single grouping set, groups by a and b; `GROUP BY (a + b)` by a + b."""
    return list(item.expressions) if isinstance(item, exp.Tuple) else [item]


# What an event-level expression (WHERE, a computed GROUP BY key, an aggregate's argument) may
# use: Spark evaluates it (the Spark-SQL pass takes a WHERE the Arrow pass cannot translate), on
# every batch and again in verify and rebuild, so it must give the same answer each time. Any
# scalar function sqlglot's Spark dialect knows does; these do not.
NOT_REPEATABLE = "aggregates, generators (EXPLODE, ...), subqueries, window functions, clocks, random values, " \
                 "the session's user or catalog, and functions Spark's SQL does not define"
_NOT_REPEATABLE_NAMES = ("Current", "Local", "Rand", "Uuid", "AI", "Generate", "ExplodingGenerate")
_CLOCK_WITHOUT_ARGUMENTS = (exp.StrToUnix, exp.TimeStrToUnix, exp.TimeToUnix)   # UNIX_TIMESTAMP() is now
_WHERE_PARTS = (exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.DataType, exp.DataTypeParam, exp.Var,
                exp.Star, exp.Paren, exp.Binary, exp.Unary, exp.Predicate, exp.Case, exp.If, exp.Cast, exp.Interval,
                exp.Tuple, exp.Escape, exp.Bracket)


# Arguments an event must not supply, or one record could stall or fail every run of its batch: a
# regular expression (invalid, or exponential to match) and the size of a string a function builds.
_LITERAL_ARGUMENTS = {exp.Repeat: "times", exp.Space: "this", exp.Pad: "expression"}


def _event_supplied(node: exp.Expression) -> exp.Expression | None:
    """The argument of `node` that must be a literal and is not (see _LITERAL_ARGUMENTS)."""
    name = "expression" if type(node).__name__.startswith("Regexp") else _LITERAL_ARGUMENTS.get(type(node))
    argument = node.args.get(name) if name else None
    return argument if argument is not None and argument.find(exp.Column) is not None else None


def _guarded(node: exp.Expression) -> exp.Expression:
    """`node` with each LIKE whose pattern comes from the event made NULL (the event filtered, or
    the value null) where the pattern is not one Spark accepts: Spark fails the whole batch on one
    such pattern (an escape before anything but %, _ or itself), and so every run of it after."""
    import re

    def guard(child: exp.Expression) -> exp.Expression:
        like, escape = (child.this, child.expression) if isinstance(child, exp.Escape) else (child, None)
        if not isinstance(like, (exp.Like, exp.ILike)) or isinstance(like.expression, exp.Literal) \
                or escape is not None and not isinstance(escape, exp.Literal):
            return child
        mark = re.escape(escape.this if escape is not None else "\\")
        valid = exp.RegexpLike(this=like.expression.copy(),
                               expression=exp.Literal.string(f"^([^{mark}]|{mark}[%_{mark}])*$"))
        return exp.Case(ifs=[exp.If(this=valid, true=child.copy())])

    return node.copy().transform(guard)


def _repeatable(node: exp.Expression) -> bool:
    if isinstance(node, exp.In) and node.args.get("query") or isinstance(node, (exp.Query, exp.Window)):
        return False
    if isinstance(node, exp.Func):
        name = type(node).__name__
        return not (isinstance(node, (exp.AggFunc, exp.UDTF, exp.Anonymous)) or name.startswith(_NOT_REPEATABLE_NAMES)
                    or isinstance(node, _CLOCK_WITHOUT_ARGUMENTS) and node.this is None)
    return isinstance(node, _WHERE_PARTS)


def _check_functions(path: Path, node: exp.Expression, where: str) -> None:
    """Every node of an event-level expression (WHERE, an aggregate's argument, a computed key) is
    one Spark evaluates alike on every batch; `where` says where it is ("in WHERE")."""
    from catalog.expressions import backslash_escaped

    for child in node.walk():
        if not _repeatable(child):
            what = child.sql(dialect="spark") if len(child.sql()) < 60 else child.key.upper()
            raise _fail(path, child, f"{what} {where}",
                        f"{where}: columns, literals, operators and Spark's scalar functions; not {NOT_REPEATABLE}")
        supplied = _event_supplied(child)
        if supplied is not None:
            raise _invalid(path, supplied, f"{child.sql(dialect='spark')} {where} takes {supplied.sql()} from each "
                                           f"event: one event could make every run of its batch fail or stall; "
                                           f"write it as a literal")
        escape = child.expression if isinstance(child, exp.Escape) else None
        if isinstance(escape, exp.Literal) and isinstance(child.this.expression, exp.Literal):
            try:        # Spark would refuse it mid-batch, every batch
                backslash_escaped(child.this.expression.this, escape.this)
            except ValueError as exc:
                raise _invalid(path, child, f"{exc} {where}") from None


KEY_TYPES = ("STRING", "BIGINT", "INT", "DOUBLE", "BOOLEAN")


def _computed_key(scope: "_Scope", node: exp.Expression, selected: dict[str, str]) -> str:
    """A GROUP BY expression (`GROUP BY UPPER(country)`, or the alias of one in SELECT): computed
    per event before grouping, by the Spark-SQL pass, and named as SELECT names it (ksqlDB asks
    the same: a grouping expression must be selected, so its rows have a column for it)."""
    text = node.sql(dialect="spark")
    if text not in selected:
        raise _invalid(scope.path, node, f"GROUP BY {node.sql()} must also be in SELECT with a name, e.g. "
                                         f"SELECT {node.sql()} AS name, ...; the rows show it under that name")
    scope.check_expression(node)
    _check_functions(scope.path, node, "in GROUP BY")
    scope.derived[selected[text]] = _guarded(node).sql(dialect="spark")
    scope.key_sql[text] = selected[text]
    return selected[text]


def sql_type(node: exp.Expression, schema: list[tuple[str, str]] | dict[str, str]) -> str:
    """An expression's Spark type over a stream's fields, by sqlglot's type inference, in the
    schema's spelling (STRING, INT); "UNKNOWN" where the inference has none."""
    from sqlglot.optimizer.annotate_types import annotate_types

    # Columns qualified by their table: unqualified ones stay UNKNOWN to the inference, and so
    # does any arithmetic or SUBSTRING over them.
    query = exp.select(node.copy().transform(
        lambda n: exp.column(n.name, table="events") if isinstance(n, exp.Column) else n).as_("k")).from_("events")
    try:
        kind = annotate_types(query, schema={"events": dict(schema)}, dialect="spark").selects[0].type.sql(dialect="spark")
    except Exception:   # noqa: BLE001 - an inference gap is reported as an unknown type
        kind = "UNKNOWN"
    return {"VARCHAR": "STRING", "TEXT": "STRING", "SMALLINT": "INT", "TINYINT": "INT"}.get(kind, kind)


def _key_type(path: Path, node: exp.Expression, schema: list[tuple[str, str]]) -> str:
    """A computed key's type (sql_type): URL keys are parsed by it, and the state keys only plain values."""
    kind = sql_type(node, schema)
    kind = "DOUBLE" if kind == "FLOAT" else kind
    if kind not in KEY_TYPES:
        raise _invalid(path, node, f"GROUP BY {node.sql()} is {kind}; a computed key must be one of {list(KEY_TYPES)}: "
                                   f"CAST it, e.g. CAST({node.sql()} AS STRING)")
    return kind


def _is_aggregate_call(node: exp.Expression) -> bool:
    return isinstance(node, exp.AggFunc) or isinstance(node, exp.Anonymous) and \
        node.name.upper() in ("LATEST_BY_OFFSET", "TOPK")


def _computed(scope: "_Scope", projection: exp.Alias, key_names: set[str], named: dict, aggregates: list,
              window: WindowSpec | None = None) -> str:
    """A SELECT column computed from the aggregates and keys when a row is shown, e.g.
    `SUM(amount) / COUNT(*) AS mean` or `UPPER(title) AS shout` (catalog.expressions.SUPPORTED).
    An aggregate in it that SELECT does not name is kept hidden in the state (`_h<n>`). Returns
    it as SQL over the row's columns."""
    from catalog.expressions import SUPPORTED as ROW_SUPPORTED, compile_value

    path, target = scope.path, projection.this
    by_sql = {p.this.sql(dialect="spark"): alias for alias, p in named.items()}

    def to_columns(child: exp.Expression) -> exp.Expression:
        if _is_aggregate_call(child):
            text = child.sql(dialect="spark")
            return exp.column(by_sql[text] if text in by_sql else _hidden_aggregate(scope, child, aggregates))
        if child.sql(dialect="spark") in scope.key_sql:        # INITCAP(c) when GROUP BY INITCAP(c): its key
            return exp.column(scope.key_sql[child.sql(dialect="spark")])
        if isinstance(child, exp.Column) and child.name == SESSION_LAST and window is not None \
                and not window.session and child.name not in scope.stream_fields:
            # A TUMBLE or HOP window ends size after it starts (rows keep only the start).
            return exp.paren(exp.Add(this=exp.column("window_start"), expression=exp.Literal.number(window.size_ms)))
        if isinstance(child, exp.Column):
            return exp.column(child.name)
        return child

    expression = target.copy().transform(to_columns)
    try:
        compile_value(expression, set(key_names) | {a.name for a in aggregates})
    except UnsupportedSql as exc:
        raise _fail(path, _located(target, exc.node), f"column {projection.alias!r}: {exc}", ROW_SUPPORTED) from None
    return expression.sql(dialect="spark")


def _hidden_aggregate(scope: "_Scope", node: exp.Expression, aggregates: list) -> str:
    """The column of an aggregate SELECT does not name (`SUM(v)` in `SUM(v) / COUNT(*) AS mean`, or
    in HAVING): kept in the state, hidden from rows, once however often it is used."""
    text = node.sql(dialect="spark")
    if text not in scope.hidden:
        scope.hidden[text] = f"_h{sum(a.hidden for a in aggregates)}"
        aggregates.append(replace(_aggregate(scope, scope.hidden[text], node), hidden=True))
    return scope.hidden[text]


def _having(path: Path, node: exp.Expression, key_names: set[str], aggregates: dict,
            scope: "_Scope", columns: list) -> str:
    """HAVING over the rows' columns: an aggregate SELECT names becomes its alias, so the predicate
    reads the row as the API shows it. Returns it as Spark SQL text."""
    from catalog.expressions import SUPPORTED as HAVING_SUPPORTED, compile_predicate

    named = {projection.this.sql(dialect="spark"): alias for alias, projection in aggregates.items()}

    def to_columns(child: exp.Expression) -> exp.Expression:
        if _is_aggregate_call(child):       # one SELECT does not name is kept hidden, as ksqlDB allows
            return exp.column(named.get(child.sql(dialect="spark")) or _hidden_aggregate(scope, child, columns))
        if isinstance(child, (exp.AggFunc, exp.Anonymous)):
            alias = named.get(child.sql(dialect="spark"))
            if alias is None:
                raise _fail(path, child, f"HAVING over {child.sql()}, an aggregate SELECT does not name",
                            f"{HAVING_SUPPORTED}; name it in SELECT (AGG(...) AS name)")
            return exp.column(alias)
        if child.sql(dialect="spark") in scope.key_sql:
            return exp.column(scope.key_sql[child.sql(dialect="spark")])
        if isinstance(child, exp.Column):
            return exp.column(child.name)
        return child

    predicate = node.copy().transform(to_columns)
    try:
        compile_predicate(predicate, set(key_names) | set(aggregates) | {a.name for a in columns})
    except UnsupportedSql as exc:
        raise _fail(path, _located(node, exc.node), f"HAVING: {exc}", HAVING_SUPPORTED) from None
    return predicate.sql(dialect="spark")


def _located(original: exp.Expression, copied: exp.Expression) -> exp.Expression:
    """The node of `original` that `copied` (from a transformed copy) stands for, for its line:col."""
    wanted = _sql_or_none(copied)
    for child in original.walk():
        if wanted is not None and _sql_or_none(child) == wanted:
            return child
    return original


def _sql_or_none(node: exp.Expression) -> str | None:
    """A node's SQL, or None for one sqlglot cannot write back (a call with its argument missing)."""
    try:
        return node.sql()
    except (AttributeError, TypeError, ValueError):
        return None


_INPUT_TABLES: contextvars.ContextVar[dict] = contextvars.ContextVar("input_tables", default={})


def as_change_topic_source(join: TableDefinition) -> TableDefinition:
    """A join (of tables, or a windowed one of streams) as the tables on it read it: its change
    topic (`output_topic`), keyed by the key as a JSON object, with its rows as values, like any
    source table on a change topic. Its own topics are what it reads, never what they read. A
    windowed join's row is named by its `rowposition` alone (both records' positions), the one
    primary key a source table has; an aggregate over a windowed join's row by its group."""
    own = {"stream_join": None, "stream_schema": [], "where": None, "key_columns": [POSITION]} \
        if join.stream_join is not None else {}
    if join.kind == "aggregate":      # an aggregate over a windowed join: its groups' rows, keyed by the groups
        types = dict(join.schema)
        schema = [(k, types[k]) for k in join.key_columns] + [(a.name, _result_type(a, types)) for a in join.aggregates]
        own = {**own, "kind": "source", "key_columns": list(join.key_columns), "schema": schema, "aggregates": [],
               "value_columns": [c for c, _ in schema]}
    return replace(join, topic=join.output_topic, key_format="json", input_table=None, joins=[], join_columns=[],
                   output_topic=None, **own)


def _result_type(aggregate: AggregateColumn, types: dict) -> str:
    """The type of an aggregate's value in a change topic's rows, from its argument's type."""
    if aggregate.function in ("count", "count_distinct"):
        return "BIGINT"
    if aggregate.function == "avg":
        return "DOUBLE"
    kind = types[aggregate.args[0]]
    return {"INT": "BIGINT", "FLOAT": "DOUBLE"}.get(kind, kind) if aggregate.function == "sum" else kind


def read_by_change_topic(table: TableDefinition) -> bool:
    """A join's rows reach the tables on it through its change topic (as_change_topic_source)."""
    return table.table_join or table.stream_join is not None


def input_definition(table: TableDefinition, tables: dict[str, TableDefinition]) -> TableDefinition:
    """The source table an aggregate over a table or a join of tables reads."""
    if table.stream_schema:
        return stream_side(table)
    source = tables[table.input_table]
    return as_change_topic_source(source) if read_by_change_topic(source) else source


class _NeedsSchema(DefinitionError):
    """A stream without '-- schema:' that may yet be a source table (load_all knows them all)."""

    def __init__(self, message: str, stream: str, table: str) -> None:
        super().__init__(message)
        self.stream = stream
        self.table = table          # "path: table 'name'", for a refusal that replaces this one


OVER_TABLE = ("an aggregate over a source table's rows: SELECT keys, COUNT/SUM/AVG/MIN/MAX/COUNT(DISTINCT)/"
              "TOPK ... FROM table [WHERE ...] GROUP BY columns [HAVING ...]")


TABLE_JOIN = ("a join of two tables: SELECT a.col [AS name], b.col [AS name], ... FROM a [alias] [LEFT] JOIN b [alias] "
              "ON a.col = b.<b's primary key> [WHERE condition over a.col, b.col], with a and b source tables; the "
              "rows have a's key")


def _join_table(path: Path, header: dict, common: dict, name: str, select: exp.Select,
                left: TableDefinition) -> TableDefinition:
    """A join of two tables (`FROM a JOIN b ON a.fk = b.id`): a row per row of `a`, keyed by a's
    key, with b's columns from the row whose key a's column names (a foreign key, or a's own key
    for a primary-key join). A change on either side updates exactly the rows it touches."""
    for option in ("event_time", "ttl", "emit", "key_format") + (() if left.stream else ("topic", "schema")):
        if option in header:
            raise DefinitionError(f"{header.where(path, option)}: table {name!r} joins tables, so option {option!r} "
                                  f"does not apply (it reads {left.name}'s topic {left.topic!r} with its schema); "
                                  f"remove it")
    if select.args.get("having"):
        raise _fail(path, select.args["having"], f"table {name!r}: HAVING in a join of tables", TABLE_JOIN)
    source = select.args.get("from") or select.args.get("from_")
    left_alias = source.this.alias or source.this.name
    (join,) = select.args["joins"] if len(select.args["joins"]) == 1 else (None,)
    if join is None:
        raise _fail(path, select.args["joins"][1], f"table {name!r}: a second JOIN in a join of tables", TABLE_JOIN)
    right_node = join.this
    right = _INPUT_TABLES.get().get(right_node.name) if isinstance(right_node, exp.Table) else None
    if right is None:
        problem = _fail(path, join, f"table {name!r}: JOIN {right_node.sql()} (not a source table defined beside it)",
                        TABLE_JOIN)
        # load_all parses once before it knows the source tables: a stream's join is parsed again then
        raise _NeedsSchema(str(problem), right_node.name, f"{path}: table {name!r}") if left.stream else problem
    kind = (join.side or "").lower() or "inner"
    if kind not in ("inner", "left") or join.kind and join.kind.upper() not in ("INNER", "OUTER"):
        raise _fail(path, join, f"{join.side or ''} {join.kind or ''} JOIN".strip(), "JOIN or LEFT JOIN")
    right_alias = right_node.alias or right_node.name
    if right_alias == left_alias:
        raise _invalid(path, right_node, f"alias {right_alias!r} is used twice; give each table its own alias")
    sides = {left_alias: left, right_alias: right}

    def column(node: exp.Expression) -> tuple[str, str]:
        if not isinstance(node, exp.Column) or node.table not in sides:
            raise _fail(path, node, f"table {name!r}: {node.sql()} (columns are named alias.column, aliases "
                                    f"{sorted(sides)})", TABLE_JOIN)
        if node.name not in dict(sides[node.table].schema):
            raise _invalid(path, node, f"unknown column {node.sql()}: table {sides[node.table].name!r} has columns "
                                       f"{[c for c, _ in sides[node.table].schema]}")
        return node.table, node.name

    on = join.args.get("on")
    if not isinstance(on, exp.EQ):
        raise _fail(path, on or join, f"join condition {on.sql() if on else '(none)'}", TABLE_JOIN)
    a, b = column(on.left), column(on.right)
    if a[0] == right_alias:
        a, b = b, a
    if a[0] != left_alias or b[0] != right_alias or [b[1]] != right.key_columns:
        raise _fail(path, on, f"table {name!r}: join condition {on.sql()}",
                    f"ON {left_alias}.<column> = {right_alias}.{right.key_columns[0]} (b's primary key)")
    a_type, b_type = dict(left.schema)[a[1]], dict(right.schema)[b[1]]
    if a_type != b_type:
        raise _invalid(path, on, f"table {name!r}: {on.sql()} compares {a_type} with {b_type}, so no row would "
                                 f"match; declare {left_alias}.{a[1]} as {b_type}")
    columns, schema = [], []
    for projection in select.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        side, col = column(target)
        out = projection.alias if isinstance(projection, exp.Alias) else col
        if any(out == o for _, o in columns):
            raise _invalid(path, projection, f"column {out!r} is selected twice; rename one with AS")
        columns.append((f"{side}.{col}", out))
        schema.append((out, dict(sides[side].schema)[col]))
    where = select.args.get("where")
    where = _join_where(path, name, where.this, sides, column) if where else None
    key = f"{left_alias}.{left.key_columns[0]}"
    if left.stream and not any(source_column == key for source_column, _ in columns):
        columns.insert(0, (key, POSITION))          # a stream's rows are keyed by their record's position
        schema.insert(0, (POSITION, "STRING"))
    if not any(source_column == key and out == left.key_columns[0] for source_column, out in columns):
        raise _invalid(path, select, f"table {name!r}: SELECT {key} (under its own name): the rows of a join of "
                                     f"tables have {left.name}'s key")
    return TableDefinition(
        name=name, path=path, kind="source", topic=left.topic, schema=schema, key_columns=list(left.key_columns),
        value_columns=[o for _, o in columns], key_format=left.key_format,
        input_table=None if left.stream else left.name, stream_schema=left.schema[1:] if left.stream else [],
        joins=[JoinSpec(right.name, right_alias, kind, f"{left_alias}.{a[1]}", b[1])], stream_alias=left_alias,
        join_columns=columns, where=where, **{**common, "bronze": False, "event_time": None})


def stream_side(join: TableDefinition) -> TableDefinition:
    """The stream a join's left side reads (`-- topic:` and `-- schema:` on the join, as on an
    aggregate over a stream), as a source table whose rows are its records: each keyed by its
    position (POSITION, "partition:offset"), never changed or deleted, so two equal events are
    two rows, and a tombstone is a dead letter, not a delete."""
    return _stream(join.name, join.path, join.topic, join.stream_schema, partitions=join.partitions,
                   format=join.format, value_schema=join.value_schema, event_time_skew_ms=join.event_time_skew_ms)


def _stream(name: str, path: Path, topic: str, fields: list[tuple[str, str]], **options) -> TableDefinition:
    """A stream's fields as a source table keyed by POSITION (stream_side)."""
    return TableDefinition(name=name, path=path, kind="source", topic=topic, schema=[(POSITION, "STRING"), *fields],
                           key_columns=[POSITION], value_columns=[POSITION, *(f for f, _ in fields)], stream=True,
                           **options)


STREAM_JOIN = ("a windowed join of two streams: '-- topic:' and '-- schema:' for a, '-- join_topic:' and "
               "'-- join_schema:' for b, then SELECT a.col [AS name], b.col [AS name], ... FROM a [LEFT|FULL OUTER] "
               "JOIN b ON a.k = b.k AND b.ts BETWEEN a.ts [- INTERVAL 'n' unit] AND a.ts|a.until [+ INTERVAL 'n' "
               "unit] [WHERE ...]")
STREAM_JOIN_KEY = "<join key>"      # join_columns' source of a stream join's key column (a's or b's join key)
TIME_COLUMN_TYPES = ("TIMESTAMP", "BIGINT", "LONG")     # an event time: a TIMESTAMP, or epoch milliseconds


def _stream_join_table(path: Path, header: _Header, common: dict, name: str, select: exp.Select) -> TableDefinition:
    """A windowed join of two streams (StreamJoin), declared as Flink declares an interval join:
    the window is a BETWEEN on the event times in ON, and the rows are the pairs (and, for an
    outer side, its records that found none once their window closed)."""
    for option in ("event_time", "ttl", "emit", "key_format", "window_retention", "format", "value_schema"):
        if option in header:
            raise DefinitionError(f"{header.where(path, option)}: table {name!r} joins two streams, so option "
                                  f"{option!r} does not apply (the event times are the BETWEEN's columns; values are "
                                  f"JSON); remove it")
    for needed in ("schema", "join_schema"):
        if needed not in header:
            raise DefinitionError(f"{path}: table {name!r} joins two streams: declare the "
                                  f"{'first' if needed == 'schema' else 'joined'} stream's JSON fields with "
                                  f"'-- {needed}: field TYPE, ...'")
    if select.args.get("having"):
        raise _fail(path, select.args["having"], f"table {name!r}: HAVING in a join of two streams (aggregate its "
                                                 f"output_topic in a table of its own)", STREAM_JOIN)
    source = select.args.get("from") or select.args.get("from_")
    joins = select.args.get("joins") or []
    if len(joins) != 1 or not isinstance(joins[0].this, exp.Table):
        raise _fail(path, joins[1] if len(joins) > 1 else select, f"table {name!r}: '-- join_topic:' without "
                                                                  f"exactly one JOIN of a stream", STREAM_JOIN)
    join, left_node = joins[0], source.this
    right_node = join.this
    la, ra = left_node.alias or left_node.name, right_node.alias or right_node.name
    if la == ra:
        raise _invalid(path, right_node, f"alias {ra!r} is used twice; give each stream its own alias")
    kind = {"": "inner", "left": "left", "full": "full"}.get((join.side or "").lower())
    if kind is None or join.kind and join.kind.upper() not in ("INNER", "OUTER"):
        raise _fail(path, join, f"{join.side or ''} {join.kind or ''} JOIN".strip(),
                    "JOIN, LEFT JOIN or FULL OUTER JOIN (for a RIGHT JOIN, swap the streams)")
    fields = {}
    for alias, option in ((la, "schema"), (ra, "join_schema")):
        fields[alias] = _parse_schema(header.where(path, option), header[option])
        if any(f == POSITION for f, _ in fields[alias]):
            raise DefinitionError(f"{header.where(path, option)}: table {name!r}: field {POSITION!r} is the name of a "
                                  f"joined pair's record positions; rename the field")
    types = {alias: dict(f) for alias, f in fields.items()}

    def column(node: exp.Expression) -> tuple[str, str]:
        if not isinstance(node, exp.Column) or node.table not in types:
            raise _fail(path, node, f"table {name!r}: {node.sql()} (columns are named alias.column, aliases "
                                    f"{sorted(types)})", STREAM_JOIN)
        if node.name not in types[node.table]:
            raise _invalid(path, node, f"unknown column {node.sql()}: stream {node.table!r} has fields "
                                       f"{list(types[node.table])}")
        return node.table, node.name

    def bound(node: exp.Expression) -> tuple[str, str, int]:
        """(alias, column, offset ms) of a BETWEEN bound: `x.ts`, `x.ts + INTERVAL ...`, `x.ts - INTERVAL ...`."""
        if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.expression, exp.Interval):
            alias, col = column(node.this)
            ms = _interval_ms(path, node.expression, "join window bound", zero=True)
            return alias, col, ms if isinstance(node, exp.Add) else -ms
        return (*column(node), 0)

    on = join.args.get("on")
    conditions = list(on.flatten()) if isinstance(on, exp.And) else [on]
    eqs = [c for c in conditions if isinstance(c, exp.EQ)]
    betweens = [c for c in conditions if isinstance(c, exp.Between)]
    if on is None or len(eqs) != 1 or len(betweens) != 1 or len(conditions) != 2:
        raise _fail(path, on or join, f"table {name!r}: join condition {on.sql() if on else '(none)'} (one equality "
                                      f"and one BETWEEN of event times)", STREAM_JOIN)
    a_key, b_key = column(eqs[0].left), column(eqs[0].right)
    if a_key[0] == ra:
        a_key, b_key = b_key, a_key
    if a_key[0] != la or b_key[0] != ra:
        raise _fail(path, eqs[0], f"table {name!r}: join condition {eqs[0].sql()}", f"ON {la}.<field> = {ra}.<field>")
    if types[la][a_key[1]] != types[ra][b_key[1]]:
        raise _invalid(path, eqs[0], f"table {name!r}: {eqs[0].sql()} compares {types[la][a_key[1]]} with "
                                     f"{types[ra][b_key[1]]}, so no pair would match; declare both fields alike")
    between = betweens[0]
    subject, low, high = column(between.this), bound(between.args["low"]), bound(between.args["high"])
    if subject[0] == ra and low[0] == la and high[0] == la:
        left_time, left_until, right_time, lower, upper = low[1], high[1], subject[1], low[2], high[2]
    elif subject[0] == la and low[0] == ra and high[0] == ra and low[1] == high[1]:
        # a.ts BETWEEN b.ts + l AND b.ts + u  <=>  b.ts BETWEEN a.ts - u AND a.ts - l
        left_time = left_until = subject[1]
        right_time, lower, upper = low[1], -high[2], -low[2]
    else:
        raise _fail(path, between, f"table {name!r}: window {between.sql()}",
                    f"{ra}.<time> BETWEEN {la}.<time> [- INTERVAL] AND {la}.<time or until> [+ INTERVAL]")
    for alias, col in ((la, left_time), (la, left_until), (ra, right_time)):
        if types[alias][col] not in TIME_COLUMN_TYPES:
            raise _invalid(path, between, f"table {name!r}: {alias}.{col} is {types[alias][col]}; a join window's "
                                          f"columns are event times, {' or '.join(TIME_COLUMN_TYPES)} (epoch ms)")
    if left_until == left_time and upper < lower:
        raise _invalid(path, between, f"table {name!r}: window {between.sql()} is empty (its upper bound is below "
                                      f"its lower one); swap the bounds")
    spec = StreamJoin(topic=header.get("join_topic", right_node.name), schema=tuple(fields[ra]), kind=kind,
                      left_alias=la, right_alias=ra, left_key=a_key[1], right_key=b_key[1], left_time=left_time,
                      left_until=left_until, right_time=right_time, lower_ms=lower, upper_ms=upper,
                      grace_ms=_duration_option(path, header, "join_grace", 0, name, zero=True),
                      max_window_ms=_duration_option(path, header, "join_max_window", JOIN_MAX_WINDOW_MS, name))
    sides = {alias: _stream(alias, path, "-", f) for alias, f in fields.items()}
    where = select.args.get("where")
    where = _join_where(path, name, where.this, sides, column) if where else None
    shared = dict(name=name, path=path, topic=header.get("topic", left_node.name), stream_schema=fields[la],
                  stream_alias=la, where=where, stream_join=spec, **{**common, "bronze": False, "event_time": None})
    if select.args.get("group"):
        keys, aggregates, columns, schema = _pair_groups(path, name, select, column, types, (a_key, b_key))
        return TableDefinition(kind="aggregate", schema=schema, key_columns=keys, aggregates=aggregates,
                               join_columns=columns, **shared)
    key_name = a_key[1]
    columns, schema = [(STREAM_JOIN_KEY, key_name), (POSITION, POSITION)], [(key_name, types[la][key_name]),
                                                                        (POSITION, "STRING")]
    for projection in select.expressions:
        if isinstance(projection, exp.Star) or isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
            raise _fail(path, projection, f"table {name!r}: SELECT * in a join of two streams", STREAM_JOIN)
        target = projection.this if isinstance(projection, exp.Alias) else projection
        alias, col = column(target)
        out = projection.alias if isinstance(projection, exp.Alias) else col
        if out == key_name and (alias, col) in (a_key, b_key):
            continue                                  # the key column: a's join key, or b's where a has none
        if any(out == o for _, o in columns):
            raise _invalid(path, projection, f"column {out!r} is selected twice, or names the join key or "
                                             f"{POSITION}; rename it with AS")
        columns.append((f"{alias}.{col}", out))
        schema.append((out, types[alias][col]))
    return TableDefinition(kind="source", schema=schema, key_columns=[key_name, POSITION],
                           value_columns=[o for _, o in columns], join_columns=columns, **shared)


# What an aggregate over a windowed join's pairs may compute: a pair is final when it is written,
# but the order pairs are found in is not the streams' order (a bid pairs when its auction comes),
# so LATEST_BY_OFFSET and TOPK's ties, which rank by arrival, would differ from a replay's.
PAIR_AGGREGATES = ("count", "sum", "min", "max", "avg", "count_distinct")


def _pair_groups(path: Path, name: str, select: exp.Select, column, types: dict, join_keys: tuple) -> tuple:
    """A windowed join with GROUP BY (Nexmark q4's `MAX(b.price) ... GROUP BY a.id, a.category`):
    the pairs are folded into their group where they are found, never stored or published as
    rows. The group begins with the join key, so a group lives in the state partition where its
    pairs' records wait. Returns (key columns, aggregates, join_columns, schema): join_columns
    picks each key column and each aggregate's argument (named `alias.column`) from a pair."""
    group = select.args["group"]
    by = [column(node) for node in group.expressions]
    if not by or by[0] not in join_keys or len(set(by)) != len(by):
        raise _invalid(path, group, f"table {name!r}: a join of two streams groups by its join key first ("
                                    f"{' or '.join(f'{a}.{c}' for a, c in join_keys)}), each column once: its "
                                    f"pairs are folded where the join key's records wait; list it first")

    class Scope:        # what _aggregate asks of its scope: an argument is a column of a pair
        def __init__(self) -> None:
            self.path = path

        @staticmethod
        def argument(node: exp.Expression) -> str:
            return ".".join(column(node))

    names, aggregates = {}, []
    for projection in select.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(target, exp.Column):
            found = column(target)
            if found not in by:
                raise _invalid(path, target, f"table {name!r}: column {target.sql()} is neither in GROUP BY nor "
                                             f"aggregated; add it to GROUP BY or aggregate it (e.g. MAX)")
            names[found] = projection.alias if isinstance(projection, exp.Alias) else found[1]
            continue
        if not isinstance(projection, exp.Alias):
            raise _invalid(path, projection, f"table {name!r}: name the aggregate {projection.sql()} with AS")
        aggregate = _aggregate(Scope(), projection.alias, target)
        if aggregate.function not in PAIR_AGGREGATES:
            raise _fail(path, target, f"table {name!r}: {target.sql()} over a windowed join's pairs, which are "
                                      f"found in no stream's order", "COUNT, SUM, MIN, MAX, AVG and COUNT(DISTINCT) "
                                      "over a windowed join; for the others, aggregate its output_topic in a table "
                                      "of its own")
        aggregates.append(aggregate)
    keys = [names.get(found, found[1]) for found in by]
    shown = keys + [a.name for a in aggregates]
    if len(set(shown)) != len(shown):
        raise _invalid(path, select, f"table {name!r}: columns {shown} name one column twice; rename one with AS")
    arguments = list(dict.fromkeys(a for aggregate in aggregates for a in aggregate.args))
    columns = [(STREAM_JOIN_KEY, keys[0])] + [(f"{a}.{c}", k) for (a, c), k in zip(by[1:], keys[1:])] + \
        [(argument, argument) for argument in arguments]
    schema = [(k, types[a][c]) for (a, c), k in zip(by, keys)] + \
        [(argument, types[argument.split(".")[0]][argument.split(".")[1]]) for argument in arguments]
    return keys, aggregates, columns, schema


def stream_join_sides(table: TableDefinition) -> tuple[TableDefinition, TableDefinition]:
    """A windowed join's two streams, each as a source table of its records keyed by position
    (stream_side), as the batch reads and classifies them."""
    j, options = table.stream_join, dict(partitions=table.partitions, event_time_skew_ms=table.event_time_skew_ms)
    return (_stream(j.left_alias, table.path, table.topic, table.stream_schema, **options),
            _stream(j.right_alias, table.path, j.topic, list(j.schema), **options))


def _join_where(path: Path, name: str, node: exp.Expression, sides: dict, column) -> str:
    """A join's WHERE over the joined row, both sides' columns (`a.category = 10 AND b.ts BETWEEN
    a.ts AND a.expires`): a joined row that does not pass is no row, and a change on either side
    that makes it pass or fail adds or deletes it. Evaluated per joined row with
    catalog.expressions (spark_jobs/steps/table_join.JoinShape), so it is written with the names
    `alias.column` as the row dict holds them; TIMESTAMP columns compare as epoch milliseconds."""
    from catalog.expressions import SUPPORTED, compile_predicate

    def qualified(child: exp.Expression) -> exp.Expression:
        if isinstance(child, exp.Column):
            side, col = column(child)
            return exp.column(f"{side}.{col}", quoted=True)
        return child

    rewritten = node.copy().transform(qualified)
    names = {f"{alias}.{col}" for alias, table in sides.items() for col, _ in table.schema}
    try:
        compile_predicate(rewritten, names)
    except UnsupportedSql as exc:
        raise DefinitionError(f"{path}:{_position(node)}: table {name!r}: WHERE {node.sql(dialect='spark')}: "
                              f"{exc.node.sql(dialect='spark').replace(chr(96), '')} is not supported in a join's "
                              f"WHERE (evaluated per joined row). Supported: {SUPPORTED}") from None
    return rewritten.sql(dialect="spark")


def _check_over_table(path: Path, header: dict, name: str, select: exp.Select, input_table: TableDefinition) -> None:
    """What an aggregate over a table's rows cannot have, each refused in one line: it reads the
    table's own topic with its schema, and its rows have no event time or arrival order."""
    for option in ("topic", "event_time", "ttl", "emit", "key_format"):
        if option in header:
            raise DefinitionError(f"{header.where(path, option)}: table {name!r} aggregates the rows of table "
                                  f"{input_table.name!r}, so option {option!r} does not apply (it reads "
                                  f"{input_table.name}'s topic {input_table.topic!r} with its schema); remove it")
    if select.args.get("joins"):
        raise _fail(path, select.args["joins"][0], f"table {name!r}: a JOIN in an aggregate over table "
                                                    f"{input_table.name!r}", OVER_TABLE)


def _check_over_table_select(path: Path, name: str, window, scope: "_Scope", aggregates: list, where) -> None:
    from catalog.expressions import compile_value

    if window is not None:
        raise DefinitionError(f"{path}: table {name!r}: a window in an aggregate over a table's rows is not "
                              f"supported (rows have no event time); GROUP BY columns. Supported: {OVER_TABLE}")
    for column in aggregates:
        if column.function in ("latest_by_offset", "latest_keeping_nulls"):
            raise DefinitionError(f"{path}: table {name!r}: LATEST_BY_OFFSET({', '.join(column.args)}) over a "
                                  f"table's rows: rows have no arrival order; use MAX or TOPK. Supported: {OVER_TABLE}")
    for derived, sql in scope.derived.items():      # computed per row in Python (table_aggregate.RowStage)
        try:
            compile_value(sqlglot.parse_one(sql, dialect="spark"), set(scope.stream_fields))
        except UnsupportedSql as exc:
            raise DefinitionError(f"{path}: table {name!r}: {sql!r}: {exc}; an aggregate over a table's rows "
                                  f"computes expressions with catalog.expressions") from None


def _check_joins(table: TableDefinition, tables: dict[str, TableDefinition]) -> None:
    for join in table.joins:
        other = tables.get(join.table)
        if other is None or other.kind != "source" or read_by_change_topic(other):
            raise DefinitionError(f"{table.path}: JOIN {join.table!r} needs a source table definition "
                                  f"(CREATE TABLE {join.table} (... PRIMARY KEY) WITH (topic=...))")
        if join.table_column not in other.key_columns:
            raise DefinitionError(f"{table.path}: JOIN {join.table} ON ...{join.table_column}: "
                                  f"a table joins on its key {other.key_columns}")
    for qualified, joined, where in table.joined_refs:
        column = qualified.split(".")[-1]
        other = tables[joined]
        if column not in other.value_columns:
            raise DefinitionError(f"{table.path}:{where}: unknown column {qualified}: table {joined!r} has columns "
                                  f"{other.value_columns}")


def load_all(folder: Path | str, broken: dict[str, str] | None = None, only: str | None = None
             ) -> dict[str, TableDefinition]:
    """Every *.sql definition in `folder`, by table name; joined tables must exist.

    Without `broken`, the first bad definition raises. With it, a bad definition costs only
    its own table (and the tables that join it): each goes into `broken` as name -> reason,
    named by its file's stem when it does not parse far enough to have a name.

    A table FROM a source table (an aggregate over its rows) takes that table's schema, so it
    is parsed once the source tables are known."""
    tables: dict[str, TableDefinition] = {}
    paths = definition_files(Path(folder), broken)
    if only is not None:        # one file, `<only>.sql`: a table on other tables does not load this way
        paths = [p for p in paths if p.stem == only]
    parsed = {path: _parsed(path) for path in paths}       # each file once; those FROM a table again below
    sources = {t.name: t for t in reversed(parsed.values())
               if isinstance(t, TableDefinition) and t.kind == "source" and not read_by_change_topic(t)}
    token = _INPUT_TABLES.set(sources)
    try:
        # Twice: a join of tables reads source tables, and is read through its change topic by the
        # tables on it.
        for _ in range(2):
            for path, result in parsed.items():
                if isinstance(result, _NeedsSchema):
                    parsed[path] = _parsed(path)
            for table in parsed.values():
                if isinstance(table, TableDefinition) and read_by_change_topic(table) and table.output_topic \
                        and not (table.kind == "aggregate" and len(table.key_columns) > 1):
                    sources.setdefault(table.name, as_change_topic_source(table))
    finally:
        _INPUT_TABLES.reset(token)
    joins = {t.name: t for t in parsed.values() if isinstance(t, TableDefinition) and read_by_change_topic(t)}
    for path, result in parsed.items():       # FROM a join that publishes no change topic: say so
        if isinstance(result, _NeedsSchema) and result.stream in joins and not joins[result.stream].output_topic:
            parsed[path] = DefinitionError(
                f"{result.table} reads join {result.stream!r}, whose rows reach other tables through its change topic; "
                f"add '-- output_topic: <topic>' to {joins[result.stream].path}")
        elif isinstance(result, _NeedsSchema) and result.stream in joins:      # a source table has one key column
            parsed[path] = DefinitionError(
                f"{result.table} reads {result.stream!r}, an aggregate over a windowed join grouped by "
                f"{joins[result.stream].key_columns}: a table reads one grouped by its join key alone; group "
                f"{result.stream!r} by its join key and take the other columns with MAX")
    _load_each(parsed, tables, broken)
    for table in list(tables.values()):
        try:
            _check_joins(table, tables)
        except DefinitionError as exc:
            if broken is None:
                raise
            broken[table.name] = str(exc)
            del tables[table.name]
    return tables


def _parsed(path: Path) -> "TableDefinition | DefinitionError":
    """One file's table, or its error: any error reading, parsing or compiling it is that table's
    DefinitionError, so no file can raise past load_all."""
    try:
        return parse(path)
    except DefinitionError as exc:
        return exc
    except RecursionError:
        return DefinitionError(f"{path}: the SQL is nested too deeply to compile; simplify it")
    except Exception as exc:    # noqa: BLE001 - whatever a hostile file raises in the parser is its own error
        return DefinitionError(f"{path}: does not load ({type(exc).__name__}: {str(exc)[:200]}); fix the file")


def _load_each(parsed: dict, tables: dict, broken: dict | None) -> None:
    """A name two files define is broken in both: which one runs must not depend on how the
    file names sort (a copy named a_... would silently take over the table)."""
    files: dict[str, list[Path]] = {}
    for path, table in parsed.items():
        if isinstance(table, TableDefinition):
            files.setdefault(table.name, []).append(path)
    for path, table in parsed.items():
        try:
            if isinstance(table, DefinitionError):
                raise table
            if len(files[table.name]) > 1:
                raise DefinitionError(f"table {table.name!r} is defined in {len(files[table.name])} files ("
                                      f"{', '.join(str(p) for p in files[table.name])}); keep one of them")
        except DefinitionError as exc:
            if broken is None:
                raise
            name = table.name if isinstance(table, TableDefinition) else path.stem
            broken[name] = str(exc)
            continue
        tables[table.name] = table
