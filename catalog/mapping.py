"""From a table definition to the state library's table spec and back to rows."""
from __future__ import annotations

import decimal
import math

from state.aggregates import (RETRACTING, Avg, Count, CountDistinct, LatestByOffset, LatestKeepingNulls, Max, Min, RetractingAggregator,
                              RetractingTopN, RowAggregator, Sum, TopN)
from state.table import TableSpec, freeze_meaning
from catalog.definitions import AggregateColumn, TableDefinition


def aggregate_of(column: AggregateColumn):
    if column.function == "topk":
        return TopN(column.n)
    return {"count": Count, "sum": Sum, "min": Min, "max": Max, "avg": Avg,
            "count_distinct": CountDistinct, "latest_by_offset": LatestByOffset,
            "latest_keeping_nulls": LatestKeepingNulls}[column.function]()


def retracting_of(column: AggregateColumn):
    return RetractingTopN(column.n) if column.function == "topk" else RETRACTING[column.function]()


ROWS_STAGE = ".rows"     # an aggregate over a table keeps its input's rows under `<table>.rows` (no table
                         # name has a dot): its first state stage, see spark_jobs/steps/table_aggregate.py


def rows_spec(table: TableDefinition, namespace: str = "") -> TableSpec:
    """The first state stage of an aggregate over a table: each input row by the input's key, so
    that a changed row's old contribution is known and taken out of its old group."""
    name = table.name + ROWS_STAGE
    meaning = table.meaning()
    # The input's rows, whatever the aggregate makes of them: a rebuild adopting a changed
    # aggregate (another GROUP BY or column) keeps this stage as it is.
    rows = {"stage": "rows", **{k: meaning[k] for k in ("topic", "schema", "partitions", "input_table", "key_format",
                                                                          "stream_schema", "stream_join")
                                if k in meaning}}
    if table.table_join:        # its schema is the join's output; the rows are a's, indexed by the join column
        rows.pop("schema")
        rows["index"] = table.joins[0].stream_column.split(".")[-1]
    return TableSpec(name, table.partitions, None, snapshot_keep=table.snapshot_keep,
                     changelog=f"{namespace}{name}-changelog", meaning=freeze_meaning(rows))


def state_spec(table: TableDefinition, namespace: str = "") -> TableSpec:
    aggregator = None
    if table.kind == "aggregate" and table.input_table:
        aggregator = RetractingAggregator({c.name: retracting_of(c) for c in table.aggregates})
    elif table.kind == "aggregate":
        aggregator = RowAggregator({c.name: aggregate_of(c) for c in table.aggregates})
    return TableSpec(table.name, table.partitions, aggregator, snapshot_keep=table.snapshot_keep,
                     changelog=f"{namespace}{table.name}-changelog", meaning=freeze_meaning(table.meaning()),
                     routing_width=table.routing_width, batch_headers=table.output_headers == "batch")


def key_names(table: TableDefinition) -> list[str]:
    """Key column names as rows show them (without a stream alias), plus window_start."""
    names = [k.split(".")[-1] for k in table.key_columns]
    return names + (["window_start"] if table.window else [])


def finite_value(value):
    """NaN and infinities as None: JSON has no such numbers, and state written before they
    were dead-lettered may still hold them."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):      # a DECIMAL is a JSON number, as ksqlDB writes it
        return float(value) if value.is_finite() else None
    if isinstance(value, (tuple, list)):
        return type(value)(finite_value(v) for v in value)
    return value


def row_of(table: TableDefinition, key: tuple, value, aggregator: RowAggregator | None = None) -> dict:
    """One table row as users see it: key columns and final aggregate values.

    Pass the table's `aggregator` when converting many rows; building it is the costly part."""
    row = dict(zip(key_names(table), key))
    if value is None:
        return row
    if table.kind == "source":
        row.update(zip(table.value_columns, value))
    else:
        row.update((aggregator or state_spec(table).aggregator).result(value))
        if table.computed:
            row = _with_computed(table, row)
        if table.having is None:        # else `shown` hides them, after HAVING has read them
            _hide(table, row)
    for name, item in row.items():
        if type(item) is float or isinstance(item, (tuple, list, decimal.Decimal)):
            row[name] = finite_value(item)
    return row


_COMPILED: dict[tuple, object] = {}


