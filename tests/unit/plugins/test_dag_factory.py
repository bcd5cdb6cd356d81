"""build_all: a task process builds only the DAG it runs (Airflow names it in the parsing
context), and the scheduler's parse still gets every table's DAGs."""
from __future__ import annotations

from statetable_airflow.dag_factory import build_all

TABLE = """-- topic: {name}
-- schema: customer_id STRING, amount DOUBLE
-- schedule: */5 * * * *
CREATE TABLE {name} AS SELECT customer_id, COUNT(amount) AS payments FROM {name} GROUP BY customer_id;
"""


def _tables(folder, count: int):
    for i in range(count):
        (folder / f"t{i}.sql").write_text(TABLE.format(name=f"t{i}"))
    return folder


def test_a_parse_for_a_task_builds_only_its_dag(tmp_path, monkeypatch):
    folder = _tables(tmp_path, 5)
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    every = build_all(folder)
    assert len(every) == 15 and "t3__incremental" in every and "t3__restore_verify" in every
    for dag_id in ("t3__incremental", "t1__rebuild", "t4__restore_verify"):
        monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", dag_id)
        only = build_all(folder)
        assert list(only) == [dag_id]
        assert only[dag_id].task_ids == every[dag_id].task_ids
        assert repr(vars(only[dag_id].timetable)) == repr(vars(every[dag_id].timetable))


def test_a_task_of_a_table_on_another_table_still_finds_its_dag(tmp_path, monkeypatch):
    """A table over another table's rows cannot load from its own file: the task's parse falls
    back to every definition, and builds the same DAG."""
    (tmp_path / "src.sql").write_text("CREATE TABLE src (id BIGINT PRIMARY KEY, customer_id STRING) WITH (topic='src');\n")
    (tmp_path / "over.sql").write_text("-- schedule: */5 * * * *\nCREATE TABLE over AS SELECT customer_id, COUNT(*) AS n "
                                       "FROM src GROUP BY customer_id;\n")
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    every = build_all(tmp_path)
    assert "over__incremental" in every
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "over__incremental")
    only = build_all(tmp_path)
    assert list(only) == ["over__incremental"] and only["over__incremental"].task_ids == ["run_batches"]
