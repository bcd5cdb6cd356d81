"""spark_jobs/steps and frames/ without a stack: the step clock, a task's report and context, what
a table's frames read and that they read it only through what they are handed. No Spark session
here: these are the parts of a batch that are logic, tested alone (#67)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

from catalog.batch_log import BatchCommit, BatchLog, BatchPlan
from catalog.definitions import load_all
from catalog.runtime import Runtime
from spark_jobs.frames.table_frames import TableFrames
from spark_jobs.steps import clock as clock_module
from spark_jobs.steps.batch_step import BatchStep
from spark_jobs.steps.clock import StepClock
from spark_jobs.steps.inputs import StoredInputs, frames_of
from spark_jobs.steps.summary import PartitionSummary
from spark_jobs.steps.table_run import TableRun
from spark_jobs.steps.task_context import TaskContext

TABLES = load_all(Path(__file__).resolve().parents[3] / "dags" / "tables")


class _Run:
    """A TableRun's describe, recorded."""

    def __init__(self) -> None:
        self.described: list[tuple[int, str]] = []

    def describe(self, batch_id: int, step: str) -> None:
        self.described.append((batch_id, step))


def test_the_clock_names_times_and_fault_points_each_step_once(monkeypatch):
    reached = []
    monkeypatch.setattr(clock_module.faults, "point", reached.append)
    run, started = _Run(), time.monotonic()
    clock = StepClock(run, 7, started)
    with clock.step("read"):
        time.sleep(0.02)
    with clock.step("dead_letters", "batch.after_dead_letters", "batch.after_bronze"):
        pass
    with clock.step("aggregate_merge", "batch.after_merge"):
        time.sleep(0.01)
    assert run.described == [(7, "read"), (7, "dead_letters"), (7, "aggregate_merge")]
    assert reached == ["batch.after_read", "batch.after_dead_letters", "batch.after_bronze", "batch.after_merge"]
    assert list(clock.seconds) == ["read", "dead_letters", "aggregate_merge"]
    assert clock.seconds["read"] >= 0.02 and clock.seconds["aggregate_merge"] >= 0.01
    # The steps add up to the pass: each is timed from the end of the one before, the first from the start.
    assert abs(sum(clock.seconds.values()) - (time.monotonic() - started)) < 0.01


def test_a_step_that_raises_is_neither_timed_nor_past_its_fault_point(monkeypatch):
    reached = []
    monkeypatch.setattr(clock_module.faults, "point", reached.append)
    clock = StepClock(_Run(), 1, time.monotonic())
    with pytest.raises(RuntimeError):
        with clock.step("read"):
            raise RuntimeError("the broker went away")
    assert clock.seconds == {} and reached == []


def test_a_tasks_report_travels_as_json_and_comes_back_typed():
    sent = PartitionSummary(partition=3, changelog_offset=41, digest="00ff", key_count=9, keys_changed=2,
                            delta_keys=5, rejected=((["k", 1], "value too large"),), ms={"fold": 3},
                            worker="w1", hydrated=True, counts={"groups_touched": 4})
    reported = json.loads(sent.to_table().column("summary")[0].as_py())
    partition = reported.pop("partition")        # as per_state_partition collects it
    back = PartitionSummary.of(partition, reported)
    assert back == sent
    assert back.rejected[0][1] == "value too large" and back.counts == {"groups_touched": 4}


def test_a_kinds_own_counts_land_in_counts_and_a_missing_field_fails_where_it_is_read():
    back = PartitionSummary.all_of({0: {"changelog_offset": 1, "digest": "0", "key_count": 1, "affected": 3}})[0]
    assert back.counts == {"affected": 3} and back.delta_keys == 0
    with pytest.raises(AttributeError):
        back.affected       # a misspelt count is an error, not a silent 0


def test_a_batch_step_totals_a_field_over_its_partitions():
    summaries = {p: PartitionSummary(partition=p, changelog_offset=p, digest="0", key_count=1, keys_changed=p,
                                     purged=1) for p in range(4)}
    step = BatchStep(reasons={None: 10}, read=10, summaries=summaries, delta_keys=4, steps={"read": 0.1})
    assert step.total("keys_changed") == 6 and step.total("purged") == 4
    with pytest.raises(AttributeError):
        step.total("keys_chnaged")


