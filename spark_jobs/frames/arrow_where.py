"""A table's WHERE and its computed GROUP BY keys and aggregate arguments (`derived`: a CASE per
price range, a day as DATE_FORMAT) for the Arrow pass: their Spark SQL, parsed by sqlglot, as
pyarrow compute expressions, or ArrowUnsupported naming what they cannot express (the table then
runs the Spark-SQL pass, arrow_pass.check_supported). What they do express must agree with Spark
SQL row for row, nulls included (tests/test_fuzz.py and tests/test_arrow_derived.py hold it)."""
from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc

from catalog.definitions import TableDefinition
from catalog.expressions import backslash_escaped
from spark_jobs.errors import ArrowUnsupported
from spark_jobs.frames.arrow_values import arrow_type, date_days, timestamp_ms

__all__ = ["derived_columns", "derived_types", "value_expression", "where_expression"]


def where_expression(table: TableDefinition):
    """The table's WHERE (Spark SQL, parsed by sqlglot) as a pyarrow expression. A row passes only
    when it is true; `Table.filter` drops nulls, which is SQL's rule."""
    import sqlglot

    return _converter(dict(table.schema))(sqlglot.parse_one(table.where, dialect="spark"))


# Spark's DATE_FORMAT letters the Arrow pass writes alike (sqlglot hands them over as strftime
# codes, a fixed width marked "strict"), and the characters it copies between them.
_TIME_CODES = {"%Y": "%Y", "%mstrict": "%m", "%dstrict": "%d", "%Hstrict": "%H", "%Mstrict": "%M", "%Sstrict": "%S"}
_LONGEST_FIRST = sorted(_TIME_CODES, key=len, reverse=True)
_TIME_SEPARATORS = set("-:/ ._")
DERIVED_TYPES = ("STRING", "BIGINT", "INT", "DOUBLE", "BOOLEAN")


def derived_types(table: TableDefinition) -> dict[str, str]:
    """Each computed key's and aggregate argument's Spark type, as sqlglot infers it over the
    stream's schema (a computed key's is already in `key_types`): the type its partials carry,
    alike in both passes."""
    return _derived_types(tuple(table.schema), tuple(table.derived.items()), tuple(table.key_types.items()))


@functools.lru_cache(maxsize=256)
def _derived_types(schema: tuple, derived: tuple, key_types: tuple) -> dict[str, str]:
    import sqlglot

    from catalog.definitions import sql_type

    known, out = dict(key_types), {}
    for name, sql in derived:
        kind = known.get(name) or sql_type(sqlglot.parse_one(sql, dialect="spark"), schema)
        if kind not in DERIVED_TYPES:
            raise ArrowUnsupported(f"{sql} of type {kind}")
        out[name] = kind
    return out


def derived_columns(table: TableDefinition) -> list[tuple[str, object, pa.DataType]]:
    """(name, pyarrow expression, Arrow type) of each computed key and aggregate argument, in the
    order the definition names them (a later one never reads an earlier one: each reads events)."""
    types = derived_types(table)
    return [(name, value_expression(sql, dict(table.schema)), arrow_type(types[name]))
            for name, sql in table.derived.items()]


def value_expression(sql: str, fields: dict[str, str]):
    """A computed value (Spark SQL over columns of these types) as a pyarrow expression."""
    import sqlglot

    return _expr(_converter(fields, arithmetic=False)(sqlglot.parse_one(sql, dialect="spark")))


