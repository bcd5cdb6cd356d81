"""Property-based fuzzing of what producers and definitions can send: record values through
the parser alone and in blocks (Hypothesis), generated row expressions against Spark SQL (ANSI
off), and generated records through both passes on the real broker and Spark.

Every run is seeded. A failure prints its seed and the command that replays it:
  STATETABLE_FUZZ_SEED=<seed> .venv/bin/python -m pytest tests/test_fuzz.py -k <test>
(Hypothesis prints its own reproduction blob for the parser properties.) An example a run
found is kept below as a regression (@example, or tests/test_wedges.py).
"""
from __future__ import annotations

import decimal
import json
import math
import os
import random
import uuid

import pandas as pd
import pyarrow as pa
import pytest
import sqlglot
from hypothesis import HealthCheck, example, given, settings, strategies as st

from catalog.errors import UnsupportedSql
from catalog.expressions import compile_value
from spark_jobs.frames.arrow_values import parse_values
from tests.fuzz import expressions as fuzz_expressions, records as fuzz_records

SEED = int(os.environ.get("STATETABLE_FUZZ_SEED", "4511"))


def _replay(test: str, seed: int) -> str:
    return f"seed {seed}; replay: STATETABLE_FUZZ_SEED={seed} .venv/bin/python -m pytest tests/test_fuzz.py -k {test}"


# ------------------------------------------------------------- records: alone and in blocks
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["2026-11-01T10:00:00Z", "1969-12-31T23:59:59.999500", "1700000000000", "\u0661\u0662",
                     "2026-01-01T00:00:00.123456+02:00", "9300000000000000000", *fuzz_records.DATES[:15]]),
)
_objects = st.dictionaries(st.sampled_from([n for n, _ in fuzz_records.SCHEMA] + ["other"]),
                           st.one_of(_scalars, st.lists(_scalars, max_size=2)), max_size=6)
_raw = st.one_of(
    _objects.map(lambda o: json.dumps(o).encode()),
    _objects.map(lambda o: json.dumps(o, ensure_ascii=False).encode()),
    st.sampled_from([b"null", b"", b" ", b"[]", b"42", b'{"k":"\\ud800"}', b'{"k":"\\ud83d\\ude00"}', b'{"k":"\xff"}',
                     b'{"v":NaN}', b'{"x":Infinity}', b'{"x":1e400}', b'{"v":' + b"9" * 40 + b"}",
                     b'{"k":"a"}{"k":"b"}', b'{"k":"a","k":"b"}', b'{"t":123456789012345678}', b'{"k":\n"a"}',
                     b' {"k":"a"} ', b'{"k":"a"', b'{"\x00":1}']),
    st.binary(max_size=40),
)


def _verdicts(values: list[bytes]) -> dict[int, object]:
    """index -> ("dead", reason) or ("good", row) for `values` parsed as one array."""
    table, index, bad = parse_values(pa.array(values, pa.binary()), fuzz_records.SCHEMA)
    rows = table.to_pylist()
    out = {i: ("dead", reason) for i, reason in bad}
    for position, i in enumerate(index.to_pylist()):
        assert i not in out, f"record {i} both parsed and dead-lettered"
        out[i] = ("good", rows[position])
    assert sorted(out) == list(range(len(values))), "a record was neither parsed nor dead-lettered"
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=int(os.environ.get("STATETABLE_FUZZ_BLOCKS", "100")), deadline=None, print_blob=True,
          database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_raw, min_size=30, max_size=60))
@example([b'{"k":"a"}{"k":"b"}', b""] + [b'{"k":"x"}'] * 10)            # two objects beside an empty value
@example([b"null"] + [b'{"k":"x"}'] * 10)                              # null in a block: malformed_json, not nulls
@example([b'{"k":"\\ud800","v":1}'] + [b'{"k":"x"}'] * 10)              # issue 45's 40-byte record
@example([b'{"k":' + b"[" * 900 + b"]" * 900 + b"}"] + [b'{"k":"x"}'] * 10)   # deep nesting in a STRING field (review)
@example([b'{"t":"1969-12-31T23:59:59.999500"}'] + [b'{"t":"2026-01-01T00:00:00Z"}'] * 10)
@example([b'{"k":"a","z":' + b"[" * 999 + b"]" * 999 + b"}"] + [b'{"k":"x"}'] * 10)   # issue 66: past the 999
@example([b'{"k":"a","z":' + b"[" * 998 + b"]" * 998 + b"}"] + [b'{"k":"x"}'] * 10)     # ... and at it
@example([b'{"k":"a","z":"' + b"[" * 100_000 + b'"}'] + [b'{"k":"x"}'] * 10)           # brackets in a string
@example([b'{"d":"0000-01-01"}'] + [b'{"d":"2026-01-01"}'] * 10)                       # issue 66: year 0
@example([b'{"d":"20240101"}', b'{"d":" 2024-01-01"}'] + [b'{"d":"2026-01-01"}'] * 10)
def test_a_record_gets_the_same_verdict_and_value_alone_as_in_a_block(values):
    together = _verdicts(values)
    for i, value in enumerate(values):
        alone = _verdicts([value])[0]
        assert alone[0] == together[i][0] and _same(alone[1], together[i][1]), \
            f"record {value[:120]!r}: alone {alone}, in a block {together[i]}"