def test_a_task_context_takes_the_stacks_places_and_its_kinds_fields(tmp_path):
    rt = Runtime(bootstrap="127.0.0.1:1", data_dir=tmp_path, snapshot_uri=str(tmp_path / "snap"),
                 tables_dir=tmp_path, namespace="ns.")
    table = TABLES["movie_tickets_sold"]
    ctx = TaskContext.of(rt, table, 12, changelog="c", purge_watermark=5)
    assert (ctx.state_dir, ctx.bootstrap, ctx.snapshot_uri, ctx.namespace) == (str(rt.state_dir), "127.0.0.1:1",
                                                                                  str(tmp_path / "snap"), "ns.")
    assert ctx.batch_id == 12 and ctx.changelog == "c" and ctx.purge_watermark == 5
    assert str(tmp_path / "replicas") in ctx.replica_roots        # a writer seeds from a local replica
    assert TaskContext.of(rt, table, 1, replica_roots=()).replica_roots == ()
    ranged = TaskContext.of(rt, table, 1, window_range=(100, 200))
    assert ranged.in_scope(("a", 100)) and not ranged.in_scope(("a", 200)) and ctx.in_scope(("a", 1))


def test_stored_inputs_read_the_watermark_each_committed_batch_began_from(tmp_path):
    rt = Runtime(bootstrap="127.0.0.1:1", data_dir=tmp_path, snapshot_uri="", tables_dir=tmp_path)
    log = BatchLog(rt.batch_dir("t"))
    for i, mark in enumerate([None, 1000, 900]):
        log.write_plan(BatchPlan(batch_id=i, topic="t", ranges={0: (i, i + 1)}, watermark_ms=mark), "t")
        log.write_commit(BatchCommit(batch_id=i, topic="t", ranges={0: (i, i + 1)}, changelog_offsets={0: i},
                                     digests={0: "0"}, key_counts={0: 1}, counts={}, watermark_ms=mark,
                                     seconds=0.1), "t")
    inputs = StoredInputs(None, rt, "t")
    assert inputs.batch_watermarks() == [(0, None), (1, 1000), (2, 900)]
    assert inputs.pinned_folder == f"{log.location}/joins"


class _Handed:
    """Inputs from memory: a TableFrames built over them reads nothing else."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def reference(self, other, pins):
        self.asked.append(other.name)
        return pa.table({"id": [1]})

    def batch_watermarks(self):
        self.asked.append("watermarks")
        return []


def test_table_frames_are_built_without_io_and_read_only_what_they_are_handed():
    """What frames/ may import holds it to reading nothing itself (tests/test_layout.py); here, a
    frames object asks its inputs nothing until a frame needs them, and a live batch's frames
    are a copy, not a mode set on a shared object."""
    inputs = _Handed()
    frames = TableFrames(None, TABLES["leaderboard"], TABLES, inputs)
    live = frames.for_batch(1234)
    assert inputs.asked == []
    assert (frames.live, frames.window_floor) == (False, None) and (live.live, live.window_floor) == (True, 1234)
    assert live.inputs is inputs and live.table is frames.table
    with pytest.raises(Exception):
        frames.live = True          # frozen


def test_a_table_run_and_its_frames_read_nothing_when_built(tmp_path):
    rt = Runtime(bootstrap="127.0.0.1:1", data_dir=tmp_path / "none", snapshot_uri="", tables_dir=tmp_path)
    run = TableRun(None, TABLES["leaderboard"], TABLES, rt)
    frames = run.frames
    assert isinstance(frames.inputs, StoredInputs) and frames.inputs.table == "leaderboard"
    assert frames_of(None, TABLES["leaderboard"], TABLES, rt).inputs == frames.inputs
    assert not (tmp_path / "none").exists()          # no folder made, no batch log read
    other = run.in_session("another session")
    assert other.spark == "another session" and other.frames.spark == "another session"


def test_a_joined_tables_pinned_rows_hold_timestamps_and_dates_as_the_state_stores_them(tmp_path):
    """b's rows as a join reads them from its pinned file: a TIMESTAMP as epoch milliseconds and a
    DATE as days, as the state's codec holds them (a datetime it cannot encode: the Nexmark q3
    join of auctions with persons failed on its first batch)."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from catalog.definitions import parse
    from spark_jobs.steps.table_join import pinned_rows

    sql = tmp_path / "person.sql"
    sql.write_text("CREATE TABLE person (id BIGINT PRIMARY KEY, name STRING, seen TIMESTAMP, born DATE) "
                   "WITH (topic='person');\n")
    right = parse(sql)
    (tmp_path / "joins").mkdir()
    pq.write_table(pa.table({
        "id": pa.array([1, 2], pa.int64()), "name": ["ann", "bob"],
        "seen": pa.array([dt.datetime(2026, 11, 30, 0, 53, 20, 123000, tzinfo=dt.timezone.utc), None],
                         pa.timestamp("us", tz="UTC")),
        "born": pa.array([dt.date(1970, 1, 11), dt.date(1969, 12, 31)], pa.date32())}),
        tmp_path / "joins" / "b.parquet")
    rows = pinned_rows(str(tmp_path / "joins"), "b.parquet", right)
    assert rows == {1: (1, "ann", 1_796_000_000_123, 10), 2: (2, "bob", None, -1)}


