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
import re
from typing import Callable

from sqlglot import exp
from catalog.errors import UnsupportedSql

SUPPORTED = ("column names (the key columns and the aggregates' aliases), the aggregates SELECT names, numbers, "
             "strings, TRUE/FALSE/NULL, = != <> < <= > >=, + - * / %, AND, OR, NOT, IS [NOT] NULL, IN (...), "
             "BETWEEN, CASE, IF, CAST and TRY_CAST (to STRING, BIGINT, INT, DOUBLE, FLOAT, BOOLEAN), COALESCE, "
             "NULLIF, GREATEST, LEAST, ABS, ROUND, FLOOR, CEIL, UPPER, LOWER, INITCAP, LENGTH, TRIM, SUBSTRING, "
             "CONCAT, ||, REPLACE, and YEAR, MONTH, DAY, HOUR, MINUTE, DAYOFWEEK, TO_DATE, DATE_TRUNC over epoch "
             "milliseconds (window_start, window_end) or ISO text")

_COMPARE = {exp.EQ: lambda c: c == 0, exp.NEQ: lambda c: c != 0, exp.GT: lambda c: c > 0,
            exp.GTE: lambda c: c >= 0, exp.LT: lambda c: c < 0, exp.LTE: lambda c: c <= 0}
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.Div)
# Errors a row's value can raise inside an operator; each is SQL's NULL there, as in Spark SQL
# with ANSI off (a definition's construct that cannot work is refused when the table loads).
_VALUE_ERRORS = (ArithmeticError, TypeError, ValueError, AttributeError, OverflowError, IndexError)
_DECIMALS = decimal.Context(prec=400, Emax=999999, Emin=-999999, traps=[])
_DECIMAL_LIMIT = decimal.Decimal(10) ** 38          # Spark's DECIMAL(38): past it, NULL
MAX_ROUND_DIGITS = 38


def compile_predicate(node: exp.Expression, columns: set[str]) -> Callable[[dict], bool]:
    """`node` (sqlglot, over `columns`) as a function of a row dict: True only when the predicate is
    true; false and unknown (NULL) both hide the row, as in SQL."""
    value = _total(_compile(node, columns))
    return lambda row: value(row) is True


def compile_value(node: exp.Expression, columns: set[str] | dict[str, str]) -> Callable[[dict], object]:
    """`node` as a function of a row dict giving its value (None for SQL's NULL; x / 0 is NULL, as
    in Spark SQL). Total: no row makes it raise, so no row can stop a table's merge or answer 500.
    `columns` names what rows hold, or maps each name to its SQL type (see _COMBINING)."""
    return _total(_compile(node, columns))


def _total(function):
    def value(row):
        try:
            return _finite(function(row))
        except _VALUE_ERRORS:
            return None
    return value


def _finite(value):
    """NaN and infinities as NULL: JSON has no such numbers, and Spark SQL's would never compare
    as a reader expects."""
    if type(value) is float and not math.isfinite(value):
        return None
    if isinstance(value, decimal.Decimal) and (not value.is_finite() or abs(value) >= _DECIMAL_LIMIT):
        return None
    return value


def _wrap64(value: int) -> int:
    """BIGINT arithmetic as Spark's with ANSI off: two's complement, wrapping past 64 bits."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def _wrap32(value):
    """INT arithmetic (both sides INT: a column of that type, a literal that fits, a CAST AS INT)
    wraps at 32 bits in Spark with ANSI off."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31) if isinstance(value, int) and not isinstance(value, bool) \
        else value


# Possessive quantifiers throughout: a run of digits or spaces followed by anything else fails in
# one pass. The greedy forms backtracked quadratically, and a producer's 1 MiB digit string held a
# table's merge (every retry) and the query server's event loop for hours.
_NUMBER_TEXT = re.compile(r"\s*+[+-]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][+-]?+\d++)?+\s*+\Z")
_INTEGER_TEXT = re.compile(r"\s*+([+-]?+\d*+)(\.\d*+)?+\s*+\Z")
_SPECIAL_DOUBLES = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
                    "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


def _text_to_double(text: str):
    if _NUMBER_TEXT.match(text):
        return float(text)
    return _SPECIAL_DOUBLES.get(text.strip().lower())


def _text_to_int(text: str):
    """CAST(text AS BIGINT) with ANSI off: digits, a fraction cut off, NULL past 64 bits."""
    match = _INTEGER_TEXT.match(text)
    if not match or match.group(1).lstrip("+-") == "" and match.group(2) is None:
        return None
    sign, digits = ("-" if match.group(1).startswith("-") else ""), match.group(1).lstrip("+-").lstrip("0")
    if len(digits) > 19:            # past 64 bits whatever follows: no int() of a megabyte of digits
        return None
    value = int(sign + (digits or "0"))
    return value if -(1 << 63) <= value < (1 << 63) else None


