"""statetable_airflow.airflow_fixes: a callback-only parse keeps the file's last parse time, so the
dag-processor does not parse the whole file again at once (the DAGs of every table)."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from airflow.dag_processing import manager

from statetable_airflow import airflow_fixes


def _parse(mgr, file, had_callbacks: bool, parsing_result):
    proc = SimpleNamespace(had_callbacks=had_callbacks, parsing_result=parsing_result, start_time=time.monotonic())
    mgr.handle_parsing_result(file, proc, session=None)


def _manager(file, parsed_at):
    mgr = object.__new__(manager.DagFileProcessorManager)
    mgr._file_stats = {file: manager.DagFileStat(num_dags=300, import_errors=0, last_finish_time=parsed_at,
                                                 last_duration=5.0, run_count=4)}
    mgr._get_team_name = lambda bundle: None
    return mgr


def test_a_callback_only_parse_keeps_the_last_parse_time_and_counts(monkeypatch):
    file = manager.DagFileInfo(rel_path=Path("statetable_tables.py"), bundle_name="dags-folder",
                               bundle_path=Path("/dags"))
    parsed_at = datetime(2026, 12, 3, 16, 0, tzinfo=timezone.utc)
    monkeypatch.setattr(manager.DagFileProcessorManager, "handle_parsing_result",
                        manager.DagFileProcessorManager.handle_parsing_result)     # undone after the test
    mgr = _manager(file, parsed_at)
    _parse(mgr, file, True, None)
    assert mgr._file_stats[file].last_finish_time is None      # Airflow alone: the file looks never parsed

    monkeypatch.setattr(sys, "argv", ["airflow", "dag-processor"])
    assert airflow_fixes.apply() and airflow_fixes.apply()      # twice: wrapped once
    assert getattr(manager.DagFileProcessorManager.handle_parsing_result, airflow_fixes.MARK)
    mgr = _manager(file, parsed_at)
    _parse(mgr, file, True, None)
    stat = mgr._file_stats[file]
    assert (stat.last_finish_time, stat.num_dags, stat.import_errors) == (parsed_at, 300, 0)
    assert stat.last_duration is not None and stat.last_duration < 5.0     # the callback parse's own duration


def test_the_fix_applies_in_the_dag_processor_only(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["airflow", "tasks", "run"])
    assert airflow_fixes.apply() is False


def _parse_file(msg):
    """Stands in for Airflow's dag_processing.processor._parse_file (this file's path names airflow)."""
    from statetable_airflow.dag_factory import build_all

    return build_all(Path(__file__).resolve().parents[3] / "dags" / "tables")


def test_a_parse_for_callbacks_builds_only_the_dags_they_name():
    """Every run ending in the triggerer sends the dag-processor a callback, which parses the DAG
    file: it builds the DAGs the callbacks name, not every table's three."""
    def request(dag_id):
        return SimpleNamespace(ti=SimpleNamespace(dag_id=dag_id))

    everything = _parse_file(SimpleNamespace(callback_requests=[]))
    assert len(everything) >= 20
    one = _parse_file(SimpleNamespace(callback_requests=[request("players__incremental")]))
    assert set(one) == {"players__incremental"}
    two = _parse_file(SimpleNamespace(callback_requests=[request("players__incremental"),
                                                         request("movies__restore_verify")]))
    assert set(two) == {"players__incremental", "movies__restore_verify"}
    odd = _parse_file(SimpleNamespace(callback_requests=[SimpleNamespace()]))     # a request it cannot read
    assert set(odd) == set(everything)


def test_a_task_s_success_callback_queues_no_parse_and_a_failure_s_does(monkeypatch):
    """A task that ends in the triggerer with success sends a callback the dag-processor's parse
    does nothing with (processor._execute_task_callbacks returns for it): with the fix, it queues
    no parse of the file; a failure or retry callback still does."""
    from airflow.callbacks.callback_requests import TaskCallbackRequest
    from airflow.utils.state import TaskInstanceState

    queued = []
    monkeypatch.setattr(manager.DagFileProcessorManager, "_add_callback_to_queue",
                        lambda self, request: queued.append(request.task_callback_type))
    monkeypatch.setattr(sys, "argv", ["airflow", "dag-processor"])
    assert airflow_fixes.apply()
    mgr = object.__new__(manager.DagFileProcessorManager)

    def request(state):
        return TaskCallbackRequest.model_construct(filepath="statetable_tables.py", bundle_name="dags-folder",
                                                   task_callback_type=state, ti=SimpleNamespace(task_id="batch"))
    for state in (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, TaskInstanceState.UP_FOR_RETRY,
                  TaskInstanceState.SUCCESS):
        mgr._add_callback_to_queue(request(state))
    assert queued == [TaskInstanceState.FAILED, TaskInstanceState.UP_FOR_RETRY]
