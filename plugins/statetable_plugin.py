"""Airflow loads plugins from the files in this folder; the plugin lives in the package."""
from statetable_airflow.plugin import StatetablePlugin

__all__ = ["StatetablePlugin"]