def _text_to_decimal(text: str):
    value = _DECIMALS.create_decimal(text.strip()) if _NUMBER_TEXT.match(text) else None
    return value if value is not None and abs(value) < _DECIMAL_LIMIT else None


def _text_to_bool(text: str):
    return {"t": True, "true": True, "y": True, "yes": True, "1": True,
            "f": False, "false": False, "n": False, "no": False, "0": False}.get(text.strip().lower())


def _is_number(value) -> bool:
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


def _operand(value):
    """An arithmetic operand: numbers as they are, text as a DOUBLE (Spark's implicit cast),
    NULL for text that is no number; a boolean is no operand (Spark refuses it)."""
    if isinstance(value, str):
        return _text_to_double(value)
    if not _is_number(value):
        raise TypeError("not a number")
    return value


def _widen(left, right):
    """Both operands in one numeric type: DOUBLE over DECIMAL over BIGINT, as Spark widens."""
    if isinstance(left, float) or isinstance(right, float):
        return float(left), float(right)
    if isinstance(left, decimal.Decimal) or isinstance(right, decimal.Decimal):
        return _DECIMALS.create_decimal(left), _DECIMALS.create_decimal(right)
    return left, right


def _arithmetic(kind, left, right):
    if left is None or right is None:
        return None
    left, right = _operand(left), _operand(right)
    if left is None or right is None:
        return None
    if kind is exp.Div:
        if isinstance(left, int) and isinstance(right, int):
            left, right = float(left), float(right)       # `/` of integers is a DOUBLE in Spark
        left, right = _widen(left, right)
        if right == 0:
            return None
        return _decimal_divide(left, right) if isinstance(left, decimal.Decimal) else left / right
    left, right = _widen(left, right)
    if kind is exp.Mod:
        if right == 0:
            return None
        if isinstance(left, int):
            return _java_remainder(left, right)
        return math.fmod(left, right) if isinstance(left, float) else _DECIMALS.remainder(left, right)
    if isinstance(left, decimal.Decimal):
        op = {exp.Add: _DECIMALS.add, exp.Sub: _DECIMALS.subtract, exp.Mul: _DECIMALS.multiply}[kind]
        return op(left, right)
    result = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul}[kind](left, right)
    return _wrap64(result) if isinstance(result, int) else result


def _java_remainder(left: int, right: int) -> int | None:
    """BIGINT % BIGINT: the dividend's sign, as Java's %; NULL for a zero divisor."""
    if right == 0:
        return None
    remainder = abs(left) % abs(right)
    return _wrap64(remainder if left >= 0 else -remainder)


_INTEGER_OPS = {exp.Add: lambda a, b: _wrap64(a + b), exp.Sub: lambda a, b: _wrap64(a - b),
                exp.Mul: lambda a, b: _wrap64(a * b), exp.Mod: _java_remainder}


def _decimal_divide(left: decimal.Decimal, right: decimal.Decimal) -> decimal.Decimal:
    """DECIMAL / DECIMAL rounded half up at Spark's result scale, max(6, s1 + p2 + 1), narrowed
    to fit 38 digits (precisions and scales read from the values themselves)."""
    def shape(value):
        digits = value.as_tuple()
        scale = max(-digits.exponent, 0)
        return max(len(digits.digits), scale), scale
    (p1, s1), (p2, s2) = shape(left), shape(right)
    scale = max(6, s1 + p2 + 1)
    precision = p1 - s1 + s2 + scale
    if precision > 38:
        scale = max(38 - (precision - scale), min(scale, 6))
    return _DECIMALS.divide(left, right).quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP,
                                                  context=_DECIMALS)


def _negate(value):
    if value is None:
        return None
    value = _operand(value)
    if value is None:
        return None
    return _wrap64(-value) if isinstance(value, int) else -value