def _converter(fields: dict[str, str], arithmetic: bool = True):
    """Spark SQL (a sqlglot tree) over columns of these types -> a pyarrow expression. Without
    `arithmetic`, a computed value refuses it: Arrow's checked kernels raise on an overflow where
    Spark (ANSI off) wraps, and a value, unlike a WHERE, has no row to drop."""
    from sqlglot import exp

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
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return -convert(node.this)            # a negative number, not arithmetic
        if not arithmetic and isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg)):
            raise ArrowUnsupported(f"arithmetic in a computed value ({node.sql(dialect='spark')})")
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
            return ~_expr(convert(node.this))
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
        if isinstance(node, (exp.Case, exp.If)):
            # SQL's CASE takes the first branch whose condition is true, a NULL condition being
            # not true; case_when does the same (if_else would make the row NULL).
            ifs = node.args["ifs"] if isinstance(node, exp.Case) else \
                [exp.If(this=node.this, true=node.args["true"])]
            default = node.args.get("default") if isinstance(node, exp.Case) else node.args.get("false")
            conditions = [_expr(convert(branch.this)) for branch in ifs]
            values = [_expr(convert(branch.args["true"])) for branch in ifs]
            if default is not None and not isinstance(default, exp.Null):
                values.append(_expr(convert(default)))
            chosen = pc.Expression._call("make_struct", conditions,
                                         pc.MakeStructOptions([f"c{i}" for i in range(len(conditions))]))
            return pc.Expression._call("case_when", [chosen, *values])
        if isinstance(node, exp.TimeToStr):
            return _formatted(node)
        raise ArrowUnsupported(f"{node.key.upper()} ({node.sql(dialect='spark')})")

    def _formatted(node):
        """DATE_FORMAT of a TIMESTAMP column in UTC (every statetable session's time zone), for
        the patterns of whole fields (yyyy, MM, dd, HH, mm, ss) and plain separators."""
        target, pattern = node.this, node.args.get("format")
        if isinstance(target, exp.TimeStrToTime):
            target = target.this
        if not (isinstance(target, exp.Column) and fields.get(target.name) == "TIMESTAMP"
                and isinstance(pattern, exp.Literal) and pattern.is_string):
            raise ArrowUnsupported(f"DATE_FORMAT {node.sql(dialect='spark')}")
        text, out = pattern.this, []
        while text:
            code = next((c for c in _LONGEST_FIRST if text.startswith(c)), None)
            if code is not None:
                out.append(_TIME_CODES[code])
                text = text[len(code):]
            elif text[0] in _TIME_SEPARATORS:
                out.append(text[0])
                text = text[1:]
            else:
                raise ArrowUnsupported(f"DATE_FORMAT pattern of {node.sql(dialect='spark')}")
        if all(code in _DATE_SLICES or code in _TIME_SEPARATORS for code in out):
            return _date_formatted(pc.field(target.name), out)
        # To whole seconds first, toward the past (a time before 1970 too): strftime would
        # write the microseconds with %S, and a cast would round toward 1970.
        seconds = pc.Expression._call("cast", [pc.Expression._call(
            "floor_temporal", [pc.field(target.name)], pc.RoundTemporalOptions(1, "second"))],
            pc.CastOptions(pa.timestamp("s", tz="UTC")))
        return pc.Expression._call("strftime", [seconds], pc.StrftimeOptions("".join(out)))

    return convert


# Where each date field sits in a DATE cast to text ("yyyy-MM-dd"). A cast to DATE floors
# toward the past, as Spark's DATE_FORMAT does, before 1970 too.
_DATE_SLICES = {"%Y": (0, -6), "%m": (-5, -3), "%d": (-2,)}    # from the end: a year past 9999 too


def _date_formatted(column: pc.Expression, codes: list[str]) -> pc.Expression:
    """A pattern of date fields only (Nexmark's day, 'yyyy-MM-dd'), cut from the day's ISO text:
    strftime took 124 ms for 200,000 times here, the DATE cast 6 ms (slices and a join 41),
    most of a q15-q17 pass's computed keys."""
    day = pc.Expression._call("cast", [pc.Expression._call("cast", [column], pc.CastOptions(pa.date32()))],
                              pc.CastOptions(pa.string()))
    if codes == ["%Y", "-", "%m", "-", "%d"]:
        return day
    parts = [pc.Expression._call("utf8_slice_codeunits", [day], pc.SliceOptions(*_DATE_SLICES[code]))
             if code in _DATE_SLICES else pc.scalar(code) for code in codes]
    return pc.Expression._call("binary_join_element_wise", parts + [pc.scalar("")])


def _expr(value):
    return value if isinstance(value, pc.Expression) else pc.scalar(value)
