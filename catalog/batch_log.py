"""The write-ahead batch log of a table: plans and commits, one JSON object each.

A plan (`<id>.plan.json`) is written before anything is read: it fixes the
batch's exact input offsets, so a re-run after a crash reads the same
records. A commit (`<id>.commit.json`) is written last: it is the batch's
commit point, with its input and changelog offsets, per-partition digests
and counts. A plan without a commit is a batch to finish, never a batch to
re-plan.

The log lives in a folder or in an object store (s3://), so that any host can
run a table's next batch. Plans, takeovers and commits are written with a
conditional create (S3's `If-None-Match: *`, a hard link on a filesystem):
of two drivers that race for a batch, exactly one creates each entry, and the
other stops with BatchHeld before it changes anything (a plan) or after its
work turned out to be the winner's (a commit: every state partition applies a
batch once, see state.partition). That is what correctness rests on; the
table's local file lock only saves a second driver on the same host the trip.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from catalog.errors import BatchLogIncomplete, BatchLogWriteFailed, CatalogError
from catalog.errors import UserError
from state.errors import BadSetting

LEASE_ENV = "STATETABLE_BATCH_LEASE_SECONDS"
POINTER = "last-commit.json"
HEAD = "checkpoint-head.json"          # {"upto": U, "block": B}: commits up to U live in checkpoint blocks
                                       # ("swept": false while the files they fold are being removed)
BLOCK = 1000                            # commits per checkpoint block file
KEEP_ENV = "STATETABLE_BATCH_LOG_KEEP"
DEFAULT_KEEP = 100                      # as Spark's minBatchesToRetain
SLIM_DROP = ("holder", "joins")         # what only the newest batches need (the next plan's driver, pins)


def _unswept(head: dict | None) -> bool:
    """A compaction moved the head and was killed before its sweep ended."""
    return bool(head) and head.get("swept") is False


def _folded_by(entry: str, upto: int) -> bool:
    """A batch's file (plan, commit, takeover, acceptance) at or before `upto`, or a legacy
    checkpoint: what a compaction to `upto` removes."""
    batch = entry.split(".")[0]
    legacy_file = entry.startswith("checkpoint-") and entry.endswith(".json.gz") and \
        not entry.startswith("checkpoint-block-")
    return legacy_file or (batch.isdigit() and int(batch) <= upto)


def keep_batches() -> int:
    """How many newest batches the log keeps as files (plans, commits, takeovers); older commits
    are folded into one checkpoint file, at most 2x this many batches apart."""
    raw = os.environ.get(KEEP_ENV, str(DEFAULT_KEEP))
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        raise UserError(f"{KEEP_ENV}={raw!r}: the batch log must keep at least 1 batch as files; unset it for "
                        f"the default {DEFAULT_KEEP}")
    return keep
DEFAULT_LEASE_SECONDS = 600.0


class BatchLogLost(CatalogError, RuntimeError):
    """A table's changelog holds committed state its batch log knows nothing of: the log was lost
    or another deployment writes under the same namespace. Going on would apply the first batches
    again on top of the restored state (or skip them as already applied), so the writer stops."""

    def __init__(self, table: str, folder, topic: str, records: int, namespace: str) -> None:
        super().__init__(
            f"{table}: its batch log ({folder}) holds no batch, but its changelog topic {topic} holds {records} "
            f"records of committed state. The batch log was lost, or another deployment writes this table under "
            f"the same namespace ({namespace!r}). Restore the batch log folder, give this deployment a namespace "
            f"of its own (STATETABLE_NAMESPACE), or delete the changelog topic to start the table over.")


class BatchHeld(CatalogError, RuntimeError):
    """Another driver holds (or has just committed) the batch this one was about to write."""

    def __init__(self, table: str, batch_id: int, holder: dict | None, what: str, location: str) -> None:
        self.table, self.batch_id, self.holder = table, batch_id, holder or {}
        super().__init__(
            f"{table}: batch {batch_id} {what} {describe(holder)} (batch log {location}); this driver changed "
            f"nothing and stops. Let that driver finish; if it is dead on another host, its claim lapses "
            f"{lease_seconds():.0f} s after it was made ({LEASE_ENV}).")


def lease_seconds() -> float:
    raw = os.environ.get(LEASE_ENV, str(DEFAULT_LEASE_SECONDS))
    try:
        return float(raw)
    except ValueError:
        raise BadSetting(f"{LEASE_ENV}={raw!r} is not a number of seconds; set it to e.g. "
                         f"{DEFAULT_LEASE_SECONDS:.0f}") from None


def start_ticks(pid: int) -> str | None:
    """A process's start time in clock ticks since boot: with the pid, it names one process
    (a pid alone may have been reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]      # a zombie has finished: it holds nothing