def _coerced(left, right):
    """The two sides of a comparison in one type, as Spark coerces them (ANSI off): text meets a
    number as that number's type, a boolean as 0 or 1, a time as a time; None where one side
    cannot be had in the other's type (the comparison is NULL)."""
    if isinstance(left, str) and not isinstance(right, str):
        right, left = _coerced(right, left)
        return left, right
    if isinstance(right, str) and not isinstance(left, str):
        if isinstance(left, bool):
            return left, _text_to_bool(right)
        if isinstance(left, int):
            return left, _text_to_int(right)
        if isinstance(left, float):
            return left, _text_to_double(right)
        if isinstance(left, decimal.Decimal):
            return left, _text_to_decimal(right)
        if isinstance(left, (dt.datetime, dt.date)):
            moment = _instant(right)
            return (left, moment) if isinstance(left, dt.datetime) else (left, moment.date())
        return left, None
    if isinstance(left, bool) and _is_number(right):
        return int(left), right
    if isinstance(right, bool) and _is_number(left):
        return left, int(right)
    if _is_number(left) and _is_number(right):
        return _widen(left, right)
    if isinstance(left, dt.datetime) and isinstance(right, (int, float)) and not isinstance(right, bool):
        return _instant(left), _instant(right)
    if type(left) is not type(right) and not (isinstance(left, dt.date) and isinstance(right, dt.date)):
        return left, None
    return left, right


def _order(left, right):
    """-1, 0 or 1; None when either side is NULL or they do not compare. NaN equals NaN and is
    above every other number, as Spark orders it."""
    if left is None or right is None:
        return None
    left, right = _coerced(left, right)
    if left is None or right is None:
        return None
    left_nan = isinstance(left, float) and math.isnan(left) or isinstance(left, decimal.Decimal) and left.is_nan()
    right_nan = isinstance(right, float) and math.isnan(right) or isinstance(right, decimal.Decimal) and right.is_nan()
    if left_nan or right_nan:
        return (left_nan > right_nan) - (left_nan < right_nan)
    if isinstance(left, dt.datetime) and isinstance(right, dt.datetime):
        left, right = _aware(left), _aware(right)
    return (left > right) - (left < right)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _truth(value):
    """A condition's value: only a boolean is one (Spark refuses anything else in AND, OR, NOT,
    WHEN and IF); anything else is unknown, so the text 'false' is never true."""
    return value if isinstance(value, bool) else None


def _literal(node: exp.Literal):
    """Spark's literal types: an integer is BIGINT, a fraction a DECIMAL, an exponent a DOUBLE."""
    text = node.this
    if node.is_string:
        return text
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", text):
        return _DECIMALS.create_decimal(text)
    return float(text)


def _compile(node: exp.Expression, columns: set[str]) -> Callable[[dict], object]:
    if isinstance(node, exp.Paren):
        return _compile(node.this, columns)
    if isinstance(node, exp.Column):
        if node.name not in columns:
            raise UnsupportedSql(node, f"column {node.sql()} (the rows have {sorted(columns)})")
        name = node.name
        return lambda row: row.get(name)
    if isinstance(node, exp.Literal):
        value = _literal(node)
        return lambda row: value
    if isinstance(node, exp.Boolean):
        value = bool(node.this)
        return lambda row: value
    if isinstance(node, exp.Null):
        return lambda row: None
    if isinstance(node, exp.Neg):
        inner = _compile(_argument(node, node.this), columns)
        if _kind(node, columns if isinstance(columns, dict) else {}) == "int":
            return lambda row: _wrap32(_negate(inner(row)))
        return lambda row: _negate(inner(row))
    if isinstance(node, exp.Not):
        inner = _compile(_argument(node, node.this), columns)
        return lambda row: None if (v := _truth(inner(row))) is None else not v
    if isinstance(node, exp.And):
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: _and(_truth(left(row)), _truth(right(row)))
    if isinstance(node, exp.Or):
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: _or(_truth(left(row)), _truth(right(row)))
    if type(node) in _COMPARE:
        test = _COMPARE[type(node)]
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        return lambda row: None if (c := _safe(_order, left(row), right(row))) is None else test(c)
    if isinstance(node, _ARITHMETIC):
        kind = type(node)
        left, right = _compile(node.left, columns), _compile(node.right, columns)
        integers = _INTEGER_OPS.get(kind)

        def arithmetic(row):
            # Two plain integers (a join's times, counts and sums) skip the operand checks and the
            # widening: 4 us a row of a Nexmark q8 WHERE, of 5 nodes, went mostly to them.
            a, b = left(row), right(row)
            if integers is not None and type(a) is int and type(b) is int:
                return integers(a, b)
            return _safe(_arithmetic, kind, a, b)
        if _kind(node, columns if isinstance(columns, dict) else {}) == "int":     # INT wraps at 32 bits
            return lambda row: _wrap32(arithmetic(row))
        return arithmetic
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = _compile(node.this, columns)
        return lambda row: inner(row) is None
    if isinstance(node, exp.In) and not node.args.get("query"):
        inner = _compile(node.this, columns)
        options = [_compile(v, columns) for v in node.expressions]
        return lambda row: _in(inner(row), [o(row) for o in options])
    if isinstance(node, exp.Between):
        inner = _compile(node.this, columns)
        low, high = _compile(node.args["low"], columns), _compile(node.args["high"], columns)

        def between(row):
            value = inner(row)
            above, below = _safe(_order, value, low(row)), _safe(_order, value, high(row))
            return _and(None if above is None else above >= 0, None if below is None else below <= 0)
        return between
    function = _function(node, columns)
    if function is not None:
        if isinstance(node, _COMBINING) and isinstance(columns, dict):
            kind = _kind(node, columns)
            scale = _scale(node, columns) if kind == "decimal" else None
            if kind in ("double", "decimal", "string"):
                return lambda row: _as_kind(function(row), kind, scale)
        return function
    raise UnsupportedSql(node, f"{node.key.upper()} ({node.sql()})")


