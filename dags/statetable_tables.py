"""Three DAGs per table definition in dags/tables/: __incremental, __rebuild, __restore_verify."""
from statetable_airflow.dag_factory import build_all

globals().update(build_all())
