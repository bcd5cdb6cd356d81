"""Issue 66, findings 1 and 2: a row's value must not cost more than its length, and no value
may raise out of an expression. Both used to stop a table's merge on every retry (and freeze the
query server's event loop): a long digit run before a non-digit backtracked quadratically in the
number-text patterns, and a DOUBLE of epoch-ms past year 9999 raised OSError in the date functions.

A bounded child process stands in for "does not wedge": on the old patterns the 200,000-
character cases take ~1,000 CPU s, here milliseconds; the bound says stall, not speed."""
from __future__ import annotations

import datetime as dt
import decimal
import multiprocessing
import random

import pytest
import sqlglot

from catalog.expressions import compile_value

HOSTILE_TEXT = ["1" * 200_000 + "x", " " * 200_000 + "x", "0" * 200_000 + "12", "1" * 200_000,
                "1." + "5" * 200_000 + "e", "-" + "9" * 200_000, "." * 100_000, "1e" + "9" * 100_000]
TIME_VALUES = [1e20, 7e19, 1e22, -1e22, 1.7e308, -1.7e308, 2**63 - 1, -(2**63), 253_402_300_799_999,
               253_402_300_800_000, -62_135_596_800_001, 0, 1_700_000_000_000, "2024-03-01T10:00:00Z",
               "0000-01-01", "9999-12-31T23:59:59Z", "10000-01-01", "2024-13-01", "1" * 200_000, True,
               dt.date(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59), decimal.Decimal("1e30"), None]
DATE_FUNCTIONS = ["HOUR(x)", "MINUTE(x)", "DAY(x)", "MONTH(x)", "YEAR(x)", "DAYOFWEEK(x)", "TO_DATE(x)",
                  "DATE_TRUNC('DAY', x)", "DATE_TRUNC('YEAR', x)", "DATE_TRUNC('MINUTE', x)"]
NUMERIC_USES = ["CAST(x AS DOUBLE)", "CAST(x AS BIGINT)", "CAST(x AS INT)", "x * 2", "x + 1", "x > 5",
                "x = 1", "CAST(x AS DOUBLE) * 3", "ROUND(x, 2)", "ABS(x)", "x IN (1, 2)", "GREATEST(x, 1)"]


def _evaluate_all(expressions, values):
    out = {}
    for sql in expressions:
        value = compile_value(sqlglot.parse_one(sql, dialect="spark"), {"x"})
        out[sql] = [value({"x": v}) for v in values]
    return out


def _bounded(function, *args, seconds=60):
    """`function(*args)` in a forked child, ended if it runs past `seconds` (a thread could not be)."""
    pool = multiprocessing.get_context("fork").Pool(1)
    try:
        return pool.apply_async(function, args).get(timeout=seconds)
    finally:
        pool.terminate()


def test_numeric_text_of_200000_characters_is_linear_and_gives_sparks_values():
    got = _bounded(_evaluate_all, NUMERIC_USES, HOSTILE_TEXT)
    cast_double = dict(zip(HOSTILE_TEXT, got["CAST(x AS DOUBLE)"]))
    cast_bigint = dict(zip(HOSTILE_TEXT, got["CAST(x AS BIGINT)"]))
    assert cast_double["1" * 200_000 + "x"] is None and cast_double[" " * 200_000 + "x"] is None
    assert cast_double["0" * 200_000 + "12"] == 12.0 and cast_bigint["0" * 200_000 + "12"] == 12
    assert cast_double["1" * 200_000] is None            # Spark's Infinity, which JSON cannot hold: NULL
    assert cast_bigint["1" * 200_000] is None and cast_bigint["-" + "9" * 200_000] is None    # past 64 bits
    assert got["x * 2"][HOSTILE_TEXT.index("0" * 200_000 + "12")] == 24.0


@pytest.mark.parametrize("sql", DATE_FUNCTIONS)
def test_date_functions_over_every_kind_of_value_are_total(sql):
    values = _bounded(_evaluate_all, [sql], TIME_VALUES)[sql]
    by_input = dict(zip(map(repr, TIME_VALUES), values))
    for far in (1e20, 7e19, 1e22, -1e22, 1.7e308, 2**63 - 1, 253_402_300_800_000, "1" * 200_000, "10000-01-01"):
        assert by_input[repr(far)] is None, (sql, far)       # past Spark's TIMESTAMP range: NULL, not OSError
    assert by_input[repr(253_402_300_799_999)] is not None and by_input[repr(1_700_000_000_000)] is not None


def test_hour_of_epoch_milliseconds_at_the_edges():
    hour = compile_value(sqlglot.parse_one("HOUR(x)", dialect="spark"), {"x"})
    year = compile_value(sqlglot.parse_one("YEAR(x)", dialect="spark"), {"x"})
    assert hour({"x": 1_700_000_000_000}) == 22 and hour({"x": 1.7e12}) == 22
    assert year({"x": 253_402_300_799_999}) == 9999 and year({"x": -62_135_596_800_000}) == 1
    assert year({"x": 1e20}) is None


def test_generated_date_expressions_over_generated_values_never_raise():
    rng = random.Random(66)
    numbers = [rng.choice([1, -1]) * 10 ** rng.uniform(0, 25) for _ in range(200)] + \
              [rng.randint(-(2**63), 2**63 - 1) for _ in range(200)]
    texts = ["".join(rng.choice("0123456789-:T .Ze+") for _ in range(rng.randint(0, 40))) for _ in range(200)]
    forms = DATE_FUNCTIONS + [f"{f}(CAST(x AS DOUBLE) * 1000)" for f in ("HOUR", "YEAR")] + \
        ["DATE_TRUNC('HOUR', x) - x", "CONCAT(TO_DATE(x), 'x')", "HOUR(x) + MINUTE(x)"]
    got = _bounded(_evaluate_all, forms, numbers + texts)
    for sql, values in got.items():
        assert all(v is None or isinstance(v, (int, float, str)) for v in values), sql


@pytest.mark.parametrize("sql, row, expected", [
    ("a - a % 10000", {"a": 1_796_001_989_953}, 1_796_001_980_000),
    ("a % b", {"a": -7, "b": 3}, -1),                         # the dividend's sign, as Java's %
    ("a % b", {"a": 7, "b": -3}, 1),
    ("a % b", {"a": 7, "b": 0}, None),                        # NULL, not an error
    ("a + b", {"a": 2**63 - 1, "b": 1}, -(2**63)),            # BIGINT wraps with ANSI off
    ("a * b", {"a": 2**62, "b": 4}, 0),
    ("a - b", {"a": -(2**63), "b": 1}, 2**63 - 1),
    ("a + b", {"a": True, "b": 1}, None),                     # a boolean is no operand
    ("a + b", {"a": "2", "b": 1}, 3.0),                       # text as a DOUBLE
    ("a / b", {"a": 7, "b": 2}, 3.5),                         # `/` of integers is a DOUBLE
])
def test_integer_arithmetic_takes_its_short_path_with_spark_s_semantics(sql, row, expected):
    """Two plain integers skip the operand checks (a windowed join's WHERE over times), and
    still wrap, keep Java's remainder sign and give NULL for a zero divisor; anything else takes
    the general path."""
    value = compile_value(sqlglot.parse_one(sql, dialect="spark"), set(row))(row)
    assert value == expected and type(value) is type(expected)
