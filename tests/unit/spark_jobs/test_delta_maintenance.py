"""delta_maintenance on the driver (delta-rs, no Spark) on a real Delta table: a bronze trim
drops the old batches and records bronze's first batch where verify reads it, the small files
become one, VACUUM leaves only that file on disk (a crashed batch's stray file too), and the
bound sends a run to Spark. The Spark side runs in tests/test_delta_maintenance.py."""
from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from catalog.runtime import Runtime
from spark_jobs.delta import delta_maintenance
from spark_jobs.delta import verify_chain


def _bronze(path: Path, batches: int = 4, rows: int = 50) -> None:
    for batch_id in range(batches):
        write_deltalake(str(path), pa.table({"batch_id": pa.array([batch_id] * rows, pa.int64()),
                                             "source_offset": pa.array(range(batch_id * rows, (batch_id + 1) * rows),
                                                                       pa.int64())}), mode="append")


def _parquet_on_disk(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.suffix == ".parquet"}


def test_on_the_driver_a_trim_compaction_and_vacuum_leave_the_kept_batches_in_one_file(tmp_path):
    rt = Runtime(bootstrap="127.0.0.1:9", data_dir=tmp_path / "data", snapshot_uri=str(tmp_path / "snapshots"),
                 tables_dir=tmp_path / "tables")
    bronze = Path(rt.delta_path("t", "bronze"))
    _bronze(bronze)
    stray = bronze / "part-00000-crashed-batch.parquet"     # a worker's file no commit names
    pq.write_table(pa.table({"batch_id": [9]}), stray)
    an_hour_ago = time.time() - 3700
    os.utime(stray, (an_hour_ago, an_hour_ago))

    done = delta_maintenance.on_driver(DeltaTable(str(bronze)), trim_from=2, hours=0)

    table = DeltaTable(str(bronze))
    kept = table.to_pyarrow_table()
    assert sorted(set(kept.column("batch_id").to_pylist())) == [2, 3] and kept.num_rows == 100
    assert done["files_written"] == 1 and len(table.file_uris()) == 1
    assert _parquet_on_disk(bronze) == {Path(table.file_uris()[0]).name}          # the stray file too
    assert verify_chain.bronze_from_batch(rt, "t") == 2


def test_vacuum_keeps_what_the_retention_promises(tmp_path):
    bronze = tmp_path / "bronze"
    _bronze(bronze)
    before = _parquet_on_disk(bronze)
    delta_maintenance.on_driver(DeltaTable(str(bronze)), trim_from=None, hours=1)
    live = {Path(u).name for u in DeltaTable(str(bronze)).file_uris()}
    assert len(live) == 1 and _parquet_on_disk(bronze) == before | live      # dropped minutes ago: kept
    assert DeltaTable(str(bronze)).to_pyarrow_table().num_rows == 200


def test_the_bound_counts_small_files_and_the_files_a_trim_rewrites(tmp_path, monkeypatch):
    bronze = tmp_path / "bronze"
    _bronze(bronze)
    actions = pa.table(DeltaTable(str(bronze)).get_add_actions(flatten=True)).to_pydict()
    size_of = dict(zip(actions["min.batch_id"], actions["size_bytes"]))
    assert sorted(size_of) == [0, 1, 2, 3]
    assert delta_maintenance._bytes_to_read(DeltaTable(str(bronze)), None) == sum(size_of.values())
    monkeypatch.setattr(delta_maintenance, "SMALL_FILE_BYTES", 1)           # as if every file were large
    assert delta_maintenance._bytes_to_read(DeltaTable(str(bronze)), None) == 0
    assert delta_maintenance._bytes_to_read(DeltaTable(str(bronze)), 2) == size_of[0] + size_of[1]


def test_a_run_over_the_bound_goes_to_spark(tmp_path, monkeypatch):
    bronze = tmp_path / "bronze"
    _bronze(bronze)
    ran = []
    monkeypatch.setattr(delta_maintenance, "_tables", lambda rt, table: {"bronze": str(bronze)})
    monkeypatch.setattr(delta_maintenance, "in_spark",
                        lambda spark, path, trim_from, hours: ran.append(path) or {"files_compacted": 4,
                                                                                   "files_written": 1})
    table = SimpleNamespace(name="t", delta_retention_ms=3_600_000, bronze_retention_ms=None)
    monkeypatch.setattr(delta_maintenance, "DRIVER_BYTES", 0)
    assert delta_maintenance.maintain(None, None, table)["bronze"]["engine"] == "spark" and ran == [str(bronze)]
    monkeypatch.setattr(delta_maintenance, "DRIVER_BYTES", 1 << 30)
    report = delta_maintenance.maintain(None, None, table)["bronze"]
    assert report["engine"] == "delta-rs" and report["files_compacted"] == 4 and ran == [str(bronze)]


def test_a_run_delta_rs_cannot_finish_goes_to_spark(tmp_path, monkeypatch):
    """A commit conflict or a writer feature delta-rs lacks must not stop the table's batches."""
    from deltalake.exceptions import CommitFailedError

    bronze = tmp_path / "bronze"
    _bronze(bronze)
    ran = []

    def refuse(target, trim_from, hours):
        raise CommitFailedError("a concurrent commit")

    monkeypatch.setattr(delta_maintenance, "_tables",
                        lambda rt, table: {"bronze": str(bronze), "dlq": str(tmp_path / "none")})
    monkeypatch.setattr(delta_maintenance, "on_driver", refuse)
    monkeypatch.setattr(delta_maintenance, "in_spark",
                        lambda spark, path, trim_from, hours: ran.append(path) or {"files_compacted": 4,
                                                                                   "files_written": 1})
    table = SimpleNamespace(name="t", delta_retention_ms=3_600_000, bronze_retention_ms=None)
    report = delta_maintenance.maintain(None, None, table)
    assert report["bronze"]["engine"] == "spark" and ran == [str(bronze)]
    assert "dlq" not in report                          # never written: no log, nothing to maintain
