"""The Spark Connect server's driver maps the jobs' class-data archive only where one was built for
its own jars: a server whose classpath differs (a cluster's, with the s3a jars) starts as before."""
from pathlib import Path

from catalog import settings as stack_settings
from deploy import connect_server
from spark_jobs.engine import jvm_archive


def _driver_options(settings) -> str:
    return connect_server.server_conf(settings)["spark.driver.extraJavaOptions"]


def test_the_server_maps_the_archive_built_for_its_jars_and_starts_without_one(tmp_path, monkeypatch):
    monkeypatch.setattr(jvm_archive, "ARCHIVE_DIR", tmp_path)
    settings = stack_settings.load()
    assert "SharedArchiveFile" not in _driver_options(settings)

    jars = [Path(p) for p in connect_server.server_conf(settings)["spark.jars"].split(",")]
    jvm_archive.archive_path(jars).write_bytes(b"")
    options = _driver_options(settings)
    assert f"-XX:SharedArchiveFile={jvm_archive.archive_path(jars)}" in options
    assert options.index("-Djava.io.tmpdir=") < options.index("-XX:SharedArchiveFile=")

    jvm_archive.archive_path(jars[:-1]).write_bytes(b"")       # built for other jars only
    jvm_archive.archive_path(jars).unlink()
    assert "SharedArchiveFile" not in _driver_options(settings)


def test_the_servers_conf_is_in_a_private_file_not_on_its_command_line(tmp_path, monkeypatch):
    """Issue 66: STATETABLE_SPARK_CONF values (a deployment's credentials) went on the server's
    command line as --conf, which every local user reads in /proc/PID/cmdline."""
    from dataclasses import replace

    monkeypatch.setenv("STATETABLE_SPARK_CONF", "spark.hadoop.fs.s3a.secret.key=sEcReT:66=x "
                                                "spark.sql.shuffle.partitions=8")
    settings = replace(stack_settings.load(), state_dir=tmp_path)
    cmd = connect_server.command(settings)
    assert "--conf" not in cmd and not any("sEcReT" in part for part in cmd)
    properties = Path(cmd[cmd.index("--properties-file") + 1])
    assert properties.stat().st_mode & 0o077 == 0
    text = properties.read_text()
    assert "spark.hadoop.fs.s3a.secret.key=sEcReT:66=x\n" in text and "spark.sql.shuffle.partitions=8\n" in text
    assert "spark.driver.extraJavaOptions=" in text