def test_generated_hostile_records_get_the_same_verdict_alone_as_in_their_batch():
    """The records the both-passes test sends (dates past their range, nesting to 100,000), as
    one batch and each alone."""
    values = fuzz_records.values(SEED, int(os.environ.get("STATETABLE_FUZZ_RECORDS", "1000")))
    together = _verdicts(values)
    for i, value in enumerate(values):
        alone = _verdicts([value])[0]
        assert alone[0] == together[i][0] and _same(alone[1], together[i][1]), \
            (f"record {i} {value[:120]!r}: alone {alone}, in the batch {together[i]}", _replay("alone", SEED))


# ------------------------------------------------------------------ expressions vs Spark SQL
def test_generated_expressions_are_total_and_agree_with_spark_sql(spark):
    failures, compared, total = [], 0, 0
    for seed in (SEED, SEED + 1):
        generator = fuzz_expressions.Generator(seed)
        expressions = list(dict.fromkeys(generator.expression() for _ in range(300)))
        theirs = fuzz_expressions.spark_values(spark, expressions)
        for sql in expressions:
            try:
                ours = compile_value(sqlglot.parse_one(sql, dialect="spark"), dict(fuzz_expressions.COLUMNS))
            except UnsupportedSql:
                continue
            values = [ours(row) for row in fuzz_expressions.ROWS]          # total: raises nothing
            total += 1
            assert all(v is None or isinstance(v, (bool, int, float, str, decimal.Decimal)) for v in values), sql
            if theirs.get(sql) is None:                                    # Spark's analyzer refuses it
                continue
            compared += 1
            spark_values, spark_type = theirs[sql]
            for row, mine, its in zip(fuzz_expressions.ROWS, values, spark_values):
                if not fuzz_expressions.same(mine, its, spark_type):
                    failures.append(f"{sql}\n  row {row}\n  ours {mine!r}, Spark {its!r} ({spark_type}); "
                                    f"{_replay('expressions', seed)}")
                    break
    assert total >= 300 and compared >= 150, (total, compared)
    assert not failures, "\n".join(failures[:10])


# ------------------------------------------------------------ records through both passes
SQL = """-- topic: {topic}
-- schema: k STRING, v BIGINT, x DOUBLE, t TIMESTAMP, flag BOOLEAN, d DATE
-- partitions: 3
-- max_records_per_batch: 400
CREATE TABLE {table} AS SELECT k, COUNT(*) AS n, SUM(v) AS s, MAX(x) AS mx, COUNT(flag) AS nf FROM events GROUP BY k;
"""


def _double_text(text: str) -> str:
    """A JSON number with a fraction or exponent as Java writes the double it is (1e2 -> 100.0)."""
    number = float(text)
    if not math.isfinite(number):
        return json.dumps("Infinity" if number > 0 else "-Infinity")
    if number == 0 or 1e-3 <= abs(number) < 1e7:
        shown = repr(number)
        return shown if "." in shown else shown + ".0"
    shortest = decimal.Decimal(repr(number)).normalize()
    sign, figures, power = shortest.as_tuple()
    figures = "".join(map(str, figures))
    return f"{'-' if sign else ''}{figures[0]}.{figures[1:] or '0'}E{power + len(figures) - 1}"


