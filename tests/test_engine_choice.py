"""Which engine a job runs on (spark_jobs.engine.session.engine): pure logic, no server started."""
from __future__ import annotations

import socket

import pytest

from spark_jobs.engine import session


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]      # closed again when the block ends: nothing listens there


def test_a_server_that_does_not_answer_fails_the_job_at_once_naming_it_and_how_to_start_it(monkeypatch):
    port = _closed_port()
    monkeypatch.setenv(session.REMOTE_ENV, f"sc://127.0.0.1:{port}/;token=s3cret")
    with pytest.raises(session.EngineUnavailable) as caught:
        session.engine()
    message = str(caught.value)
    assert f"sc://127.0.0.1:{port}/" in message and "statetable stack up" in message
    assert f"{session.REMOTE_ENV}=local" in message
    assert "s3cret" not in message


def test_a_bad_setting_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(session.REMOTE_ENV, "spark://master:7077")
    with pytest.raises(ValueError, match=r"STATETABLE_SPARK_REMOTE='spark://master:7077'.*sc://HOST:PORT.*'local'"):
        session.engine()


def test_local_forces_a_local_session_and_unset_falls_back_to_one_when_no_server_answers(monkeypatch):
    monkeypatch.setenv(session.REMOTE_ENV, "local")
    assert session.engine() == (None, "STATETABLE_SPARK_REMOTE=local")
    monkeypatch.delenv(session.REMOTE_ENV)
    monkeypatch.setenv("STATETABLE_SPARK_CONNECT_PORT", str(_closed_port()))
    url, why = session.engine()
    assert url is None and "no Spark Connect server answers" in why


def test_a_token_goes_to_localhost_and_an_existing_one_is_kept():
    assert session.client_url("sc://127.0.0.1:15002", "abc") == "sc://localhost:15002/;token=abc"
    assert session.client_url("sc://localhost:15002/;token=x", "abc") == "sc://localhost:15002/;token=x"
    assert session.client_url("sc://spark-connect:15002", None) == "sc://spark-connect:15002/"


def test_every_job_shares_one_server_session_and_a_closed_one_has_a_successor():
    assert session.session_id() == session.session_id(0)
    assert len({session.session_id(g) for g in range(5)}) == 5