# Where Spark gives one result type to values of several: CASE of a BIGINT and a DOUBLE is all
# DOUBLE, and shows 5.0 where the row's own value would show 5. Needs the columns' types
# (compile_value over a dict of them); over bare names, each value keeps its own type.
_COMBINING = (exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif)
_NUMERIC_KINDS = ("int", "bigint", "decimal", "double")


def _column_kind(dtype: str | None) -> str | None:
    base = (dtype or "").split("(")[0].upper()
    return {"BIGINT": "bigint", "INT": "int", "LONG": "bigint", "SMALLINT": "int", "TINYINT": "int", "DOUBLE": "double",
            "FLOAT": "double", "DECIMAL": "decimal", "STRING": "string", "BOOLEAN": "boolean"}.get(base)


def _kind(node, columns: dict) -> str | None:
    """The static type Spark gives `node` (bigint, double, decimal, string, boolean, null; None
    where this does not follow it)."""
    if isinstance(node, exp.Paren):
        return _kind(node.this, columns)
    if isinstance(node, exp.Column):
        return _column_kind(columns.get(node.name))
    if isinstance(node, exp.Literal):
        value = _literal(node)
        if isinstance(value, int):
            return "int" if -(1 << 31) <= value < (1 << 31) else "bigint"
        return "string" if isinstance(value, str) else "decimal" if isinstance(value, decimal.Decimal) else "double"
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, (exp.Boolean, exp.Not, exp.And, exp.Or, exp.Is, exp.In, exp.Between)) or type(node) in _COMPARE:
        return "boolean"
    if isinstance(node, _ARITHMETIC):
        kinds = {_kind(node.left, columns), _kind(node.right, columns)}
        if "string" in kinds or "double" in kinds:
            return "double"
        if "decimal" in kinds:
            return "decimal"
        if isinstance(node, exp.Div):
            return "double" if kinds <= {"int", "bigint", "null"} else None
        if kinds <= {"int", "null"}:
            return "int"
        return "bigint" if kinds <= {"int", "bigint", "null"} else None
    if isinstance(node, (exp.Neg, exp.Abs)):
        inner = _kind(node.this, columns)
        return "double" if inner == "string" else inner
    if isinstance(node, (exp.Cast, exp.TryCast)):
        return _column_kind(node.args["to"].this.name) or ("string" if node.args["to"].this.name in _CASTS else None)
    if isinstance(node, exp.Round):
        inner = _kind(node.this, columns)
        return "double" if inner == "string" else inner
    if isinstance(node, (exp.Floor, exp.Ceil)):
        return "decimal" if _kind(node.this, columns) == "decimal" else "bigint"
    if isinstance(node, (exp.Upper, exp.Lower, exp.Trim, exp.Concat, exp.DPipe, exp.Substring, exp.Replace)):
        return "string"
    if isinstance(node, exp.Length) or type(node) in _DATE_PARTS:
        return "int"
    if isinstance(node, _COMBINING):
        if isinstance(node, exp.Case):
            parts = [b.args["true"] for b in node.args["ifs"]] + [node.args.get("default")]
        elif isinstance(node, exp.If):
            parts = [node.args["true"], node.args.get("false")]
        elif isinstance(node, exp.Nullif):
            parts = [node.this]
        else:
            parts = [node.this, *node.expressions]
        kinds = {_kind(p, columns) for p in parts if p is not None} - {"null"}
        if kinds and kinds <= set(_NUMERIC_KINDS):
            return max(kinds, key=_NUMERIC_KINDS.index)
        if "string" in kinds and kinds <= {"string", *_NUMERIC_KINDS} and not isinstance(node, (exp.Greatest, exp.Least)):
            return "string"             # text among numbers: all text, as Spark coerces them
        return kinds.pop() if len(kinds) == 1 else None
    return None


