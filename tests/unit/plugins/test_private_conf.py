"""spark-submit tasks keep their Spark conf off the command line (issue 66): STATETABLE_SPARK_CONF
values went out as `--conf k=v`, readable by every local user in /proc/PID/cmdline."""
from __future__ import annotations

import os
import stat

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from plugins.statetable_airflow.spark_submit import PrivateConfSparkSubmitOperator


def test_the_conf_goes_in_a_private_file_that_is_gone_after(monkeypatch):
    seen = {}

    def submitted(self, context):
        seen["conf"] = dict(self.conf)
        seen["mode"] = stat.S_IMODE(os.stat(self.properties_file).st_mode)
        seen["text"] = open(self.properties_file).read()
        seen["command"] = self._get_hook()._build_spark_submit_command("app.py")
        seen["path"] = self.properties_file

    monkeypatch.setattr(SparkSubmitOperator, "execute", submitted)
    task = PrivateConfSparkSubmitOperator(task_id="t", application="app.py", conn_id="spark_default",
                                          conf={"spark.hadoop.fs.s3a.secret.key": "sEcReT:66", "spark.x": "1"})
    task.execute({})
    assert seen["conf"] == {} and seen["mode"] == 0o600
    assert "spark.hadoop.fs.s3a.secret.key=sEcReT:66\n" in seen["text"]
    assert not any("sEcReT" in part for part in seen["command"]) and "--conf" not in seen["command"]
    assert "--properties-file" in seen["command"] and not os.path.exists(seen["path"])
