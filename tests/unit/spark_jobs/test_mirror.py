"""mirror.fold_if_due on the driver (delta-rs, no Spark): the newest change per key wins, a delete
removes its key, a re-run folds nothing twice, and a fold over the row bound goes to Spark. The
Spark side and the mirror under kills run in tests/test_microbatch.py and tests/test_exactly_once.py."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa

from catalog.runtime import Runtime
from spark_jobs.delta import delta_files, mirror

TABLE = SimpleNamespace(name="t", mirror_every=2)


def _runtime(tmp_path: Path) -> Runtime:
    return Runtime(bootstrap="127.0.0.1:9", data_dir=tmp_path, snapshot_uri=str(tmp_path / "snapshots"),
                   tables_dir=tmp_path / "tables")


def _commit(rt: Runtime, batch_id: int, changes: dict[str, int | None]) -> None:
    """One batch's change file (value None: the key is gone), committed as the driver does."""
    keys = sorted(changes)
    built = pa.table({"key": [json.dumps([k]) for k in keys],
                      "row": [json.dumps({"k": k, "v": changes[k]}) if changes[k] is not None
                              else json.dumps({"k": k}) for k in keys],
                      "deleted": [changes[k] is None for k in keys]})
    mirror.write_change_rows(mirror.changes_path(rt, TABLE.name), batch_id, 0, built)
    mirror.commit_changes(rt, TABLE.name, batch_id)


def _mirror_rows(rt: Runtime) -> dict[str, int]:
    rows = delta_files.load(mirror.mirror_path(rt, TABLE.name)).to_pyarrow_table(columns=["key", "row"])
    return {json.loads(k)[0]: json.loads(r)["v"] for k, r in zip(rows.column("key").to_pylist(),
                                                                  rows.column("row").to_pylist())}


def test_folds_on_the_driver_newest_change_wins_deletes_remove_and_a_re_run_folds_nothing(tmp_path):
    rt = _runtime(tmp_path)
    _commit(rt, 0, {"a": 1, "b": 1, "c": 1})
    mirror.fold_if_due(None, rt, TABLE, 0)                   # not due: batch 1 is the first fold
    assert delta_files.load(mirror.mirror_path(rt, TABLE.name)) is None
    _commit(rt, 1, {"a": 2, "b": None, "d": 1})
    mirror.fold_if_due(None, rt, TABLE, 1)                   # spark=None: no Spark is touched
    assert _mirror_rows(rt) == {"a": 2, "c": 1, "d": 1}
    folded = delta_files.load(mirror.mirror_path(rt, TABLE.name))
    assert folded.transaction_version("t.mirror") == 1
    assert delta_files.load(mirror.changes_path(rt, TABLE.name)).to_pyarrow_table().num_rows == 0

    version = folded.version()
    mirror.fold_if_due(None, rt, TABLE, 1)                   # a re-run after the fold: nothing again
    assert delta_files.load(mirror.mirror_path(rt, TABLE.name)).version() == version

    _commit(rt, 2, {"c": None, "a": 3})
    _commit(rt, 3, {"a": 4, "e": 5})
    assert mirror.committed_rows(rt, TABLE.name)[0] == 3     # the overlay answers before the fold
    before = mirror.committed_rows(rt, TABLE.name)[1]
    mirror.fold_if_due(None, rt, TABLE, 3)
    assert _mirror_rows(rt) == {"a": 4, "d": 1, "e": 5}
    after = mirror.committed_rows(rt, TABLE.name)
    assert after[0] == 3 and sorted(after[1].to_pylist(), key=str) == sorted(before.to_pylist(), key=str)


def test_a_fold_over_the_row_bound_goes_to_spark(tmp_path, monkeypatch):
    rt = _runtime(tmp_path)
    _commit(rt, 0, {"a": 1, "b": 2})
    _commit(rt, 1, {"c": 3})
    called = []
    monkeypatch.setattr(mirror, "DRIVER_FOLD_ROWS", 2)
    monkeypatch.setattr(mirror, "_fold_in_spark", lambda spark, path, changes, batch_id, table:
                        called.append((spark, batch_id, table)))
    mirror.fold_if_due("the session", rt, TABLE, 1)
    assert called == [("the session", 1, "t")]              # 3 change rows > 2


def test_newest_per_key_takes_the_highest_batch_whatever_the_order():
    changes = pa.table({"key": ["x", "y", "x", "x"], "row": ["x1", "y0", "x3", "x2"],
                        "batch_id": pa.array([1, 0, 3, 2], pa.int64()), "deleted": [False, False, True, False]},
                       schema=mirror.change_schema())
    newest = {r["key"]: (r["row"], r["batch_id"], r["deleted"]) for r in mirror.newest_per_key(changes).to_pylist()}
    assert newest == {"x": ("x3", 3, True), "y": ("y0", 0, False)}
