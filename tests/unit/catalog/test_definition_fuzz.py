"""The definitions fuzzer (issue 66): generated and mutated `.sql` files dropped beside the
shipped tables. Whatever a file holds, `load_all` returns, every shipped table still loads, the
bad file is listed with a reason, and no file takes more than a bounded time.

Seeded; a failure prints its seed and the replay command:
  STATETABLE_FUZZ_SEED=<seed> .venv/bin/python -m pytest tests/unit/catalog/test_definition_fuzz.py
"""
from __future__ import annotations

import multiprocessing
import os
import random
import shutil
from pathlib import Path

import pytest

from catalog.definitions import load_all

SEED = int(os.environ.get("STATETABLE_FUZZ_SEED", "6601"))
SHIPPED = Path(__file__).resolve().parents[3] / "dags" / "tables"
GOOD = (SHIPPED / "payments_per_customer.sql").read_text()
PER_FILE_SECONDS = 20


def _replay(seed: int) -> str:
    return f"seed {seed}; replay: STATETABLE_FUZZ_SEED={seed} .venv/bin/python -m pytest " \
           f"tests/unit/catalog/test_definition_fuzz.py"


def _named(text: str, name: str) -> str:
    return text.replace("payments_per_customer", name)


def _select(extra: str, name: str) -> str:
    return _named(GOOD, name).replace("SELECT customer_id,", f"SELECT customer_id, {extra} AS extra,", 1)


def _where(condition: str, name: str) -> str:
    return _named(GOOD, name).replace("GROUP BY", f"WHERE {condition}\nGROUP BY", 1)


# Issue 66's files, each of which used to raise out of load_all or block it.
KNOWN = {
    "latin1.sql": lambda d: (d / "latin1.sql").write_bytes(b"-- caf\xe9\n" + _named(GOOD, "latin1").encode()),
    "sum_chain.sql": lambda d: (d / "sum_chain.sql").write_text(_select("+".join(["SUM(amount)"] * 3000), "sum_chain")),
    "not_not.sql": lambda d: (d / "not_not.sql").write_text(_where("NOT " * 3000 + "amount > 0", "not_not")),
    "cases.sql": lambda d: (d / "cases.sql").write_text(
        _select("CASE WHEN amount > 0 THEN " * 500 + "1" + " END" * 500, "cases")),
    ".#payments_per_customer.sql": lambda d: os.symlink("root@host.4242:1700000000", d / ".#payments_per_customer.sql"),
    "x.sql": lambda d: (d / "x.sql").mkdir(),
    "fifo.sql": lambda d: os.mkfifo(d / "fifo.sql"),
    "long_name.sql": lambda d: (d / "long_name.sql").write_text(_named(GOOD, "t" * 240)),
    "huge.sql": lambda d: (d / "huge.sql").write_text(_named(GOOD, "huge") + "-- " + "x" * 400_000 + "\n"),
    "parens.sql": lambda d: (d / "parens.sql").write_text(_where("(" * 100_000 + "amount > 0" + ")" * 100_000, "parens")),
    "minus.sql": lambda d: (d / "minus.sql").write_text(_select("-" * 5000 + "1", "minus")),
    "nul.sql": lambda d: (d / "nul.sql").write_bytes(_named(GOOD, "nul").encode().replace(b"SELECT", b"SEL\x00ECT")),
    "empty.sql": lambda d: (d / "empty.sql").write_text(""),
    "quote.sql": lambda d: (d / "quote.sql").write_text(_named(GOOD, "quote").replace("FROM", "'FROM")),
}


