"""The generated DAGs: their graph, and runs on the real stack over Airflow's REST API and CLI.

The stack is the session's test Airflow (LocalExecutor) against the test
broker; the tables are the real definitions in dags/tables/. Runs here are
triggered (schedules are off in tests, see conftest), so each one is known.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from deploy import airflow_server
from deploy.airflow_api import AirflowApi
from deploy import samples
from catalog.definitions import load_all
from ops.failures import FAILURES
from catalog.runtime import Runtime
from statetable_airflow.timetables import daily_minute, places, spread
from tests.browser import screenshots
from tests.table_env import read_topic
from tests.tamper import corrupt_value

TABLES_DIR = Path(__file__).resolve().parent.parent / "dags" / "tables"
MOVIES = "movie_tickets_sold"
TIMINGS: dict[str, float] = {}


# ------------------------------------------------------------------ the graph (no server)
def test_dagbag_has_three_dags_per_table_with_the_expected_graph():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(TABLES_DIR.parent))
    assert bag.import_errors == {}
    tables = load_all(TABLES_DIR)
    for name, table in tables.items():
        inc, reb, rv = (bag.dags[f"{name}__{kind}"] for kind in ("incremental", "rebuild", "restore_verify"))
        assert [t.task_id for t in inc.tasks] == ["run_batches"]      # one task process per run
        assert _edges(reb) == {("plan_rebuild", "rebuild")}
        assert _edges(rv) == {("inject_failure", "restore"), ("restore", "verify"), ("verify", "record_result")}
        assert inc.max_active_runs == 1 and inc.catchup is False
        timetable = getattr(inc.timetable, "timetable", inc.timetable)    # AssetOrTimeSchedule wraps the cron
        assert timetable.expression == spread(table.schedule, name,
                                              places({u.name: u.schedule for u in tables.values()})[name])
        assert [a.uri for a in inc.get_task("run_batches").outlets] == [f"statetable://tables/{name}"]
        upstream = [u.name for u in tables.values() if u.output_topic and u.output_topic == table.topic]
        upstream += [j.table for j in table.joins] if table.table_join else []    # a join of tables: its joined one
        if upstream:        # a table on another table's change topic also runs when that one commits
            assert {a.uri for a in inc.timetable.asset_condition.objects} == \
                {f"statetable://tables/{u}" for u in upstream}
        assert type(inc.get_task("run_batches")).__name__ == "TableBatchesOperator"     # the default mode
        assert inc.get_task("run_batches").conn_id == "spark_connect_default"
        assert inc.get_task("run_batches").max_batches == table.max_batches_per_run
        assert "Retries are safe" in inc.doc_md
        assert set(rv.params.get_param("failure").schema["enum"]) == set(FAILURES)
        assert rv.get_task("record_result").trigger_rule == "all_done"
        assert type(rv.timetable).__name__ == "NextTimeOnlyTimetable"
        assert rv.timetable._expression == "{1} {0} * * *".format(*daily_minute(name))
    assert len({daily_minute(name) for name in tables}) == len(tables)       # no two drills in one minute
    assert len([d for d in bag.dag_ids if "__" in d]) == 3 * len(tables)


def test_schedules_every_n_minutes_are_spread_over_their_interval():
    crons = {name: spread("*/5 * * * *", name) for name in (f"table_{i}" for i in range(20))}
    minutes = Counter(cron.split()[0] for cron in crons.values())
    assert set(minutes) == {"*/5", "1-59/5", "2-59/5", "3-59/5", "4-59/5"}      # every minute of the five used
    assert all(cron.endswith("/5 * * * *") for cron in crons.values())
    assert spread("*/5 * * * *", "table_0") == spread("*/5 * * * *", "table_0")       # stable
    assert spread("0 * * * *", "t") == "0 * * * *" and spread("*/7 * * * *", "t") == "*/7 * * * *"
    assert spread(None, "t") is None


def test_the_tables_on_one_cron_share_its_minutes_evenly_and_a_new_table_moves_only_those_after_it():
    """A hash put 26 of 100 tables on one minute of `*/5` and 16 on another; the busiest minute
    is what a wave waits for."""
    names = [f"pay_{i:03d}" for i in range(100)]
    minutes = Counter(spread("*/5 * * * *", n, _place(n, names)).split()[0] for n in names)
    assert sorted(minutes.values()) == [20] * 5
    assert Counter(spread("*/15 * * * *", n, _place(n, names[:22])).split()[0]
                   for n in names[:22]).most_common(1)[0][1] == 2
    grown = names + ["pay_050a"]
    moved = [n for n in names
             if spread("*/5 * * * *", n, _place(n, names)) != spread("*/5 * * * *", n, _place(n, grown))]
    assert moved == [n for n in names if n > "pay_050a"]
    assert spread("*/5 * * * *", "other", _place("other", names)) == spread("*/5 * * * *", "other")   # no place: its hash


def _place(name: str, names: list[str]) -> int | None:
    """`name`'s place among `names`, all on one cron, as the DAG factory computes it."""
    return places({n: "*/5 * * * *" for n in names}).get(name)


