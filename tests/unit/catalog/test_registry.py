"""catalog.registry.table_lock: private, and a wait with an end that names who holds it."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from catalog import registry
from catalog.runtime import Runtime


def test_a_held_lock_is_waited_for_a_bounded_time_and_its_holder_named(tmp_path):
    rt = dataclasses.replace(Runtime.from_env(), data_dir=tmp_path)
    waiter = f"""
import dataclasses, os, pathlib, sys
os.environ["STATETABLE_LOCK_WAIT_SECONDS"] = "1"
from catalog.runtime import Runtime
from catalog import registry
rt = dataclasses.replace(Runtime.from_env(), data_dir=pathlib.Path({str(tmp_path)!r}))
try:
    with registry.table_lock("t", rt):
        print("got it")
except registry.LockTimeout as exc:
    print(exc)
"""
    with registry.table_lock("t", rt):
        done = subprocess.run([sys.executable, "-c", waiter], capture_output=True, text=True, timeout=60)
    assert "got it" not in done.stdout
    assert "still held by pid" in done.stdout and "after 1s (STATETABLE_LOCK_WAIT_SECONDS)" in done.stdout, \
        done.stdout + done.stderr
    lock = tmp_path / "locks" / "t.lock"
    assert lock.stat().st_mode & 0o777 == 0o600 and lock.parent.stat().st_mode & 0o777 == 0o700
    done = subprocess.run([sys.executable, "-c", waiter], capture_output=True, text=True, timeout=60)
    assert "got it" in done.stdout        # released when its holder let go


def test_a_lock_wait_setting_that_is_not_a_number_is_refused(monkeypatch):
    monkeypatch.setenv("STATETABLE_LOCK_WAIT_SECONDS", "soon")
    with pytest.raises(ValueError, match="STATETABLE_LOCK_WAIT_SECONDS='soon' is not a number"):
        registry.lock_patience()


def test_loaded_definitions_parse_again_only_after_a_change_and_hand_out_copies(tmp_path, monkeypatch):
    """A long-lived process asks for definitions on every run: it parses each change once, and a
    caller that sets a field for its run (jobs.run's batch cap) changes nobody else's copy."""
    from catalog import registry

    sql = ("-- topic: t\n-- schema: k STRING, v DOUBLE\n-- schedule: */5 * * * *\n"
           "CREATE TABLE t AS SELECT k, SUM(v) AS total FROM t GROUP BY k;\n")
    (tmp_path / "t.sql").write_text(sql)
    parses = []
    real = registry.load_all
    monkeypatch.setattr(registry, "load_all", lambda folder, broken: parses.append(1) or real(folder, broken=broken))
    rt = dataclasses.replace(Runtime.from_env(), tables_dir=tmp_path)
    first, _ = registry.load_table("t", rt)
    first.max_records_per_batch = 7
    second, tables = registry.load_table("t", rt)
    assert len(parses) == 1 and second.max_records_per_batch != 7 and tables["t"] is second
    assert registry.loaded_definitions(tmp_path)[0]["t"].max_records_per_batch != 7
    (tmp_path / "t.sql").write_text(sql.replace("*/5", "*/10"))
    third, _ = registry.loaded_definitions(tmp_path)
    assert len(parses) == 2 and third["t"].schedule == "*/10 * * * *"
    (tmp_path / "u.sql").write_text("not sql")
    _, broken = registry.loaded_definitions(tmp_path)
    assert len(parses) == 3 and "u" in broken
