"""One bad .sql file costs only its own table (issue 14, item 9): the other tables keep their
DAGs and jobs, the API answers 503 with the reason for the broken one, and Airflow shows an
import error that names it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spark_jobs import jobs
from catalog.definitions import DefinitionError
from serving.query import QueryService, StateUnavailable
from catalog.runtime import Runtime

SHIPPED = Path(__file__).resolve().parent.parent / "dags"
BAD = "-- topic: t\n-- schema: a STRING\nCREATE TABLE broken_one AS SELECT a, COUNT(nope) AS n FROM s GROUP BY a\n"


@pytest.fixture
def tables_dir(tmp_path) -> Path:
    folder = tmp_path / "tables"
    shutil.copytree(SHIPPED / "tables", folder)
    (folder / "broken_one.sql").write_text(BAD)
    return folder


def test_a_broken_definition_costs_only_its_own_table(tables_dir, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    rt = Runtime(bootstrap="127.0.0.1:1", data_dir=tmp_path / "data", snapshot_uri=str(tmp_path / "snap"),
                 tables_dir=tables_dir)
    table, _ = jobs.load_table("movie_tickets_sold", rt)
    assert table.name == "movie_tickets_sold"
    with pytest.raises(DefinitionError, match=r"broken_one\.sql:3.*nope"):
        jobs.load_table("broken_one", rt)

    service = QueryService(rt, background=False)
    try:
        with pytest.raises(StateUnavailable, match="broken_one.*nope") as unavailable:
            service.get("broken_one", "x")
        assert unavailable.value.retry_after > 0
        assert service.get("movie_tickets_sold", "x") == (None, None)     # never run: empty, not broken
        assert "broken_one" in service.broken_tables() and "broken_one" not in service.definitions
    finally:
        service.close()

    monkeypatch.setenv("STATETABLE_TABLES_DIR", str(tables_dir))
    bag = DagBag(dag_folder=str(SHIPPED))
    assert {"movie_tickets_sold__incremental", "leaderboard__rebuild"} <= set(bag.dag_ids)
    assert not any(d.startswith("broken_one") for d in bag.dag_ids)
    errors = {Path(path).name: text for path, text in bag.import_errors.items()}
    assert list(errors) == ["statetable_definition_errors.py"]
    assert "broken_one" in errors["statetable_definition_errors.py"] and "nope" in errors["statetable_definition_errors.py"]