def test_a_new_drill_waits_for_its_first_time_and_then_follows_its_cron():
    """The restore drill of a table that just appeared must not run the interval already begun:
    on a fresh stack that started every table's drill at once, before any batch existed."""
    from airflow.timetables.base import DataInterval, TimeRestriction
    from pendulum import DateTime, UTC

    from statetable_airflow.timetables import daily_drill

    timetable = daily_drill("movie_tickets_sold")
    hour, minute = daily_minute("movie_tickets_sold")
    now = DateTime.now(UTC)
    first = timetable.next_dagrun_info(last_automated_data_interval=None,
                                       restriction=TimeRestriction(datetime(2026, 1, 1, tzinfo=UTC), None, False))
    assert first.run_after > now and first.run_after - now <= __import__("datetime").timedelta(days=1)
    assert (first.run_after.hour, first.run_after.minute) == (hour, minute)
    later = timetable.next_dagrun_info(last_automated_data_interval=DataInterval(first.run_after, first.run_after),
                                       restriction=TimeRestriction(datetime(2026, 1, 1, tzinfo=UTC), None, False))
    assert (later.run_after - first.run_after).total_seconds() == 86400
    # A backfill (catchup) still gets every day's interval.
    caught = timetable.next_dagrun_info(last_automated_data_interval=None,
                                        restriction=TimeRestriction(datetime(2026, 1, 1, tzinfo=UTC), None, True))
    assert caught.run_after.date().isoformat() == "2026-01-01"
    # Airflow stores and reloads it by the plugin's registration.
    from airflow.serialization.encoders import encode_timetable
    assert "NextTimeOnlyTimetable" in json.dumps(encode_timetable(timetable), default=str)


def _edges(dag) -> set[tuple[str, str]]:
    return {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}


def test_rebuild_params_fail_before_any_work_naming_table_and_param():
    from spark_jobs.recompute.rebuild import rebuild_window

    tables = load_all(TABLES_DIR)
    movies = tables[MOVIES]
    with pytest.raises(ValueError, match=r"movie_tickets_sold.*window_from='yesterday'"):
        rebuild_window(movies, "yesterday", "2026-03-02", False, None)
    with pytest.raises(ValueError, match="both params window_from and window_to"):
        rebuild_window(movies, "2026-03-01", None, False, None)
    with pytest.raises(ValueError, match="exclude each other"):
        rebuild_window(movies, "2026-03-01", "2026-03-02", True, None)
    with pytest.raises(ValueError, match="has no windows"):
        rebuild_window(movies, "2026-03-01", "2026-03-02", False, None)
    day = (datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 3, 2, tzinfo=timezone.utc))
    assert rebuild_window(movies, None, None, False, day) is None      # no windows: full rebuild


# ------------------------------------------------------------------ on the stack
@pytest.fixture(scope="module")
def api(airflow):
    return AirflowApi(airflow)


@pytest.fixture(scope="module")
def stack_rt(airflow, kafka):
    import dataclasses

    return dataclasses.replace(Runtime.from_env(), bootstrap=kafka, data_dir=airflow.data_dir,
                               snapshot_uri=str(airflow.data_dir / "snapshots"))


def _run(api: AirflowApi, dag_id: str, conf: dict | None = None, timeout: float = 900) -> tuple[str, dict, dict]:
    api.wait_for_dag(dag_id)
    started = time.monotonic()
    run_id = api.trigger(dag_id, conf)
    run = api.wait_run(dag_id, run_id, timeout=timeout)
    TIMINGS[f"{dag_id} {json.dumps(conf or {})}"] = round(time.monotonic() - started, 1)
    return run_id, run, api.task_states(dag_id, run_id)


def _expected_movies(bootstrap: str) -> dict[tuple, tuple]:
    counts = Counter()
    for message in read_topic(bootstrap, "movie_ticket_sales"):
        record = json.loads(message.value())
        if record.get("ticket_total_value") is not None:
            counts[record["title"]] += 1
    return {(title,): (n,) for title, n in counts.items()}


def _state(rt: Runtime) -> dict:
    from spark_jobs import jobs

    return jobs.state_rows(MOVIES, rt)


