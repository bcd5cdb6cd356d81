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

import re
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp

from state.windows import WindowSpec

SUPPORTED = (
    "CREATE TABLE t (col TYPE PRIMARY KEY, ...) WITH (topic='...') for source tables; "
    "CREATE TABLE t AS SELECT key, AGG(...) AS name FROM stream [JOIN|LEFT JOIN table ON stream.col = table.key] "
    "[WHERE ...] GROUP BY key [, TUMBLE(ts, size[, grace]) | HOP(ts, size, advance[, grace])] with AGG one of "
    "COUNT, SUM, MIN, MAX, AVG, COUNT(DISTINCT x), LATEST_BY_OFFSET(x), TOPK(n, score, col, ...)"
)
HEADER_KEYS = {
    "topic", "schema", "partitions", "schedule", "max_records_per_batch", "snapshot_every", "event_time",
    "key_field", "snapshot_keep", "max_batches_per_run",
}
SPARK_TYPES = {"STRING", "BIGINT", "INT", "DOUBLE", "FLOAT", "BOOLEAN", "TIMESTAMP", "DATE", "LONG", "DECIMAL"}


class DefinitionError(ValueError):
    """A table definition the product cannot run; the message says where and how to fix it."""


@dataclass(frozen=True)
class AggregateColumn:
    name: str
    function: str            # count, sum, min, max, avg, count_distinct, latest_by_offset, topk
    args: tuple[str, ...]    # input columns (qualified "alias.col" where joins exist)
    n: int | None = None     # TOPK's N


@dataclass(frozen=True)
class JoinSpec:
    table: str               # a source table definition
    alias: str
    kind: str                # "inner" | "left"
    stream_column: str
    table_column: str


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
    event_time: str | None = None
    aggregates: list[AggregateColumn] = field(default_factory=list)
    joins: list[JoinSpec] = field(default_factory=list)
    where: str | None = None                   # a Spark SQL predicate over the stream
    window: WindowSpec | None = None
    stream_alias: str | None = None
    value_columns: list[str] = field(default_factory=list)   # source tables



def _fail(path: Path, node: exp.Expression | None, construct: str, hint: str = SUPPORTED) -> DefinitionError:
    meta = {}
    if node is not None:
        meta = node.meta or (node.this.meta if isinstance(node.this, exp.Expression) else {}) or {}
        if not meta:
            for child in node.walk():
                if getattr(child, "meta", None):
                    meta = child.meta
                    break
    where = f"{path}:{meta.get('line', '?')}:{meta.get('col', '?')}"
    return DefinitionError(f"{where}: {construct} is not supported. Supported: {hint}")


def _parse_header(path: Path, text: str) -> tuple[dict[str, str], int]:
    header: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break
        match = re.match(r"--\s*([a-z_]+)\s*:\s*(.+)$", stripped)
        if not match:
            continue
        key, value = match.group(1), match.group(2).strip()
        if key not in HEADER_KEYS:
            raise DefinitionError(f"{path}:{number}: unknown option {key!r}; use one of {sorted(HEADER_KEYS)}")
        header[key] = value
    return header, 0


def _int_option(path: Path, header: dict, key: str, default: int, low: int = 1) -> int:
    raw = header.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise DefinitionError(f"{path}: option {key}={raw!r} must be an integer, e.g. {default}") from None
    if value < low:
        raise DefinitionError(f"{path}: option {key}={value} must be at least {low}")
    return value


def _parse_schema(path: Path, raw: str) -> list[tuple[str, str]]:
    columns = []
    for part in raw.split(","):
        bits = part.split()
        if len(bits) != 2 or bits[1].upper().split("(")[0] not in SPARK_TYPES:
            raise DefinitionError(
                f"{path}: schema entry {part.strip()!r} must be 'name TYPE' with TYPE one of {sorted(SPARK_TYPES)}")
        columns.append((bits[0], bits[1].upper()))
    return columns


def _interval_ms(path: Path, node: exp.Expression) -> int:
    if isinstance(node, exp.Interval):
        amount = float(node.this.name)
        unit = (node.unit.name if node.unit else "SECOND").upper().rstrip("S")
        factor = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}.get(unit)
        if factor:
            return int(amount * factor)
    raise _fail(path, node, f"window length {node.sql()}", "INTERVAL 'n' SECOND|MINUTE|HOUR|DAY")


