"""Triggers: a table's incremental run, awaited in the triggerer instead of a worker slot.

`run_batches` starts in the triggerer (start_from_trigger): TableRunTrigger hands the run to the
stack's batch service (ops/batch_service.py) and awaits its answer. A run with nothing new ends
there, skipped, and a failed one fails there (Airflow's retries apply as to any failure), each
without a worker process at all; a run that committed batches resumes on a worker
(`TableBatchesOperator.execute_complete`) for what only a task process does: its Asset event
with the batches' facts, its lineage, its XCom and metrics. Measured at 100 tables on two cores,
a task process cost 1.25-1.5 CPU s per run (imports, a Spark Connect session, Kafka clients)
against 0.5 for the batch itself (docs/benchmarks/tables_per_stack.json).
"""
from __future__ import annotations

import functools
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent, TriggerEvent

BATCHES_CONN_ID = "statetable_batches"
ERROR_KEY = "error"          # the XCom key the drill's record reads a cause from (operators.ERROR_KEY)


def _verify(scheme: str):
    """No certificate store for plain HTTP (the stack's service on 127.0.0.1): httpx loads one per
    client unless told, 34 ms of CPU, 3.4 of the triggerer's 6.5 CPU s in a wave of 100 runs;
    over HTTPS one context, loaded once per triggerer, verifies every run's connection."""
    return False if scheme == "http" else _tls_context()


@functools.lru_cache(maxsize=1)
def _tls_context():
    import ssl

    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class TableRunTrigger(BaseTrigger):
    """Asks the batch service to run `table` (at most `max_batches`, until caught up) and waits."""

    def __init__(self, table: str, max_batches: int, conn_id: str = BATCHES_CONN_ID, end_here: bool = False,
                 **newer: Any) -> None:
        # `newer`: arguments a newer statetable's DAG file passes while this triggerer still runs
        # the older module (an upgrade parses DAGs before it restarts the triggerer): ignored,
        # rather than failing every run in between.
        super().__init__()
        self.table, self.max_batches, self.conn_id, self.end_here = table, max_batches, conn_id, end_here

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__name__}",
                {"table": self.table, "max_batches": self.max_batches, "conn_id": self.conn_id,
                 "end_here": self.end_here})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import httpx
        from airflow.sdk import BaseHook

        conn = await BaseHook.aget_connection(self.conn_id)
        scheme = conn.schema or "http"
        url = f"{scheme}://{conn.host}:{conn.port}/runs"
        problem, outcome = None, {}
        try:
            # The token goes only to a listener of this user's (the stack's service), as every
            # stack secret does (catalog.listeners): a port left free while the stack is down
            # may be bound by another local user.
            from catalog.listeners import ForeignListener, check_ours

            check_ours(conn.host, int(conn.port), "the batch service")
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None),
                                         verify=_verify(scheme)) as client:
                answer = await client.post(url, json={"table": self.table, "max_batches": self.max_batches},
                                           headers={"Authorization": f"Bearer {conn.password}"})
            if answer.status_code == 200:
                outcome = answer.json()
            else:
                problem = f"HTTP {answer.status_code}: {answer.text[:300]}"
        except (httpx.HTTPError, ValueError, ForeignListener) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            message = (f"{self.table}: the batch service at {url} did not run it ({problem}); "
                       f"`statetable stack status` shows whether it runs")
            self.log.error("%s", message)
            yield TaskFailedEvent(xcoms={ERROR_KEY: message[:2000]})
            return
        for line in outcome.get("log", []):
            self.log.info("%s", line)
        phases = outcome.get("phases", {})
        self.log.info("%s: in the batch service: %s", self.table,
                      ", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))
        if outcome["outcome"] == "skipped":
            self.log.info("%s", outcome["reason"])
            yield TaskSkippedEvent(xcoms={ERROR_KEY: outcome["reason"]})
        elif outcome["outcome"] == "failed":
            self.log.error("%s: %s", self.table, outcome["error"])
            yield TaskFailedEvent(xcoms={ERROR_KEY: outcome["error"][:2000]})
        elif self.end_here:
            # The measured direction of ending a run here, with no worker at all (STATETABLE_RUN_END=
            # trigger, bench only): its stats and metrics, but no Asset event and no lineage, which
            # only Airflow's task runner emits (see the README's "Tables per stack").
            from statetable_airflow.operators import batch_stats, emit_stats

            stats = batch_stats(self.log, self.table, outcome["result"], outcome["lag"])
            emit_stats(self.table, stats, outcome["durations"])
            yield TaskSuccessEvent(xcoms={"return_value": {**stats, "phases": phases}})
        else:
            yield TriggerEvent({k: v for k, v in outcome.items() if k != "log"})
