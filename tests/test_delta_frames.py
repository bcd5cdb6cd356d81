"""The Delta tables verify, rebuild and the mirror read, read over the files delta-rs lists: the
same rows as delta-spark's reader through appends, a compaction, a delete and an added column;
an empty table keeps its schema; a table whose log holds what its files do not (partition
values) is read by delta-spark."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.delta import delta_files, delta_frames


def _rows(frame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


def _append(path: str, name: str, table: pa.Table, version: int) -> None:
    os.makedirs(path, exist_ok=True)
    pq.write_table(table, os.path.join(path, name))
    delta_files.commit_files(path, [delta_files.DataFile(name, os.path.getsize(os.path.join(path, name)),
                                                         table.num_rows)], table.schema, "test", version)


def test_our_tables_read_over_their_files_equal_delta_sparks_reader(spark, tmp_path):
    path = str(tmp_path / "bronze")
    schema = pa.schema([("key", pa.string()), ("n", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("batch_id", pa.int64())])
    for batch in range(3):
        _append(path, f"part-{batch}.parquet", pa.table({"key": [f"k{i}" for i in range(4)], "n": [batch] * 4,
                                                         "ts": [None, 0, 1, 2], "batch_id": [batch] * 4},
                                                        schema=schema), batch)
    table = delta_files.load(path)
    assert delta_frames._files_are_the_table(table)
    assert _rows(delta_frames.read(spark, path)) == _rows(spark.read.format("delta").load(path))
    assert len(_rows(delta_frames.read(spark, path))) == 12

    table.optimize.compact()                    # files removed from the log stay on disk until VACUUM
    table.delete("batch_id = 1")
    assert len(os.listdir(path)) > len(delta_files.load(path).file_uris())
    ours = _rows(delta_frames.read(spark, path))
    assert ours == _rows(spark.read.format("delta").load(path)) and len(ours) == 8
    assert {r[3] for r in ours} == {0, 2}

    # A file a worker wrote but no commit added is not read; a column added by a later writer
    # reads as null in the older files, as Delta has it.
    wider = schema.append(pa.field("extra", pa.string()))
    pq.write_table(pa.table({"key": ["z"], "n": [9], "ts": [None], "batch_id": [3], "extra": ["x"]}, schema=wider),
                   os.path.join(path, "part-3.parquet"))
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"key": ["y"], "n": [10], "ts": [None], "batch_id": [4], "extra": ["y"]},
                                   schema=wider), mode="append", schema_mode="merge")
    frame = delta_frames.read(spark, path)
    assert frame.columns == ["key", "n", "ts", "batch_id", "extra"]
    assert _rows(frame) == _rows(spark.read.format("delta").load(path))
    assert sorted(r[4] for r in _rows(frame) if r[4] is not None) == ["y"]


def test_an_empty_table_keeps_its_schema_and_a_partitioned_one_is_read_by_delta_spark(spark, tmp_path):
    empty = str(tmp_path / "empty")
    delta_files.commit_files(empty, [], pa.schema([("key", pa.string()), ("batch_id", pa.int64())]), "test", 0)
    frame = delta_frames.read(spark, empty)
    assert frame.columns == ["key", "batch_id"] and frame.count() == 0

    parted = str(tmp_path / "parted")
    spark.range(6).selectExpr("id", "id % 2 AS half").write.format("delta").partitionBy("half").save(parted)
    assert not delta_frames._files_are_the_table(delta_files.load(parted))
    assert _rows(delta_frames.read(spark, parted)) == [(i, i % 2) for i in range(6)]


def test_dead_letters_reach_their_delta_table_once_a_batch_through_a_re_run(kafka, spark, tmp_path):
    """The dead-letter table is written as bronze is (workers' files, one delta-rs commit): each
    batch's bad records once, with reason and source coordinates; a re-run of a committed batch
    adds nothing, and an attempt's stray file is never read."""
    from confluent_kafka import Producer

    from deploy import samples
    from spark_jobs import jobs
    from spark_jobs.steps import sinks
    from tests.table_env import isolated_runtime

    rt, suffix = isolated_runtime(kafka, tmp_path)
    table = "movie_tickets_sold"
    producer = Producer({"bootstrap.servers": rt.bootstrap})
    for batch in range(2):
        samples.produce(table, rt.bootstrap, 50, suffix=suffix)
        producer.produce("movie_ticket_sales" + suffix, f"{{bad json {batch}".encode())
        assert producer.flush(10) == 0
        (commit,) = jobs.run(table, spark=spark, rt=rt, max_batches=1)
        assert commit.batch_id == batch
    path = rt.delta_path(table, "dlq")
    rows = sorted((r["batch_id"], r["reason"], r["value"]) for r in delta_frames.read(spark, path).collect())
    assert rows == [(0, "malformed_json", "{bad json 0"), (1, "malformed_json", "{bad json 1")]
    assert _rows(delta_frames.read(spark, path)) == _rows(spark.read.format("delta").load(path))

    again = spark.createDataFrame([("x", 0, 1, "again", 1)], "reason string, source_partition int, "
                                  "source_offset long, value string, batch_id int")
    sinks._append_files(again, path, f"{table}.dlq", 1, "dlq-b000000000001")       # batch 1 is committed
    pq.write_table(pa.table({"reason": ["stray"]}), os.path.join(path, "dlq-b000000000002-s00009.parquet"))
    sinks._append_files(again.selectExpr("reason", "source_partition", "source_offset", "value", "2 AS batch_id"),
                        path, f"{table}.dlq", 2, "dlq-b000000000002")
    assert sorted(r["batch_id"] for r in delta_frames.read(spark, path).collect()) == [0, 1, 2]
    assert not os.path.exists(os.path.join(path, "dlq-b000000000002-s00009.parquet"))
