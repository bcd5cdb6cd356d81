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


def test_hostile_files_in_the_tables_folder_cost_no_other_table(tmp_path, monkeypatch):
    """Issue 66: a non-UTF-8 file, an editor's lock symlink, a directory and a FIFO named *.sql and
    a 3,000-term expression each stopped every table (load_all raised or blocked). Dropped beside
    the shipped tables, they leave every shipped table's DAGs in Airflow's DagBag and in the query
    service, and `statetable tables` lists each with its reason."""
    import json
    import os
    import subprocess
    import sys

    from airflow.dag_processing.dagbag import DagBag

    from tests.unit.catalog.test_definition_fuzz import KNOWN

    folder = tmp_path / "tables"
    shutil.copytree(SHIPPED / "tables", folder)
    shipped = sorted(p.stem for p in folder.glob("*.sql"))
    for name in ("latin1.sql", ".#payments_per_customer.sql", "x.sql", "fifo.sql", "sum_chain.sql"):
        KNOWN[name](folder)
    rt = Runtime(bootstrap="127.0.0.1:1", data_dir=tmp_path / "data", snapshot_uri=str(tmp_path / "snap"),
                 tables_dir=folder)
    service = QueryService(rt, background=False)
    try:
        assert sorted(service.definitions) == shipped
        assert {"latin1", ".#payments_per_customer.sql", "x.sql", "fifo.sql", "sum_chain"} <= set(service.broken_tables())
    finally:
        service.close()

    monkeypatch.setenv("STATETABLE_TABLES_DIR", str(folder))
    bag = DagBag(dag_folder=str(SHIPPED))
    assert {f"{t}__incremental" for t in shipped} <= set(bag.dag_ids)
    errors = {Path(path).name: text for path, text in bag.import_errors.items()}
    assert list(errors) == ["statetable_definition_errors.py"]
    for reason in ("is not UTF-8", "hidden file", "not a regular file", "operators in one expression"):
        assert reason in errors["statetable_definition_errors.py"], reason

    env = {**os.environ, **rt.as_env()}
    broken = ["latin1", "x.sql", "fifo.sql", "sum_chain", ".#payments_per_customer.sql"]
    listed = subprocess.run([str(Path(sys.executable).parent / "statetable"), "tables", *broken, "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    rows = {row["table"]: row for row in json.loads(listed.stdout)}
    assert set(broken) == set(rows), listed.stderr
    assert "is not UTF-8" in rows["latin1"]["broken"] and "Traceback" not in listed.stderr