def _column_name(path: Path, node: exp.Expression, aliases: dict[str, str]) -> str:
    if not isinstance(node, exp.Column):
        raise _fail(path, node, f"expression {node.sql()} as an aggregate input", "a plain column")
    table = node.table
    if table and table not in aliases:
        raise _fail(path, node, f"unknown table alias {table!r}", f"one of {sorted(aliases)}")
    return f"{table}.{node.name}" if table else node.name


def _aggregate(path: Path, alias: str, func: exp.Expression, aliases: dict[str, str]) -> AggregateColumn:
    if isinstance(func, exp.Count):
        inner = func.this
        if isinstance(inner, exp.Distinct):
            (col,) = inner.expressions
            return AggregateColumn(alias, "count_distinct", (_column_name(path, col, aliases),))
        if isinstance(inner, exp.Star):
            return AggregateColumn(alias, "count", ())
        return AggregateColumn(alias, "count", (_column_name(path, inner, aliases),))
    simple = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
    for cls, name in simple.items():
        if isinstance(func, cls):
            return AggregateColumn(alias, name, (_column_name(path, func.this, aliases),))
    if isinstance(func, exp.Anonymous):
        name = func.name.upper()
        args = func.expressions
        if name == "LATEST_BY_OFFSET" and len(args) == 1:
            return AggregateColumn(alias, "latest_by_offset", (_column_name(path, args[0], aliases),))
        if name == "TOPK" and len(args) >= 2 and isinstance(args[0], exp.Literal) and args[0].is_int:
            return AggregateColumn(alias, "topk", tuple(_column_name(path, a, aliases) for a in args[1:]),
                                   n=int(args[0].name))
    raise _fail(path, func, f"aggregate {func.sql()}")


def _window(path: Path, node: exp.Anonymous) -> tuple[str, WindowSpec]:
    name, args = node.name.upper(), node.expressions
    if name == "TUMBLE" and len(args) in (2, 3):
        size = _interval_ms(path, args[1])
        grace = _interval_ms(path, args[2]) if len(args) == 3 else 0
        return args[0].name, WindowSpec(size_ms=size, grace_ms=grace, retention_ms=size)
    if name == "HOP" and len(args) in (3, 4):
        size, advance = _interval_ms(path, args[1]), _interval_ms(path, args[2])
        grace = _interval_ms(path, args[3]) if len(args) == 4 else 0
        try:
            return args[0].name, WindowSpec(size_ms=size, advance_ms=advance, grace_ms=grace, retention_ms=size)
        except ValueError as exc:
            raise _fail(path, node, f"window {node.sql()} ({exc})") from None
    raise _fail(path, node, f"GROUP BY {node.sql()}")


def parse(path: Path | str, text: str | None = None) -> TableDefinition:
    path = Path(path)
    text = path.read_text() if text is None else text
    header, _ = _parse_header(path, text)
    try:
        statements = [s for s in sqlglot.parse(text, dialect="spark") if s is not None]
    except sqlglot.errors.ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        raise DefinitionError(f"{path}:{err.get('line', '?')}:{err.get('col', '?')}: SQL does not parse "
                              f"({err.get('description', exc)}). Supported: {SUPPORTED}") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Create):
        raise DefinitionError(f"{path}: expected exactly one CREATE TABLE statement. Supported: {SUPPORTED}")
    create = statements[0]
    common = dict(
        partitions=_int_option(path, header, "partitions", 4),
        max_records_per_batch=_int_option(path, header, "max_records_per_batch", 1_000_000),
        max_batches_per_run=_int_option(path, header, "max_batches_per_run", 10),
        snapshot_every=_int_option(path, header, "snapshot_every", 10),
        snapshot_keep=_int_option(path, header, "snapshot_keep", 3),
        schedule=header.get("schedule", "*/5 * * * *"),
        event_time=header.get("event_time"),
    )
    if isinstance(create.this, exp.Schema):
        return _source_table(path, create, header, common)
    return _aggregate_table(path, create, header, common)


def _source_table(path, create: exp.Create, header: dict, common: dict) -> TableDefinition:
    schema_node = create.this
    name = schema_node.this.name
    columns, keys = [], []
    for col in schema_node.expressions:
        if not isinstance(col, exp.ColumnDef):
            raise _fail(path, col, f"table element {col.sql()}", "column definitions with one PRIMARY KEY")
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
    if not topic:
        raise DefinitionError(f"{path}: source table {name!r} needs a topic: WITH (topic='...') or '-- topic: ...'")
    return TableDefinition(name=name, path=path, kind="source", topic=topic, schema=columns, key_columns=keys,
                           value_columns=[c for c, _ in columns], **common)


