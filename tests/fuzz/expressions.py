"""Generated row expressions (HAVING and computed columns) and their values under Spark SQL.

A seeded generator writes expressions over the columns a table's rows hold (a BIGINT count, a
DOUBLE total, a DECIMAL sum, a STRING key, a BOOLEAN flag, a TIMESTAMP at and near the ends
of its range), and Spark SQL with ANSI off
evaluates every expression over the same rows in one query. Expressions Spark's analyzer
refuses (a boolean in arithmetic, text in GREATEST with numbers) have no Spark value: for those
only totality is checked (catalog.expressions must give NULL or a value, never raise).
"""
from __future__ import annotations

import decimal
import math
import random

COLUMNS = {"n": "BIGINT", "x": "DOUBLE", "d": "DECIMAL(20,0)", "s": "STRING", "b": "BOOLEAN", "t": "TIMESTAMP"}
# A row holds a TIMESTAMP as epoch milliseconds, as state does; Spark's frame gets the instant.
FIRST_MS, LAST_MS = -62_135_596_800_000, 253_402_300_799_999       # 0001-01-01, 9999-12-31T23:59:59.999
ROWS = [
    {"n": 7, "x": 2.5, "d": decimal.Decimal(12), "s": "10", "b": True, "t": 1_709_287_200_123},
    {"n": -3, "x": -0.125, "d": decimal.Decimal(-5), "s": "abc", "b": False, "t": FIRST_MS},
    {"n": 0, "x": 1.7e308, "d": decimal.Decimal(10) ** 18, "s": " 2.5 ", "b": None, "t": LAST_MS},
    {"n": 9223372036854775807, "x": 0.0, "d": decimal.Decimal(0), "s": "true", "b": True, "t": 0},
    {"n": None, "x": None, "d": None, "s": None, "b": None, "t": None},
    {"n": -9223372036854775808, "x": 1e-5, "d": decimal.Decimal(99999), "s": "-7", "b": False, "t": -1},
    {"n": 100, "x": 12345678.0, "d": decimal.Decimal(3), "s": "2024-03-01T10:00:00", "b": True,
     "t": 951_782_400_000},                                          # 2000-02-29, a leap day
]
# Text past year 9999 is left out: Spark reads '10000-01-01' as a time (its range goes to year
# 294247), ours as NULL (Python's and JSON's range), a difference the README names;
# tests/unit/catalog/test_expression_cost.py holds such text to totality and cost.
TIMES = ["t", "s", "'2024-02-29T23:59:59'", "'2024-03-01'", "'9999-12-31T23:59:59'", "'0001-01-01T00:00:00'",
         "'2024-13-01'", "'2023-02-29'", "'x'", "''"]
DATE_PARTS = ["YEAR", "MONTH", "DAY", "HOUR", "MINUTE", "DAYOFWEEK"]
STRINGS = ["'10'", "'abc'", "'2.5'", "'true'", "'false'", "''", "' 7 '", "'1e3'", "'%d'", "'100%'", "'x'"]


class Generator:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def literal(self) -> str:
        r = self.random.random()
        if r < 0.35:
            return str(self.random.randint(-100, 100))
        if r < 0.55:
            return f"{self.random.randint(-999, 999) / 100}"
        if r < 0.65:
            return self.random.choice(["1e0", "2.5e0", "1e300", "-3.5e-2", "0e0"])
        if r < 0.85:
            return self.random.choice(STRINGS)
        return self.random.choice(["TRUE", "FALSE", "NULL"])

    def expression(self, depth: int = 0) -> str:
        r = self.random.random()
        if depth >= 3 or r < 0.25:
            leaves = [c for c in COLUMNS if c != "t"]      # a TIMESTAMP only where time is asked for
            return self.random.choice(leaves) if self.random.random() < 0.6 else self.literal()
        e = lambda: self.expression(depth + 1)      # noqa: E731
        # Time: the TIMESTAMP column, ISO text in and out of range, or any expression (Spark's
        # analyzer refuses a number there: then only totality is checked).
        when = lambda: self.random.choice(TIMES) if self.random.random() < 0.8 else e()    # noqa: E731
        forms = [
            lambda: f"({e()} {self.random.choice(['+', '-', '*', '/', '%'])} {e()})",
            lambda: f"({e()} {self.random.choice(['=', '<>', '<', '<=', '>', '>='])} {e()})",
            lambda: f"({e()} {self.random.choice(['AND', 'OR'])} {e()})",
            lambda: f"(NOT {e()})",
            lambda: f"(- {e()})",
            lambda: f"({e()} IS {self.random.choice(['', 'NOT '])}NULL)",
            lambda: f"({e()} IN ({e()}, {e()}))",
            lambda: f"({e()} BETWEEN {e()} AND {e()})",
            lambda: f"CASE WHEN {e()} THEN {e()} ELSE {e()} END",
            lambda: f"IF({e()}, {e()}, {e()})",
            lambda: f"COALESCE({e()}, {e()})",
            lambda: f"NULLIF({e()}, {e()})",
            lambda: f"{self.random.choice(['GREATEST', 'LEAST'])}({e()}, {e()})",
            lambda: f"CAST({e()} AS {self.random.choice(['STRING', 'BIGINT', 'INT', 'DOUBLE', 'BOOLEAN'])})",
            lambda: f"{self.random.choice(['ABS', 'FLOOR', 'CEIL', 'UPPER', 'LOWER', 'LENGTH', 'TRIM'])}({e()})",
            lambda: f"ROUND({e()}, {self.random.randint(-3, 4)})",
            lambda: f"ROUND({e()})",
            lambda: f"CONCAT({e()}, {e()})",
            lambda: f"SUBSTRING({e()}, {self.random.randint(-3, 3)}, {self.random.randint(-1, 4)})",
            lambda: f"{self.random.choice(DATE_PARTS)}({when()})",
            lambda: f"{self.random.choice(DATE_PARTS)}({self.time(when())})",
        ]
        if depth == 0 and self.random.random() < 0.1:
            return self.time(when())
        return self.random.choice(forms)()

    def time(self, of: str) -> str:
        """A time (TO_DATE, DATE_TRUNC), only where a time is read as one: at the top or inside
        a date part. Ours is epoch milliseconds or ISO text, not a typed instant, so a CAST of
        it to a number is not Spark's (seconds): docs/tables.md says so."""
        if self.random.random() < 0.4:
            return f"TO_DATE({of})"
        return f"DATE_TRUNC('{self.random.choice(['YEAR', 'MONTH', 'DAY', 'HOUR', 'MINUTE'])}', {of})"


