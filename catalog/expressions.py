"""HAVING: a predicate over a table's rows as the API shows them, with SQL's three-valued logic.

The state keeps every key's aggregate; HAVING only decides which rows the query API, the push
queries, the change topic and the Delta mirror show (a row that stops passing is a delete
there, as ksqlDB emits a tombstone). So a HAVING change never touches state, and verify, which
compares state, is unaffected by it.
"""
from __future__ import annotations

import operator
from typing import Callable

from sqlglot import exp

SUPPORTED = ("column names (the key columns and the aggregates' aliases), the aggregates SELECT names, numbers, "
             "strings, TRUE/FALSE/NULL, = != <> < <= > >=, + - * / %, AND, OR, NOT, IS [NOT] NULL, IN (...), "
             "BETWEEN")

_COMPARE = {exp.EQ: operator.eq, exp.NEQ: operator.ne, exp.GT: operator.gt, exp.GTE: operator.ge,
            exp.LT: operator.lt, exp.LTE: operator.le}
_ARITHMETIC = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul, exp.Mod: operator.mod}


class Unsupported(ValueError):
    """A construct outside SUPPORTED; `node` is where it is."""

    def __init__(self, node: exp.Expression, what: str) -> None:
        super().__init__(what)
        self.node = node


def compile_predicate(node: exp.Expression, columns: set[str]) -> Callable[[dict], bool]:
    """`node` (sqlglot, over `columns`) as a function of a row dict: True only when the predicate is
    true; false and unknown (NULL) both hide the row, as in SQL."""
    value = _compile(node, columns)
    return lambda row: value(row) is True


def compile_value(node: exp.Expression, columns: set[str]) -> Callable[[dict], object]:
    """`node` as a function of a row dict giving its value (None for SQL's NULL; x / 0 is NULL, as
    in Spark SQL)."""
    return _compile(node, columns)


def _compile(node: exp.Expression, columns: set[str]) -> Callable[[dict], object]:
    if isinstance(node, exp.Paren):
        return _compile(node.this, columns)
    if isinstance(node, exp.Column):
        if node.name not in columns:
            raise Unsupported(node, f"column {node.sql()} (the rows have {sorted(columns)})")
        name = node.name
        return lambda row: row.get(name)
    if isinstance(node, exp.Literal):
        value = node.this if node.is_string else (int(node.this) if node.this.lstrip("-").isdigit()
                                                   else float(node.this))
        return lambda row: value
    if isinstance(node, exp.Boolean):
        value = bool(node.this)
        return lambda row: value
    if isinstance(node, exp.Null):
        return lambda row: None
    if isinstance(node, exp.Neg):
        inner = _compile(node.this, columns)
        return lambda row: None if (v := inner(row)) is None else -v
    if isinstance(node, exp.Not):
        inner = _compile(node.this, columns)
        return lambda row: None if (v := inner(row)) is None else not v
    if isinstance(node, exp.And):
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: _and(left(row), right(row))
    if isinstance(node, exp.Or):
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: _or(left(row), right(row))
    if type(node) in _COMPARE or type(node) in _ARITHMETIC:
        op = _COMPARE.get(type(node)) or _ARITHMETIC[type(node)]
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: _strict(op, left(row), right(row))
    if isinstance(node, exp.Div):
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: None if (r := right(row)) in (None, 0) or (lv := left(row)) is None else lv / r
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = _compile(node.this, columns)
        return lambda row: inner(row) is None
    if isinstance(node, exp.In) and not node.args.get("query"):
        inner = _compile(node.this, columns)
        options = [_compile(v, columns) for v in node.expressions]
        return lambda row: None if (v := inner(row)) is None else v in [o(row) for o in options]
    if isinstance(node, exp.Between):
        inner = _compile(node.this, columns)
        low, high = _compile(node.args["low"], columns), _compile(node.args["high"], columns)
        return lambda row: _and(_strict(operator.ge, inner(row), low(row)), _strict(operator.le, inner(row), high(row)))
    raise Unsupported(node, f"{node.key.upper()} ({node.sql()})")


def _strict(op, left, right):
    if left is None or right is None:
        return None
    try:
        return op(left, right)
    except (TypeError, ZeroDivisionError):
        return None


def _and(left, right):
    if left is False or right is False:
        return False
    return None if left is None or right is None else bool(left and right)


def _or(left, right):
    if left is True or right is True:
        return True
    return None if left is None or right is None else bool(left or right)
