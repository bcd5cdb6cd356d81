"""A table's WHERE for the Arrow pass: its Spark SQL, parsed by sqlglot, as a pyarrow compute
expression, or ArrowUnsupported naming what it cannot express (the table then runs the Spark-SQL
pass, arrow_pass.check_supported). What it does express must agree with Spark SQL row for row,
nulls included (tests/test_fuzz.py holds it)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import TableDefinition
from catalog.expressions import backslash_escaped
from spark_jobs.errors import ArrowUnsupported
from spark_jobs.frames.arrow_values import date_days, timestamp_ms

__all__ = ["where_expression"]


def where_expression(table: TableDefinition):
    """The table's WHERE (Spark SQL, parsed by sqlglot) as a pyarrow expression. A row passes only
    when it is true; `Table.filter` drops nulls, which is SQL's rule."""
    import sqlglot
    from sqlglot import exp

    fields = dict(table.schema)

    def literal_for(node, other_type):
        value = convert(node)
        if other_type in ("TIMESTAMP", "DATE") and isinstance(value, str):
            parsed = timestamp_ms(value) if other_type == "TIMESTAMP" else date_days(value)
            if parsed is None:
                raise ArrowUnsupported(f"literal {node.sql()} is not a {other_type}")
            return pa.scalar(parsed * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")) \
                if other_type == "TIMESTAMP" else pa.scalar(parsed, pa.date32())
        return value

    def column_type(node):
        return fields.get(node.name) if isinstance(node, exp.Column) else None

    binary = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal",
              exp.LT: "less", exp.LTE: "less_equal", exp.Add: "add_checked", exp.Sub: "subtract_checked",
              exp.Mul: "multiply_checked"}

    def convert(node):
        if isinstance(node, exp.Paren):
            return convert(node.this)
        if isinstance(node, exp.Column):
            if node.name not in fields:
                raise ArrowUnsupported(f"column {node.sql()}")
            return pc.field(node.name)
        if isinstance(node, exp.Boolean):
            return pc.scalar(bool(node.this))
        if isinstance(node, exp.Null):
            return pc.scalar(None)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.this
            text = node.this
            return int(text) if text.lstrip("-").isdigit() else float(text)
        if isinstance(node, exp.Neg):
            return pc.negate_checked(convert(node.this))
        if isinstance(node, exp.Not):
            return ~convert(node.this)
        if isinstance(node, exp.And):
            return convert(node.left) & convert(node.right)
        if isinstance(node, exp.Or):
            return convert(node.left) | convert(node.right)
        if type(node) in binary:
            left, right = node.left, node.right
            lv = literal_for(left, column_type(right)) if not isinstance(left, exp.Column) else convert(left)
            rv = literal_for(right, column_type(left)) if not isinstance(right, exp.Column) else convert(right)
            return pc.Expression._call(binary[type(node)], [_expr(lv), _expr(rv)])
        if isinstance(node, exp.Div):
            return pc.Expression._call("divide", [pc.Expression._call("cast", [_expr(convert(node.left))],
                                                                      pc.CastOptions(pa.float64())),
                                                  _expr(convert(node.right))])
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return pc.field(node.this.name).is_null() if isinstance(node.this, exp.Column) \
                else _expr(convert(node.this)).is_null()
        if isinstance(node, exp.In) and not node.args.get("query"):
            values = [literal_for(v, column_type(node.this)) for v in node.expressions]
            return _expr(convert(node.this)).isin(values)
        if isinstance(node, exp.Between):
            target = node.this
            low = literal_for(node.args["low"], column_type(target))
            high = literal_for(node.args["high"], column_type(target))
            return (_expr(convert(target)) >= _expr(low)) & (_expr(convert(target)) <= _expr(high))
        escape = None
        if isinstance(node, exp.Escape) and isinstance(node.this, (exp.Like, exp.ILike)):
            escape, node = node.expression, node.this
            if not (isinstance(escape, exp.Literal) and escape.is_string):
                raise ArrowUnsupported(f"ESCAPE {escape.sql()}")
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise ArrowUnsupported(f"LIKE {pattern.sql()}")
            try:
                text = backslash_escaped(pattern.this, escape and escape.this)
            except ValueError as exc:
                raise ArrowUnsupported(str(exc)) from None
            # sqlglot keeps NOT LIKE as Like(negate=True) rather than Not(Like): honour it.
            matched = pc.Expression._call("match_like", [_expr(convert(node.this))],
                                          pc.MatchSubstringOptions(text, ignore_case=isinstance(node, exp.ILike)))
            return ~matched if node.args.get("negate") else matched
        raise ArrowUnsupported(f"{node.key.upper()} in WHERE")

    return convert(sqlglot.parse_one(table.where, dialect="spark"))


def _expr(value):
    return value if isinstance(value, pc.Expression) else pc.scalar(value)
