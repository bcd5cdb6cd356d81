"""The write-ahead batch log of a table: plans and commits, one JSON file each.

A plan (`<id>.plan.json`) is written before anything is read: it fixes the
batch's exact input offsets, so a re-run after a crash reads the same
records. A commit (`<id>.commit.json`) is written last: it is the batch's
commit point, with its input and changelog offsets, per-partition digests
and counts. A plan without a commit is a batch to finish, never a batch to
re-plan. Files are written to a temporary name and renamed, so a reader sees
a whole entry or none.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


class BatchLogLost(RuntimeError):
    """A table's changelog holds committed state its batch log knows nothing of: the log was lost
    or another deployment writes under the same namespace. Going on would apply the first batches
    again on top of the restored state (or skip them as already applied), so the writer stops."""

    def __init__(self, table: str, folder: Path, topic: str, records: int, namespace: str) -> None:
        super().__init__(
            f"{table}: its batch log ({folder}) holds no batch, but its changelog topic {topic} holds {records} "
            f"records of committed state. The batch log was lost, or another deployment writes this table under "
            f"the same namespace ({namespace!r}). Restore the batch log folder, give this deployment a namespace "
            f"of its own (STATETABLE_NAMESPACE), or delete the changelog topic to start the table over.")


@dataclass
class BatchPlan:
    batch_id: int
    topic: str
    ranges: dict[int, tuple[int, int]]     # source partition -> [start, end)
    watermark_ms: int | None               # event-time watermark before this batch
    created_at: float = field(default_factory=time.time)
    topic_id: str | None = None            # the topic's incarnation (Kafka's topic id)
    accepted: dict | None = None           # an operator's acceptance of a reset or gap before this batch
    definition: dict | None = None         # {"fingerprint", "meaning"} of the definition the batch applies
    joins: dict | None = None              # joined table -> {"batch", "file"}: its state the batch joins (see
                                           # MicroBatchRunner._pin_joins)

    @property
    def record_count(self) -> int:
        return sum(end - start for start, end in self.ranges.values())


@dataclass
class BatchCommit:
    batch_id: int
    topic: str
    ranges: dict[int, tuple[int, int]]
    changelog_offsets: dict[int, int]
    digests: dict[int, str]
    key_counts: dict[int, int]
    counts: dict[str, int]                  # read, parsed, dead_lettered, late, keys_changed, ...
    watermark_ms: int | None
    seconds: float
    committed_at: float = field(default_factory=time.time)
    topic_id: str | None = None
    accepted: dict | None = None
    definition: dict | None = None
    changelog: str | None = None            # set when a rebuild moved the state to a new changelog topic
    refused: list | None = None             # [[key, reason], ...] the state kept at their old values


def _ranges_from_json(raw: dict) -> dict[int, tuple[int, int]]:
    return {int(p): (int(r[0]), int(r[1])) for p, r in raw.items()}


class BatchLog:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _write(self, name: str, payload: dict) -> None:
        tmp = self.folder / f".{name}.tmp"
        with open(tmp, "w") as out:
            json.dump(payload, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.folder / name)
        # The rename is durable only once the folder's entry is on disk.
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def _ids(self, suffix: str) -> list[int]:
        return sorted(int(p.name.split(".")[0]) for p in self.folder.glob(f"*.{suffix}.json"))

    def write_plan(self, plan: BatchPlan) -> None:
        self._write(f"{plan.batch_id:012d}.plan.json", asdict(plan))

    def write_commit(self, commit: BatchCommit) -> None:
        self._write(f"{commit.batch_id:012d}.commit.json", asdict(commit))

    def _read(self, batch_id: int, suffix: str) -> dict | None:
        path = self.folder / f"{batch_id:012d}.{suffix}.json"
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        raw["ranges"] = _ranges_from_json(raw["ranges"])
        return raw

    def plan(self, batch_id: int) -> BatchPlan | None:
        raw = self._read(batch_id, "plan")
        return None if raw is None else BatchPlan(**raw)

    def commit(self, batch_id: int) -> BatchCommit | None:
        raw = self._read(batch_id, "commit")
        if raw is None:
            return None
        for key in ("changelog_offsets", "digests", "key_counts"):
            raw[key] = {int(p): v for p, v in raw[key].items()}
        return BatchCommit(**raw)

    def last_commit(self) -> BatchCommit | None:
        ids = self._ids("commit")
        return self.commit(ids[-1]) if ids else None

    def pending_plan(self) -> BatchPlan | None:
        """The newest plan without a commit: a batch a crash interrupted."""
        plans, commits = self._ids("plan"), set(self._ids("commit"))
        if plans and plans[-1] not in commits:
            return self.plan(plans[-1])
        return None

    def commits(self) -> list[BatchCommit]:
        return [self.commit(i) for i in self._ids("commit")]

    # -- where reading stopped -------------------------------------------------
    def write_acceptance(self, after_batch: int, entry: dict) -> None:
        """An operator's acceptance of a topic reset or gap: the next batch starts at `entry["starts"]`."""
        self._write(f"{after_batch:012d}.accept.json", entry)

    def acceptance(self, after_batch: int) -> dict | None:
        path = self.folder / f"{after_batch:012d}.accept.json"
        return json.loads(path.read_text()) if path.exists() else None

    def read_position(self) -> tuple[str, str | None, dict[int, int], dict | None] | None:
        """(topic, topic id, end offset per partition, acceptance) where the next batch
        continues; None before the first commit. An acceptance after the last commit wins."""
        last = self.last_commit()
        if last is None:
            return None
        accepted = self.acceptance(last.batch_id)
        if accepted is not None:
            return (accepted["topic"], accepted.get("topic_id"), {int(p): s for p, s in accepted["starts"].items()},
                    accepted)
        return last.topic, last.topic_id, {p: end for p, (_, end) in last.ranges.items()}, None
