"""A fix to the Airflow the stack runs, applied in its dag-processor (the stack's
`airflow_local_settings.py` calls `apply`).

Airflow 3.3's dag-processor runs a task's callbacks by parsing the task's DAG file, and records
that callback-only parse with a fresh file stat whose `last_finish_time` is None, overwriting the
file's last real parse. The file then looks never parsed, and is parsed again in full at once.
Airflow sends a callback for every task that ends in the triggerer with success, failure or a
retry, so each such batch of runs cost a full parse of the file holding every table's DAGs
(~5 CPU s at 100 tables). Measured with the runs of 100 tables ending in the triggerer: the
dag-processor took 42-95 CPU s of a wave, parsing the file in full every ~15 s. Upstream:
apache/airflow#73432 (the same stat, reached through a callback's bundle version) and its fix
in review, #73433; the callback-only stat itself is #55698's, meant to leave the timestamp as it
was, not to clear it.

The fix keeps the file's previous parse time and DAG counts when a callback-only parse ends.
It changes nothing else, applies only to a DagFileProcessorManager with the method and stat it
expects, and says in the log when it does not apply.

A second fix leaves out the callbacks that parse does nothing with. A task that succeeds in the
triggerer (every table's batch, handed to the batch service and awaited there) sends a success
callback too (models/trigger.py), and the dag-processor parses the file for it, only to log "Task
callback requested but is not a failure callback" and return (processor._execute_task_callbacks).
At 100 tables that was ~100 parses a wave, each a new process importing the DAG file: the
dag-processor's 10-11 CPU s a wave. Failure and retry callbacks, and DAG callbacks, go on as
they are.
"""
from __future__ import annotations

import functools
import logging
import sys

log = logging.getLogger("statetable.airflow_fixes")
MARK = "_statetable_keeps_parse_time"


def apply() -> bool:
    """Patch the dag-processor's manager, in the dag-processor only (other Airflow processes do
    not import it, and should not pay for it)."""
    if "dag-processor" not in sys.argv[1:2]:
        return False
    return keep_parse_time_after_callbacks() & skip_success_task_callbacks()


def keep_parse_time_after_callbacks() -> bool:
    try:
        import attrs
        from airflow.dag_processing import manager
    except ImportError as exc:
        log.warning("statetable: Airflow's dag-processor fix not applied: %s", exc)
        return False
    cls = getattr(manager, "DagFileProcessorManager", None)
    original = getattr(cls, "handle_parsing_result", None)
    stat_cls = getattr(manager, "DagFileStat", None)
    if original is None or stat_cls is None or not attrs.has(stat_cls) or \
            not {"last_finish_time", "num_dags", "import_errors"} <= {f.name for f in attrs.fields(stat_cls)}:
        log.warning("statetable: Airflow's dag-processor fix not applied: this Airflow's manager differs")
        return False

    def handle_parsing_result(self, file, proc, *args, **kwargs):
        before = self._file_stats.get(file)
        result = original(self, file, proc, *args, **kwargs)
        after = self._file_stats.get(file)
        if getattr(proc, "had_callbacks", False) and getattr(proc, "parsing_result", True) is None \
                and before is not None and after is not None and after.last_finish_time is None \
                and before.last_finish_time is not None:
            self._file_stats[file] = attrs.evolve(after, last_finish_time=before.last_finish_time,
                                                  num_dags=before.num_dags, import_errors=before.import_errors)
        return result

    return _replace_once(cls, "handle_parsing_result", handle_parsing_result)


def _manager_class(fix: str):
    """Airflow's DagFileProcessorManager, or None (said in the log) where this Airflow has none."""
    try:
        from airflow.dag_processing import manager
    except ImportError as exc:
        log.warning("statetable: Airflow's %s fix not applied: %s", fix, exc)
        return None
    return getattr(manager, "DagFileProcessorManager", None)


def _replace_once(cls, name: str, patched) -> bool:
    """`cls.name` replaced by `patched` (which calls the original), unless an earlier apply did."""
    original = getattr(cls, name)
    if not getattr(original, MARK, False):
        patched = functools.wraps(original)(patched)
        setattr(patched, MARK, True)
        setattr(cls, name, patched)
    return True


def skip_success_task_callbacks() -> bool:
    """Drop a task's success callback request before it queues a parse of its DAG file: the parse
    would run nothing for it (see the module's docstring)."""
    try:
        from airflow.callbacks.callback_requests import TaskCallbackRequest
    except ImportError as exc:      # the dag-processor starts either way: a fix, not a dependency
        log.warning("statetable: Airflow's success-callback fix not applied: %s", exc)
        return False
    cls = _manager_class("success-callback")
    original = getattr(cls, "_add_callback_to_queue", None)
    if original is None or not hasattr(TaskCallbackRequest, "is_failure_callback"):
        log.warning("statetable: Airflow's success-callback fix not applied: this Airflow's manager differs")
        return False

    def add_callback_to_queue(self, request, *args, **kwargs):
        if isinstance(request, TaskCallbackRequest) and not request.is_failure_callback:
            self.log.debug("statetable: no parse for %s's success callback (nothing runs for it)", request.ti.task_id)
            return None
        return original(self, request, *args, **kwargs)

    return _replace_once(cls, "_add_callback_to_queue", add_callback_to_queue)
