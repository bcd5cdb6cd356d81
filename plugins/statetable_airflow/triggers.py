"""Triggers: a table's incremental run, awaited in the triggerer instead of a worker slot.

`run_batches` starts in the triggerer (start_from_trigger): TableRunTrigger hands the run to the
stack's batch service (ops/batch_service.py) and awaits its answer. A run with nothing new ends
there, skipped, and a failed one fails there (Airflow's retries apply as to any failure), each
without a worker process at all. A run that committed batches ends there too on the stack
(`end_here`): the trigger sends what a task process would have, its Asset event with the
batches' facts (through Airflow's REST API, as the stack's `statetable-runs` user), its
OpenLineage START and COMPLETE (through the provider's adapter), its metrics and its XCom. The
worker's resume step (a task process, its Execution API calls, the scheduler's queueing) was
~0.3 CPU s a run, a fifth of a 100-table wave on two cores. Where the Asset event cannot be sent
from here (no `statetable_airflow_api` connection, the API not answering), the run resumes on a
worker (`TableBatchesOperator.execute_complete`) as before, so no event is ever lost.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent, TriggerEvent

BATCHES_CONN_ID = "statetable_batches"
API_CONN_ID = "statetable_airflow_api"     # Airflow's own REST API, as a user allowed to send Asset events
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


class _AirflowApi:
    """Airflow's REST API from the triggerer: one token per login, kept until a minute before it
    expires, and each Asset's id looked up once (both per triggerer process)."""

    tokens: dict[tuple, tuple[str, float]] = {}
    asset_ids: dict[tuple, int] = {}

    def __init__(self, conn) -> None:
        self.conn = conn
        self.base = f"{conn.schema or 'http'}://{conn.host}:{conn.port}"
        self.key = (self.base, conn.login)

    async def _token(self, client, fresh: bool = False) -> str:
        held = self.tokens.get(self.key)
        if held and not fresh and held[1] > time.time() + 60:
            return held[0]
        answer = await client.post(f"{self.base}/auth/token",
                                   json={"username": self.conn.login, "password": self.conn.password})
        answer.raise_for_status()
        token = answer.json()["access_token"]
        self.tokens[self.key] = (token, _expires(token))
        return token

    async def _call(self, client, method: str, path: str, **kwargs):
        for fresh in (False, True):         # a token the server no longer takes: a new one, once
            headers = {"Authorization": f"Bearer {await self._token(client, fresh)}"}
            answer = await client.request(method, f"{self.base}{path}", headers=headers, **kwargs)
            if answer.status_code != 401:
                break
        answer.raise_for_status()
        return answer.json()

    async def asset_event(self, client, uri: str, extra: dict) -> int:
        """Send one Asset event; its id."""
        key = (self.base, uri)
        if key not in self.asset_ids:
            # A substring match (LIKE, `_` a wildcard): in URI order the exact one comes before
            # every longer URI it begins, so a page holds it however many tables share its prefix.
            found = await self._call(client, "GET", "/api/v2/assets",
                                     params={"uri_pattern": uri, "order_by": "uri", "limit": 100})
            ids = [a["id"] for a in found.get("assets", []) if a.get("uri") == uri]
            if not ids:
                from statetable_airflow.errors import AssetUnknown

                raise AssetUnknown(f"Airflow has no Asset {uri}")
            self.asset_ids[key] = ids[0]
        event = await self._call(client, "POST", "/api/v2/assets/events",
                                 json={"asset_id": self.asset_ids[key], "extra": extra})
        return event["id"]


def _expires(token: str) -> float:
    """A JWT's `exp` (the token is Airflow's own; nothing here trusts it beyond when to renew)."""
    try:
        payload = token.split(".")[1]
        return float(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return time.time() + 300


class TableRunTrigger(BaseTrigger):
    """Asks the batch service to run `table` (at most `max_batches`, until caught up) and waits."""

    def __init__(self, table: str, max_batches: int, conn_id: str = BATCHES_CONN_ID, end_here: bool = False,
                 outlets: list[str] | None = None, **newer: Any) -> None:
        # `newer`: arguments a newer statetable's DAG file passes while this triggerer still runs
        # the older module (an upgrade parses DAGs before it restarts the triggerer): ignored,
        # rather than failing every run in between.
        super().__init__()
        self.table, self.max_batches, self.conn_id, self.end_here = table, max_batches, conn_id, end_here
        self.outlets = list(outlets or [])

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__name__}",
                {"table": self.table, "max_batches": self.max_batches, "conn_id": self.conn_id,
                 "end_here": self.end_here, "outlets": self.outlets})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import httpx
        from airflow.sdk import BaseHook

        started = datetime.now(timezone.utc)
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
        else:
            ended = await self._end_here(outcome, phases, started) if self.end_here else None
            yield ended if ended is not None else TriggerEvent({k: v for k, v in outcome.items() if k != "log"})

    async def _end_here(self, outcome: dict, phases: dict, started: datetime) -> TriggerEvent | None:
        """End a run that committed batches here, doing what its resume step on a worker would
        (TableBatchesOperator._finish); None, after a warning, when its Asset event cannot be
        sent from here, so that the worker sends it."""
        import httpx
        from airflow.sdk import BaseHook

        from statetable_airflow.operators import batch_stats, emit_stats, run_facts

        ti = self.task_instance
        result, snapshot = outcome["result"], outcome["snapshot"]
        stats = batch_stats(_QUIET, self.table, result, outcome["lag"])
        facts = run_facts(self.table, result, stats)
        try:
            conn = await BaseHook.aget_connection(API_CONN_ID)
            from catalog.listeners import check_ours

            check_ours(conn.host, int(conn.port), "the stack's Airflow API server")     # before the password
            api = _AirflowApi(conn)
            async with httpx.AsyncClient(timeout=30.0, verify=_verify(conn.schema or "http")) as client:
                for uri in self.outlets:
                    await api.asset_event(client, uri, {**facts, "dag_id": ti.dag_id, "run_id": ti.run_id,
                                                        "task_id": ti.task_id})
        except Exception as exc:        # noqa: BLE001 - the worker sends it instead; nothing is lost
            self.log.warning("%s: the run's Asset event could not be sent from the triggerer (%s: %s); the task "
                             "resumes on a worker to send it", self.table, type(exc).__name__, exc)
            return None
        stats = batch_stats(self.log, self.table, result, outcome["lag"])
        emit_stats(self.table, stats, outcome["durations"])
        if snapshot["partitions"]:
            self.log.info("%s: snapshot of partitions %s at batch %s in %.2fs", self.table, snapshot["partitions"],
                          snapshot["batch"], snapshot["seconds"])
        try:
            from statetable_airflow.lineage import emit_run_events

            await asyncio.to_thread(emit_run_events, self.table, ti, started, datetime.now(timezone.utc))
        except Exception as exc:        # noqa: BLE001 - lineage never fails a run
            self.log.warning("%s: OpenLineage events not sent: %s: %s", self.table, type(exc).__name__, exc)
        self.log.info("%s: the run ended in the triggerer, with its Asset event (%s)", self.table,
                      ", ".join(f"{k} {v}" for k, v in facts.items() if k != "table"))
        return TaskSuccessEvent(xcoms={"return_value": {**stats, "snapshot_partitions": snapshot["partitions"],
                                                        "phases": phases, "ended_in": "triggerer"}})


_QUIET = logging.getLogger("statetable.triggers.quiet")
_QUIET.disabled = True          # stats computed before the Asset event is sent: logged once it is