def _scale(node, columns: dict) -> int | None:
    """The scale of a DECIMAL `node` as Spark types it (digits after the point), or None."""
    if isinstance(node, exp.Paren):
        return _scale(node.this, columns)
    kind = _kind(node, columns)
    if kind in ("int", "bigint"):
        return 0
    if kind != "decimal":
        return None
    if isinstance(node, exp.Column):
        match = re.search(r",\s*(\d+)\s*\)", columns.get(node.name) or "")
        return int(match.group(1)) if match else 0
    if isinstance(node, exp.Literal):
        return max(-_literal(node).as_tuple().exponent, 0)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
        left, right = _scale(node.left, columns), _scale(node.right, columns)
        if left is None or right is None:
            return None
        return left + right if isinstance(node, exp.Mul) else max(left, right)
    if isinstance(node, (exp.Neg, exp.Abs)):
        return _scale(node.this, columns)
    if isinstance(node, exp.Round):
        return max(_round_digits(node), 0)
    if isinstance(node, (exp.Floor, exp.Ceil)):
        return 0
    if isinstance(node, _COMBINING):
        parts = [node.this, *node.expressions] if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)) else \
            [b.args["true"] for b in node.args["ifs"]] + [node.args.get("default")] if isinstance(node, exp.Case) else \
            [node.args["true"], node.args.get("false")] if isinstance(node, exp.If) else [node.this]
        scales = [_scale(p, columns) for p in parts if p is not None and _kind(p, columns) != "null"]
        return None if any(x is None for x in scales) or not scales else max(scales)
    return None


def _as_kind(value, kind: str, scale: int | None = None):
    if not _is_number(value):
        return value
    if kind == "string":
        return _to_text(value)
    if kind == "double":
        return float(value)
    value = _DECIMALS.create_decimal(value) if isinstance(value, int) else value
    if scale is not None and isinstance(value, decimal.Decimal) and value.is_finite():
        return value.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP, context=_DECIMALS)
    return value


def _argument(node: exp.Expression, child):
    """A function's argument, which the definition must give: CEIL() is refused when the table
    loads, not raised for every row."""
    if child is None:
        raise UnsupportedSql(node, f"{node.key.upper()}() needs an argument")
    return child


def _safe(function, *args):
    try:
        return function(*args)
    except _VALUE_ERRORS:
        return None


def _in(value, options: list):
    """IN with Spark's coercion: text among numbers compares as text; NULL when nothing matched
    and something was NULL."""
    if value is None:
        return None
    present = [value] + [o for o in options if o is not None]
    texts = any(isinstance(v, str) for v in present) and not all(isinstance(v, str) for v in present)
    unknown = False
    for option in options:
        if option is None:
            unknown = True
            continue
        same = (_to_text(value) == _to_text(option)) if texts else _safe(_order, value, option) == 0
        if same:
            return True
    return None if unknown else False


