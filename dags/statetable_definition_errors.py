"""No DAGs: an import error here names every table whose definition in dags/tables/ is broken
(the other tables keep their DAGs, declared in statetable_tables.py)."""
from statetable_airflow.dag_factory import definition_errors

definition_errors()