def _mutations(rng: random.Random, count: int) -> list[bytes]:
    """Byte-level and token-level mutations of a good definition."""
    pieces = ["(", ")", "CASE WHEN 1 THEN ", " END", "NOT ", "-", "'", '"', "`", "--", "/*", "*/", ";", ",",
              "SUM(", "COUNT(DISTINCT ", "TUMBLE(payment_ts, INTERVAL '1' HOUR)", "\\", "\u00e9", "\x00", "\n",
              "JOIN t ON a.x = b.y", "GROUP BY", "HAVING ", "TOPK(3, amount, customer_id)", "1e999999"]
    out = []
    for _ in range(count):
        text = _named(GOOD, f"m{rng.randrange(10**6)}")
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(text) + 1)
            if rng.random() < 0.7:
                text = text[:at] + rng.choice(pieces) * rng.choice([1, 1, 2, 70, 600]) + text[at:]
            else:
                text = text[:at] + text[at + rng.randint(1, 30):]
        data = text.encode("utf-8", "surrogatepass")
        if rng.random() < 0.1:
            data = data[:rng.randrange(len(data) + 1)] + bytes([rng.randrange(256)]) + data[rng.randrange(len(data) + 1):]
        out.append(data)
    return out


def _load(folder: str):
    broken: dict[str, str] = {}
    tables = load_all(folder, broken=broken)
    return {name: Path(table.path).name for name, table in tables.items()}, broken


def _load_bounded(folder: Path, seconds: float):
    pool = multiprocessing.get_context("fork").Pool(1)
    try:
        return pool.apply_async(_load, (str(folder),)).get(timeout=seconds)
    except multiprocessing.TimeoutError:
        pytest.fail(f"load_all took over {seconds} s in {folder}: {sorted(os.listdir(folder))}")
    finally:
        pool.terminate()


@pytest.fixture
def folder(tmp_path):
    for path in SHIPPED.glob("*.sql"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_each_known_hostile_file_is_listed_and_every_shipped_table_still_loads(folder):
    shipped, _ = _load(str(folder))
    for name, make in KNOWN.items():
        make(folder)
    tables, broken = _load_bounded(folder, PER_FILE_SECONDS * len(KNOWN))
    assert tables == shipped
    listed = "\n".join(f"{k}: {v}" for k, v in broken.items())
    for name in KNOWN:
        assert name in listed, (name, listed)      # every bad file, with its reason
    assert "is not UTF-8" in broken["latin1"] and "nest deeper" in broken["not_not"]
    assert "not a regular file" in broken["fifo.sql"] and "hidden file" in broken[".#payments_per_customer.sql"]
    assert "at most 100 characters" in broken["long_name"] and "operators in one expression" in broken["sum_chain"]


def test_two_files_defining_one_table_break_that_table_only(folder):
    (folder / "a_copy.sql").write_text(GOOD)
    tables, broken = _load(str(folder))
    assert "payments_per_customer" not in tables and "movies" in tables
    assert "a_copy.sql" in broken["payments_per_customer"] and "payments_per_customer.sql" in broken["payments_per_customer"]


def test_generated_and_mutated_definitions_never_raise_out_of_load_all(folder):
    shipped, _ = _load(str(folder))
    rng = random.Random(SEED)
    mutated = _mutations(rng, int(os.environ.get("STATETABLE_FUZZ_DEFINITIONS", "150")))
    for i, data in enumerate(mutated):
        (folder / f"fuzz_{i}.sql").write_bytes(data)
    tables, broken = _load_bounded(folder, PER_FILE_SECONDS + 0.2 * len(mutated))
    assert set(shipped) <= set(tables), (sorted(set(shipped) - set(tables)), _replay(SEED))
    for i in range(len(mutated)):
        listed = f"fuzz_{i}" in broken or any(f"/fuzz_{i}.sql" in reason for reason in broken.values())
        loaded = f"fuzz_{i}.sql" in tables.values()
        assert listed or loaded, (i, mutated[i][:200], _replay(SEED))


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace("-- topic: payments", "-- topic: pay`ments"), "is not a Kafka topic name"),
    (lambda t: "-- partitions: 2\nCREATE TABLE payments_per_customer (`we``ird` STRING PRIMARY KEY, v BIGINT) "
               "WITH (topic='src');\n", "without a backquote"),
])
def test_a_topic_or_column_name_the_tables_own_sql_cannot_quote_is_refused_when_it_loads(folder, edit, problem):
    (folder / "payments_per_customer.sql").write_text(edit(GOOD))
    tables, broken = _load(str(folder))
    assert "payments_per_customer" not in tables and problem in broken["payments_per_customer"]
    assert "movies" in tables