def _round_half_up(value, digits: int):
    """ROUND as Spark SQL rounds: halves away from zero (Python's round goes to even), a DOUBLE
    through its shortest decimal text (Java's BigDecimal.valueOf); NULL for non-finite input."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = _text_to_double(value)
        if value is None:
            return None
    if isinstance(value, int):
        if digits >= 0:
            return value
        exact = decimal.Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return value                # as Spark: an infinity stays one (and shows as NULL)
        exact = decimal.Decimal(repr(value))
    elif isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        exact = value
    else:
        return None
    rounded = exact.quantize(decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP, context=_DECIMALS)
    if rounded.is_zero():
        rounded = rounded.copy_abs()    # no negative zero: Spark's BigDecimal has none
    if isinstance(value, float):
        return float(rounded)
    return _wrap64(int(rounded)) if isinstance(value, int) else rounded


def _to_int(value):
    """CAST(x AS BIGINT) with ANSI off: text through its digits, a fraction toward zero, a DOUBLE
    clamped to 64 bits and NaN 0 (Java's cast), a DECIMAL past 64 bits NULL."""
    if isinstance(value, str):
        return _text_to_int(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        if value >= 2.0 ** 63:
            return (1 << 63) - 1
        if value <= -2.0 ** 63:
            return -(1 << 63)
        return int(value)
    if isinstance(value, decimal.Decimal):
        return _wrap64(int(value)) if value.is_finite() else None    # Java's longValue: the low 64 bits
    if isinstance(value, int):
        return value
    return None


def _to_int32(value):
    """CAST(x AS INT): a DOUBLE clamped to 32 bits, a BIGINT cut to its low 32 bits (ANSI off)."""
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        return max(-(1 << 31), min((1 << 31) - 1, int(value) if math.isfinite(value) else
                                   (1 << 31 if value > 0 else -(1 << 32))))
    whole = _to_int(value)
    if whole is None:
        return None
    if isinstance(value, str) and not -(1 << 31) <= whole < (1 << 31):
        return None
    return (whole + (1 << 31)) % (1 << 32) - (1 << 31)


def _to_bool(value):
    if isinstance(value, str):
        return _text_to_bool(value)
    if isinstance(value, bool):
        return value
    if _is_number(value):
        return value != 0
    return None


def java_double(value: float) -> str:
    """A DOUBLE as Spark writes it as text (Java's Double.toString): 100.0, 1.0E20, 1.0E-5."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        return text if "." in text or "e" in text else text + ".0"
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    power = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def _to_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)


def _to_float(value):
    if isinstance(value, str):
        return _text_to_double(value)
    if isinstance(value, bool):
        return float(value)
    if _is_number(value):
        return float(value)
    return None


def _to_float32(value):
    import struct

    number = _to_float(value)
    if number is None or not math.isfinite(number):
        return number
    try:
        return struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        return math.copysign(math.inf, number)


def _floor_or_ceil(value, up: bool):
    """FLOOR and CEIL: a BIGINT (clamped, as Spark's cast) from a DOUBLE or text, a DECIMAL
    from a DECIMAL, an integer unchanged."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, decimal.Decimal):
        return value.to_integral_value(rounding=decimal.ROUND_CEILING if up else decimal.ROUND_FLOOR)
    number = _to_float(value)
    if number is None:
        return None
    if not math.isfinite(number):
        return _to_int(number)          # Spark's cast of an infinity: clamped; NaN: 0
    return _to_int(float(math.ceil(number) if up else math.floor(number)))


def _absolute(value):
    value = _operand(value)
    if value is None:
        return None
    return _wrap64(abs(value)) if isinstance(value, int) else abs(value)


def backslash_escaped(pattern: str, escape: str | None) -> str:
    """A LIKE pattern with its ESCAPE character (`LIKE 'a!%' ESCAPE '!'`) in the form where a
    backslash escapes (Arrow's match_like, Spark's default). Raises what Spark would refuse
    mid-batch: an escape of more than one character, or one before anything but %, _ or itself."""
    if escape is None:
        return pattern
    if len(escape) != 1:
        raise ValueError(f"ESCAPE {escape!r}: one character")
    out, chars = [], iter(pattern)
    for char in chars:
        if char == escape:
            escaped = next(chars, None)
            if escaped not in ("%", "_", escape):
                raise ValueError(f"LIKE {pattern!r} ESCAPE {escape!r}: {escape!r} must come before %, _ or "
                                 f"itself, not {'the end' if escaped is None else repr(escaped)}")
            out.append("\\" + escaped)
        else:
            out.append("\\" + char if char == "\\" else char)
    return "".join(out)


def _initcap(text: str) -> str:
    """Spark's INITCAP: lower case, then each letter after a space (and the first) upper case."""
    return " ".join(word[:1].upper() + word[1:] for word in text.lower().split(" "))


_CASTS = {"TEXT": _to_text, "VARCHAR": _to_text, "CHAR": _to_text, "BIGINT": _to_int, "INT": _to_int32,
          "SMALLINT": _to_int32, "TINYINT": _to_int32, "DOUBLE": _to_float, "FLOAT": _to_float32,
          "BOOLEAN": _to_bool}
_ONE_ARGUMENT = {exp.Upper: lambda v: _to_text(v).upper(), exp.Lower: lambda v: _to_text(v).lower(),
                 exp.Length: lambda v: len(_to_text(v)), exp.Trim: lambda v: _to_text(v).strip(" "),
                 exp.Initcap: lambda v: _initcap(_to_text(v)),
                 exp.Abs: _absolute, exp.Floor: lambda v: _floor_or_ceil(v, False),
                 exp.Ceil: lambda v: _floor_or_ceil(v, True)}


def _null_safe(function, *parts):
    """A function of compiled parts that is NULL when any part is (SQL's rule for these functions)."""
    def value(row):
        args = [p(row) for p in parts]
        if any(a is None for a in args):
            return None
        try:
            return function(*args)
        except _VALUE_ERRORS:
            return None
    return value


def _round_digits(node: exp.Expression) -> int:
    """ROUND's digits: an integer literal within ±MAX_ROUND_DIGITS, checked when the table loads
    (Spark also wants a constant there)."""
    digits = node.args.get("decimals")
    if digits is None:
        return 0
    value = digits.this if isinstance(digits, exp.Neg) else digits
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise UnsupportedSql(node, f"ROUND's digits must be an integer literal, not {digits.sql()}")
    number = -int(value.this) if isinstance(digits, exp.Neg) else int(value.this)
    if abs(number) > MAX_ROUND_DIGITS:
        raise UnsupportedSql(node, f"ROUND to {number} digits (at most {MAX_ROUND_DIGITS} either side of the point)")
    return number


def _greatest(values: list, pick):
    """GREATEST and LEAST: NULLs skipped, numbers compared as numbers (NaN above all), NULL
    where the arguments are of kinds Spark refuses to mix (text with numbers)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(_is_number(v) for v in present):
        best = present[0]
        for v in present[1:]:
            order = _order(v, best)
            if order is not None and (order > 0 if pick is max else order < 0):
                best = v
        if any(isinstance(v, float) for v in present):
            return float(best)
        scales = [-v.as_tuple().exponent for v in present if isinstance(v, decimal.Decimal) and v.is_finite()]
        if scales:                      # Spark's common DECIMAL type: the widest scale of them
            return _DECIMALS.create_decimal(best).quantize(decimal.Decimal(1).scaleb(-max(scales)), context=_DECIMALS)
        return best
    if len({type(v) for v in present}) != 1:
        return None
    return pick(present)


def _function(node: exp.Expression, columns: set[str]) -> Callable[[dict], object] | None:
    """The function calls rows may use (SUPPORTED), compiled; None for anything else."""
    def part(child):
        return _compile(_argument(node, child), columns)

    if isinstance(node, exp.Case):
        operand = part(node.this) if node.this is not None else None
        branches = [(part(branch.this), part(branch.args["true"])) for branch in node.args["ifs"]]
        default = part(node.args["default"]) if node.args.get("default") is not None else (lambda row: None)

        def case(row):
            subject = operand(row) if operand is not None else None
            for condition, result in branches:
                test = condition(row)
                if (_truth(test) is True) if operand is None else (_safe(_order, subject, test) == 0):
                    return result(row)
            return default(row)
        return case
    if isinstance(node, exp.If):
        condition, yes = part(node.this), part(node.args["true"])
        no = part(node.args["false"]) if node.args.get("false") is not None else (lambda row: None)
        return lambda row: yes(row) if _truth(condition(row)) is True else no(row)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        parts = [part(node.this)] + [part(e) for e in node.expressions]
        if isinstance(node, exp.Coalesce):
            return lambda row: next((v for v in (p(row) for p in parts) if v is not None), None)
        pick = max if isinstance(node, exp.Greatest) else min
        return lambda row: _safe(_greatest, [p(row) for p in parts], pick)
    if isinstance(node, exp.Nullif):
        left, right = part(node.this), part(node.expression)
        return lambda row: None if _safe(_order, v := left(row), right(row)) == 0 else v
    if isinstance(node, (exp.Cast, exp.TryCast)):
        target = node.args["to"].this.name
        if target not in _CASTS:
            raise UnsupportedSql(node, f"CAST to {node.args['to'].sql()} (casts go to {sorted(_CASTS)})")
        return _null_safe(_CASTS[target], part(node.this))
    if type(node) in _ONE_ARGUMENT:
        return _null_safe(_ONE_ARGUMENT[type(node)], part(node.this))
    if isinstance(node, exp.Round):
        digits = _round_digits(node)
        return _null_safe(lambda v: _round_half_up(v, digits), part(node.this))
    if isinstance(node, (exp.Concat, exp.DPipe)):
        items = node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression]
        return _null_safe(lambda *texts: "".join(_to_text(t) for t in texts), *[part(i) for i in items])
    if isinstance(node, exp.Substring):
        start = part(node.args["start"]) if node.args.get("start") is not None else (lambda row: 1)
        length = part(node.args["length"]) if node.args.get("length") is not None else (lambda row: 1 << 62)
        return _null_safe(_substring, part(node.this), start, length)
    if isinstance(node, exp.TsOrDsToDate):
        if _kind(node.this, columns if isinstance(columns, dict) else {}) in _NUMERIC_KINDS:
            return lambda row: None         # Spark: no number is a date (epoch ms come as untyped columns)
        return _null_safe(lambda v: _instant(v, date_only=True).date().isoformat(), part(node.this))   # as JSON shows a DATE
    if type(node) in _DATE_PARTS:
        return _null_safe(lambda v, pick=_DATE_PARTS[type(node)]: pick(_instant(v)), part(node.this))
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = node.args["unit"].name.upper()
        if unit not in _TRUNCATE:
            raise UnsupportedSql(node, f"DATE_TRUNC to {unit} (units {sorted(_TRUNCATE)})")
        return _null_safe(lambda v: _truncated(v, unit), part(node.this))
    if isinstance(node, exp.Replace):
        return _null_safe(lambda text, old, new: _to_text(text).replace(_to_text(old), _to_text(new)),
                          part(node.this), part(node.expression), part(node.args["replacement"]))
    return None


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
# Spark's TIMESTAMP range (years 1-9999, as Python's): a number past it is NULL, as Spark's
# casts give NULL where its microseconds would overflow.
_INSTANT_LIMIT_MS = 253_402_300_799_999


def _instant(value, date_only: bool = False) -> dt.datetime:
    """A row's time value as a UTC datetime: epoch milliseconds (window_start, window_end), a
    date or datetime, or text as Spark reads it (`_parsed_text`)."""
    if isinstance(value, bool):
        raise TypeError("a boolean is no time")
    if isinstance(value, (int, float)):
        if not -_INSTANT_LIMIT_MS <= value <= _INSTANT_LIMIT_MS:     # the platform's time_t raises OSError past it
            raise OverflowError("an instant past years 1-9999")
        return _EPOCH + dt.timedelta(milliseconds=value)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    return _parsed_text(str(value), date_only)


# Spark's text forms (DateTimeUtils.stringToDate / stringToTimestamp): a year of 4-7 digits,
# then optional -[m]m and -[d]d; a date may be followed by ' ' or 'T' and anything, a timestamp
# by [h]h[:[m]m[:[s]s[.fraction]]] and a zone. Possessive, so no text costs more than its length.
_DATE_TEXT = re.compile(r"\s*+\+?+(\d{4,7}+)(?:-(\d{1,2}+)(?:-(\d{1,2}+))?+)?+")
_TIME_TEXT = re.compile(r"(?:[ T](?:(\d{1,2}+)(?::(\d{1,2}+)(?::(\d{1,2}+)(?:\.(\d{0,9}+))?+)?+)?+)?+)?+"
                        r"\s*+(Z|[+-]\d{1,2}+(?::?+\d{2}+)?+)?+\s*+")


def _parsed_text(text: str, date_only: bool) -> dt.datetime:
    if len(text) > 64 and not date_only:        # no time text is longer; Spark's parse gives NULL
        raise ValueError("not a time")
    day = _DATE_TEXT.match(text)
    if not day:
        raise ValueError("not a time")
    year, month, date = int(day[1]), int(day[2] or 1), int(day[3] or 1)
    if date_only:
        rest = text[day.end():]
        if rest.strip() and rest[0] not in " T":
            raise ValueError("not a date")
        return dt.datetime(year, month, date, tzinfo=dt.timezone.utc)   # ValueError past years 1-9999
    clock = _TIME_TEXT.fullmatch(text, day.end())
    if not clock:
        raise ValueError("not a time")
    hour, minute, second, fraction, zone = clock.groups()
    moment = dt.datetime(year, month, date, int(hour or 0), int(minute or 0), int(second or 0),
                         int((fraction or "0")[:6].ljust(6, "0")), tzinfo=dt.timezone.utc)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        hours, minutes = (int(digits[:-2]), int(digits[-2:])) if len(digits) > 2 else (int(digits), 0)
        moment -= sign * dt.timedelta(hours=hours, minutes=minutes)
    return moment


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
    if isinstance(value, (int, float)):
        return (cut - _EPOCH) // dt.timedelta(milliseconds=1)
    return f"{cut.year:04d}-{cut:%m-%dT%H:%M:%S}Z"      # strftime's %Y does not pad years before 1000


def _substring(text, start, length) -> str | None:
    """SUBSTRING as Spark SQL counts: from 1, a negative start from the end, 0 as 1."""
    text, start, length = _to_text(text), _to_int32(start), _to_int32(length)
    if start is None or length is None:
        return None
    if length < 0:
        return ""
    begin = start - 1 if start > 0 else (len(text) + start if start < 0 else 0)
    end = begin + length            # from the unclamped start, as Spark's substringSQL
    return text[max(begin, 0):max(end, 0)]


def _and(left, right):
    if left is False or right is False:
        return False
    return None if left is None or right is None else bool(left and right)


def _or(left, right):
    if left is True or right is True:
        return True
    return None if left is None or right is None else bool(left or right)