def _as_text(value) -> str:
    """A JSON value as a STRING field holds it: compact JSON text, integers as written, other
    numbers as Java writes their double (Spark's reader)."""
    if isinstance(value, tuple):
        return value[1] if value[0] in ("int", "const") else _double_text(value[1])
    if isinstance(value, list):
        return "[" + ",".join(_as_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_as_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _reference(applied: list[bytes]) -> dict[str, tuple]:
    """pandas over the records the table applied, read with json (not the product's parser): a
    STRING field keeps a number's text as written."""
    rows = []
    for value in applied:
        obj = json.loads(value, parse_int=lambda t: ("int", t), parse_float=lambda t: ("float", t),
                         parse_constant=lambda t: ("const", json.dumps(t)))    # NaN in text: '"NaN"', as Spark
        k = obj["k"] if isinstance(obj["k"], str) else _as_text(obj["k"])
        v = obj.get("v")
        x = obj.get("x")
        rows.append({"k": k, "v": None if v is None else int(v[1]), "x": None if x is None else float(x[1]),
                     "flag": obj.get("flag")})
    frame = pd.DataFrame(rows, columns=["k", "v", "x", "flag"], dtype=object)   # object: ints past 2**53 stay exact
    out = {}
    for key, group in frame.groupby("k", dropna=False, sort=False):
        v = group["v"].dropna()
        x = group["x"].dropna()
        out[key] = (len(group), sum(int(i) for i in v) if len(v) else None,
                    max(float(i) for i in x) if len(x) else None, int(group["flag"].notna().sum()))
    return out


@pytest.mark.timeout(900)
def test_generated_records_commit_on_both_passes_with_the_same_verdicts_and_state(kafka, spark, tmp_path,
                                                                                  monkeypatch):
    from confluent_kafka import Producer

    from catalog.mapping import row_of
    from catalog.registry import load_table
    from serving.query import BadQuery, NoSuchTable, QueryService
    from spark_jobs import jobs
    from state.kafka_admin import ensure_topic
    from tests.table_env import isolated_runtime, read_topic

    rt, suffix = isolated_runtime(kafka, tmp_path)
    values = fuzz_records.values(SEED, int(os.environ.get("STATETABLE_FUZZ_RECORDS", "1000")))
    rng = random.Random(SEED)
    topic = f"fuzz-{uuid.uuid4().hex[:6]}{suffix}"
    ensure_topic(rt.bootstrap, topic, 2, {"max.message.bytes": "2000000"})
    producer = Producer({"bootstrap.servers": rt.bootstrap, "message.max.bytes": 2_000_000})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=fuzz_records.kafka_key(rng), partition=i % 2,
                         headers=[("h", bytes(rng.randrange(256) for _ in range(rng.randint(0, 20))))])
    assert producer.flush(60) == 0
    read_back = {(m.partition(), m.offset()): m.value() for m in read_topic(rt.bootstrap, topic)}
    assert len(read_back) == len(values)

    results = {}
    for engine in ("arrow", "spark"):
        table = f"fuzz_{engine}"
        (rt.tables_dir / f"{table}.sql").write_text(SQL.format(topic=topic, table=table))
        monkeypatch.setenv("STATETABLE_ENGINE", engine)
        commits = jobs.run(table, until_caught_up=True, spark=spark, rt=rt)
        assert sum(c.counts["read"] for c in commits) == len(values), _replay("both_passes", SEED)
        dead = {}
        for message in read_topic(rt.bootstrap, rt.dead_letter_topic(table)):
            headers = dict(message.headers())
            coordinate = (int(headers["source_partition"]), int(headers["source_offset"]))
            assert headers["reason"], coordinate
            dead[coordinate] = headers["reason"].decode()
        counted = sum(c.counts["dead_lettered"] for c in commits)
        assert counted == len(dead), (engine, counted, len(dead), _replay("both_passes", SEED))
        applied = [v for c, v in read_back.items() if c not in dead]
        definition = load_table(table, rt)[0]
        state = {k[0]: row_of(definition, k, v) for k, v in jobs.state_rows(table, rt).items()}
        got = {k: (r["n"], r["s"], r["mx"], r["nf"]) for k, r in state.items()}
        assert got == _reference(applied), (engine, _replay("both_passes", SEED))
        results[engine] = (dead, got)

        service = QueryService(rt)                                   # no key a client sends is a server error
        try:
            for raw in [*(k for k in got if isinstance(k, str)), "\ud800", '["\\ud800"]', "[", '[1,2]', "\x00", "é" * 300]:
                try:
                    service.get(table, raw)
                except (BadQuery, NoSuchTable):
                    pass
        finally:
            service.close()

    (arrow_dead, arrow_state), (spark_dead, spark_state) = results["arrow"], results["spark"]
    assert set(arrow_dead) == set(spark_dead), (
        {c: (read_back[c][:80], arrow_dead.get(c), spark_dead.get(c)) for c in set(arrow_dead) ^ set(spark_dead)},
        _replay("both_passes", SEED))
    assert arrow_state == spark_state, _replay("both_passes", SEED)
