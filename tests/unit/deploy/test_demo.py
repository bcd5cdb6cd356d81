"""The demo's waves (deploy/demo.py): a wave's DAG runs go at once, so a table in a wave with a
table it reads would race it (the leaderboard's as-of join would find no players)."""
from __future__ import annotations

from catalog.definitions import load_all
from catalog.settings import PROJECT_ROOT
from deploy import demo
from statetable_airflow.dag_factory import upstream_tables


def test_every_shipped_table_runs_once_after_every_table_it_reads():
    tables = load_all(PROJECT_ROOT / "dags" / "tables")
    waves = [set(wave) for wave in demo.WAVES]
    assert sorted(name for wave in demo.WAVES for name in wave) == sorted(tables)
    for i, wave in enumerate(waves):
        before = set().union(*waves[:i])
        for name in wave:
            reads = set(upstream_tables(tables[name], tables)) | {j.table for j in tables[name].joins}
            assert reads <= before, f"{name} (wave {i + 1}) reads {sorted(reads - before)} of its own wave or later"
    assert {j.table for j in tables["leaderboard"].joins} == {"players", "products"}     # the check can fail
