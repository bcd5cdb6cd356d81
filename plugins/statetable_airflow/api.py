"""The REST API over committed state, and the statetable status page.

One FastAPI app, two ways to run it: mounted in Airflow's api-server by the
plugin (auth by Airflow's own JWT) and standalone with `statetable serve`
(auth by a configured token). Every route is read-only and needs a bearer
token. Answers come from serving.query, which guarantees that one answer
is one committed batch; the batch is named in the body and in the
X-Statetable-Batch header (the seed-shaped leaderboard routes keep the
seed's body exactly and name it in the header only).
"""
from __future__ import annotations

import hmac
import json
import html
import inspect
import os
import re
import threading
import time

import anyio
from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ops.status import age_text, verify_verdict
from serving.query import BadQuery, NoSuchTable, QueryService, StateUnavailable
from serving.presenters import TIMES
from catalog.errors import UserError

BATCH_HEADER = "X-Statetable-Batch"
LEADERBOARD_TABLE = "leaderboard"


# ---------------------------------------------------------------- authentication
class TokenAuth:
    """Standalone: one shared token (STATETABLE_API_TOKEN or a token file)."""

    def __init__(self, token: str) -> None:
        if len(token) < 16:
            raise UserError("the API token must be at least 16 characters; generate one with "
                            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        self.token = token.encode()

    async def check(self, token: str | None, request: Request):
        """The principal the token stands for, or None."""
        return "token" if token is not None and hmac.compare_digest(token.encode(), self.token) else None

    async def may_read(self, principal, table: str) -> bool:
        return True     # the deployment's own token: standalone serving has one reader


def table_dag(table: str) -> str:
    """The DAG whose permissions govern reads of a table: the one that writes it."""
    return f"{table}__incremental"


class AirflowAuth:
    """Inside Airflow: the JWT Airflow issues (bearer header, or the UI's session cookie), and
    Airflow's auth manager decides what that user may read. A table's rows are its incremental
    DAG's output, so reading them needs what reading that DAG's XComs needs: whatever per-DAG
    grants the deployment's auth manager (FAB, Keycloak, simple) holds apply to the table."""

    def __init__(self, auth_manager=None) -> None:
        self._auth_manager = auth_manager

    def manager(self):
        if self._auth_manager is None:
            from airflow.api_fastapi.app import get_auth_manager

            return get_auth_manager()
        return self._auth_manager

    async def check(self, token: str | None, request: Request):
        from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

        token = token or request.cookies.get(COOKIE_NAME_JWT_TOKEN)
        if not token:
            return None
        try:
            return await self.manager().get_user_from_token(token)
        except Exception:
            return None

    async def may_read(self, principal, table: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

        return bool(self.manager().is_authorized_dag(method="GET", user=principal, access_entity=DagAccessEntity.XCOM,
                                                     details=DagDetails(id=table_dag(table))))


bearer = HTTPBearer(auto_error=False, description="Airflow's JWT inside Airflow; STATETABLE_API_TOKEN standalone")


# ---------------------------------------------------------------- the app
class _Service:
    """Created on the first request, so importing the plugin starts no threads."""

    def __init__(self, factory) -> None:
        self.factory = factory
        self.lock = threading.Lock()
        self.service: QueryService | None = None

    def get(self) -> QueryService:
        with self.lock:
            if self.service is None:
                self.service = self.factory()
            return self.service

    async def ask(self, method: str, *args):
        """A reader process service is awaited; an in-process one answers on a thread. Its reads
        are microseconds on secondaries, but a row's computed columns run a definition's
        expressions over a producer's values, and in the Airflow-mounted API a slow one on the
        event loop froze the whole api-server (UI and the tasks' Execution API). Making the
        service (reader processes open every table) happens on a thread too."""
        service = self.service or await run_in_threadpool(self.get)
        call = getattr(service, method)
        if inspect.iscoroutinefunction(call):
            return await call(*args)
        return await run_in_threadpool(call, *args)

    def close(self) -> None:
        with self.lock:
            if self.service is not None:
                self.service.close()
                self.service = None


class _Followers:
    """Push-query followers: at most `limit` at once (more get 503), and their Kafka and batch-log
    reads run on threads of their own, so followers, however slow their clients, never take the
    threads the other routes answer on."""

    def __init__(self) -> None:
        self.limit = int(os.environ.get("STATETABLE_API_MAX_FOLLOWERS", "32"))
        self.poll = float(os.environ.get("STATETABLE_API_FOLLOW_POLL_SECONDS", "0.5"))
        self.keepalive = 15.0
        # A stream outlives the request's one authorisation: its token may be revoked or expire,
        # its grant removed. Checked again at most this often, and before every batch sent.
        self.recheck = min(30.0, float(os.environ.get("STATETABLE_API_RECHECK_SECONDS", "30")))
        self.count = 0
        self.threads = None

    def take(self) -> None:
        """A follower's slot, taken before the request's first await: ten requests that arrive at
        once must not all see the count below the limit."""
        if self.count >= self.limit:
            raise StateUnavailable(f"{self.count} clients already follow changes, the most this server "
                                   f"allows (STATETABLE_API_MAX_FOLLOWERS)", retry_after=5)
        self.count += 1

    def release(self) -> None:
        self.count -= 1

    async def stream(self, request: Request, table, rt, after: int, allowed, times: str = "iso"):
        """The batches after `after`, while the client stays connected and `allowed()` (its token
        and its grant, re-checked at least every RECHECK_SECONDS and before each batch) holds. The
        slot was taken by `take`; it is given back here."""
        from serving.changes import DefinitionMismatch, next_batch

        self.threads = self.threads or anyio.CapacityLimiter(4)
        try:
            quiet_since = checked = time.monotonic()
            while not await request.is_disconnected():
                try:
                    found = await anyio.to_thread.run_sync(next_batch, table, rt, after, times, limiter=self.threads)
                except DefinitionMismatch as exc:
                    yield _sse_error(str(exc))
                    return
                if found is not None or time.monotonic() - checked >= self.recheck:
                    why = await allowed()
                    checked = time.monotonic()
                    if why is not None:
                        yield _sse_error(why)
                        return
                if found is not None:
                    after, pieces = found
                    while (piece := await anyio.to_thread.run_sync(next, pieces, None, limiter=self.threads)) is not None:
                        yield piece                  # the batch's event, as its changelog is read
                    quiet_since = time.monotonic()
                    continue
                if time.monotonic() - quiet_since > self.keepalive:
                    yield ": keepalive\n\n"            # a comment: proxies keep the stream open
                    quiet_since = time.monotonic()
                await anyio.sleep(self.poll)
        finally:
            self.release()


def _sse_error(cause: str) -> str:
    """The event that ends a stream, with its cause (a client sees why, not only a closed socket)."""
    return f"event: error\ndata: {json.dumps({'error': cause})}\n\n"


def _answer(body, batch: int | None, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={BATCH_HEADER: "none" if batch is None else str(batch)})


def _definition(name: str, rt):
    from catalog.definitions import DefinitionError
    from catalog.registry import load_table

    try:
        return load_table(name, rt)[0]
    except DefinitionError as exc:
        if (rt.tables_dir / f"{name}.sql").exists():
            raise StateUnavailable(f"table {name!r} cannot be followed: its definition is broken: {exc}",
                                   retry_after=60) from None
        raise NoSuchTable(str(exc)) from None


def _built_with(definition, rt) -> None:
    """503 with the cause when the table's state was built under another definition."""
    from serving.changes import DefinitionMismatch, check_definition

    try:
        check_definition(definition, rt)
    except DefinitionMismatch as exc:
        raise StateUnavailable(str(exc), retry_after=60) from None


def create_app(auth, service_factory=QueryService) -> FastAPI:
    holder = _Service(service_factory)

    async def authenticated(request: Request,
                            credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        token = credentials.credentials if credentials and credentials.scheme.lower() == "bearer" else None
        principal = await auth.check(token, request)
        if principal is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        request.state.principal = principal
        request.state.token = token

    async def authorize(request: Request, table: str) -> None:
        if not await auth.may_read(request.state.principal, table):
            raise HTTPException(403, f"you may not read table {table!r}: reading it needs read access to the "
                                     f"XComs of DAG {table_dag(table)!r}")

    async def readable(request: Request, tables: list[dict]) -> list[dict]:
        return [t for t in tables if await auth.may_read(request.state.principal, t["table"])]

    # No /docs or /redoc (they load JavaScript from a CDN); the OpenAPI document needs a token like every route.
    app = FastAPI(
        title="statetable", version="1",
        description="Read-only queries over the committed state of statetable tables. Every answer names the "
                    "batch it comes from (body and X-Statetable-Batch header).",
        dependencies=[Depends(authenticated)], docs_url=None, redoc_url=None, openapi_url=None,
    )
    app.state.queries = holder

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi():
        return JSONResponse(app.openapi())

    @app.exception_handler(NoSuchTable)
    async def _no_table(request: Request, exc: NoSuchTable):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(BadQuery)
    async def _bad_query(request: Request, exc: BadQuery):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(StateUnavailable)
    async def _unavailable(request: Request, exc: StateUnavailable):
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after)})

    @app.on_event("shutdown")
    def _shutdown() -> None:
        holder.close()

    async def fresh_enough(table: str, batch: int | None, bound: int | None) -> None:
        """Kafka Streams' PositionBound, ksqlDB's max.allowed.offset.lag: refuse an answer that
        trails the batch log by more than the client accepts."""
        if bound is None:
            return
        from serving.replica import batches_behind

        logged = await holder.ask("log_batch", table)
        behind = batches_behind(logged, batch)
        if behind > bound:
            raise StateUnavailable(f"table {table!r}: this server answers from batch {batch}, {behind} behind the "
                                   f"last commit (batch {logged}), more than max_lag_batches={bound}; retry, or "
                                   f"ask another server", retry_after=1)

    lag_query = Query(None, ge=0, description="answer 503 if the served batch trails the last commit by more")
    table_path = Path(..., description="table name", max_length=200)
    key_path = Path(..., description="the key: a single value, or a JSON array for composite keys", max_length=4096)
    times_query = Query("iso", max_length=16, description="TIMESTAMP and DATE columns as `iso` (ISO 8601, UTC) or "
                                                          "`epoch_ms` (epoch milliseconds; a DATE as days since 1970)")

    @app.get("/tables", summary="every table with its key, columns, partitions, last batch, lag and last snapshot")
    async def tables(request: Request):
        broken = await holder.ask("broken_tables")
        return {"tables": await readable(request, await holder.ask("tables")),
                "broken": {name: reason for name, reason in broken.items()
                           if await auth.may_read(request.state.principal, name)}}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request):
        """OpenMetrics for Prometheus (scrape with the same bearer token), the tables this token
        may read only."""
        from serving.metrics import exposition

        rows = await readable(request, await holder.ask("tables"))
        service = holder.service or await run_in_threadpool(holder.get)
        body, content_type = await run_in_threadpool(exposition, service.rt, rows, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @app.get("/tables/{table}/rows/{key}", summary="one row")
    async def row(request: Request, table: str = table_path, key: str = key_path,
                  max_lag_batches: int | None = lag_query, times: str = times_query):
        await authorize(request, table)
        batch, found = await holder.ask("get", table, key, times)
        await fresh_enough(table, batch, max_lag_batches)
        if found is None:
            return _answer({"detail": f"table {table!r} has no row for key {key!r}", "table": table,
                            "batch": batch}, batch, 404)
        return _answer({"table": table, "batch": batch, "row": found}, batch)

    @app.get("/tables/{table}/rows", summary="rows in key order, by prefix or range, a page at a time")
    async def rows(request: Request, table: str = table_path,
             prefix: str | None = Query(None, max_length=4096, description="leading key part(s)"),
             from_: str | None = Query(None, alias="from", max_length=4096, description="first key (inclusive)"),
             to: str | None = Query(None, max_length=4096, description="last key (exclusive)"),
             limit: int | None = Query(None, description="page size; capped at 1000"),
             cursor: str | None = Query(None, max_length=4096, description="next_cursor of the previous page"),
             max_lag_batches: int | None = lag_query, times: str = times_query):
        await authorize(request, table)
        page = await holder.ask("scan", table, prefix, from_, to, limit, cursor, times)
        await fresh_enough(table, page.batch, max_lag_batches)
        return _answer({"table": table, "batch": page.batch, "rows": page.rows, "next_cursor": page.next_cursor},
                       page.batch)

    @app.get("/tables/{table}/rows/{key}/windows", summary="a windowed table's windows of one key")
    async def windows(request: Request, table: str = table_path, key: str = key_path,
                from_: int | None = Query(None, alias="from", description="first window start, epoch ms"),
                to: int | None = Query(None, description="window starts before this, epoch ms"),
                limit: int | None = Query(None, description="at most this many windows; capped at 1000"),
                max_lag_batches: int | None = lag_query, times: str = times_query):
        await authorize(request, table)
        if limit is not None and limit < 1:
            raise BadQuery(f"limit must be at least 1, not {limit}")
        page = await holder.ask("windows", table, key, from_, to, limit, times)
        await fresh_enough(table, page.batch, max_lag_batches)
        return _answer({"table": table, "batch": page.batch, "key": key, "windows": page.rows}, page.batch)

    followers = _Followers()

    @app.get("/tables/{table}/changes", summary="committed changes as server-sent events, one per batch",
             response_class=StreamingResponse)
    async def changes(request: Request, table: str = table_path,
                      after_batch: int = Query(-1, ge=-1, description="send the batches after this one"),
                      last_event_id: str | None = Header(None, alias="Last-Event-ID", max_length=20),
                      times: str = times_query):
        """Each committed batch as one event (`id` = the batch, `data` = its changed rows, null for
        a deleted key), oldest first, then each new batch as it commits. A client that reconnects
        with Last-Event-ID resumes after that batch, without gaps or repeats."""
        await authorize(request, table)
        if times not in TIMES:
            raise BadQuery(f"times={times!r}: give one of {', '.join(TIMES)}")
        if last_event_id is not None and not re.fullmatch(r"-1|\d{1,18}", last_event_id.strip()):
            raise BadQuery(f"Last-Event-ID must be a batch id (a whole number), not {last_event_id!r}")
        followers.take()
        try:
            rt = (holder.service or await run_in_threadpool(holder.get)).rt
            definition = await run_in_threadpool(_definition, table, rt)
            await run_in_threadpool(_built_with, definition, rt)
        except BaseException:
            followers.release()
            raise
        after = int(last_event_id) if last_event_id is not None else after_batch
        token = request.state.token

        async def allowed() -> str | None:
            principal = await auth.check(token, request)
            if principal is None:
                return "the stream's token is no longer valid (expired or revoked); reconnect with a new one"
            if not await auth.may_read(principal, table):
                return f"you may no longer read table {table!r}"
            return None

        return StreamingResponse(followers.stream(request, definition, rt, after, allowed, times),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/leaderboard", summary="every game's top 3, in the seed's shape")
    async def leaderboard(request: Request):
        from serving.presenters import leaderboard_entries

        await authorize(request, LEADERBOARD_TABLE)
        boards, batch, cursor = {}, None, None
        while True:
            page = await holder.ask("scan", LEADERBOARD_TABLE, None, None, None, 1000, cursor)
            if batch is not None and page.batch != batch:   # a batch landed between pages: start over
                boards, cursor, batch = {}, None, None
                continue
            batch = page.batch
            for r in page.rows:
                boards[str(r["product_id"])] = leaderboard_entries(r)
            if page.next_cursor is None:
                return _answer(boards, batch)
            cursor = page.next_cursor

    @app.get("/leaderboard/{productId}", summary="one game's top 3, in the seed's shape")
    async def leaderboard_of(request: Request, productId: str = Path(..., max_length=40)):
        from serving.presenters import leaderboard_entries

        await authorize(request, LEADERBOARD_TABLE)
        batch, found = await holder.ask("get", LEADERBOARD_TABLE, productId)
        if found is None:
            return _answer({"detail": f"no leaderboard for product {productId!r}"}, batch, 404)
        return _answer(leaderboard_entries(found), batch)

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    async def ui(request: Request):
        from ops import capacity

        service = holder.service or await run_in_threadpool(holder.get)
        notice = capacity.warning(await run_in_threadpool(capacity.read, service.rt))
        return HTMLResponse(status_page(await readable(request, await holder.ask("tables")), notice))

    return app


# ---------------------------------------------------------------- the status page
def status_page(tables: list[dict], notice: str | None = None) -> str:
    """Every value in words a user reads: no Python `None`, no DIFFERS without a difference, no
    green for a verify that compared nothing (ops.status.verify_verdict)."""
    now = time.time()
    rows = []
    for t in tables:
        last = t.get("last_batch")
        verified, verified_class = verify_verdict(t.get("last_verify"), now)
        batch = "no batch yet" if last is None else (f"#{last['batch_id']}: {last['read']} read, "
                                                      f"{last['keys_changed']} keys changed, {last['seconds']:.1f}s, "
                                                      f"{age_text(now - last['committed_at'])}")
        name = html.escape(t["table"])
        if not t.get("available", True):
            served = f"unavailable: {t.get('reason')}"
        elif t.get("readable_batch") is None:
            served = "nothing committed to serve yet"
        else:
            served = (f"batch {t['readable_batch']} from its {t.get('served_from', 'writer')}, "
                      f"{t.get('lag_batches') or 0} behind; {t.get('keys', 0)} keys")
        lag = t["lag"]
        lag_text = f"{lag} records" if isinstance(lag, int) else str(lag)
        reasons = t.get("dead_letters_by_reason") or {}
        dead = str(t["dead_letters"]) + (" (" + ", ".join(f"{r} {n}" for r, n in reasons.items()) + ")"
                                         if reasons else "")
        schemas = "".join(f"<br><small>writer schema {s['id']}: {s['records']} records, batches "
                          f"{s['first_batch']}-{s['last_batch']}</small>" for s in t.get("writer_schemas") or [])
        rows.append(
            f"<tr><td><b>{name}</b><br><small>{html.escape(t.get('shape', t['kind']))}, key "
            f"{html.escape(', '.join(t['key']))}, {t['partitions']} partitions</small>{schemas}</td>"
            f"<td>{html.escape(batch)}</td><td>{html.escape(served)}</td>"
            f"<td>{html.escape(lag_text)}</td><td>{age_text(t['snapshot_age_seconds'])}</td>"
            f"<td class='{verified_class}'>{html.escape(verified)}</td><td>{html.escape(dead)}</td>"
            f"<td><a href='tables/{name}/rows?limit=20'>rows</a> · "
            f"<a href='/dags/{name}__incremental' target='_top'>incremental</a> · "
            f"<a href='/dags/{name}__rebuild' target='_top'>rebuild</a> · "
            f"<a href='/dags/{name}__restore_verify' target='_top'>restore-verify</a></td></tr>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>statetable</title><style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #1b1f24; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #d0d7de; padding: .5em .6em; text-align: left; vertical-align: top; }}
th {{ background: #f0f3f6; }} td.ok {{ color: #1a7f37; }} td.bad {{ color: #cf222e; font-weight: bold; }}
p.warn {{ background: #fff8c5; border: 1px solid #d4a72c; padding: .6em .8em; }}
td.none {{ color: #6e7781; }} td.failed {{ color: #9a6700; font-weight: bold; }} small {{ color: #57606a; }}
</style></head><body>
<h2>statetable: state tables</h2>
{f"<p class='warn'>{html.escape(notice)}</p>" if notice else ""}
<table><tr><th>table</th><th>last batch</th><th>served</th><th>lag</th><th>newest snapshot</th><th>last restore-verify</th>
<th>dead letters</th><th>DAGs</th></tr>
{''.join(rows)}
</table></body></html>"""