def _aggregate_table(path, create: exp.Create, header: dict, common: dict) -> TableDefinition:
    name = create.this.name
    select = create.expression
    if not isinstance(select, exp.Select):
        raise _fail(path, select, "a CREATE TABLE without AS SELECT or a column list")
    for unsupported in ("having", "order", "limit", "distinct", "with"):
        if select.args.get(unsupported):
            raise _fail(path, select.args[unsupported], unsupported.upper())
    source = select.args.get("from") or select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        raise _fail(path, select, "a SELECT without FROM <stream>")
    stream = source.this
    stream_alias = stream.alias or stream.name
    aliases = {stream_alias: stream.name}
    joins = []
    for join in select.args.get("joins") or []:
        table = join.this
        if not isinstance(table, exp.Table):
            raise _fail(path, join, f"JOIN {join.this.sql()}", "JOIN <source table> [alias] ON stream.col = table.key")
        kind = (join.side or "").lower() or "inner"
        if kind not in ("inner", "left") or join.kind and join.kind.upper() not in ("INNER", "OUTER"):
            raise _fail(path, join, f"{join.side or ''} {join.kind or ''} JOIN".strip(), "JOIN or LEFT JOIN")
        alias = table.alias or table.name
        aliases[alias] = table.name
        on = join.args.get("on")
        if not isinstance(on, exp.EQ) or not all(isinstance(s, exp.Column) for s in (on.left, on.right)):
            raise _fail(path, on or join, f"join condition {on.sql() if on else '(none)'}", "ON stream.col = table.key")
        left, right = on.left, on.right
        if left.table == alias:
            left, right = right, left
        joins.append(JoinSpec(table.name, alias, kind, _column_name(path, left, aliases), right.name))

    group = select.args.get("group")
    if group is None:
        raise _fail(path, select, "an aggregate without GROUP BY")
    keys, window = [], None
    event_time = common.get("event_time")
    for item in group.expressions:
        if isinstance(item, exp.Column):
            keys.append(_column_name(path, item, aliases))
        elif isinstance(item, exp.Anonymous) and item.name.upper() in ("TUMBLE", "HOP"):
            event_time, window = _window(path, item)
        else:
            raise _fail(path, item, f"GROUP BY {item.sql()}")
    aggregates = []
    for projection in select.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(target, exp.Column):
            if _column_name(path, target, aliases) not in keys:
                raise _fail(path, target, f"column {target.sql()} outside GROUP BY and outside an aggregate")
            continue
        if not isinstance(projection, exp.Alias):
            raise _fail(path, projection, f"aggregate {projection.sql()} without an alias", "AGG(...) AS name")
        aggregates.append(_aggregate(path, projection.alias, target, aliases))
    if not aggregates:
        raise _fail(path, select, "a GROUP BY without aggregates")
    where = select.args.get("where")
    topic = header.get("topic", stream.name)
    schema_raw = header.get("schema")
    if not schema_raw:
        raise DefinitionError(f"{path}: table {name!r} reads stream {stream.name!r}; declare its JSON fields "
                              f"with '-- schema: field TYPE, ...'")
    common["event_time"] = event_time
    return TableDefinition(
        name=name, path=path, kind="aggregate", topic=topic, schema=_parse_schema(path, schema_raw),
        key_columns=keys, aggregates=aggregates, joins=joins, window=window, stream_alias=stream_alias,
        where=where.this.sql(dialect="spark") if where else None, **common,
    )


def load_all(folder: Path | str) -> dict[str, TableDefinition]:
    """Every *.sql definition in `folder`, by table name; joined tables must exist."""
    tables = {}
    for path in sorted(Path(folder).glob("*.sql")):
        table = parse(path)
        if table.name in tables:
            raise DefinitionError(f"{path}: table {table.name!r} is also defined in {tables[table.name].path}")
        tables[table.name] = table
    for table in tables.values():
        for join in table.joins:
            other = tables.get(join.table)
            if other is None or other.kind != "source":
                raise DefinitionError(f"{table.path}: JOIN {join.table!r} needs a source table definition "
                                      f"(CREATE TABLE {join.table} (... PRIMARY KEY) WITH (topic=...))")
            if join.table_column not in other.key_columns:
                raise DefinitionError(f"{table.path}: JOIN {join.table} ON ...{join.table_column}: "
                                      f"a table joins on its key {other.key_columns}")
    return tables
