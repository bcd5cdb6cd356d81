"""statetable as an Airflow provider: what `airflow providers list`, the connection form and
the docs read through the `apache_airflow_provider` entry point (see pyproject.toml)."""
from __future__ import annotations


def get_provider_info() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = [version("statetable")]
    except PackageNotFoundError:       # run from a checkout without installing it
        versions = ["0.0.0"]
    return {
        "package-name": "statetable",
        "name": "statetable",
        "description": "Fault-tolerant, queryable state tables for Kafka event streams, run by Spark and "
                       "proven exact by restore-and-verify DAGs.",
        "versions": versions,
        "integrations": [{"integration-name": "statetable", "tags": ["software"],
                          "external-doc-url": "https://github.com/statetable/statetable"}],
        "operators": [{"integration-name": "statetable",
                       "python-modules": ["statetable_airflow.operators", "statetable_airflow.spark_submit"]}],
        "sensors": [{"integration-name": "statetable", "python-modules": ["statetable_airflow.sensors"]}],
        "hooks": [{"integration-name": "statetable", "python-modules": ["statetable_airflow.hooks"]}],
        "triggers": [{"integration-name": "statetable", "python-modules": ["statetable_airflow.triggers"]}],
        "connection-types": [{"connection-type": "statetable", "hook-class-name":
                              "statetable_airflow.hooks.StatetableApiHook", "hook-name": "statetable query API"}],
        "plugins": [{"name": "statetable", "plugin-class": "statetable_airflow.plugin.StatetablePlugin"}],
    }
