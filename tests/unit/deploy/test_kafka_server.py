"""deploy.kafka_server's JVM options: a collector named in STATETABLE_SERVER_JVM_OPTIONS replaces
Kafka's G1 (the JVM refuses two collectors, and the broker would not start)."""
from __future__ import annotations

import pytest

from deploy import kafka_server


@pytest.mark.parametrize("options, expected", [
    ("", ["-XX:+UseG1GC"]),
    ("-XX:TieredStopAtLevel=1", ["-XX:+UseG1GC"]),
    ("-XX:MaxGCPauseMillis=50", ["-XX:+UseG1GC"]),          # tunes a collector, chooses none
    ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", []),
    ("-XX:+UseParallelGC", []),
    ("-XX:+UseZGC", []),
])
def test_a_collector_in_the_server_options_replaces_g1(monkeypatch, options, expected):
    monkeypatch.setenv("STATETABLE_SERVER_JVM_OPTIONS", options)
    assert kafka_server.collector_options() == expected
