"""A small client for Airflow's REST API (v2), used by the CLI and the tests.

Only what statetable needs: trigger a DAG run, wait for it, read task states
and XComs. Every call carries a bearer token from /auth/token.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse

from deploy import airflow_server
from catalog.settings import StackSettings
from deploy.errors import AirflowRefused, NoAnswer, WaitTimedOut

TERMINAL_RUN_STATES = {"success", "failed"}


class AirflowApi:
    def __init__(self, settings: StackSettings, token: str | None = None) -> None:
        self.base = settings.airflow_url
        self.token = token or airflow_server.api_token(settings)

    def _call(self, method: str, path: str, body: dict | None = None, patience: float = 60.0) -> dict:
        """One REST call; a GET the server did not answer is asked again for `patience` seconds, a
        POST only when the connection was refused, so a run is never triggered twice."""
        try:
            return airflow_server.http_json(
                self.base + path, method=method, body=json.dumps(body).encode() if body is not None else None,
                headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
                patience=patience, retry_unanswered=method == "GET")
        except urllib.error.HTTPError as exc:
            raise AirflowRefused(f"{method} {path} -> {exc.code}: {exc.read().decode(errors='replace')}") from None

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0, on_wait=None) -> dict:
        """Wait until the dag-processor has parsed `dag_id` into the database (`on_wait(text)`
        hears, once, what is waited for)."""
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                return self._call("GET", f"/api/v2/dags/{dag_id}")
            except RuntimeError as exc:
                if time.monotonic() > deadline:
                    raise NoAnswer(f"Airflow has no DAG {dag_id!r} after {timeout:.0f}s; its dag-processor log "
                                       f"says why (an import error shows in the UI's banner too)") from exc
                if on_wait and not told:
                    on_wait(f"waiting for Airflow's dag-processor to parse {dag_id} (a table file's DAGs come within seconds of it)")
                    told = True
                time.sleep(2)

    def trigger(self, dag_id: str, conf: dict | None = None, logical_date: str | None = None) -> str:
        run = self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": logical_date, "conf": conf or {}})
        return run["dag_run_id"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")

    def runs(self, dag_id: str) -> list[dict]:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]

    def runs_after(self, since: str) -> list[dict]:
        """Every DAG's runs due at or after `since` (ISO 8601), all pages: one call per hundred
        runs where a call per run would load the API server that serves the runs themselves."""
        out: list[dict] = []
        while True:
            page = self._call("GET", f"/api/v2/dags/~/dagRuns?run_after_gte={urllib.parse.quote(since)}"
                                     f"&limit=100&offset={len(out)}&order_by=run_after")
            out += page["dag_runs"]
            if not page["dag_runs"] or len(out) >= page["total_entries"]:
                return out

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600.0, on_poll=None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if on_poll:
                on_poll(run)
            if run["state"] in TERMINAL_RUN_STATES:
                return run
            if time.monotonic() > deadline:
                raise WaitTimedOut(f"{dag_id} run {run_id} still {run['state']} after {timeout:.0f}s")
            time.sleep(2)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        quoted = urllib.parse.quote(run_id, safe="")
        items = self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in items}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        quoted = urllib.parse.quote(run_id, safe="")
        entry = self._call(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/xcomEntries/{key}?deserialize=true"
        )
        return entry["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task's log as text (Airflow 3 returns structured events; their text is joined)."""
        quoted = urllib.parse.quote(run_id, safe="")
        body = self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/logs/"
                                 f"{try_number}?full_content=true")
        content = body.get("content", "")
        if isinstance(content, list):
            return "\n".join(e.get("event", "") if isinstance(e, dict) else str(e) for e in content)
        return str(content)

    def failed_logs(self, dag_id: str, run_id: str, tail: int = 3000) -> dict[str, str]:
        """Each task of the run that failed, with its log's last `tail` characters: what explains a
        run that did not succeed. A task whose log Airflow cannot serve says so instead of raising,
        so the explanation of one failure never hides behind another."""
        logs = {}
        for task_id, ti in self.task_instances(dag_id, run_id).items():
            if ti.get("state") not in ("failed", "up_for_retry"):
                continue
            try:
                logs[task_id] = self.task_log(dag_id, run_id, task_id, ti.get("try_number") or 1)[-tail:]
            except (RuntimeError, OSError) as exc:
                logs[task_id] = f"(Airflow served no log: {exc})"
        return logs

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        quoted = urllib.parse.quote(run_id, safe="")
        items = self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in items}
