"""HAVING and computed SELECT columns: expressions over a table's rows as the API shows them,
with SQL's NULLs and three-valued logic.

The state keeps every key's aggregate; HAVING only decides which rows the query API, the push
queries, the change topic and the Delta mirror show (a row that stops passing is a delete
there, as ksqlDB emits a tombstone). So a HAVING change never touches state, and verify, which
compares state, is unaffected by it.
"""
from __future__ import annotations

import datetime as dt
import decimal
import math
import operator
from typing import Callable

from sqlglot import exp

SUPPORTED = ("column names (the key columns and the aggregates' aliases), the aggregates SELECT names, numbers, "
             "strings, TRUE/FALSE/NULL, = != <> < <= > >=, + - * / %, AND, OR, NOT, IS [NOT] NULL, IN (...), "
             "BETWEEN, CASE, IF, CAST and TRY_CAST (to STRING, BIGINT, INT, DOUBLE, FLOAT, BOOLEAN), COALESCE, "
             "NULLIF, GREATEST, LEAST, ABS, ROUND, FLOOR, CEIL, UPPER, LOWER, LENGTH, TRIM, SUBSTRING, CONCAT, ||, "
             "REPLACE, and YEAR, MONTH, DAY, HOUR, MINUTE, DAYOFWEEK, TO_DATE, DATE_TRUNC over epoch milliseconds "
             "(window_start, window_end) or ISO text")

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
    function = _function(node, columns)
    if function is not None:
        return function
    raise Unsupported(node, f"{node.key.upper()} ({node.sql()})")


def _round_half_up(value, digits: int):
    """ROUND as Spark SQL rounds: halves away from zero (Python's round goes to even)."""
    if isinstance(value, int) and digits >= 0:
        return value
    rounded = decimal.Decimal(repr(value)).quantize(decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP)
    return float(rounded) if isinstance(value, float) else int(rounded)


def _to_int(value):
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)             # toward zero, as Spark casts a fraction


def _to_bool(value):
    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.strip().lower())
    return bool(value)


def _to_text(value):
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _to_float(value):
    try:
        return float(value)
    except ValueError:
        return None


_CASTS = {"TEXT": _to_text, "VARCHAR": _to_text, "CHAR": _to_text, "BIGINT": _to_int, "INT": _to_int,
          "SMALLINT": _to_int, "TINYINT": _to_int, "DOUBLE": _to_float, "FLOAT": _to_float, "BOOLEAN": _to_bool}
_ONE_ARGUMENT = {exp.Upper: str.upper, exp.Lower: str.lower, exp.Length: len, exp.Trim: str.strip, exp.Abs: abs,
                 exp.Floor: math.floor, exp.Ceil: math.ceil}


def _null_safe(function, *parts):
    """A function of compiled parts that is NULL when any part is (SQL's rule for these functions)."""
    def value(row):
        args = [p(row) for p in parts]
        if any(a is None for a in args):
            return None
        try:
            return function(*args)
        except (TypeError, ValueError, AttributeError, OverflowError):
            return None
    return value