def compiled(compile_name: str, sql: str, columns: set[str]):
    """catalog.expressions' `compile_name` of `sql` over `columns`, once per process."""
    key = (compile_name, sql, frozenset(columns))
    if key not in _COMPILED:
        import sqlglot

        from catalog import expressions

        _COMPILED[key] = getattr(expressions, compile_name)(sqlglot.parse_one(sql, dialect="spark"), columns)
    return _COMPILED[key]


def _row_columns(table: TableDefinition) -> set[str]:
    """What HAVING and computed columns may read: the keys and every aggregate, hidden ones too."""
    return set(key_names(table)) | {a.name for a in table.aggregates}


def shown_columns(table: TableDefinition) -> list[str]:
    """The columns of a row as the API shows it."""
    if table.kind == "source":
        return key_names(table) + [c for c in table.value_columns if c not in key_names(table)]
    return key_names(table) + [a.name for a in table.aggregates if not a.hidden] + list(table.computed)


TIME_TYPES = ("TIMESTAMP", "DATE")
_PASSING_TYPE = ("min", "max", "latest_by_offset", "latest_keeping_nulls")   # a result of its input's type


def time_columns(table: TableDefinition, tables: dict[str, TableDefinition] | None = None) -> dict[str, str]:
    """The shown columns that hold a TIMESTAMP (epoch milliseconds in the state) or a DATE (days
    since 1970), by name: what a reader turns into ISO 8601 (serving.presenters). A joined
    table's column is found in `tables` when given. window_start stays epoch milliseconds, as
    ksqlDB's WINDOWSTART: it is a number a client computes with, and the key it queries by."""
    fields = dict(table.schema)
    joined = {j.alias: dict((tables or {})[j.table].schema) for j in table.joins if j.table in (tables or {})}

    def type_of(column: str) -> str | None:
        if column in fields:        # an aggregate over a windowed join names its arguments `alias.column`
            return fields[column]
        alias, _, name = column.rpartition(".")
        if alias and alias != table.stream_alias:
            return joined.get(alias, {}).get(name)
        return fields.get(name)

    found = {name: table.key_types.get(key) or type_of(key)
             for key, name in zip(table.key_columns, key_names(table))}
    if table.kind == "source":
        found.update((name, fields.get(name)) for name in table.value_columns)
    found.update((a.name, type_of(a.args[0])) for a in table.aggregates
                 if a.function in _PASSING_TYPE and len(a.args) == 1 and a.args[0] not in table.derived)
    if table.kind == "source":      # a join's columns (an aggregate's join_columns are its arguments)
        found.update((name, fields.get(name) or type_of(column)) for column, name in table.join_columns)
    return {name: dtype for name, dtype in found.items() if dtype in TIME_TYPES}


def _with_computed(table: TableDefinition, row: dict) -> dict:
    """The row with its computed SELECT columns."""
    row.update({name: compiled("compile_value", sql, _row_columns(table))(row) for name, sql in table.computed.items()})
    return row


def computed_columns(table: TableDefinition, names: list[str], columns: list[list], values: list) -> list[list]:
    """Each computed column's values (None where `values` says the row is gone), as _with_computed
    gives them, from the rows' key and aggregate results held as columns (`names`, hidden
    aggregates too): a dict a row for the expressions, and no row_of, _hide or JSON of the
    whole row (a mirror of q17's 30,000 keys a task: 374 ms row by row)."""
    functions = [compiled("compile_value", sql, _row_columns(table)) for sql in table.computed.values()]
    out: list[list] = [[] for _ in functions]
    appends = [(column.append, function) for column, function in zip(out, functions)]
    for row_values, value in zip(zip(*columns), values):
        if value is None:
            for append, _ in appends:
                append(None)
            continue
        row = dict(zip(names, row_values))
        for append, function in appends:
            append(function(row))
    return out


def shown(table: TableDefinition, row: dict | None) -> dict | None:
    """`row` if the table shows it: HAVING (catalog/expressions.py) hides a row that does not pass,
    while the state keeps its aggregate."""
    if row is None or table.having is None:
        return row
    passes = compiled("compile_predicate", table.having, _row_columns(table) | set(table.computed))
    return _hide(table, row) if passes(row) else None


def _hide(table: TableDefinition, row: dict) -> dict:
    """The row without the aggregates kept only for computed columns, HAVING or the TTL."""
    for aggregate in table.aggregates:
        if aggregate.hidden:
            row.pop(aggregate.name, None)
    return row
