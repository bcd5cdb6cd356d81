"""Airflow sees a table file's change within seconds, and parses no DAG file while none changes.

Every table's DAGs come from one DAG file that reads dags/tables/ (dags/statetable_tables.py),
so Airflow's dag-processor notices a new, edited or removed table only by parsing that file
again on its own clock. On a 30 s clock that parse was the stack's largest fixed cost: 5-6 CPU s
a parse at 100 tables (300 DAGs), 10.7-11.7 of a wave's ~120 CPU s on two cores, and a likely
cause of one record's spread through a DAG (README, "Tables per stack"). The stack's clock is 30
minutes instead (a backstop), and this watch moves the DAG files' modification time when a
table file changes: Airflow's dag-processor (`file_parsing_sort_mode = modified_time`) parses at once a file
modified after its last parse ended, whatever the interval.

A parse that was already running when a table file changed can end after the touch and so
hide it (Airflow compares with the parse's end); the watch touches the DAG files once more
`settle_s` later, so a change costs two parses and is never left for the 30-minute clock.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("statetable.table_files")

SUFFIX = ".sql"


def signature(tables_dir: Path) -> tuple:
    """What a table file's change changes: each table file's name (one added, removed or
    renamed), size and modification time; an editor's other files in the folder are not tables.
    One stat a table: nothing next to a parse. A file that cannot be stat'ed (a dangling
    symlink, one removed mid-scan) counts by its name alone: it must not blind the watch to the
    folder's other changes."""
    try:
        entries = [e for e in os.scandir(tables_dir) if e.name.endswith(SUFFIX)]
    except FileNotFoundError:
        return ()
    return tuple(sorted((e.name, *_stamp(e)) for e in entries))


def _stamp(entry: os.DirEntry) -> tuple:
    try:
        st = entry.stat()
    except OSError:
        return (None, None)
    return (st.st_mtime_ns, st.st_size)


class TableFilesWatch:
    """Polls `tables_dir` every `interval_s`; on a change, touches `dag_files` now and again
    `settle_s` later."""

    def __init__(self, tables_dir: Path, dag_files: list[Path], interval_s: float = 2.0,
                 settle_s: float = 30.0) -> None:
        self.tables_dir, self.dag_files = Path(tables_dir), [Path(p) for p in dag_files]
        self.interval_s, self.settle_s = interval_s, settle_s
        self.seen = signature(self.tables_dir)
        self.again_at: float | None = None
        self.touches = 0
        self.failed = False

    def check(self, now: float | None = None) -> bool:
        """One poll: whether it touched the DAG files."""
        now = time.monotonic() if now is None else now
        current = signature(self.tables_dir)
        if current != self.seen:
            self.seen = current
            self.again_at = now + self.settle_s
            return self._touch()
        if self.again_at is not None and now >= self.again_at:
            self.again_at = None
            return self._touch()
        return False

    def _touch(self) -> bool:
        touched = False
        for path in self.dag_files:
            try:
                os.utime(path)
                touched = True
            except OSError as exc:
                if not self.failed:      # once: a read-only DAG folder leaves Airflow's own clock
                    log.warning("cannot touch %s (%s): Airflow sees table file changes on its own "
                                "min_file_process_interval instead", path, exc)
                    self.failed = True
        self.touches += touched
        return touched

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:        # noqa: BLE001 - a watch that dies would leave Airflow on its 30-minute clock
                log.warning("table files watch: a poll failed", exc_info=True)

    def start(self) -> threading.Event:
        stop = threading.Event()
        threading.Thread(target=self.run, args=(stop,), name="table-files", daemon=True).start()
        return stop


def dag_files(dags_folder: Path) -> list[Path]:
    """The DAG files that build tables' DAGs: those importing the DAG factory (the definitions'
    error DAG included); the others never change with a table file."""
    return sorted(p for p in Path(dags_folder).glob("*.py")
                  if "statetable_airflow.dag_factory" in p.read_text(errors="replace"))
