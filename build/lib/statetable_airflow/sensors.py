"""Sensors: wait for something outside Airflow."""
from __future__ import annotations

from airflow.sdk import BaseSensorOperator
from airflow.sdk.bases.sensor import PokeReturnValue

from statetable_airflow.hooks import KAFKA_CONN_ID, StateTableHook


class OffsetLagSensor(BaseSensorOperator):
    """Waits until a table's topic has at least `min_records` records past its last batch.

    One watermark request per poke, so it is cheap. With `timeout=0` and
    `soft_fail=True` it is a short-circuit: a run with nothing to read is
    skipped at once, and so are the tasks after it.
    """

    template_fields = ("table",)

    def __init__(self, *, table: str, min_records: int = 1, kafka_config_id: str = KAFKA_CONN_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.min_records = min_records
        self.kafka_config_id = kafka_config_id

    def get_openlineage_facets_on_complete(self, task_instance):
        from statetable_airflow.lineage import operator_lineage

        return operator_lineage(self.table, "wait")

    def poke(self, context) -> PokeReturnValue | bool:
        lag = StateTableHook(self.kafka_config_id).lag(self.table)
        self.log.info("%s: %d records to read (waiting for %d)", self.table, lag, self.min_records)
        return PokeReturnValue(is_done=True, xcom_value=lag) if lag >= self.min_records else False