def this_driver() -> dict:
    """Who is writing: enough to tell a live holder from a dead one on its host, and to name it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": start_ticks(os.getpid()),
            "run": _RUN, "at": time.time()}


_RUN = uuid.uuid4().hex[:12]


def describe(holder: dict | None) -> str:
    if not holder:
        return "by a driver that left no name (a log written before holders were recorded)"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(holder.get("at", 0)))
    return f"by driver pid {holder.get('pid')} on {holder.get('host')} (run {holder.get('run')}, since {when} UTC)"


def is_mine(holder: dict | None) -> bool:
    me = this_driver()
    return bool(holder) and all(holder.get(k) == me[k] for k in ("host", "pid", "run"))


def is_alive(holder: dict | None) -> bool:
    """Whether the holder may still be working. On this host the answer is exact (the process is
    there or not); on another, the claim stands until its lease lapses."""
    if not holder:
        return False
    if holder.get("host") == socket.gethostname():
        return holder.get("started") is not None and start_ticks(int(holder["pid"])) == holder["started"]
    return time.time() - float(holder.get("at", 0)) < lease_seconds()


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
                                           # planning.pin_joins)
    holder: dict | None = None             # the driver that planned it (see this_driver)
    resumed: bool = False                  # taken over from the log: an earlier attempt did not commit it

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
    holder: dict | None = None              # the driver that committed it
    joins: dict | None = None               # the plan's pinned joined tables (a join of tables reads its
                                            # next batch's changes of them against these)
    event_times: dict | None = None         # a windowed join of streams: the newest accepted event time of
                                            # each input partition ("a:0", "b:3"), its watermark's inputs


def _ranges_from_json(raw: dict) -> dict[int, tuple[int, int]]:
    return {int(p): (int(r[0]), int(r[1])) for p, r in raw.items()}


def _commit_of(raw: dict) -> "BatchCommit":
    """A commit entry as read back (JSON keys are strings; partitions are ints)."""
    raw = dict(raw)
    for key in ("changelog_offsets", "digests", "key_counts"):
        raw[key] = {int(p): v for p, v in raw[key].items()}
    return BatchCommit(**raw)


class _FolderStore:
    """Entries as files; the conditional create is a hard link, which fails if the name exists."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.location = str(self.folder)

    def _sync_folder(self) -> None:
        # A rename or link is durable only once the folder's entry is on disk.
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def _temporary(self, name: str, data: bytes) -> Path:
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return tmp

    def put(self, name: str, data: bytes) -> None:
        os.replace(self._temporary(name, data), self.folder / name)
        self._sync_folder()

    def create(self, name: str, data: bytes) -> bool:
        tmp = self._temporary(name, data)
        try:
            os.link(tmp, self.folder / name)
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        self._sync_folder()
        return True

    def get(self, name: str) -> bytes | None:
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return (self.folder / name).exists()

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.folder / name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        return [p.name for p in self.folder.iterdir() if not p.name.startswith(".")]


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str | None, key: str | None):
    """One client per store and identity in a process: a BatchLog is made per call, and a new
    client reads its configuration anew and logs where it found the endpoint, every time."""
    import logging

    import boto3

    logging.getLogger("botocore").setLevel(logging.WARNING)
    return boto3.client("s3")


class _S3Store:
    """Entries as objects; the conditional create is a PUT with If-None-Match: *, which S3 (and
    S3-compatible stores that implement it) refuses with 412 when the key exists. The endpoint
    and credentials come from the AWS_* environment, as for every other S3 client here."""

    def __init__(self, uri: str) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/") + "/"
        self.location = uri
        self.client = _s3_client(os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ACCESS_KEY_ID"))

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def create(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data, IfNoneMatch="*")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + name)
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def delete(self, names: list[str]) -> None:
        """One DeleteObjects request per 1,000 names (S3's most), not one request per name: a
        compaction's sweep of ~2x `keep` batches' entries is a few requests."""
        for start in range(0, len(names), 1000):
            chunk = names[start:start + 1000]
            done = self.client.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": self.prefix + name} for name in chunk], "Quiet": True})
            failed = [f"{e.get('Key')}: {e.get('Code')}" for e in done.get("Errors", [])]
            if failed:
                raise BatchLogWriteFailed(f"batch log {self.location}: {len(failed)} of {len(chunk)} entries were not "
                              f"removed ({'; '.join(failed[:3])}); the next compaction removes them")

    def names(self) -> list[str]:
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix,
                                                                           Delimiter="/"):
            found += [item["Key"][len(self.prefix):] for item in page.get("Contents", [])]
        return found