def test_incremental_over_rest_equals_recomputation_then_skips_without_new_data(api, stack_rt, kafka):
    samples.produce(MOVIES, kafka, 5000)
    run_id, run, states = _run(api, f"{MOVIES}__incremental")
    assert run["state"] == "success", states
    assert set(states.values()) == {"success"}
    assert _state(stack_rt) == _expected_movies(kafka)
    stats = api.xcom(f"{MOVIES}__incremental", run_id, "run_batches")
    in_topic = len(read_topic(kafka, "movie_ticket_sales"))      # 5000, and what earlier tests produced
    assert stats["read"] == in_topic >= 5000 and stats["lag"] == 0
    log = api.task_log(f"{MOVIES}__incremental", run_id, "run_batches")
    assert "records/s" in log and f"read {in_topic}" in log

    _, run, states = _run(api, f"{MOVIES}__incremental")
    assert run["state"] == "success"
    assert states == {"run_batches": "skipped"}


def test_backfill_of_three_dates_of_a_table_without_windows_rebuilds_once_and_state_verifies(api, airflow, stack_rt,
                                                                                           spark):
    """A table without windows rebuilds in full for any day: one day of the backfill rebuilds,
    the other two (run side by side by Airflow) find the rebuild done under the table's lock and
    say why they did not repeat it (three identical full rebuilds were run before)."""
    from spark_jobs.recompute.verify import verify

    from catalog.batch_log import BatchLog

    dag_id = f"{MOVIES}__rebuild"
    api.wait_for_dag(dag_id)
    before = {r["dag_run_id"] for r in api.runs(dag_id)}
    last_before = BatchLog(stack_rt.batch_dir(MOVIES)).last_commit().batch_id
    started = time.monotonic()
    created = airflow_server.airflow_cli(airflow, "backfill", "create", "--dag-id", dag_id, "--from-date",
                                         "2026-03-01", "--to-date", "2026-03-03", capture=True, check=False)
    assert created.returncode == 0, created.stdout[-2000:] + created.stderr[-2000:]
    deadline = time.monotonic() + 900
    while True:
        runs = [r for r in api.runs(dag_id) if r["dag_run_id"] not in before]
        if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            break
        assert time.monotonic() < deadline, f"backfill runs not finished: {runs}"
        time.sleep(3)
    TIMINGS["rebuild backfill of 3 dates"] = round(time.monotonic() - started, 1)
    assert sorted(r["logical_date"][:10] for r in runs) == ["2026-03-01", "2026-03-02", "2026-03-03"]
    assert [r["state"] for r in runs] == ["success"] * 3
    logs = [api.task_log(dag_id, r["dag_run_id"], "rebuild") for r in runs]
    assert sum("another full rebuild would compute the same state" in text for text in logs) == 2, logs
    rebuilt = [c for c in BatchLog(stack_rt.batch_dir(MOVIES)).commits_after(last_before) if c.counts.get("rebuild")]
    assert len(rebuilt) == 1, rebuilt
    result = verify(MOVIES, spark=spark, rt=stack_rt)
    assert result.ok, result.summary()
    assert result.keys_compared == len(_expected_movies(stack_rt.bootstrap))


@pytest.mark.parametrize("failure", [f for f in FAILURES if f != "kill_worker"])   # a cluster's: test_cluster.py
def test_restore_verify_succeeds_after_every_failure_and_records_restore_time(api, stack_rt, kafka, failure):
    from ops import status

    from ops import failures
    from state.snapshots import SnapshotStore

    if failure in ("kill_mid_batch", "kill_engine"):
        samples.produce(MOVIES, kafka, 3000)          # a batch to kill
    live = SnapshotStore(stack_rt.snapshot_uri)
    before = {p: live.list(MOVIES, p) for p in range(4)}
    run_id, run, states = _run(api, f"{MOVIES}__restore_verify", {"failure": failure})
    assert run["state"] == "success", (states, api.failed_logs(f"{MOVIES}__restore_verify", run_id))
    assert set(states.values()) == {"success"}
    record = status.verify_history(stack_rt, MOVIES, limit=1)[0]
    assert record["run_id"] == run_id and record["failure"] == failure and record["ok"] is True
    assert record["differences"] == 0 and record["keys_compared"] > 0
    assert record["restore_seconds"] is not None
    if failure in ("wipe_local_store", "corrupt_latest_snapshot", "lose_all_snapshots", "broker_restart"):
        assert record["restored_partitions"] == [0, 1, 2, 3]
    if failure == "corrupt_latest_snapshot":
        assert record["corrupt_snapshots"] == 4
    # Drills damage a scratch copy only: every live snapshot is still there and still checks out.
    for p, manifests in before.items():
        still = {m.path for m in live.list(MOVIES, p)}
        for m in manifests:
            assert m.path in still, f"{failure} deleted live snapshot {m.path}"
            live.download(m, stack_rt.data_dir / "drill-check" / f"p{p}")
    assert not SnapshotStore(failures.scratch_uri(stack_rt)).list(MOVIES, 0), "the scratch copy outlived recovery"
    if failure in ("kill_mid_batch", "kill_engine"):
        assert record["injected"]["facts"]["exit_code"] != 0
    if failure == "kill_engine":
        facts = record["injected"]["facts"]
        assert facts["engine_was_down"] is True and facts["engine_restart_seconds"] > 0
    assert _state(stack_rt) == _expected_movies(kafka)
    TIMINGS[f"restore_verify {failure}: restore seconds"] = record["restore_seconds"]
    if failure == "wipe_local_store":
        _assert_lineage(run_id, stack_rt, kafka)


