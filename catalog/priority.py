"""The batch path yields the CPU to interactive queries.

Where the query API shares a host with the pipeline (local[*], a small node),
a committing batch would take the cores from the readers answering requests,
and their tail latency would follow the batch's CPU use. Queries are bound by
latency and batches by throughput, so the batch's JVM and Python workers run
at a lower CPU priority (a higher nice), as RocksDB lowers its compaction
threads. On idle cores this costs the batch nothing.
"""
from __future__ import annotations

import os
from catalog.errors import UserError

NICE_ENV = "STATETABLE_BATCH_NICE"
DEFAULT_NICE = 10


def batch_niceness() -> int:
    raw = os.environ.get(NICE_ENV, str(DEFAULT_NICE))
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise UserError(f"{NICE_ENV}={raw!r}: the batch path's CPU niceness must be an integer from 0 (the same "
                        f"priority as queries) to 19; unset it for the default {DEFAULT_NICE}")
    return value


def yield_cpu_to_queries(pid: int | None = None) -> int:
    """Lower every thread of process `pid` (this one by default) to the batch niceness; threads it
    starts later inherit it. Never raises a priority back (that takes privilege). Returns the
    main thread's niceness afterwards."""
    target, pid = batch_niceness(), pid or os.getpid()
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
        except OSError:
            pass    # a thread that ended meanwhile
    return os.getpriority(os.PRIO_PROCESS, pid)
