"""`AirflowApi.failed_logs`: a failed run is explained by the logs of the tasks that failed, and a
log Airflow will not serve (a task that never ran has no try to read: 404 "TaskInstance not found",
which hid CI's failure at 372b9d5 behind the test's own message) is named, not raised."""
from __future__ import annotations

from deploy.airflow_api import AirflowApi


class _Api(AirflowApi):
    """The REST calls answered from a dict; everything else is the real client."""

    def __init__(self, instances: list[dict], logs: dict[tuple[str, int], str]) -> None:
        self.instances, self.logs, self.asked = instances, logs, []

    def _call(self, method, path, body=None, patience=60.0):
        if path.endswith("/taskInstances"):
            return {"task_instances": self.instances}
        task, try_number = path.split("/taskInstances/")[1].split("/logs/")
        key = (task, int(try_number.split("?")[0]))
        self.asked.append(key)
        if key not in self.logs:
            raise RuntimeError(f"GET {path} -> 404: {{\"detail\":\"TaskInstance not found\"}}")
        return {"content": [{"event": line} for line in self.logs[key].splitlines()]}


def test_only_failed_tasks_are_read_at_their_own_try_and_a_missing_log_is_named():
    api = _Api([{"task_id": "inject_failure", "state": "success", "try_number": 1},
                {"task_id": "restore", "state": "failed", "try_number": 2},
                {"task_id": "verify", "state": "upstream_failed", "try_number": 0},
                {"task_id": "record_result", "state": "failed", "try_number": 1}],
               {("restore", 2): "restoring\nRuntimeError: table 'movies': no snapshot"})
    logs = api.failed_logs("movies__restore_verify", "manual__1")
    assert list(logs) == ["restore", "record_result"]
    assert logs["restore"] == "restoring\nRuntimeError: table 'movies': no snapshot"
    assert logs["record_result"].startswith("(Airflow served no log: GET ") and "404" in logs["record_result"]
    assert api.asked == [("restore", 2), ("record_result", 1)]
    assert api.failed_logs("movies__restore_verify", "manual__1", tail=10)["restore"] == "o snapshot"
