"""The one Kafka client config (state.kafka_config): read from a mode-600 file, never logged,
translated for Spark's Kafka source, and used by every client the product builds."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from state import kafka_config

ROOT = Path(__file__).resolve().parents[3]


def _write(tmp_path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_file_gives_every_client_its_security_settings_and_spark_gets_them_as_java_properties(
        tmp_path, monkeypatch):
    path = _write(tmp_path, "# managed Kafka\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                            "sasl.username=statetable\nsasl.password=s3cr\"et\nssl.ca.location=/etc/ca.pem\n")
    monkeypatch.setenv(kafka_config.CONFIG_ENV, str(path))
    conf = kafka_config.client_config("b1:9093", **{"group.id": "g"})
    assert conf == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "statetable",
                    "sasl.password": 's3cr"et', "ssl.ca.location": "/etc/ca.pem", "bootstrap.servers": "b1:9093",
                    "group.id": "g"}
    spark = kafka_config.spark_options("b1:9093")
    assert spark == {
        "kafka.bootstrap.servers": "b1:9093", "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="statetable" password="s3cr\\"et";',
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/etc/ca.pem"}
    assert "s3cr" not in str(kafka_config.describe(conf)) and kafka_config.describe(conf)["sasl.username"] == \
        "statetable"


def test_a_file_others_may_read_or_a_missing_one_fails_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(kafka_config.CONFIG_ENV, str(_write(tmp_path, "sasl.password=x\n", 0o644)))
    with pytest.raises(ValueError, match=r"mode 644\); `chmod 600"):
        kafka_config.client_config("b:1")
    monkeypatch.setenv(kafka_config.CONFIG_ENV, str(tmp_path / "nope.properties"))
    with pytest.raises(ValueError, match="no such file"):
        kafka_config.client_config("b:1")


def test_an_airflow_connection_whose_security_settings_the_file_lacks_or_contradicts_fails_in_one_line(
        tmp_path, monkeypatch):
    monkeypatch.delenv(kafka_config.CONFIG_ENV, raising=False)
    assert kafka_config.connection_mismatch("kafka_default", {"bootstrap.servers": "b:1"}) is None
    line = kafka_config.connection_mismatch("kafka_default", {"bootstrap.servers": "b:1", "security.protocol": "SASL_SSL"})
    assert line.startswith("Airflow connection 'kafka_default' sets security.protocol=SASL_SSL") and "\n" not in line
    assert f"{kafka_config.CONFIG_ENV} (unset), which has no security.protocol; put security.protocol in" in line

    path = _write(tmp_path, "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.password=right\n")
    monkeypatch.setenv(kafka_config.CONFIG_ENV, str(path))
    agreeing = {"bootstrap.servers": "b:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    assert kafka_config.connection_mismatch("kafka_default", agreeing) is None
    line = kafka_config.connection_mismatch("kafka_default", {**agreeing, "sasl.password": "wrong"})
    assert "sets sasl.password=<secret>" in line and "sets it otherwise" in line and "wrong" not in line


def test_replication_settings_default_to_the_brokers_and_refuse_nonsense(monkeypatch):
    assert kafka_config.replication_factor() == -1 and kafka_config.min_insync_replicas() is None
    monkeypatch.setenv(kafka_config.REPLICATION_ENV, "3")
    monkeypatch.setenv(kafka_config.MIN_ISR_ENV, "2")
    assert (kafka_config.replication_factor(), kafka_config.min_insync_replicas()) == (3, 2)
    for bad in ("0", "-2", "three"):
        monkeypatch.setenv(kafka_config.REPLICATION_ENV, bad)
        with pytest.raises(ValueError, match=kafka_config.REPLICATION_ENV):
            kafka_config.replication_factor()


def test_no_kafka_client_in_the_product_is_built_without_the_shared_config():
    """Every Producer/Consumer/AdminClient and every Spark Kafka source or sink in the product's
    packages takes its settings from state.kafka_config."""
    offenders = []
    for package in ("state", "catalog", "spark_jobs", "ops", "serving", "plugins", "deploy"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            for match in re.finditer(r"\b(Producer|Consumer|AdminClient)\(\s*\{(?!\s*\*\*conf)", text):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
            if re.search(r'\.option\("kafka\.bootstrap\.servers"', text):
                offenders.append(f"{path.relative_to(ROOT)}: kafka.bootstrap.servers by hand")
    assert offenders == []