class BatchLog:
    def __init__(self, location: Path | str) -> None:
        location = str(location)
        self.store = _S3Store(location) if location.startswith("s3://") else _FolderStore(Path(location))
        self.location = self.store.location
        self._folded: dict[tuple, dict[int, dict]] = {}     # (upto, block) -> batch id -> slim commit

    def _ids(self, suffix: str) -> list[int]:
        return sorted(int(n.split(".")[0]) for n in self.store.names() if n.endswith(f".{suffix}.json"))

    @staticmethod
    def _encode(payload: dict) -> bytes:
        return json.dumps(payload, indent=1, sort_keys=True).encode()

    def _create(self, entry: BatchPlan | BatchCommit, suffix: str, table: str, lost: str) -> None:
        """Create `entry` as its batch's `suffix` entry, in this driver's name; if another driver
        created it first, stop (BatchHeld) naming that driver."""
        entry.holder = this_driver()
        if not self.store.create(f"{entry.batch_id:012d}.{suffix}.json", self._encode(asdict(entry))):
            theirs = self._read(entry.batch_id, suffix)
            raise BatchHeld(table or entry.topic, entry.batch_id, theirs.get("holder") if theirs else None, lost,
                            self.location)

    def write_plan(self, plan: BatchPlan, table: str = "") -> None:
        self._create(plan, "plan", table, "was planned meanwhile")

    def write_commit(self, commit: BatchCommit, table: str = "") -> None:
        self._create(commit, "commit", table, "was committed meanwhile")
        # A hint, written after the commit point: readers find the newest commit from here
        # without listing the log (a crash before it, or a stale driver writing an older id,
        # only costs them a step forward, see last_commit_id).
        self.store.put(POINTER, self._encode({"batch_id": commit.batch_id}))

    def _takeovers(self, batch_id: int) -> list[str]:
        prefix = f"{batch_id:012d}.takeover-"
        return sorted((n for n in self.store.names() if n.startswith(prefix)),
                      key=lambda n: int(n[len(prefix):].split(".")[0]))

    def holder(self, batch_id: int, takeovers: list[str] | None = None) -> dict | None:
        """The driver working on a planned batch: the newest takeover's, else the plan's."""
        takeovers = self._takeovers(batch_id) if takeovers is None else takeovers
        if takeovers:
            return json.loads(self.store.get(takeovers[-1]))
        plan = self.plan(batch_id)
        return plan.holder if plan else None

    def take_over(self, plan: BatchPlan, table: str) -> None:
        """Claim an unfinished batch before finishing it. A live holder keeps it (BatchHeld); a dead
        one's batch goes to whichever driver creates the next takeover entry first."""
        takeovers = self._takeovers(plan.batch_id)
        holder = self.holder(plan.batch_id, takeovers)
        if is_mine(holder):
            return
        if is_alive(holder):
            raise BatchHeld(table, plan.batch_id, holder, "is being run", self.location)
        if not self.store.create(f"{plan.batch_id:012d}.takeover-{len(takeovers) + 1}.json",
                                 self._encode(this_driver())):
            raise BatchHeld(table, plan.batch_id, self.holder(plan.batch_id), "was taken over meanwhile",
                            self.location)

    def _read(self, batch_id: int, suffix: str) -> dict | None:
        data = self.store.get(f"{batch_id:012d}.{suffix}.json")
        if data is None:
            return None
        raw = json.loads(data)
        raw["ranges"] = _ranges_from_json(raw["ranges"])
        return raw

    def plan(self, batch_id: int) -> BatchPlan | None:
        raw = self._read(batch_id, "plan")
        return None if raw is None else BatchPlan(**raw)

    def commit(self, batch_id: int) -> BatchCommit | None:
        raw = self._read(batch_id, "commit")
        if raw is None:
            raw = self._checkpointed(batch_id)
            if raw is None:
                return None
        return _commit_of(raw)

    def _entry(self, batch_id: int, suffix: str) -> str:
        return f"{batch_id:012d}.{suffix}.json"

    def last_commit_id(self) -> int | None:
        """The newest committed batch id, found without listing the log: the pointer written
        after each commit, then a step forward for every commit that exists past it (a crash
        between a commit and its pointer, or a stale driver's late pointer). A log without a
        pointer (written before it existed) or whose pointer names a missing commit is listed
        once."""
        data = self.store.get(POINTER)
        newest = json.loads(data)["batch_id"] if data else None
        if newest is None or not self.store.exists(self._entry(newest, "commit")):
            ids = self._ids("commit")
            if not ids:
                return None
            newest = ids[-1]
        while self.store.exists(self._entry(newest + 1, "commit")):
            newest += 1
        return newest

    def last_commit(self) -> BatchCommit | None:
        newest = self.last_commit_id()
        return None if newest is None else self.commit(newest)

    def pending_plan(self) -> BatchPlan | None:
        """The newest plan without a commit: a batch a crash interrupted (or another driver runs).
        Batches are planned one after another, so it can only be the one after the last commit."""
        newest = self.last_commit_id()
        if newest is None:
            plans = self._ids("plan")          # no commit yet: the log is a plan or two long
            return self.plan(plans[-1]) if plans else None
        return self.plan(newest + 1)

    def commits(self) -> list[BatchCommit]:
        """Every commit, oldest first: the checkpoint blocks' folded ones, then the files after
        them, read one by one (the log is never listed once it has a checkpoint)."""
        head = self._head()
        if head is None:
            return [self.commit(i) for i in self._ids("commit")]
        folded = self._all_folded(head)
        found = [_commit_of({**folded[i], "ranges": _ranges_from_json(folded[i]["ranges"])}) for i in sorted(folded)]
        tail = head["upto"] + 1
        while (commit := self.commit(tail)) is not None:
            found.append(commit)
            tail += 1
        return found

    # -- compaction -------------------------------------------------------------
    # Folded commits live in blocks of BLOCK batches (`checkpoint-block-<n>.json.gz` holds batches
    # n*BLOCK .. n*BLOCK+BLOCK-1), so a compaction rewrites the one or two blocks its batches fall
    # in, and reading a folded commit reads its block: what both cost is bounded by BLOCK, never by
    # the table's age. A log compacted before blocks (one `checkpoint-<upto>.json.gz` holding every
    # folded commit) is read as it is, and moved into blocks by its next compaction.
    def _head(self) -> dict | None:
        data = self.store.get(HEAD)
        return None if data is None else json.loads(data)

    @staticmethod
    def _block_name(block: int) -> str:
        return f"checkpoint-block-{block:08d}.json.gz"

    def _load(self, name: str) -> dict[int, dict]:
        import gzip

        data = self.store.get(name)
        if data is None:
            raise BatchLogIncomplete(f"batch log {self.location}: {HEAD} needs {name}, which is missing; "
                                    f"restore the batch log folder from a backup")
        return {entry["batch_id"]: entry for entry in json.loads(gzip.decompress(data))["commits"]}

    def _block(self, head: dict, block: int) -> dict[int, dict]:
        """The folded commits of one block (a legacy head's one file for any block), up to `upto`."""
        key = (head["upto"], head.get("file") or block)
        if key not in self._folded:
            if len(self._folded) > 4:
                self._folded.clear()
            upto = head["upto"]
            if head.get("file"):
                entries = self._load(head["file"])
            else:
                entries = self._load(self._block_name(block)) if block * head["block"] <= upto else {}
            self._folded[key] = {i: e for i, e in entries.items() if i <= upto}
        return self._folded[key]

    def _all_folded(self, head: dict) -> dict[int, dict]:
        if head.get("file"):
            return self._block(head, 0)
        folded: dict[int, dict] = {}
        for block in range(head["upto"] // head["block"] + 1):
            folded.update(self._block(head, block))
        return folded

    def _checkpointed(self, batch_id: int) -> dict | None:
        """A folded commit's entry (its ranges as tuples), or None when the checkpoint does not
        hold it. Only a batch at or before the head's `upto` reads its block."""
        head = self._head()
        if head is None or batch_id > head["upto"]:
            return None
        entry = self._block(head, batch_id // head.get("block", BLOCK)).get(batch_id)
        return None if entry is None else {**entry, "ranges": _ranges_from_json(entry["ranges"])}

    def compact_if_due(self, keep: int | None = None) -> int | None:
        """Fold old commits when the log holds 2x `keep` batches past its checkpoint (checked
        after each commit: one small read)."""
        keep = keep or keep_batches()
        last = self.last_commit_id()
        head = self._head()
        if last is None or (last - (head["upto"] if head else -1) < 2 * keep and not _unswept(head)):
            return None
        return self.compact(keep)

    def compact(self, keep: int | None = None) -> int | None:
        """Fold every commit older than the newest `keep` into the checkpoint blocks (gzip JSON;
        each commit as recorded, less SLIM_DROP), move the head past them, then remove what they
        fold: the batches' plans, commits, takeovers and acceptances, and a legacy checkpoint.

        Crash-safe in that order: a block rewritten before the head moves holds entries past the
        head's `upto`, which readers ignore (they read those batches' files); after the head moves,
        the files it folded are never read (readers start after `upto`), so a crash anywhere
        leaves leftovers the next compaction removes, never a lost commit. Only compaction lists
        the log, which it keeps to ~2x `keep` batches. Returns the new upto."""
        import gzip

        from state import faults

        keep = keep or keep_batches()
        last = self.last_commit_id()
        if last is None or last - keep < 0:
            return None
        upto = last - keep
        head = self._head()
        unswept = _unswept(head)
        before = head["upto"] if head else -1
        if upto > before or (head and head.get("file")):
            legacy = self._all_folded(head) if head and head.get("file") else {}
            new = dict(legacy)
            for batch_id in range(before + 1, upto + 1):
                raw = self._read(batch_id, "commit")
                if raw is None:
                    raise BatchLogIncomplete(f"batch log {self.location}: commit {batch_id} is missing between its "
                                            f"checkpoint (up to {before}) and the last commit ({last}); nothing "
                                            f"was compacted")
                new[batch_id] = {k: v for k, v in raw.items() if k not in SLIM_DROP}
            upto = max(upto, before)
            for block in sorted({i // BLOCK for i in new}):
                entries = {} if legacy or block * BLOCK > before else \
                    self._block({"upto": before, "block": BLOCK}, block)
                entries = {**entries, **{i: e for i, e in new.items() if i // BLOCK == block}}
                payload = json.dumps({"block": block, "commits": [entries[i] for i in sorted(entries)]},
                                     sort_keys=True, separators=(",", ":"))
                self.store.put(self._block_name(block), gzip.compress(payload.encode(), 6))
            faults.point("batch_log.after_checkpoint")
            self.store.put(HEAD, self._encode({"upto": upto, "block": BLOCK, "swept": False}))
            self._folded.clear()
            faults.point("batch_log.after_head")
            unswept = True
        else:
            upto = before
        folded = [entry for entry in self.store.names() if _folded_by(entry, upto)]
        if folded:
            self.store.delete(folded[:1])
            faults.point("batch_log.mid_sweep")
            self.store.delete(folded[1:])
        if unswept:
            # Only now is the sweep done: until this write, the next commit's compact_if_due
            # finishes it, rather than leaving a killed sweep's leftovers for 2x `keep` batches.
            self.store.put(HEAD, self._encode({"upto": upto, "block": BLOCK}))
        return upto

    def changelog_of(self, commit: BatchCommit, default: str) -> str:
        """The changelog topic `commit` wrote: recorded in it, or (a commit written before commits
        recorded it) in the newest earlier commit that does, else `default`."""
        batch_id = commit.batch_id
        while commit is not None and not commit.changelog and batch_id > 0:
            batch_id -= 1
            commit = self.commit(batch_id)
        return (commit.changelog if commit is not None else None) or default

    def commits_after(self, batch_id: int) -> list[BatchCommit]:
        """The commits after `batch_id`, for readers that fold the log as it grows: read one by
        one from there, so a follower's poll costs what was committed since, not the log's age."""
        if batch_id < 0:
            return self.commits()
        found = []
        while (commit := self.commit(batch_id + 1 + len(found))) is not None:
            found.append(commit)
        return found

    # -- where reading stopped -------------------------------------------------
    def write_acceptance(self, after_batch: int, entry: dict) -> None:
        """An operator's acceptance of a topic reset or gap: the next batch starts at `entry["starts"]`."""
        self.store.put(f"{after_batch:012d}.accept.json", self._encode(entry))

    def acceptance(self, after_batch: int) -> dict | None:
        data = self.store.get(f"{after_batch:012d}.accept.json")
        return None if data is None else json.loads(data)

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