def test_window_purges_fall_at_each_tables_snapshot_phase(tmp_path):
    """Tables started together purge expired windows in different batches, each every
    snapshot_every batches at its own phase; a pinned phase keeps the old batches 0, N, 2N; a
    table without windows never purges."""
    from catalog.definitions import parse
    from catalog.registry import snapshot_phase
    from spark_jobs.steps.merge_step import purge_at

    def table(name: str, header: str = "", window: bool = True):
        path = tmp_path / f"{name}.sql"
        group = "k, TUMBLE(ts, INTERVAL '1' MINUTE)" if window else "k"
        path.write_text(f"-- topic: s\n-- schema: k STRING, ts TIMESTAMP\n-- snapshot_every: 10\n{header}"
                        f"CREATE TABLE {name} AS SELECT k, COUNT(*) AS n FROM s GROUP BY {group}")
        return parse(path)

    tables = [table(f"t{i:02d}") for i in range(20)]
    purging = {t.name: [b for b in range(40) if purge_at(t, b, 1_000) is not None] for t in tables}
    for t in tables:
        phase = snapshot_phase(t)
        assert purging[t.name] == [phase, phase + 10, phase + 20, phase + 30], t.name
        assert purge_at(t, phase, 1_000) == 1_000 and purge_at(t, phase, None) is None
    assert len({batches[0] for batches in purging.values()}) > 3        # spread, not all at batch 0
    pinned = table("pinned", "-- snapshot_phase: 0\n")
    assert [b for b in range(25) if purge_at(pinned, b, 5)] == [0, 10, 20]
    assert [b for b in range(25) if purge_at(table("plain", window=False), b, 5)] == []


WINDOWED = ("-- topic: p\n-- schema: id BIGINT, name STRING, city STRING, dateTime TIMESTAMP\n-- partitions: 2\n"
            "-- join_topic: a\n-- join_schema: id BIGINT, seller BIGINT, itemName STRING, dateTime TIMESTAMP\n"
            "-- join_grace: 10s\n-- output_topic: j-out\nCREATE TABLE j AS SELECT p.id, p.name, a.itemName FROM p p "
            "JOIN a a ON p.id = a.seller AND a.dateTime BETWEEN p.dateTime - INTERVAL '10' SECOND AND p.dateTime "
            "+ INTERVAL '10' SECOND WHERE a.dateTime - a.dateTime % 10000 = p.dateTime - p.dateTime % 10000;")


