"""A table's Delta tables stay small as it ages (#46 item 4): every `maintain_every` batches the
batch job compacts bronze, the mirror and the dead letters and vacuums them; a bronze retention
deletes old history, after which verify and rebuild refuse in one line naming the option. Checked
against the records read back from the topic (pandas), not the product's own code."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from deploy import samples
from spark_jobs.delta import verify_chain
from spark_jobs.recompute.rebuild import rebuild
from spark_jobs.recompute.verify import verify
from spark_jobs.delta import delta_files, delta_maintenance
from spark_jobs import jobs
from tests.table_env import isolated_runtime, read_topic

TABLE = "movie_tickets_sold"
STATETABLE = str(Path(sys.executable).parent / "statetable")


def _files_on_disk(path: str) -> int:
    return len([p for p in Path(path).iterdir() if p.suffix == ".parquet"])


@pytest.mark.timeout(1800)       # ~8 batches, 4 verifies and 3 maintenance runs; 585 s beside the other worker
def test_bronze_is_compacted_vacuumed_and_trimmed_and_verify_names_the_option(kafka, spark, tmp_path):
    rt, suffix = isolated_runtime(kafka, tmp_path)
    sql = rt.tables_dir / f"{TABLE}.sql"
    sql.write_text("-- maintain_every: 3\n-- delta_retention: 1h\n" + sql.read_text())
    bronze = rt.delta_path(TABLE, "bronze")
    produced = 0
    for round_ in range(4):                          # batches 0..3: the fourth is due for maintenance
        samples.produce(TABLE, rt.bootstrap, 500, suffix=suffix)
        produced += 500
        (commit,) = jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
        assert commit.batch_id == round_
        if round_ == 2:
            before = len(delta_files.load(bronze).file_uris())
            assert before > 1
    assert len(delta_files.load(bronze).file_uris()) == 1, "bronze was not compacted at batch 3"
    optimized = [h for h in delta_files.load(bronze).history() if h["operation"] == "OPTIMIZE"]
    assert len(optimized) == 1 and "delta-rs" in optimized[0].get("clientVersion", ""), optimized   # under the bound
    assert _files_on_disk(bronze) > 1                # dropped files stay for delta_retention (1 h)
    frame = spark.read.format("delta").load(bronze)
    assert frame.count() == produced == frame.select("source_partition", "source_offset").distinct().count()
    result = verify(TABLE, spark=spark, rt=rt)
    assert result.ok, result.summary()

    # VACUUM with no retention, by Spark (over the driver's bound): only the live file is left on
    # disk, and the table reads the same.
    table, _ = jobs.load_table(TABLE, rt)
    table.delta_retention_ms = 0
    with pytest.MonkeyPatch.context() as bound:
        bound.setattr(delta_maintenance, "DRIVER_BYTES", 0)
        assert delta_maintenance.maintain(spark, rt, table)["bronze"]["engine"] == "spark"
    assert _files_on_disk(bronze) == len(delta_files.load(bronze).file_uris()) == 1
    assert spark.read.format("delta").load(bronze).count() == produced

    # A retention that splits the batches: two more after a pause and a verify (the checkpoint
    # that bronze keeps every batch after), then bronze keeps only the recent ones.
    time.sleep(3)
    for round_ in (4, 5):
        samples.produce(TABLE, rt.bootstrap, 500, suffix=suffix)
        produced += 500
        (commit,) = jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
    verified = verify(TABLE, spark=spark, rt=rt)
    assert verified.ok and verified.batch_id == 5, verified.summary()
    from catalog.batch_log import BatchLog

    age = time.time() - BatchLog(rt.batch_dir(TABLE)).commit(4).committed_at    # batch 3 is 3 s older still
    table.delta_retention_ms, table.bronze_retention_ms = 3_600_000, int((age + 1.5) * 1000)
    report = delta_maintenance.maintain(spark, rt, table)
    assert report["bronze"]["bronze_from_batch"] == 4 == verify_chain.bronze_from_batch(rt, TABLE)
    assert report["bronze"]["engine"] == "delta-rs", report
    assert report["bronze"]["files_compacted"] >= 2 and report["bronze"]["files_written"] == 1, report
    kept = spark.read.format("delta").load(bronze)
    assert sorted(r["batch_id"] for r in kept.select("batch_id").distinct().collect()) == [4, 5]
    assert kept.count() == 1000

    # A full verify now refuses, in one line naming the option, from the CLI too (exit 2), before
    # it asks for a Spark engine (none answers at the address it is given); a verify from the
    # checkpoint still proves the table.
    env = {**os.environ, **rt.as_env(), "STATETABLE_SPARK_REMOTE": "sc://127.0.0.1:9"}
    cli = subprocess.run([STATETABLE, "verify", TABLE, "--full"], capture_output=True, text=True, env=env)
    assert cli.returncode == 2, cli.stderr[-2000:]
    message = [line for line in cli.stderr.splitlines() if "bronze_retention" in line]
    assert len(message) == 1 and "a full verify recomputes from batch 0" in message[0], cli.stderr[-2000:]
    assert "Error" not in cli.stderr and "Traceback" not in cli.stderr, cli.stderr[-2000:]
    with pytest.raises(Exception, match="bronze_retention"):
        rebuild(TABLE, spark=spark, rt=rt)

    # The table goes on: the next batch commits into the trimmed bronze, and the state equals
    # pandas over every record the topic holds.
    samples.produce(TABLE, rt.bootstrap, 500, suffix=suffix)
    produced += 500
    (commit,) = jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
    assert spark.read.format("delta").load(bronze).where("batch_id = 6").count() == 500
    records = pd.DataFrame([json.loads(m.value()) for m in read_topic(rt.bootstrap, "movie_ticket_sales" + suffix)])
    assert len(records) == produced
    expected = records.groupby("title")["ticket_total_value"].count().to_dict()
    assert {k[0]: v[0] for k, v in jobs.state_rows(TABLE, rt).items()} == expected
    chained = verify(TABLE, spark=spark, rt=rt)
    assert chained.ok and chained.chained_from == 5, chained.summary()

    # A changed definition cannot be adopted from trimmed history: the batch stops naming the way
    # out instead of the rebuild it otherwise offers (which refuses the same way), and the old
    # definition, put back, runs on.
    from spark_jobs.errors import HistoryTrimmed
    from state.errors import DefinitionChanged

    original = sql.read_text()
    sql.write_text(original.replace("COUNT(ticket_total_value)", "SUM(ticket_total_value)"))
    samples.produce(TABLE, rt.bootstrap, 500, suffix=suffix)
    produced += 500
    with pytest.raises(DefinitionChanged, match="history starts at batch 4") as stopped:
        jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
    assert "put the old definition back" in str(stopped.value) and "rebuild" not in str(stopped.value)
    with pytest.raises(HistoryTrimmed, match="history starts at batch 4.*put the old definition back"):
        rebuild(TABLE, spark=spark, rt=rt)
    sql.write_text(original)
    (commit,) = jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
    assert commit.batch_id == 7 and commit.counts["read"] == 500


@pytest.mark.parametrize("header, fragment", [
    ("-- bronze_retention: 1h\n-- delta_retention: 2h\n", "shorter than delta_retention"),
    ("-- bronze: off\n-- bronze_retention: 30d\n", "keeps no bronze"),
    ("-- delta_retention: 10m\n", "at least 1h"),
    ("-- bronze_retention: soon\n", "not a duration"),
    ("-- bronze_retention: 30d\n-- event_time: sale_ts\n-- ttl: 30d\n", "without windows or a ttl"),
])
def test_retention_options_fail_fast_naming_the_table_and_the_fix(tmp_path, header, fragment):
    from catalog.definitions import DefinitionError, parse

    shipped = Path(__file__).resolve().parent.parent / "dags" / "tables" / f"{TABLE}.sql"
    path = tmp_path / f"{TABLE}.sql"
    path.write_text(header + shipped.read_text())
    with pytest.raises(DefinitionError, match=fragment) as raised:
        parse(path)
    assert len(str(raised.value).splitlines()) == 1