def _function(node: exp.Expression, columns: set[str]) -> Callable[[dict], object] | None:
    """The function calls rows may use (SUPPORTED), compiled; None for anything else."""
    def part(child):
        return _compile(child, columns)

    if isinstance(node, exp.Case):
        operand = part(node.this) if node.this is not None else None
        branches = [(part(branch.this), part(branch.args["true"])) for branch in node.args["ifs"]]
        default = part(node.args["default"]) if node.args.get("default") is not None else (lambda row: None)

        def case(row):
            subject = operand(row) if operand is not None else None
            for condition, result in branches:
                test = condition(row)
                if (test is True) if operand is None else (subject is not None and test == subject):
                    return result(row)
            return default(row)
        return case
    if isinstance(node, exp.If):
        condition, yes = part(node.this), part(node.args["true"])
        no = part(node.args["false"]) if node.args.get("false") is not None else (lambda row: None)
        return lambda row: yes(row) if condition(row) is True else no(row)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        parts = [part(node.this)] + [part(e) for e in node.expressions]
        if isinstance(node, exp.Coalesce):
            return lambda row: next((v for v in (p(row) for p in parts) if v is not None), None)
        pick = max if isinstance(node, exp.Greatest) else min
        # Spark's GREATEST and LEAST skip NULLs; NULL only when every argument is
        return lambda row: pick(values) if (values := [v for v in (p(row) for p in parts) if v is not None]) else None
    if isinstance(node, exp.Nullif):
        left, right = part(node.this), part(node.expression)
        return lambda row: None if (v := left(row)) == right(row) else v
    if isinstance(node, (exp.Cast, exp.TryCast)):
        target = node.args["to"].this.name
        if target not in _CASTS:
            raise Unsupported(node, f"CAST to {node.args['to'].sql()} (casts go to {sorted(_CASTS)})")
        return _null_safe(_CASTS[target], part(node.this))
    if type(node) in _ONE_ARGUMENT:
        return _null_safe(_ONE_ARGUMENT[type(node)], part(node.this))
    if isinstance(node, exp.Round):
        digits = part(node.args["decimals"]) if node.args.get("decimals") is not None else (lambda row: 0)
        return _null_safe(_round_half_up, part(node.this), digits)
    if isinstance(node, (exp.Concat, exp.DPipe)):
        items = node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression]
        return _null_safe(lambda *texts: "".join(_to_text(t) for t in texts), *[part(i) for i in items])
    if isinstance(node, exp.Substring):
        start = part(node.args["start"]) if node.args.get("start") is not None else (lambda row: 1)
        length = part(node.args["length"]) if node.args.get("length") is not None else (lambda row: 1 << 62)
        return _null_safe(_substring, part(node.this), start, length)
    if isinstance(node, exp.TsOrDsToDate):
        return _null_safe(lambda v: _instant(v).date().isoformat(), part(node.this))     # as JSON shows a DATE
    if type(node) in _DATE_PARTS:
        return _null_safe(lambda v, pick=_DATE_PARTS[type(node)]: pick(_instant(v)), part(node.this))
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = node.args["unit"].name.upper()
        if unit not in _TRUNCATE:
            raise Unsupported(node, f"DATE_TRUNC to {unit} (units {sorted(_TRUNCATE)})")
        return _null_safe(lambda v: _truncated(v, unit), part(node.this))
    if isinstance(node, exp.Replace):
        return _null_safe(lambda text, old, new: text.replace(old, new), part(node.this), part(node.expression),
                          part(node.args["replacement"]))
    return None


def _instant(value) -> dt.datetime:
    """A row's time value as a UTC datetime: epoch milliseconds (window_start, window_end), a
    date or datetime, or ISO text."""
    if isinstance(value, bool):
        raise TypeError("a boolean is no time")
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value / 1000, tz=dt.timezone.utc)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


_DATE_PARTS = {exp.Year: lambda t: t.year, exp.Month: lambda t: t.month, exp.Day: lambda t: t.day,
               exp.Hour: lambda t: t.hour, exp.Minute: lambda t: t.minute,
               exp.DayOfWeek: lambda t: t.isoweekday() % 7 + 1}         # Spark: 1 = Sunday
_TRUNCATE = {"YEAR": dict(month=1, day=1, hour=0, minute=0, second=0, microsecond=0),
             "MONTH": dict(day=1, hour=0, minute=0, second=0, microsecond=0),
             "DAY": dict(hour=0, minute=0, second=0, microsecond=0),
             "HOUR": dict(minute=0, second=0, microsecond=0), "MINUTE": dict(second=0, microsecond=0)}


def _truncated(value, unit: str):
    """DATE_TRUNC, giving back the kind it was given: epoch milliseconds stay milliseconds, and
    anything else becomes ISO text in UTC."""
    cut = _instant(value).replace(**_TRUNCATE[unit])
    return int(cut.timestamp() * 1000) if isinstance(value, (int, float)) else cut.strftime("%Y-%m-%dT%H:%M:%SZ")


def _substring(text: str, start: int, length: int) -> str:
    """SUBSTRING as Spark SQL counts: from 1, a negative start from the end, 0 as 1."""
    if length < 0:
        return ""
    begin = start - 1 if start > 0 else (max(len(text) + start, 0) if start < 0 else 0)
    return text[begin:begin + length]


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