def spark_values(spark, expressions: list[str], rows=ROWS) -> dict[str, list | None]:
    """Each expression's values over `rows` by Spark SQL (ANSI off); None for one it refuses."""
    from pyspark.sql import types as T

    from pyspark.errors import AnalysisException

    session = spark.newSession()
    session.conf.set("spark.sql.ansi.enabled", "false")
    session.conf.set("spark.sql.session.timeZone", "UTC")
    # Compiled, as a user's engine runs it: the suite's sessions run Spark SQL interpreted
    # (tests/conftest.py), and ours is compared with what users get.
    session.conf.set("spark.sql.codegen.wholeStage", "true")
    session.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    schema = T.StructType([T.StructField(n, T._parse_datatype_string(t)) for n, t in COLUMNS.items()])
    frame = session.createDataFrame([tuple(_for_spark(c, r[c]) for c in COLUMNS) for r in rows], schema)
    frame = frame.withColumn("_row", __import__("pyspark.sql.functions", fromlist=["x"]).monotonically_increasing_id())
    out: dict[str, list | None] = {}
    accepted, types = [], {}
    for expression in dict.fromkeys(expressions):
        try:                            # analysis only: is it an expression Spark takes, and of what type
            types[expression] = frame.selectExpr(f"{expression} AS v").schema[0].dataType
            accepted.append(expression)
        except AnalysisException:
            out[expression] = None
    for start in range(0, len(accepted), 100):
        batch = accepted[start:start + 100]
        # A time comes back as text: Spark's range (years -290308 to 294247) is wider than Python's.
        timed = lambda e: isinstance(types[e], (T.TimestampType, T.DateType))      # noqa: E731
        result = frame.selectExpr("_row", *[f"CAST({e} AS STRING) AS e{i}" if timed(e) else f"{e} AS e{i}"
                                            for i, e in enumerate(batch)]).orderBy("_row").collect()
        for i, e in enumerate(batch):
            out[e] = ([_instant(r[f"e{i}"]) if timed(e) else r[f"e{i}"] for r in result], types[e])
    return out


class OutOfRange(str):
    """A Spark time Python cannot hold (a year outside 1-9999): ours must be NULL."""


def _instant(text: str | None):
    import datetime as dt

    if text is None:
        return None
    try:
        if len(text) == 10:
            return dt.date.fromisoformat(text)
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return OutOfRange(text)


def _for_spark(column: str, value):
    import datetime as dt

    if COLUMNS[column] != "TIMESTAMP" or value is None:
        return value
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=value)


def same(ours, theirs, spark_type) -> bool:
    """Our value equals Spark's: numbers within rounding (a DECIMAL at Spark's scale), NaN and
    infinities as our NULL (JSON has none), text as text."""
    from pyspark.sql import types as T

    if isinstance(theirs, float) and not math.isfinite(theirs):
        return ours is None
    if isinstance(theirs, OutOfRange):
        return ours is None
    if theirs is None or ours is None:
        return theirs is None and ours is None
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return ours is theirs
    import datetime as dt

    if isinstance(theirs, dt.datetime):         # ours: epoch milliseconds from one, ISO text from text
        ms = (theirs.replace(tzinfo=theirs.tzinfo or dt.timezone.utc) - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) \
            // dt.timedelta(milliseconds=1)
        return ours == ms or ours == f"{theirs.year:04d}-{theirs:%m-%dT%H:%M:%S}Z"
    if isinstance(theirs, dt.date):             # ours: as JSON shows a DATE
        return ours == theirs.isoformat()
    if isinstance(theirs, (int, float, decimal.Decimal)):
        if not isinstance(ours, (int, float, decimal.Decimal)):
            return False
        if isinstance(spark_type, T.DecimalType):
            step = decimal.Decimal(1).scaleb(-spark_type.scale)
            mine = decimal.Decimal(repr(ours) if isinstance(ours, float) else ours)
            return abs(mine - theirs) <= step
        return math.isclose(float(ours), float(theirs), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(theirs, str) and isinstance(ours, str):
        # Numbers inside text may be written 5 or 5.0: Spark writes a value by its expression's
        # static type (a CASE of BIGINT and DOUBLE is all DOUBLE), the rows carry values' own.
        return ours == theirs or _numbers_as_text(ours) == _numbers_as_text(theirs)
    return ours == theirs


_ZERO_FRACTION = __import__("re").compile(r"\.0+(?![0-9])")


def _numbers_as_text(text: str) -> str:
    return _ZERO_FRACTION.sub("", text)