def _assert_lineage(run_id: str, rt, kafka: str) -> None:
    """One START and one COMPLETE OpenLineage event per task of the run, each naming what the
    task reads and writes (the provider's file transport, set in conftest)."""
    lineage_file = Path(json.loads(os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"])["log_file_path"])
    events = [json.loads(line) for line in lineage_file.read_text().splitlines() if line.strip()]
    broker = f"kafka://{kafka.split(',')[0]}"
    changelog = (broker, f"{MOVIES}-changelog")
    bronze = ("file", str(rt.delta_path(MOVIES, "bronze")))
    expected = {"inject_failure": (set(), set()), "restore": ({changelog}, set()),
                "verify": ({bronze, changelog}, set()), "record_result": (set(), set())}
    for task, (inputs, outputs) in expected.items():
        mine = [e for e in events if e["job"]["name"] == f"{MOVIES}__restore_verify.{task}"
                and run_id in json.dumps(e["run"]["facets"])]
        assert sorted(e["eventType"] for e in mine) == ["COMPLETE", "START"], (task, [e["eventType"] for e in mine])
        complete = next(e for e in mine if e["eventType"] == "COMPLETE")
        assert {(d["namespace"], d["name"]) for d in complete["inputs"]} == inputs, (task, complete["inputs"])
        assert {(d["namespace"], d["name"]) for d in complete["outputs"]} == outputs, (task, complete["outputs"])


def test_restore_verify_fails_and_names_the_key_after_a_value_is_flipped_behind_its_back(api, stack_rt):
    from state import codec
    from state.backends import RocksBackend
    from state.table import partition_of

    victim = sorted(_state(stack_rt))[0]
    p = partition_of(codec.encode_key(victim), 4)
    backend = RocksBackend(stack_rt.state_dir / MOVIES / f"p{p:04d}")
    try:
        corrupt_value(backend, codec.encode_key(victim), codec.encode_value((123456789,)))
    finally:
        backend.close()
    run_id, run, states = _run(api, f"{MOVIES}__restore_verify", {"failure": "none"})
    assert run["state"] == "failed"
    assert states["verify"] == "failed" and states["record_result"] == "failed"
    log = api.task_log(f"{MOVIES}__restore_verify", run_id, "verify")
    assert f"key {list(victim)}" in log and "123456789" in log
    assert f"digest mismatches in partitions [{p}]" in log

    # Repair: the local store is only a cache; restoring it from the changelog gives back the truth.
    from spark_jobs import jobs

    jobs.restore(MOVIES, rt=stack_rt)
    _, run, _ = _run(api, f"{MOVIES}__restore_verify", {"failure": "none"})
    assert run["state"] == "success"


def test_bad_failure_param_is_rejected_before_any_work(api):
    with pytest.raises(RuntimeError, match="400|422"):
        api.trigger(f"{MOVIES}__restore_verify", {"failure": "meteor_strike"})


def test_zz_print_timings(api):
    """Takes `api` to run among the tests that use Airflow, after the DAG runs it times."""
    print("\nDAG run wall times (s): " + json.dumps(TIMINGS, indent=1))


def test_screenshots_of_the_grid_and_the_statetable_page(airflow):
    """Headless Chromium (Debian's, driven by Playwright) logged in with an Airflow JWT cookie."""
    token = airflow_server.api_token(airflow)
    shots = {"airflow-grid.png": f"/dags/{MOVIES}__restore_verify",
             "airflow-dags.png": "/dags?tags=statetable",
             "statetable-page.png": "/plugin/statetable"}
    text = screenshots(airflow.airflow_url, token, shots, text_of="/statetable/ui")
    assert "statetable: state tables" in text and MOVIES in text and "restore-verify" in text
    # Words, not Python: no None, no DIFFERS where every drill was exact.
    assert "None" not in text and "DIFFERS" not in text, text