def test_a_windowed_join_keeps_the_fields_its_rows_and_where_read_and_builds_its_change_rows_as_stored(tmp_path):
    """What a windowed join's records carry (stream_join.PairShape.used: the SELECT's and the
    WHERE's fields, a WHERE field kept though no row shows it), and its change rows built from
    the rows it put (stream_join.Written) equal to those decoded from the commit's bytes."""
    from catalog.definitions import parse
    from spark_jobs.steps.merge_task import unbatched_rows
    from spark_jobs.steps.stream_join import PairShape, Written
    from state import codec

    (tmp_path / "j.sql").write_text(WINDOWED)
    table = parse(tmp_path / "j.sql")
    assert PairShape(table).used == {"a": {"name", "dateTime"}, "b": {"itemName", "dateTime"}}

    rows = {(7, "0:1|1:2"): (7, "0:1|1:2", "Ann \"é\"", "lamp"), (-3, "0:5|1:9"): (-3, "0:5|1:9", None, "x\\y"),
            (8, "1:4|0:0"): (8, "1:4|0:0", "Bo", "chair")}
    written = Written(table)
    for key, row in rows.items():
        written.add(key, codec.encode_key(key), row)
    stored = {codec.encode_key(k): codec.encode_value(v) for k, v in rows.items() if k[0] != 8}   # 8: unchanged
    built = written.changed(stored)
    assert built.equals(unbatched_rows(table, None, {}, stored))
    assert sorted(built.column("key").to_pylist()) == ['[-3, "0:5|1:9"]', '[7, "0:1|1:2"]']


def test_a_windowed_join_side_crosses_to_its_merge_tasks_as_blobs_and_opens_as_the_spark_shape(tmp_path):
    """arrow_rows' exchange: a side's accepted rows leave the read as one IPC blob a state
    partition, and the merge task opens them (exchanged) into the columns stream_join._records
    reads, beside the other side's rows as Spark shaped them; every record once, in its partition."""
    import pyarrow as pa

    from catalog.definitions import parse, stream_join_sides
    from spark_jobs.frames import arrow_rows
    from spark_jobs.steps.stream_join import _records

    (tmp_path / "j.sql").write_text(WINDOWED)
    table = parse(tmp_path / "j.sql")
    left, _ = stream_join_sides(table)
    assert left.value_columns == ["rowposition", "id", "name", "city", "dateTime"]
    rows = pa.table({"_k0": ["0:1", "0:2", "1:7"], "_v0": ["0:1", "0:2", "1:7"], "_v1": [5, 6, 5],
                     "_v2": ["Ann", None, "Bo"], "_v3": pa.nulls(3, pa.string()), "_v4": [1000, 2000, 3000],
                     "_sp": pa.array([1, 0, 1], pa.int32())})
    spec = arrow_rows.RowsSpec(left, 2, 3, 0, join_key="id",
                               exchange=arrow_rows.SideExchange("a", "id", "dateTime", "dateTime", frozenset({"name"})))
    blobs = pa.concat_tables(list(arrow_rows._blobs(rows, spec)))
    assert blobs.column("_sp").to_pylist() == [0, 1] and blobs.column("_kind").to_pylist() == ["blob", "blob"]
    # the other side's rows as Spark gives them (_side_rows), in the same task's group
    spark_rows = pa.table({"_k0": [5], "_k1": ["3:4"], "_side": ["b"], "_t": [1500], "_u": [1500],
                           "_b": pa.array([{"id": 9, "seller": 5, "itemName": "lamp", "dateTime": 1500}])})
    for sp, want in ((1, [("a", 5, "0:1", 1000, ("Ann",)), ("a", 5, "1:7", 3000, ("Bo",)),
                          ("b", 5, "3:4", 1500, ("lamp",))]),
                     (0, [("a", 6, "0:2", 2000, (None,))])):
        blob = blobs.filter(pa.compute.equal(blobs.column("_sp"), sp)).column("value").combine_chunks()
        group = pa.concat_tables([pa.table({"_blob": blob}), spark_rows.append_column(
            "_blob", pa.nulls(1, pa.binary()))] if sp == 1 else [pa.table({"_blob": blob})], promote_options="default")
        got = [(r.side, r.key, r.position, r.time, (r.row[1],) if r.side == "a" else (r.row[2],))
               for r in _records(arrow_rows.exchanged(group))]
        assert got == want
