"""A deployment's data folder is its user's alone whatever umask made it (issue 66): the provider
in a user's own Airflow runs under umask 022, and an older version's folder kept mode 755."""
from __future__ import annotations

import os
import stat

from catalog.runtime import Runtime


def test_the_data_folder_is_made_and_tightened_to_0700(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh" / "data"
        monkeypatch.setenv("STATETABLE_DATA_DIR", str(fresh))
        assert Runtime.from_env().data_dir == fresh
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o700

        older = tmp_path / "older"
        older.mkdir(mode=0o755)
        (older / "state").mkdir()
        monkeypatch.setenv("STATETABLE_DATA_DIR", str(older))
        Runtime.from_env()
        assert stat.S_IMODE(older.stat().st_mode) == 0o700
    finally:
        os.umask(old)
