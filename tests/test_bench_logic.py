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


def test_nexmark_answers_follow_the_queries_and_a_difference_names_its_keys():
    """pandas' answers to Nexmark's SQL over a handful of bids, the shape both systems' rows take,
    and the check that fails a run (bench/nexmark)."""
    import pandas as pd

    from bench.nexmark.__main__ import _flink_rows, _ms
    from bench.nexmark.statetable_queries import answers, differing, expected

    bids = pd.DataFrame([
        {"auction": 1, "bidder": 7, "price": 50, "channel": "A", "url": "u1", "dateTime": "2026-12-01T10:00:00.001Z", "extra": ""},
        {"auction": 1, "bidder": 7, "price": 20_000, "channel": "B", "url": "u2", "dateTime": "2026-12-01T10:01:00.002Z", "extra": "x"},
        {"auction": 1, "bidder": 8, "price": 2_000_000, "channel": "A", "url": "u3", "dateTime": "2026-12-01T10:02:00.003Z", "extra": ""},
        {"auction": 2, "bidder": 8, "price": 7, "channel": "A", "url": "u4", "dateTime": "2026-12-02T00:00:00.004Z", "extra": ""},
    ])
    auctions = pd.DataFrame({"id": [1, 2], "itemName": ["i1", "i2"], "initialBid": [5, 6], "reserve": [8, 9],
                             "dateTime": ["2026-12-01T10:00:00.000Z", "2026-12-01T23:00:00.000Z"],
                             "expires": ["2026-12-01T10:01:30.000Z", "2026-12-02T01:00:00.000Z"],
                             "seller": [9, 9], "category": [10, 11], "extra": ["", ""]})
    frames = {"bid": bids, "auction": auctions,
              "person": pd.DataFrame({"id": [9, 10], "name": ["p", "q"], "city": ["c", "d"], "state": ["OR", "NY"],
                                      "dateTime": ["2026-12-01T10:00:09.999Z", "2026-12-01T22:59:59.999Z"]})}
    want = expected(frames)
    # total, rank1-3 of bids; of distinct bidders; of distinct auctions
    assert want["q15"][("2026-12-01",)] == (3, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1)
    assert want["q16"][("A", "2026-12-01")] == ("10:02", 2, 1, 0, 1, 2, 1, 0, 1, 1, 1, 0, 1)
    assert want["q17"][(1, "2026-12-01")] == (3, 1, 1, 1, 50, 2_000_000, 2_020_050 // 3, 2_020_050)
    assert want["q18"][(7, 1)] == (20_000, "B", "u2", _ms("2026-12-01T10:01:00.002Z"), "x")
    assert want["q18"][(8, 2)][0] == 7
    assert want["q19"][(1,)] == ((2_000_000, 20_000, 50),)
    assert want["q3"] == {(1,): ("p", "c", "OR")}           # auction 2 is not category 10
    # q4: auction 1's highest bid inside its window (the 2,000,000 came after it expired); auction 2's one bid
    assert want["q4"] == {(10,): (20_000,), (11,): (7,)}
    assert want["q20"] == {(1, b, price, ch, _ms(t), "i1", 5, 8, 9, 10): 1 for b, price, ch, t in (
        (7, 50, "A", "2026-12-01T10:00:00.001Z"), (7, 20_000, "B", "2026-12-01T10:01:00.002Z"),
        (8, 2_000_000, "A", "2026-12-01T10:02:00.003Z"))}
    # q9: the highest bid inside each auction's window, with its bidder and time
    assert want["q9"] == {(1,): (20_000, 7, _ms("2026-12-01T10:01:00.002Z")), (2,): (7, 8, _ms("2026-12-02T00:00:00.004Z"))}
    # q8: person 9 joined in the window [10:00:00, 10:00:10) its auction 1 opened in; person 10
    # joined a millisecond before the window of auction 2, whose seller it is not anyway
    assert want["q8"] == {(9,): ("p", _ms("2026-12-01T10:00:00.000Z"))}
    assert answers("q8", [{"id": 9, "name": "p", "person_time": _ms("2026-12-01T10:00:09.999Z")}]) == want["q8"]
    assert answers("q8", _flink_rows("q8", [{"id": 9, "name": "p", "starttime": "2026-12-01T10:00:00"}])) == want["q8"]
    winner = [{"auction": 1, "winner": [[20_000, _ms("2026-12-01T10:01:00.002Z"), 7]]}]
    assert answers("q9", winner) == {(1,): want["q9"][(1,)]}
    q20_row = {"auction": 1, "bidder": 7, "price": 50, "channel": "A", "dateTime": _ms("2026-12-01T10:00:00.001Z"),
               "itemName": "i1", "initialBid": 5, "reserve": 8, "seller": 9, "category": 10}
    assert answers("q20", [q20_row, dict(q20_row)]) == {tuple(q20_row.values()): 2}     # equal rows counted

    flink_top = _flink_rows("q19", [{"auction": 1, "rank_number": r, "price": p}
                                    for r, p in ((2, 20_000), (1, 2_000_000), (3, 50))])
    statetable_top = [{"auction": 1, "top": [[50, 7], [2_000_000, 8], [20_000, 7]]}]
    assert answers("q19", flink_top) == answers("q19", statetable_top) == {(1,): want["q19"][(1,)]}
    assert differing(answers("q19", statetable_top), {(1,): want["q19"][(1,)]}) == "ok"
    wrong = differing({(1,): ((2_000_000,),), (3,): ((1,),)}, {(1,): want["q19"][(1,)]})
    assert wrong["differing_keys"] == [[1], [3]] and wrong["rows"] == [2, 1]


def test_nexmark_sessions_split_after_more_than_the_gap_and_count_exact_gaps_apart():
    import pandas as pd

    from bench.nexmark.statetable_queries import _sessions, exact_gaps

    bids = pd.DataFrame({"bidder": [1, 1, 1, 1, 2], "ms": [0, 10_000, 20_001, 20_002, 5]})
    assert _sessions(bids, 10_000) == {(1, 0): (2, 10_000), (1, 20_001): (2, 20_002), (2, 5): (1, 5)}
    assert exact_gaps(bids) == 1


def test_nexmark_q7_is_each_windows_highest_price_and_its_bids_in_every_systems_rows():
    import pandas as pd

    from bench.nexmark.__main__ import _flink_rows
    from bench.nexmark.statetable_queries import answers, expected

    bids = pd.DataFrame({"auction": [1, 2, 3, 4], "bidder": [7, 8, 9, 7], "price": [5, 9, 9, 3],
                         "channel": "A", "url": "u", "extra": "",
                         "dateTime": ["2026-12-01T00:00:01.000Z", "2026-12-01T00:00:02.000Z",
                                      "2026-12-01T00:00:09.999Z", "2026-12-01T00:00:10.000Z"]})
    frames = {"bid": bids, "auction": pd.DataFrame({c: [] for c in ("id", "seller", "category", "dateTime", "expires",
                                                                   "itemName", "initialBid", "reserve")}),
              "person": pd.DataFrame({"id": [], "name": [], "city": [], "state": [], "dateTime": []})}
    want = expected(frames)["q7"]
    first = 1796083200000          # 2026-12-01T00:00:00Z
    assert want == {(first,): (9, ((2, 8), (3, 9))), (first + 10_000,): (3, ((4, 7),))}
    statetable = [{"window_start": first, "maxprice": 9, "top": [[9, 2, 8], [9, 3, 9], [5, 1, 7]]},
                  {"window_start": first + 10_000, "maxprice": 3, "top": [[3, 4, 7]]}]
    flink = [{"auction": a, "price": p, "bidder": b, "dateTime": t} for a, p, b, t in (
        (3, 9, 9, "2026-12-01T00:00:09.999Z"), (2, 9, 8, "2026-12-01T00:00:02.000Z"),
        (4, 3, 7, "2026-12-01T00:00:10.000Z"))]
    assert answers("q7", statetable) == answers("q7", _flink_rows("q7", flink)) == want


def test_nexmark_q5_is_each_sliding_windows_auctions_with_the_most_bids_in_every_systems_rows():
    """A bid counts in the five 10-second windows that slide by 2 s over it; a window's answer is
    every auction at its highest count, ties included."""
    import pandas as pd

    from bench.nexmark.__main__ import _flink_rows
    from bench.nexmark.statetable_queries import answers, differing, expected

    first = 1796083200000          # 2026-12-01T00:00:00Z
    bids = pd.DataFrame({"auction": [1, 1, 2], "bidder": 7, "price": 5, "channel": "A", "url": "u", "extra": "",
                         "dateTime": ["2026-12-01T00:00:01.000Z", "2026-12-01T00:00:03.000Z",
                                      "2026-12-01T00:00:03.500Z"]})
    empty = {c: [] for c in ("id", "seller", "category", "dateTime", "expires", "itemName", "initialBid", "reserve")}
    frames = {"bid": bids, "auction": pd.DataFrame(empty),
              "person": pd.DataFrame({"id": [], "name": [], "city": [], "state": [], "dateTime": []})}
    want = expected(frames)["q5"]
    assert want == {**{(first + s, 1): (2,) for s in (-6000, -4000, -2000, 0)},
                    (first - 8000, 1): (1,), (first + 2000, 1): (1,), (first + 2000, 2): (1,)}
    statetable = [{"window_start": first + 2000, "maxn": 1, "top": [[1, 2], [1, 1]]},
                  {"window_start": first, "maxn": 2, "top": [[2, 1], [1, 2], [1, 1]]}]     # 1's older count too
    assert answers("q5", statetable) == {(first + 2000, 1): (1,), (first + 2000, 2): (1,), (first, 1): (2,)}
    flink = _flink_rows("q5", [{"auction": 2, "num": 1, "starttime": "2026-12-01T00:00:02"}])
    assert answers("q5", flink) == {(first + 2000, 2): (1,)}
    assert differing(answers("q5", flink), want) != "ok"


def test_nexmark_q12_counts_each_bidders_bids_per_10_second_window_by_the_bids_time_in_every_systems_rows():
    """q12 by event time: a bid at a window's end (10.000 s) counts in the next window; Flink's
    window start (a TIMESTAMP(3)) and Spark's (ISO with a zone) answer as statetable's epoch ms."""
    import pandas as pd

    from bench.nexmark.__main__ import _flink_rows, _spark_rows
    from bench.nexmark.statetable_queries import answers, differing, expected

    first = 1796083200000          # 2026-12-01T00:00:00Z
    bids = pd.DataFrame({"auction": 1, "bidder": [7, 7, 8, 7], "price": 5, "channel": "A", "url": "u", "extra": "",
                         "dateTime": ["2026-12-01T00:00:00.000Z", "2026-12-01T00:00:09.999Z",
                                      "2026-12-01T00:00:03.000Z", "2026-12-01T00:00:10.000Z"]})
    empty = {c: [] for c in ("id", "seller", "category", "dateTime", "expires", "itemName", "initialBid", "reserve")}
    frames = {"bid": bids, "auction": pd.DataFrame(empty),
              "person": pd.DataFrame({"id": [], "name": [], "city": [], "state": [], "dateTime": []})}
    want = expected(frames)["q12"]
    assert want == {(7, first): (2,), (8, first): (1,), (7, first + 10_000): (1,)}
    statetable = [{"bidder": 7, "starttime": first, "bid_count": 2, "endtime": first + 10_000},
                  {"bidder": 8, "starttime": first, "bid_count": 1, "endtime": first + 10_000},
                  {"bidder": 7, "starttime": first + 10_000, "bid_count": 1, "endtime": first + 20_000}]
    flink = [{"bidder": 7, "bid_count": 2, "starttime": "2026-12-01T00:00:00", "endtime": "2026-12-01T00:00:10"},
             {"bidder": 8, "bid_count": 1, "starttime": "2026-12-01T00:00:00", "endtime": "2026-12-01T00:00:10"},
             {"bidder": 7, "bid_count": 1, "starttime": "2026-12-01T00:00:10", "endtime": "2026-12-01T00:00:20"}]
    spark = [{**r, "starttime": r["starttime"] + ".000Z"} for r in flink]
    assert answers("q12", statetable) == answers("q12", _flink_rows("q12", flink)) == \
        answers("q12", _spark_rows("q12", spark)) == want
    assert differing(answers("q12", _flink_rows("q12", flink[:2])), want) != "ok"


def test_nexmark_spark_rows_take_statetables_shape_and_a_refusal_is_reported_not_checked():
    """Spark's sink rows (ISO times, AVG as a double, a session's end) answer as pandas does, and
    a query Spark refuses shows Spark's error in the report instead of a figure (bench/nexmark)."""
    import pandas as pd

    from bench.nexmark.__main__ import _ms, _spark_lines, _spark_row, _spark_rows
    from bench.nexmark.statetable_queries import SESSION_GAP_MS, _sessions, answers, differing, pd_ms

    bids = pd.DataFrame({"bidder": [7, 7, 7], "dateTime": ["2026-12-01T10:00:00.000Z", "2026-12-01T10:00:10.000Z",
                                                            "2026-12-01T10:00:20.001Z"]})
    want = _sessions(bids.assign(ms=pd_ms(bids["dateTime"])), SESSION_GAP_MS)
    spark = [{"bidder": 7, "bid_count": 2, "starttime": "2026-12-01T10:00:00.000Z", "endtime": "2026-12-01T10:00:20.000Z"},
             {"bidder": 7, "bid_count": 1, "starttime": "2026-12-01T10:00:20.001Z", "endtime": "2026-12-01T10:00:30.001Z"}]
    assert differing(answers("q11", _spark_rows("q11", spark)), want) == "ok"
    q17 = _spark_rows("q17", [{"auction": 1, "day": "2026-12-01", "total_bids": 3, "rank1_bids": 1, "rank2_bids": 1,
                               "rank3_bids": 1, "min_price": 50, "max_price": 2_000_000, "avg_price": 673350.0,
                               "sum_price": 2_020_050}])
    assert answers("q17", q17) == {(1, "2026-12-01"): (3, 1, 1, 1, 50, 2_000_000, 2_020_050 // 3, 2_020_050)}
    assert _spark_rows("q18", [{"dateTime": "2026-12-01T10:00:00.002Z"}])[0]["dateTime"] == _ms("2026-12-01T10:00:00.002Z")

    refused = _spark_row({"refused": "[NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING] ...", "rewritten": False}, 10, 1.0, {})
    assert "check" not in refused          # nothing to check, and not a failed check
    ran = _spark_row({"seconds": 4.0, "whole_seconds": 20.0, "rewritten": True, "peak_rss_mb": 900,
                      "answers": {(1,): (2,)}}, 100, 2.0, {(1,): (3,)})
    assert ran["ratio"] == 2.0 and ran["events_per_s"] == 25 and ran["check"]["differing_keys"] == [[1]]
    text = "\n".join(_spark_lines({"spark_version": "4.2.0", "queries": [
        {"query": "q18", "spark": ran}, {"query": "q19", "spark": refused},
        {"query": "q5", "spark": _spark_row({"not_tried": "HOP window TVF"}, 10, 1.0, {})}]}))
    assert "| q18 | 4.0 (20.0) | 25 | 2.00x | 900 | DIFFERS | Spark rewrite |" in text
    assert "- q19: `[NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING] ...`" in text
    assert "- q5: HOP window TVF" in text


def test_a_peer_killed_at_the_timeout_is_a_lower_bound_not_a_failed_check(tmp_path):
    """A peer's query that runs past `--peer-timeout` is killed (its process gone), and the report
    shows its seconds and ratio as lower bounds with no answer checked; the run does not fail
    for it (bench/nexmark)."""
    import sys

    import psutil
    import pytest

    from bench.compare.measure import PeerTimeout, run_peer
    from bench.nexmark.__main__ import NOT_FINISHED, _killed, _spark_lines, _spark_row, report

    with pytest.raises(PeerTimeout) as caught:
        run_peer("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, timeout=0.5)
    assert caught.value.seconds == 0.5
    assert not [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(60)" in " ".join(p.info["cmdline"] or [])]

    killed = _spark_row(_killed(caught.value), 100, 0.25, {})
    assert killed["check"] == NOT_FINISHED and killed["ratio_at_least"] == 2.0
    text = "\n".join(_spark_lines({"spark_version": "4.2.0", "queries": [{"query": "q20", "spark": killed}]}))
    assert "| q20 | > 0 (killed) | - | > 2.00x | - | not finished" in text

    statetable = {"seconds": 2.0, "events_per_s": 50, "check": "ok", "engine": "tables", "step_ms": {"join": 1500}}
    result = {"events": 100, "rate": 10, "cores": 2, "date": "2026-12-06",
              "produced": {"counts": {"bid": 100}, "bytes": {"bid": 1e6}},
              "json_ceiling": {"bytes": 1e6, "records_per_s": 1, "mb_per_s": 1.0}, "statetable_session_seconds": 1,
              "statetable_peak_rss_mb": 10, "peer_timeout_seconds": 600, "unfinished": ["q9 flink"],
              "queries": [{"query": "q9", "statetable": statetable,
                           "flink": {"timed_out": 600, "check": NOT_FINISHED}, "ratio_to_flink_at_least": 300.0}]}
    text = report(result)
    assert "| q9 | 2.0 | 50 | > 600 (killed) | - | > 300.00x |" in text
    assert "peer timeout (600 s" in text and "q9 flink" in text
