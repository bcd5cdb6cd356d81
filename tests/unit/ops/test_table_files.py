"""The watch that tells Airflow's dag-processor a table file changed (ops.table_files): it
touches the DAG files for every kind of change a user makes, twice, and never without one."""
from __future__ import annotations

import os

from ops.table_files import TableFilesWatch, dag_files


def _mtime(path) -> int:
    return path.stat().st_mtime_ns


def _setup(tmp_path):
    tables, dags = tmp_path / "tables", tmp_path / "dags"
    tables.mkdir()
    dags.mkdir()
    (tables / "a.sql").write_text("CREATE TABLE a AS SELECT 1")
    factory = dags / "statetable_tables.py"
    factory.write_text("from statetable_airflow.dag_factory import build_all\n")
    (dags / "other.py").write_text("from airflow.sdk import DAG\n")
    old = 1_000_000_000
    for path in (factory, dags / "other.py"):
        os.utime(path, (old, old))
    return tables, dags, factory


def test_only_the_dag_files_that_build_tables_are_touched(tmp_path):
    tables, dags, factory = _setup(tmp_path)
    assert dag_files(dags) == [factory]


def test_every_kind_of_table_file_change_touches_now_and_once_more_after_settling(tmp_path):
    tables, dags, factory = _setup(tmp_path)
    watch = TableFilesWatch(tables, dag_files(dags), settle_s=30)
    assert watch.check(now=0) is False and _mtime(factory) == 1_000_000_000 * 10**9   # nothing changed

    changes = [
        lambda: (tables / "b.sql").write_text("CREATE TABLE b AS SELECT 1"),                 # added
        lambda: (tables / "a.sql").write_text("CREATE TABLE a AS SELECT 22"),                # edited (size)
        lambda: os.utime(tables / "a.sql", (2_000_000_000, 2_000_000_000)),                  # edited (time)
        lambda: (tables / "b.sql").rename(tables / "c.sql"),                                 # renamed
        lambda: (tables / "c.sql").unlink(),                                                 # removed
    ]
    now = 100.0
    for change in changes:
        os.utime(factory, (1, 1))
        change()
        assert watch.check(now=now) is True and _mtime(factory) > 10**9, change
        os.utime(factory, (1, 1))
        assert watch.check(now=now + 29) is False and _mtime(factory) == 10**9      # settling
        assert watch.check(now=now + 30) is True and _mtime(factory) > 10**9        # a parse it may have raced
        assert watch.check(now=now + 90) is False
        now += 100
    assert watch.touches == 2 * len(changes)


def test_an_editors_other_files_are_not_a_table_change(tmp_path):
    tables, dags, factory = _setup(tmp_path)
    watch = TableFilesWatch(tables, dag_files(dags))
    (tables / ".a.sql.swp").write_text("x")
    (tables / "notes.txt").write_text("x")
    assert watch.check(now=0) is False and watch.touches == 0


def test_a_dag_folder_it_cannot_write_leaves_airflows_clock_with_one_warning(tmp_path, caplog):
    tables, dags, factory = _setup(tmp_path)
    watch = TableFilesWatch(tables, [dags / "gone.py", dags / "also_gone.py"])
    (tables / "b.sql").write_text("x")
    assert watch.check(now=0) is False
    (tables / "c.sql").write_text("x")
    assert watch.check(now=100) is False
    assert len([r for r in caplog.records if "cannot touch" in r.getMessage()]) == 1


def test_a_dangling_table_file_link_does_not_blind_the_watch_to_other_changes(tmp_path):
    tables, dags = tmp_path / "tables", tmp_path / "dags"
    tables.mkdir()
    dags.mkdir()
    dag = dags / "statetable_tables.py"
    dag.write_text("from statetable_airflow.dag_factory import build_all\n")
    (tables / "gone.sql").symlink_to(tmp_path / "nowhere.sql")
    watch = TableFilesWatch(tables, [dag], settle_s=1000)
    assert watch.check(now=0) is False
    (tables / "orders.sql").write_text("-- a new table\n")
    assert watch.check(now=1) is True and watch.touches == 1
