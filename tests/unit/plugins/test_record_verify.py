"""RecordVerifyOperator: what a drill's record says when a step before the verify failed, when
the injection was skipped, and when the verify ran (Airflow's task instance is a stand-in here:
the logic under test is the record, not Airflow)."""
from __future__ import annotations

import dataclasses
import json

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from catalog.runtime import Runtime
from ops import status
from statetable_airflow.operators import ERROR_KEY, RecordVerifyOperator


class _TaskInstance:
    dag_id, run_id = "t__restore_verify", "manual__1"

    def __init__(self, states: dict, errors: dict, returns: dict) -> None:
        self.states, self.errors, self.returns = states, errors, returns

    def get_task_states(self, dag_id, task_ids, run_ids):
        return {self.run_id: {t: self.states.get(t) for t in task_ids}}

    def xcom_pull(self, task_ids, key="return_value"):
        return self.errors.get(task_ids) if key == ERROR_KEY else self.returns.get(task_ids)


@pytest.fixture
def rt(tmp_path, monkeypatch):
    runtime = dataclasses.replace(Runtime.from_env(), data_dir=tmp_path)
    monkeypatch.setattr(RecordVerifyOperator, "hook", property(lambda self: type("H", (), {"runtime": lambda _: runtime})()))
    return runtime


def _operator(tmp_path) -> RecordVerifyOperator:
    return RecordVerifyOperator(task_id="record_result", table="t", failure="wipe_local_store",
                                result_path=str(tmp_path / "verify.json"), inject_task="inject_failure",
                                restore_task="restore")


def test_a_restore_that_failed_is_recorded_with_its_cause_never_as_a_difference(rt, tmp_path):
    ti = _TaskInstance({"inject_failure": "success", "restore": "failed", "verify": "upstream_failed"},
                       {"restore": "ReadTimeout: the read operation timed out"}, {"inject_failure": {"detail": "x"}})
    with pytest.raises(RuntimeError, match="drill failed at restore: ReadTimeout: the read operation timed out"):
        _operator(tmp_path).execute({"ti": ti, "run_id": ti.run_id})
    record = status.verify_history(rt, "t", limit=1)[0]
    assert record["drill_failed"] == "restore: ReadTimeout: the read operation timed out" and record["ok"] is False
    text, kind = status.verify_verdict(record)
    assert kind == "failed" and "DIFFERS" not in text and "None" not in text


def test_a_skipped_injection_is_recorded_as_not_verified_with_its_reason(rt, tmp_path):
    ti = _TaskInstance({"inject_failure": "skipped"}, {"inject_failure": "table 't' has no committed batch yet"}, {})
    with pytest.raises(AirflowSkipException, match="not verified: table 't' has no committed batch yet"):
        _operator(tmp_path).execute({"ti": ti, "run_id": ti.run_id})
    record = status.verify_history(rt, "t", limit=1)[0]
    assert record["skipped"] and status.verify_verdict(record)[0].startswith("not verified after wipe_local_store")


def test_an_exact_verify_is_recorded_with_its_keys(rt, tmp_path):
    (tmp_path / "verify.json").write_text(json.dumps({"ok": True, "batch_id": 4, "keys_compared": 9, "missing": 0,
                                                      "unexpected": 0, "different": 0, "seconds": 1.0}))
    ti = _TaskInstance({t: "success" for t in ("inject_failure", "restore", "verify")}, {},
                       {"restore": {"restore_seconds": 0.25, "restored_partitions": [0, 1]}})
    record = _operator(tmp_path).execute({"ti": ti, "run_id": ti.run_id})
    assert status.verify_verdict(record)[0].startswith("exact at batch 4 after wipe_local_store: 9 keys, restore 0.25s")
