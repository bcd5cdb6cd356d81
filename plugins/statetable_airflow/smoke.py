"""The smoke DAG: plan an exact offset range, read it into Delta with Spark, report.

It is the first end-to-end check of the stack (Kafka, Spark with its Kafka
source and Delta, Airflow's LocalExecutor and the Spark provider).
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, task

import spark_jobs.smoke
from statetable_airflow.hooks import KafkaConnectionHook
from statetable_airflow.operators import spark_task
from statetable_airflow.errors import SmokeFailed

DAG_ID = "statetable_smoke"
SMOKE_TOPIC = "smoke_events"


def _data_dir() -> Path:
    return Path(os.environ.get("STATETABLE_DATA_DIR", Path.cwd() / "statetable-data"))


def build_smoke_dag() -> DAG:
    with DAG(
        dag_id=DAG_ID,
        description="Kafka offset range -> Spark -> Delta: the stack's end-to-end check",
        schedule="@daily",
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
        tags=["statetable", "smoke"],
        doc_md=__doc__,
    ) as dag:

        @task
        def plan_offsets() -> dict:
            from airflow.sdk.exceptions import AirflowSkipException

            from spark_jobs.steps.offsets import full_range

            hook = KafkaConnectionHook()
            try:
                offsets = full_range(hook.bootstrap_servers(), SMOKE_TOPIC)
            except LookupError:
                raise AirflowSkipException(f"no topic {SMOKE_TOPIC} yet; `statetable smoke` produces it") from None
            if offsets.record_count == 0:
                raise AirflowSkipException(f"{SMOKE_TOPIC} is empty; nothing to read")
            print(f"planned {offsets.record_count} records of {SMOKE_TOPIC}: {offsets.ranges}")
            return {"bootstrap": hook.bootstrap_servers(), "offsets": offsets.to_json()}

        plan = plan_offsets()
        result_file = str(_data_dir() / "smoke" / "result-{{ run_id | replace(':', '_') }}.json")
        arguments = [
            "--bootstrap", "{{ ti.xcom_pull(task_ids='plan_offsets')['bootstrap'] }}",
            "--offsets", "{{ ti.xcom_pull(task_ids='plan_offsets')['offsets'] }}",
            "--delta-path", str(_data_dir() / "delta" / "smoke_events"),
            "--result-file", result_file,
            "--run-key", "{{ run_id }}",
        ]
        submit = spark_task("read_range_to_delta", "spark_jobs.smoke", spark_jobs.smoke.__file__, "statetable-smoke",
                            arguments)

        @task
        def report(result_path: str) -> dict:
            result = json.loads(Path(result_path).read_text())
            print(f"smoke result: {result}")
            if result["count"] != result["planned"]:
                raise SmokeFailed(f"read {result['count']} records but planned {result['planned']}")
            return result

        plan >> submit >> report(result_file)
    return dag
