"""spark_jobs.passes: each shipped table is run by the Pass of its kind, and each Pass answers
the questions the steps around it ask (no Spark here: the answers are the kind's)."""
from __future__ import annotations

from pathlib import Path

import pytest

from catalog.definitions import load_all
from spark_jobs.passes import Pass, pass_for
from spark_jobs.passes.aggregate import AggregatePass
from spark_jobs.passes.source import SourcePass
from spark_jobs.passes.table_aggregate import TableAggregatePass
from spark_jobs.passes.table_join import TableJoinPass

TABLES = load_all(Path(__file__).resolve().parents[3] / "dags" / "tables")


@pytest.mark.parametrize("name, kind", [("movies", SourcePass), ("movie_ticket_totals", SourcePass),
                                        ("movie_tickets_sold", AggregatePass), ("leaderboard", AggregatePass),
                                        ("tickets_per_genre", TableAggregatePass),
                                        ("movie_ticket_genres", TableJoinPass)])
def test_every_kind_of_shipped_table_gets_its_pass(name, kind):
    assert type(pass_for(TABLES[name])) is kind


def test_what_each_kind_answers():
    facts = {type(p).__name__: (p.rows, p.pins_since, p.rows_stage)
             for p in map(pass_for, (TABLES["movies"], TABLES["movie_tickets_sold"], TABLES["tickets_per_genre"],
                                     TABLES["movie_ticket_genres"]))}
    assert facts == {"SourcePass": (True, False, False), "AggregatePass": (False, False, False),
                     "TableAggregatePass": (False, False, True), "TableJoinPass": (True, True, True)}


def test_engines(monkeypatch):
    monkeypatch.delenv("STATETABLE_ENGINE", raising=False)
    assert pass_for(TABLES["movies"]).engine == "spark"               # the Arrow pass keeps no rows
    assert pass_for(TABLES["movie_tickets_sold"]).engine == "arrow"
    assert pass_for(TABLES["tickets_per_genre"]).engine == pass_for(TABLES["movie_ticket_genres"]).engine == "tables"
    monkeypatch.setenv("STATETABLE_ENGINE", "spark")
    assert pass_for(TABLES["movie_tickets_sold"]).engine == "spark"


def test_only_an_aggregate_over_a_stream_with_bronze_and_no_window_or_ttl_chains_its_verify():
    chained = {name for name, table in TABLES.items() if pass_for(table).chains_verify()}
    assert chained and all(type(pass_for(TABLES[n])) is AggregatePass for n in chained)
    assert all(TABLES[n].window is None and TABLES[n].ttl_ms is None and TABLES[n].bronze for n in chained)


def test_the_base_pass_leaves_nothing_silently_undone():
    base = Pass(TABLES["movies"])
    with pytest.raises(NotImplementedError):
        base.run(None, None, 0.0, 0.0)
    with pytest.raises(NotImplementedError):
        base.recompute(None, None, None, None)
    assert base.moved_without_records(None, None) is False and base.chains_verify() is False
