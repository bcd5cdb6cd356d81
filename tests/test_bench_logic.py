"""The benchmark's own pure logic: the reference check that fails a run, the target ratios, the profile."""
from __future__ import annotations

import json

from bench.compare import profile, report
from bench.workload import compare


def test_compare_names_missing_extra_and_wrong_keys():
    expected = {"a": (2, 10), "b": (1, 1), "c": (3, 3)}
    got = {"a": [2, 10], "b": [1, 2], "d": [1, 1]}        # b wrong, c missing, d extra
    check = compare("peer", got, expected)
    assert check["differences"] == 3
    assert [e["key"] for e in check["examples"]] == ["b", "c", "d"]
    assert compare("peer", {k: list(v) for k, v in expected.items()}, expected)["differences"] == 0


def test_advantages_are_ratios_against_each_target():
    results = {
        "throughput": {"rows": [{"system": "statetable", "events_per_s": 100_000},
                                {"system": "Quix Streams", "events_per_s": 50_000},
                                {"system": "Spark Structured Streaming", "events_per_s": 200_000}]},
        "recovery": {"rows": [{"system": "statetable", "recovery_seconds": 1.0},
                              {"system": "Quix Streams", "recovery_seconds": 12.0}]},
    }
    got = {(a["peer"], a["workload"]): (a["measured"], a["met"]) for a in report.advantages(results)}
    assert got == {("Quix Streams", "throughput"): (2.0, False),
                   ("Spark Structured Streaming", "throughput"): (0.5, False),
                   ("Quix Streams", "recovery"): (12.0, True)}


def test_warm_advantages_set_each_warm_statetable_row_against_warm_spark():
    warm = {"rows": [{"system": "minimal pass (warm session)", "events_per_s": 900},
                     {"system": "statetable (warm session)", "events_per_s": 600},
                     {"system": "statetable (Connect server, warmed)", "events_per_s": 450},
                     {"system": "Spark Structured Streaming (warm session)", "events_per_s": 300}]}
    results = {"throughput": {"rows": [], "warm": warm}, "recovery": {"rows": []}}
    got = {a["peer"]: (a["measured"], a["met"]) for a in report.advantages(results)}
    assert got == {"Spark Structured Streaming (warm session), as statetable (warm session)": (2.0, True),
                   "Spark Structured Streaming (warm session), as statetable (Connect server, warmed)": (1.5, False)}


def test_profile_maps_stages_to_batch_steps_and_finds_the_slowest(tmp_path):
    def stage(stage_id, wall, run, cpu_ns):
        return {"Event": "SparkListenerStageCompleted", "Stage Info": {
            "Stage ID": stage_id, "Stage Name": f"collect at x.py:{stage_id}", "Number of Tasks": 4,
            "Submission Time": 1000, "Completion Time": 1000 + wall,
            "Accumulables": [{"Name": "internal.metrics.executorRunTime", "Value": run},
                             {"Name": "internal.metrics.executorCpuTime", "Value": cpu_ns}]}}

    events = [
        {"Event": "SparkListenerJobStart", "Stage IDs": [1, 2], "Properties": {"spark.job.description": "t batch 0: read"}},
        {"Event": "SparkListenerJobStart", "Stage IDs": [3], "Properties": {"spark.job.description": "t batch 0: mirror"}},
        {"Event": "SparkListenerJobStart", "Stage IDs": [4], "Properties": {}},
        stage(1, 300, 500, 200_000_000), stage(2, 100, 150, 50_000_000), stage(3, 250, 260, 10_000_000),
        stage(4, 9999, 9999, 0),                                          # not a batch step: ignored
    ]
    (tmp_path / "app").write_text("\n".join(json.dumps(e) for e in events))
    summary = profile.summarize(tmp_path)
    assert summary["slowest"] == "read"
    assert summary["steps"]["read"] == {"wall_ms": 400, "run_ms": 650, "cpu_ms": 250, "gc_ms": 0, "stages": 2}
    assert [s["stage"] for s in summary["top_stages"]] == ["collect at x.py:1", "collect at x.py:2"]
    text = profile.markdown(summary, [{"ms_read": 700, "ms_mirror": 300}])
    assert "Slowest step: **read**" in text and "| read | 700 | 70% |" in text


def test_cpu_by_kind_counts_each_process_from_its_first_reading_or_from_zero():
    """bench.suite_cpu's readings are (kind, CPU seconds, command line) by (pid, start time); the
    benchmarks that read them unpacked two fields after the command line was added, and failed."""
    from bench.suite_cpu import cpu_by_kind

    before = {(1, "10"): ("kafka broker", 5.0, "java kafka.Kafka"), (2, "11"): ("pyspark python workers", 1.0, "py")}
    after = {(1, "10"): ("kafka broker", 7.5, "java kafka.Kafka"), (2, "11"): ("pyspark python workers", 1.5, "py"),
             (3, "12"): ("pyspark python workers", 2.0, "py"), (2, "13"): ("other python", 0.25, "a reused pid")}
    assert cpu_by_kind(before, after) == {"kafka broker": 2.5, "pyspark python workers": 2.5, "other python": 0.25}
