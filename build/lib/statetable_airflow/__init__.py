"""statetable's Airflow side: hooks, operators, sensors and DAG factories.

Installed with the project and also found in Airflow's plugins folder, so the
scheduler, the dag-processor and task processes import the same code.
"""
