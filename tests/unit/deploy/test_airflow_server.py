"""deploy.airflow_server's settings are options Airflow reads: a misspelt or renamed one (Airflow
2's `[scheduler] min_file_process_interval`) is ignored without a word, and the stack runs on a
default nobody chose."""
from __future__ import annotations

import os

import pytest

from catalog.settings import StackSettings
from deploy import airflow_server


def unread(names) -> list[str]:
    """The AIRFLOW__SECTION__OPTION names among `names` that no Airflow option (its own or an
    installed provider's) answers to."""
    from airflow.configuration import conf

    described = conf.configuration_description
    unknown = []
    for name in names:
        section, _, option = name.removeprefix("AIRFLOW__").lower().partition("__")
        if option not in described.get(section, {}).get("options", {}):
            unknown.append(name)
    return unknown


@pytest.mark.parametrize("executor", ["local", "celery"])
def test_every_airflow_option_the_stack_sets_is_one_airflow_reads(tmp_path, monkeypatch, executor):
    monkeypatch.setenv(airflow_server.EXECUTOR_ENV, executor)
    for name in [k for k in os.environ if k.startswith("AIRFLOW__")]:
        monkeypatch.delenv(name)                      # the stack's own settings only, not the caller's
    settings = StackSettings("127.0.0.1", 29092, 29093, 28080, tmp_path / "stack")
    env = airflow_server.airflow_env(settings)
    assert unread(n for n in env if n.startswith("AIRFLOW__")) == []


def test_the_suites_airflow_options_are_ones_airflow_reads():
    """tests/conftest.py's own (the scheduler off, metrics, lineage): ignored, scheduled runs would
    race the runs the tests trigger. pytest loaded tests/conftest.py, which set them, before this."""
    assert os.environ.get("AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE") == "False"
    assert unread(n for n in os.environ if n.startswith("AIRFLOW__")) == []


def test_the_parse_clock_is_30_minutes_with_changes_parsed_by_mtime_unless_the_deployment_sets_its_own(
        tmp_path, monkeypatch):
    """A user's new table file is a DAG within seconds through the batch service's watch
    (ops.table_files), which needs Airflow to parse a file by its modification time; the clock
    is a backstop, and a deployment's own wins."""
    name = "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"
    settings = StackSettings("127.0.0.1", 29092, 29093, 28080, tmp_path / "stack")
    monkeypatch.delenv(name, raising=False)
    assert airflow_server.airflow_env(settings)[name] == "1800"
    assert airflow_server.airflow_env(settings)["AIRFLOW__DAG_PROCESSOR__FILE_PARSING_SORT_MODE"] == "modified_time"
    monkeypatch.setenv(name, "120")
    assert airflow_server.airflow_env(settings)[name] == "120"


def _health_server(report: dict, delay: float = 0.0):
    """A local HTTP server answering /api/v2/monitor/health with `report` after `delay` s."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(delay)
            body = json.dumps(report).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            """The slow answer's client gave up (the 1 s timeout under test): its broken pipe, printed
            to stderr a second after the test, landed in the next test's captured output."""

    server = Quiet(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("report, delay, expected", [
    ({p: {"status": "healthy"} for p in ("metadatabase", "scheduler", "triggerer", "dag_processor")}, 0, "up"),
    ({"metadatabase": {"status": "healthy"}, "scheduler": {"status": "unhealthy"},
      "triggerer": {"status": "healthy"}, "dag_processor": {"status": None}}, 0,
     "down (scheduler, dag-processor not healthy)"),
    ({}, 2.0, "down (the API server did not answer in 1 s"),
])
def test_the_status_line_names_what_is_not_healthy(tmp_path, monkeypatch, report, delay, expected):
    """`stack status` exits 3 on a line that says down, bare or with its cause, and on no other."""
    from deploy import stack

    server = _health_server(report, delay)
    try:
        settings = StackSettings("127.0.0.1", 29092, 29093, server.server_address[1], tmp_path / "stack")
        monkeypatch.setattr(airflow_server, "process", lambda s, c: type("P", (), {"is_running": lambda self: True})())
        line = airflow_server.status_line(settings, timeout=1.0)
    finally:
        server.shutdown()
    assert line.startswith(f"airflow {settings.airflow_url} {expected}"), line
    assert stack.is_down(line) == (expected != "up")
