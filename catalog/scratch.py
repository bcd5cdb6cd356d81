"""Scratch folders of the JVMs statetable starts, under the stack's folder instead of /tmp.

Spark puts its local dirs (`spark-*`, `blockmgr-*`), Spark Connect its `artifacts-*` and the
compression codecs their native libraries (`liblz4*`, `snappy*`) in java.io.tmpdir, and deletes
them from a shutdown hook. A JVM that is killed (the fault drills do it on purpose, the OOM killer
and a host reboot do it anyway) never runs the hook: in /tmp they stayed for good, about 36
folders and 0.8 GB per test run, until the disk was full. Here every driver gets a folder named by
its process (pid and start time, so a reused pid is not mistaken for it), and a folder whose
process is gone is swept the next time any driver starts; a server the stack runs under a fixed
name gets its folder emptied when it starts.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from catalog.batch_log import start_ticks

PREFIX = "pid-"


def root(state_dir: Path) -> Path:
    return state_dir / "tmp"


def _private_root(state_dir: Path) -> Path:
    """The scratch root, its owner's alone: the codecs' libraries and Spark's blocks (a batch's
    rows) are made readable by others by the JVM itself, so the folder above them is what keeps
    them private (in /tmp they were readable by anyone)."""
    folder = root(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def for_process(state_dir: Path, pid: int | None = None) -> Path:
    """This process's scratch folder (made now), after sweeping those of processes that are gone.
    Where the stack's folder cannot be written (a wheel installed read-only, with no
    STATETABLE_STACK_DIR), a folder of this user's under the system's temp dir, swept the same way."""
    pid = os.getpid() if pid is None else pid
    try:
        return _made(state_dir, pid)
    except OSError:
        import tempfile

        return _made(Path(tempfile.gettempdir()) / f"statetable-{os.getuid()}", pid)


def _made(state_dir: Path, pid: int) -> Path:
    sweep(state_dir)
    folder = _private_root(state_dir) / f"{PREFIX}{pid}-{start_ticks(pid)}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def for_server(state_dir: Path, name: str) -> Path:
    """The scratch folder of a server the stack starts under `name`, emptied: called only while
    that server is not running, so nothing in it is in use."""
    folder = _private_root(state_dir) / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sweep(state_dir: Path) -> list[Path]:
    """Remove the folders of processes that are gone; the ones removed."""
    gone = []
    for folder in root(state_dir).glob(f"{PREFIX}*"):
        pid, _, started = folder.name[len(PREFIX):].partition("-")
        try:
            alive = started not in ("", "None") and start_ticks(int(pid)) == started
        except ValueError:
            alive = False
        if not alive:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


def java_options(folder: Path) -> str:
    """The JVM option that puts java.io.tmpdir (codecs' native libraries, Connect's artifacts)
    in `folder`."""
    return f"-Djava.io.tmpdir={folder}"
