"""catalog.scratch: a driver's scratch folder is its own, and goes once its process is gone."""
from __future__ import annotations

import os
import subprocess
import sys

from catalog import scratch


def test_folders_of_gone_processes_are_swept_and_live_ones_kept(tmp_path):
    mine = scratch.for_process(tmp_path)
    (mine / "spark-1").mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = scratch.for_process(tmp_path, pid=int(gone.stdout))
    assert dead.name.endswith("-None")           # no start time: the process had ended
    (dead / "blockmgr-1").mkdir(parents=True)
    reused = scratch.root(tmp_path) / f"{scratch.PREFIX}{os.getpid()}-1"   # this pid, another start
    reused.mkdir()
    junk = scratch.root(tmp_path) / f"{scratch.PREFIX}x-y"
    junk.mkdir()

    assert sorted(scratch.sweep(tmp_path)) == sorted([dead, reused, junk])
    assert [p.name for p in scratch.root(tmp_path).iterdir()] == [mine.name]
    assert (mine / "spark-1").is_dir()
    assert scratch.for_process(tmp_path) == mine


def test_a_servers_folder_is_emptied_when_it_starts(tmp_path):
    folder = scratch.for_server(tmp_path, "spark-connect")
    (folder / "artifacts-1").mkdir()
    assert scratch.for_server(tmp_path, "spark-connect") == folder
    assert list(folder.iterdir()) == []
    assert scratch.java_options(folder) == f"-Djava.io.tmpdir={folder}"
    assert oct(scratch.root(tmp_path).stat().st_mode & 0o777) == "0o700"      # what is below is private


def test_a_stack_folder_that_cannot_be_written_falls_back_to_the_users_temp_folder(tmp_path, monkeypatch):
    import tempfile

    locked = tmp_path / "site-packages"
    locked.mkdir()
    (locked / ".stack").write_text("a file where the folder would be")    # mkdir fails, as read-only would
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    folder = scratch.for_process(locked / ".stack")
    assert folder.is_dir() and folder.parent == tmp_path / "tmp" / f"statetable-{os.getuid()}" / "tmp"
