"""Smoke DAG: an exact Kafka offset range through Spark into Delta."""
from statetable_airflow.smoke import build_smoke_dag

dag = build_smoke_dag()
