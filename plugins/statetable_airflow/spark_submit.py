"""spark-submit for clusters without a Spark Connect server (STATETABLE_SPARK_MODE=submit).

Its own module because the Spark provider's operator imports the OpenLineage client (~0.4 CPU s):
every task process of the default Connect mode parses the DAG file, and paid for it unused."""
from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class PrivateConfSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit with the conf in a private properties file (mode 600, removed after), not as
    `--conf` on a command line every local user reads: STATETABLE_SPARK_CONF may hold a
    deployment's credentials. Written when the task runs, on the host that runs it."""

    def execute(self, context):
        import tempfile

        from spark_jobs.engine.session import java_properties

        with tempfile.NamedTemporaryFile("w", suffix=".properties", prefix="statetable-") as conf_file:
            conf_file.write(java_properties(self.conf or {}))
            conf_file.flush()
            self.properties_file, self.conf = conf_file.name, {}
            return super().execute(context)
