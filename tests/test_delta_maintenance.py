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
from spark_jobs import batch, delta_files, delta_maintenance, jobs
from tests.table_env import isolated_runtime, read_topic

TABLE = "movie_tickets_sold"
STATETABLE = str(Path(sys.executable).parent / "statetable")


def _files_on_disk(path: str) -> int:
    return len([p for p in Path(path).iterdir() if p.suffix == ".parquet"])


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
    assert _files_on_disk(bronze) > 1                # dropped files stay for delta_retention (1 h)
    frame = spark.read.format("delta").load(bronze)
    assert frame.count() == produced == frame.select("source_partition", "source_offset").distinct().count()
    result = batch.verify(TABLE, spark=spark, rt=rt)
    assert result.ok, result.summary()

    # VACUUM with no retention: only the live file is left on disk, and the table reads the same.
    table, _ = jobs.load_table(TABLE, rt)
    table.delta_retention_ms = 0
    delta_maintenance.maintain(spark, rt, table)
    assert _files_on_disk(bronze) == len(delta_files.load(bronze).file_uris()) == 1
    assert spark.read.format("delta").load(bronze).count() == produced

    # A retention that splits the batches: two more after a pause, then bronze keeps only those.
    time.sleep(3)
    for round_ in (4, 5):
        samples.produce(TABLE, rt.bootstrap, 500, suffix=suffix)
        produced += 500
        (commit,) = jobs.run(TABLE, spark=spark, rt=rt, max_batches=1)
    table.delta_retention_ms, table.bronze_retention_ms = 3_600_000, 2_500
    report = delta_maintenance.maintain(spark, rt, table)
    assert report["bronze"]["bronze_from_batch"] == 4 == delta_maintenance.bronze_from_batch(rt, TABLE)
    kept = spark.read.format("delta").load(bronze)
    assert sorted(r["batch_id"] for r in kept.select("batch_id").distinct().collect()) == [4, 5]
    assert kept.count() == 1000

    # Verify now refuses, in one line naming the option, from the CLI too (a user's mistake: exit 2).
    cli = subprocess.run([STATETABLE, "verify", TABLE], capture_output=True, text=True, env={**os.environ, **rt.as_env()})
    assert cli.returncode == 2, cli.stderr[-2000:]
    message = cli.stderr.strip().splitlines()
    assert len(message) == 1 and "bronze_retention" in message[0] and "Error" not in message[0], message

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


@pytest.mark.parametrize("header, fragment", [
    ("-- bronze_retention: 1h\n-- delta_retention: 2h\n", "shorter than delta_retention"),
    ("-- bronze: off\n-- bronze_retention: 30d\n", "keeps no bronze"),
    ("-- delta_retention: 10m\n", "at least 1h"),
    ("-- bronze_retention: soon\n", "not a duration"),
])
def test_retention_options_fail_fast_naming_the_table_and_the_fix(tmp_path, header, fragment):
    from catalog.definitions import DefinitionError, parse

    shipped = Path(__file__).resolve().parent.parent / "dags" / "tables" / f"{TABLE}.sql"
    path = tmp_path / f"{TABLE}.sql"
    path.write_text(header + shipped.read_text())
    with pytest.raises(DefinitionError, match=fragment) as raised:
        parse(path)
    assert len(str(raised.value).splitlines()) == 1
