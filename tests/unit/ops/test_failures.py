"""The drills' deployment commands (ops/failures.py `_run_deployment_command`): a command that
hangs fails the drill in one line naming the command, what it said and the setting to change; a
slow one is waited for (a Spark Connect restart beside other work passed the old 180 s limit)."""
from __future__ import annotations

import sys

import pytest

from ops import failures


def test_a_hanging_command_fails_in_one_line_naming_it_and_the_setting(monkeypatch):
    monkeypatch.setattr(failures, "DEPLOYMENT_COMMAND_SECONDS", 1.0)
    monkeypatch.setenv(failures.ENGINE_RESTART_ENV,
                       f"{sys.executable} -c \"import time; print('starting the engine', flush=True); time.sleep(30)\"")
    with pytest.raises(RuntimeError) as caught:
        failures._run_deployment_command("kill_engine", failures.ENGINE_RESTART_ENV, "restart-engine",
                                         "Spark Connect server")
    message = str(caught.value)
    assert "\n" not in message and "had not finished after 1s" in message
    assert "(it said: starting the engine)" in message and failures.ENGINE_RESTART_ENV in message


def test_a_command_that_finishes_gives_its_seconds_and_itself(monkeypatch):
    monkeypatch.setenv(failures.ENGINE_RESTART_ENV, f"{sys.executable} -c \"import time; time.sleep(1.5)\"")
    seconds, command = failures._run_deployment_command("kill_engine", failures.ENGINE_RESTART_ENV,
                                                        "restart-engine", "Spark Connect server")
    assert 1.5 <= seconds < failures.DEPLOYMENT_COMMAND_SECONDS and command.startswith(sys.executable)
    assert failures.DEPLOYMENT_COMMAND_SECONDS >= 600
