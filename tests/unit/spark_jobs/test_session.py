"""A deployment's own Spark settings (STATETABLE_SPARK_CONF): they reach every driver's
configuration, and one that would make batches, rebuilds and verifies disagree, or is not a
setting at all, fails in one line naming the variable, the setting and the fix."""
from __future__ import annotations

import pytest

from catalog.errors import UserError
from spark_jobs.engine import session


def test_pairs_reach_the_drivers_configuration_and_override_statetables_defaults(monkeypatch):
    monkeypatch.setenv(session.SPARK_CONF_ENV, " spark.sql.shuffle.partitions=8\tspark.sql.codegen.wholeStage=false ")
    assert session.deployment_conf() == {"spark.sql.shuffle.partitions": "8", "spark.sql.codegen.wholeStage": "false"}
    monkeypatch.setattr(session, "spark_jars", lambda: [])
    conf = session.spark_conf("t")
    assert conf["spark.sql.shuffle.partitions"] == "8" and conf["spark.sql.codegen.wholeStage"] == "false"
    assert conf["spark.sql.ansi.enabled"] == "false"


def test_unset_or_blank_changes_nothing(monkeypatch):
    monkeypatch.delenv(session.SPARK_CONF_ENV, raising=False)
    assert session.deployment_conf() == {}
    monkeypatch.setenv(session.SPARK_CONF_ENV, "  ")
    assert session.deployment_conf() == {}


@pytest.mark.parametrize("value, named", [
    ("spark.sql.shuffle.partitions", "'spark.sql.shuffle.partitions' is not a Spark setting"),
    ("shuffle.partitions=8", "'shuffle.partitions=8' is not a Spark setting"),
    ("spark.sql.shuffle.partitions=", "is not a Spark setting"),
    ("spark.sql.ansi.enabled=true", "spark.sql.ansi.enabled is statetable's to set"),
    ("spark.sql.extensions=x", "spark.sql.extensions is statetable's to set"),
    ("spark.driver.extraJavaOptions=-Xss4m", "spark.driver.extraJavaOptions is statetable's to set"),
])
def test_a_setting_it_cannot_take_fails_in_one_line(monkeypatch, value, named):
    monkeypatch.setenv(session.SPARK_CONF_ENV, f"spark.sql.shuffle.partitions=8 {value}")
    with pytest.raises(UserError) as raised:
        session.deployment_conf()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("STATETABLE_SPARK_CONF: ") and named in message, message
    assert "remove it" in message or "key=value" in message
