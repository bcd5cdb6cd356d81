"""OpenLineage datasets of a table's tasks, for Airflow's OpenLineage provider.

A lineage UI (Marquez, DataHub, ...) should show a table with what it reads (its input topic,
the tables it joins) and what it writes (its changelog, change and dead-letter topics, its
Delta bronze and mirror tables). The operators return these from
`get_openlineage_facets_on_complete`; the provider sends them with each task's run events
through whatever transport the deployment configured (nothing is sent when none is).
Names follow OpenLineage's naming spec: `kafka://host:port` + topic, `file` or
`s3://bucket` + path.
"""
from __future__ import annotations

#: What each task reads and writes, by kind of task.
KINDS = ("run", "rebuild", "verify", "restore", "wait", "none")


def _dataset(namespace: str, name: str):
    from airflow.providers.common.compat.openlineage.facet import Dataset

    return Dataset(namespace=namespace, name=name)


def _topic(rt, topic: str):
    first = rt.bootstrap.split(",")[0].strip()
    return _dataset(f"kafka://{first}", topic)


def _path(location: str):
    for scheme in ("s3a://", "s3://"):
        if location.startswith(scheme):
            bucket, _, key = location[len(scheme):].partition("/")
            return _dataset(f"s3://{bucket}", key)
    return _dataset("file", location.removeprefix("file://"))


def datasets(table_name: str, kind: str, rt=None) -> tuple[list, list]:
    """(inputs, outputs) of a task of `kind` on the table."""
    from catalog.registry import load_table, spec_of
    from catalog.runtime import Runtime

    if kind not in KINDS:
        from catalog.errors import UserError
        raise UserError(f"lineage kind {kind!r}: use one of {', '.join(KINDS)}")
    if kind == "none":
        return [], []
    rt = rt or Runtime.from_env()
    table, _ = load_table(table_name, rt)
    source = _topic(rt, table.topic)
    changelog = _topic(rt, spec_of(table, rt).changelog)
    joined = [_topic(rt, spec_of(load_table(j.table, rt)[0], rt).changelog) for j in table.joins]
    if table.stream_join is not None:           # a windowed join of two streams reads its second topic too
        joined.append(_topic(rt, table.stream_join.topic))
    bronze = [_path(rt.delta_path(table.name, "bronze"))] if table.bronze else []
    mirror = _path(rt.delta_path(table.name, "mirror"))
    changes = [_topic(rt, table.output_topic)] if table.output_topic else []
    if kind == "wait":
        return [source], []
    if kind == "run":
        return [source, *joined], [changelog, *changes, _topic(rt, rt.dead_letter_topic(table.name)), *bronze, mirror]
    if kind == "rebuild":
        return (bronze or [source]) + joined, [changelog, *changes, mirror]
    if kind == "verify":
        return (bronze or [source]) + joined + [changelog], []
    return [changelog], []          # restore: the changelog (and snapshots) rebuild the local store


def operator_lineage(table_name: str, kind: str):
    """The provider's OperatorLineage for the task; an empty one if the table cannot be loaded
    (lineage must never fail a task)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    try:
        inputs, outputs = datasets(table_name, kind)
    except Exception:      # noqa: BLE001 - a broken definition fails the task itself, not its lineage
        return OperatorLineage()
    return OperatorLineage(inputs=inputs, outputs=outputs)


def emit_run_events(table_name: str, ti, started, ended) -> None:
    """A run's START and COMPLETE events when it ended in the triggerer: Airflow's OpenLineage
    listener runs only in a task process, so the trigger sends what it would have, through the
    provider's own adapter and transport (nothing when the provider is off). The Airflow run's
    ids ride in an `airflowDagRun` run facet so a lineage UI can find the run. A failure raises;
    the caller logs it (lineage never fails a run)."""
    from airflow.providers.openlineage import conf
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
    from airflow.providers.openlineage.plugins.facets import AirflowDagRunFacet
    from airflow.providers.openlineage.utils.utils import build_task_instance_ol_run_id

    if conf.is_disabled():
        return
    dag_run = getattr(ti, "dag_run", None)
    instant = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None) or started
    run_id = build_task_instance_ol_run_id(dag_id=ti.dag_id, task_id=ti.task_id, try_number=ti.try_number,
                                           logical_date=instant, map_index=getattr(ti, "map_index", -1))
    facets = {"airflowDagRun": AirflowDagRunFacet(
        dag={"dag_id": ti.dag_id},
        dagRun={"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "try_number": ti.try_number,
                "ended_in": "triggerer"})}
    job = f"{ti.dag_id}.{ti.task_id}"
    common = {"nominal_start_time": None, "nominal_end_time": None, "owners": None, "tags": None,
              "job_description": None, "run_facets": facets}
    adapter = OpenLineageAdapter()
    adapter.start_task(run_id=run_id, job_name=job, event_time=started.isoformat(), task=OperatorLineage(),
                       **common)
    adapter.complete_task(run_id=run_id, job_name=job, end_time=ended.isoformat(),
                          task=operator_lineage(table_name, "run"), **common)
