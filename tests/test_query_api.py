"""The REST API over committed state: answers, errors, auth, torn reads,
restores, and schemathesis against its OpenAPI spec. Standalone
(`statetable serve` as a real process) and inside Airflow's api-server."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest

from deploy import airflow_server
from deploy.processes import wait_until
from spark_jobs import jobs
from deploy import samples
from catalog.mapping import state_spec
from catalog.definitions import parse as parse_definition
from serving.readers import ProcessQueryService, state_signature
from state.table import StateTable
from tests.table_env import isolated_runtime, port

PORT = port(int(os.environ.get("STATETABLE_TEST_API_PORT", "28181")))
TOKEN = "test-token-" + "x" * 24
INVARIANT_SQL = """-- topic: inv_events
-- schema: k STRING, v DOUBLE
-- partitions: 4
CREATE TABLE inv AS SELECT k, COUNT(v) AS n FROM inv_events GROUP BY k;
"""
KEYS = 200


@pytest.fixture(scope="module")
def env(kafka, spark, tmp_path_factory):
    rt, suffix = isolated_runtime(kafka, tmp_path_factory.mktemp("api"))
    (rt.tables_dir / "inv.sql").write_text(INVARIANT_SQL)
    samples.produce("leaderboard", rt.bootstrap, suffix=suffix)
    samples.produce("movie_tickets_sold", rt.bootstrap, 3000, suffix=suffix)
    for name in ("players", "products", "leaderboard", "movie_tickets_sold"):
        jobs.run(name, until_caught_up=True, spark=spark, rt=rt)
    return rt


def _serve(env, port: int, *args: str):
    env_vars = {**os.environ, **env.as_env(), "STATETABLE_API_TOKEN": TOKEN}
    log_path = env.data_dir / f"serve-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "statetable"), "serve", "--port", str(port), *args],
                            env=env_vars, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log_path.read_text()
        try:
            return _get(base, "/openapi.json").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 60, what="statetable serve")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture(scope="module")
def server(env):
    """Reads in the server process, as the Airflow-mounted app does."""
    yield from _serve(env, PORT)


@pytest.fixture(scope="module")
def reader_server(env):
    """Reads in reader processes that take turns catching up (`serve --readers 2`)."""
    yield from _serve(env, PORT + 1, "--readers", "2")


BOTH_SERVERS = pytest.mark.parametrize("served", ["server", "reader_server"])


def _get(base: str, path: str, token: str | None = TOKEN, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(base + path, headers=headers, params=params, timeout=30)


SEED_GAME_1 = [
    {"playerId": 3, "productId": 1, "playerName": "Isabelle", "gameName": "Super Smash Bros", "score": 4000},
    {"playerId": 2, "productId": 1, "playerName": "Mitch", "gameName": "Super Smash Bros", "score": 2000},
    {"playerId": 1, "productId": 1, "playerName": "Elyse", "gameName": "Super Smash Bros", "score": 1000},
]


@BOTH_SERVERS
def test_leaderboard_answers_like_the_seed(served, request):
    server = request.getfixturevalue(served)
    one = _get(server, "/leaderboard/1")
    assert one.status_code == 200 and one.json() == SEED_GAME_1
    assert int(one.headers["X-Statetable-Batch"]) >= 0
    every = _get(server, "/leaderboard").json()
    assert every["1"] == SEED_GAME_1
    assert every["6"][0] == {"playerId": 3, "productId": 6, "playerName": "Isabelle", "gameName": "Mario Kart",
                             "score": 9000}
    assert _get(server, "/leaderboard/999").status_code == 404


@BOTH_SERVERS
def test_point_and_scan_answers_equal_the_state_and_name_their_batch(served, request, env):
    server = request.getfixturevalue(served)
    state = {k[0]: v[0] for k, v in jobs.state_rows("movie_tickets_sold", env).items()}
    title = sorted(state)[0]
    point = _get(server, f"/tables/movie_tickets_sold/rows/{urllib.parse.quote(title, safe='')}")
    assert point.status_code == 200
    body = point.json()
    assert body["row"] == {"title": title, "tickets_sold": state[title]}
    assert body["batch"] == int(point.headers["X-Statetable-Batch"]) == 0

    scanned, cursor, pages = {}, None, 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = _get(server, "/tables/movie_tickets_sold/rows", **params).json()
        pages += 1
        scanned.update({r["title"]: r["tickets_sold"] for r in page["rows"]})
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert scanned == state and pages == -(-len(state) // 3)

    prefix = _get(server, "/tables/movie_tickets_sold/rows", prefix=title).json()["rows"]
    assert prefix == [{"title": title, "tickets_sold": state[title]}]
    ranged = _get(server, "/tables/movie_tickets_sold/rows", **{"from": sorted(state)[1], "to": sorted(state)[3]})
    assert [r["title"] for r in ranged.json()["rows"]] == sorted(state)[1:3]

    listing = _get(server, "/tables").json()["tables"]
    movies = next(t for t in listing if t["table"] == "movie_tickets_sold")
    assert movies["key"] == ["title"] and movies["columns"] == ["title", "tickets_sold"]
    assert movies["partitions"] == 4 and movies["last_batch"]["batch_id"] == 0 and movies["lag"] == 0


@BOTH_SERVERS
def test_errors_are_404_422_and_limits_are_capped(served, request):
    server = request.getfixturevalue(served)
    missing = _get(server, "/tables/movie_tickets_sold/rows/no-such-film")
    assert missing.status_code == 404 and "no row" in missing.json()["detail"]
    assert _get(server, "/tables/nope/rows/1").status_code == 404
    assert "no table 'nope'" in _get(server, "/tables/nope/rows").json()["detail"]
    bad_key = _get(server, "/tables/leaderboard/rows/not-a-number")
    assert bad_key.status_code == 422 and "BIGINT" in bad_key.json()["detail"]
    assert _get(server, "/tables/leaderboard/rows/[1,2,3]").status_code == 422
    for hostile in ("9223372036854775808", "-9223372036854775809", "[9223372036854775808]", "9" * 5000,
                    "[" * 3000 + "]" * 3000, "[" + "1" * 5000 + "]"):
        answer = _get(server, "/tables/leaderboard/rows/" + hostile)
        assert answer.status_code == 422, (hostile[:30], answer.status_code, answer.text[:200])
    assert _get(server, "/tables/leaderboard/rows", prefix="[" * 3000 + "]" * 3000).status_code == 422
    assert _get(server, "/tables/movie_tickets_sold/rows", limit=0).status_code == 422
    assert _get(server, "/tables/movie_tickets_sold/rows", limit="many").status_code == 422
    assert _get(server, "/tables/movie_tickets_sold/rows", cursor="!!").status_code == 422
    assert _get(server, "/tables/movie_tickets_sold/rows/x/windows").status_code == 422   # not windowed
    big = _get(server, "/tables/inv/rows", limit=10**9)
    assert big.status_code == 200


def test_every_route_needs_a_valid_token(server):
    routes = ["/tables", "/tables/movie_tickets_sold/rows", "/tables/movie_tickets_sold/rows/x",
              "/tables/movie_tickets_sold/rows/x/windows", "/leaderboard", "/leaderboard/1", "/ui"]
    spec_paths = set(_get(server, "/openapi.json").json()["paths"])
    streamed = "/tables/movie_tickets_sold/changes"       # never ends with a token: checked by its own test
    assert spec_paths <= {r.replace("movie_tickets_sold", "{table}").replace("/x", "/{key}")
                          .replace("/leaderboard/1", "/leaderboard/{productId}") for r in routes + [streamed]}
    for route in routes + ["/openapi.json", streamed]:
        assert _get(server, route, token=None).status_code == 401, route
        assert _get(server, route, token="wrong-token").status_code == 401, route
        assert route == streamed or _get(server, route).status_code in (200, 404, 422), route


def _commit_one_each(writer: StateTable, table, keys: list[tuple], batch_id: int) -> None:
    """Count 1 more for every key, partition by partition, as Spark's merge tasks do."""
    for p in range(table.partitions):
        part = writer.open(p)
        tx = part.begin(batch_id)
        for key in keys:
            if writer.partition_of(key) == p:
                tx.merge(key, (1,))
        tx.commit()
        time.sleep(0.01)


@BOTH_SERVERS
def test_readers_never_see_two_batches_mixed_while_batches_commit(served, request, env):
    server = request.getfixturevalue(served)
    table = parse_definition(env.tables_dir / "inv.sql")
    spec = state_spec(table, env.namespace)
    writer = StateTable(spec, env.state_dir, bootstrap=env.bootstrap)
    keys = [(f"k{i:04d}",) for i in range(KEYS)]
    batches, seen, errors, sequences = 40, [], [], []
    stop = threading.Event()

    def commit(batch_id: int) -> None:
        _commit_one_each(writer, table, keys, batch_id)

    # Batches stay numbered from 0 across both servers' runs, so after batch b every key counts b + 1.
    applied = writer.open(0).meta.applied_batch
    first = 0 if applied is None else applied + 1
    commit(first)

    def hammer() -> None:
        mine: list[int] = []
        sequences.append(mine)
        with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            while not stop.is_set():
                resp = client.get(f"{server}/tables/inv/rows", params={"limit": 1000})
                if resp.status_code != 200:
                    errors.append((resp.status_code, resp.text[:200]))
                    continue
                body = resp.json()
                seen.append((body["batch"], sum(r["n"] for r in body["rows"]), len(body["rows"])))
                mine.append(body["batch"])

    readers = [threading.Thread(target=hammer) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        for b in range(first + 1, first + batches):
            commit(b)
            time.sleep(0.05)            # let the server's refresher land on some of the batches
        wait_until(lambda: any(b == first + batches - 1 for b, _, _ in seen), 20, interval=0.1,
                   what="readers to see the last batch")
    finally:
        stop.set()
        for r in readers:
            r.join()
        writer.close()
    assert not errors, (errors[:3], (env.data_dir / f"serve-{server.rsplit(':', 1)[1]}.log").read_text()[-3000:])
    torn = [(b, total) for b, total, n in seen if total != (b + 1) * KEYS or n != KEYS]
    assert not torn, torn[:5]
    assert len({b for b, _, _ in seen}) >= 3          # readers really ran across several batches
    assert max(b for b, _, _ in seen) == first + batches - 1
    # Monotonic reads: the reader processes take turns catching up, and no client is ever sent back
    # to a batch older than one it has already been shown.
    backwards = [(a, b) for mine in sequences for a, b in zip(mine, mine[1:]) if b < a]
    assert not backwards, backwards[:5]


@BOTH_SERVERS
def test_a_table_being_restored_answers_503_with_retry_after(served, request, env):
    server = request.getfixturevalue(served)
    part = env.state_dir / "inv" / "p0001"
    aside = part.with_name("p0001.restoring")
    part.rename(aside)
    try:
        def unavailable() -> bool:
            return _get(server, "/tables/inv/rows").status_code == 503

        wait_until(unavailable, 10, interval=0.2, what="503 while restoring")
        resp = _get(server, "/tables/inv/rows/k0001")
        assert resp.status_code == 503 and int(resp.headers["Retry-After"]) > 0
        assert "restore" in resp.json()["detail"]
    finally:
        aside.rename(part)
    wait_until(lambda: _get(server, "/tables/inv/rows").status_code == 200, 10, interval=0.2, what="back")


def test_no_docs_pages_and_nothing_loaded_from_third_parties(server):
    for route in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert _get(server, route).status_code == 404, route
        assert _get(server, route, token=None).status_code in (401, 404), route
    page = _get(server, "/ui")
    assert page.status_code == 200
    assert "<script" not in page.text and "http" not in page.text.replace("http-equiv", "")


def test_schemathesis_finds_no_server_errors(server, tmp_path):
    spec = tmp_path / "openapi.json"
    spec.write_text(_get(server, "/openapi.json").text)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", str(spec), "--url", server,
         "-H", f"Authorization: Bearer {TOKEN}", "--checks", "not_a_server_error", "--max-examples", "40"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_inside_airflow_the_api_takes_airflows_token_and_nothing_else(airflow):
    base = f"{airflow.airflow_url}/statetable"
    token = airflow_server.api_token(airflow)
    ok = _get(base, "/tables", token=token)
    assert ok.status_code == 200
    assert {t["table"] for t in ok.json()["tables"]} >= {"movie_tickets_sold", "leaderboard"}
    assert _get(base, "/tables", token=None).status_code == 401
    assert _get(base, "/tables", token=TOKEN).status_code == 401
    assert _get(base, "/leaderboard", token="not.a.jwt").status_code == 401


def test_idle_readers_stay_serving_and_a_commit_reaches_every_reader(env):
    """A catch-up takes a reader from the requests; with nothing written since its last one it
    would find nothing, so it must not happen. The next commit must still reach every reader."""
    table = parse_definition(env.tables_dir / "inv.sql")
    writer = StateTable(state_spec(table, env.namespace), env.state_dir, bootstrap=env.bootstrap)
    keys = [(f"k{i:04d}",) for i in range(KEYS)]
    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def scenario(service: ProcessQueryService) -> None:
        # Every table is open in every reader before the first request (opening replays the WAL).
        assert all({"inv", "leaderboard", "movie_tickets_sold"} <= set(r.batches) for r in service.readers)
        await service.get("inv", "k0000")      # the first call starts the refresher on this loop
        _commit_one_each(writer, table, keys, 1000)
        await until(lambda: all(r.batch_of("inv") == 1000 for r in service.readers), "every reader at batch 1000")
        first, row = await service.get("inv", "k0000")
        assert first == 1000
        await asyncio.sleep(0.5)
        idle_before = [r.refreshes for r in service.readers]
        await asyncio.sleep(1.5)           # ~30 refresh turns at this interval
        assert [r.refreshes for r in service.readers] == idle_before

        _commit_one_each(writer, table, keys, 1001)
        await until(lambda: all(r.batch_of("inv") == 1001 for r in service.readers), "every reader at batch 1001")
        assert all(r.refreshes > before for r, before in zip(service.readers, idle_before))
        assert await service.get("inv", "k0000") == (1001, {**row, "n": row["n"] + 1})

    service = ProcessQueryService(env, readers=3, refresh_interval=0.05)
    try:
        asyncio.run(scenario(service))
    finally:
        service.close()
        writer.close()


IDLE_SECONDS = int(os.environ.get("STATETABLE_IDLE_SERVE_SECONDS", "30"))


def test_idle_servers_write_nothing_to_disk(server, reader_server, env):
    """Two servers up over committed tables and nothing committing: their secondaries, logs and
    everything else in the data folder keep every byte (a server's readers caught up every
    0.1 s and logged each time, ~1 GB a day). The suite idles 30 s, 300 catch-ups of each
    reader: nothing in a reader writes on a timer (RocksDB's 10-minute statistics dump is off for
    readers), so `STATETABLE_IDLE_SERVE_SECONDS=600` (#46's 10 minutes) checks the same, longer."""
    for base in (server, reader_server):
        assert _get(base, "/tables/movie_tickets_sold/rows", limit=5).status_code == 200
    time.sleep(2)              # the answers' own log lines are written

    def disk() -> dict[str, int]:
        return {str(p.relative_to(env.data_dir)): p.stat().st_size for p in env.data_dir.rglob("*") if p.is_file()}

    before = disk()
    assert any("query-secondaries" in name for name in before), sorted(before)[:20]
    started = time.monotonic()
    while time.monotonic() - started < IDLE_SECONDS:
        time.sleep(min(30, IDLE_SECONDS))
        after = disk()
        grown = {name: (before.get(name), size) for name, size in after.items() if before.get(name) != size}
        assert grown == {} and sum(after.values()) == sum(before.values()), \
            (round(time.monotonic() - started), grown)


def test_state_signature_changes_with_each_write_flush_and_restore(tmp_path):
    partition = tmp_path / "t" / "p0000"
    partition.mkdir(parents=True)
    (partition / "000004.log").write_bytes(b"a")
    (partition / "MANIFEST-000005").write_bytes(b"m")
    (partition / "CURRENT").write_text("MANIFEST-000005\n")
    (partition / "000003.sst").write_bytes(b"s")
    first = state_signature(tmp_path, ["t"])
    assert state_signature(tmp_path, ["t"]) == first

    (partition / "000009.sst").write_bytes(b"s")          # an SST alone comes with a MANIFEST write
    assert state_signature(tmp_path, ["t"]) == first
    with open(partition / "000004.log", "ab") as wal:     # a commit appends to the WAL
        wal.write(b"b")
    appended = state_signature(tmp_path, ["t"])
    assert appended != first
    (partition / "000010.log").write_bytes(b"")            # a flush starts a new WAL
    new_wal = state_signature(tmp_path, ["t"])
    assert new_wal != appended

    partition.rename(partition.with_name("p0000.old"))    # a restore swaps the folder in
    partition.mkdir()
    for entry in partition.with_name("p0000.old").iterdir():
        (partition / entry.name).write_bytes(entry.read_bytes())
    swapped = state_signature(tmp_path, ["t"])
    assert swapped != new_wal
    assert state_signature(tmp_path, ["u", "t"]) == swapped + (("u", None),)   # a table with no state yet


def _sse_events(response, want: int) -> list[tuple[int, dict]]:
    """Server-sent events off a streamed response until `want` have come, as (id, data)."""
    import json

    from tests.table_env import sse_events

    events = sse_events(response, lambda seen: len(seen) == want)
    assert all(e.get("event") == "batch" for e in events), events
    return [(int(e["id"]), json.loads(e["data"])) for e in events]


def test_a_push_query_follows_batches_once_in_order_and_resumes_from_last_event_id(server, env, spark):
    """A real HTTP client follows /changes while 5 batches commit, disconnects after 3, and
    resumes with Last-Event-ID: every batch once, in order, each with exactly the keys that
    batch changed, and the changes folded give the table (pandas over what was produced)."""
    import json
    import uuid

    import pandas as pd
    from confluent_kafka import Producer

    from state.kafka_admin import ensure_topic

    topic = f"push-{uuid.uuid4().hex[:8]}"
    (env.tables_dir / "pushed.sql").write_text(
        f"-- topic: {topic}\n-- schema: k STRING, v BIGINT\n-- partitions: 2\n"
        "CREATE TABLE pushed AS SELECT k, COUNT(v) AS n, SUM(v) AS s FROM events GROUP BY k;\n")
    ensure_topic(env.bootstrap, topic, 2)
    url, auth = f"{server}/tables/pushed/changes", {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={**auth, "Last-Event-ID": "x"}, timeout=10).status_code == 422

    first: list = []

    def follow_three() -> None:
        with httpx.stream("GET", url, headers=auth, params={"after_batch": -1}, timeout=120) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            first.extend(_sse_events(response, 3))

    follower = threading.Thread(target=follow_three)
    follower.start()
    producer = Producer({"bootstrap.servers": env.bootstrap})
    produced, touched = [], []
    for batch in range(5):
        keys = [f"key{(batch * 3 + i) % 7}" for i in range(4)]
        for i, key in enumerate(keys):
            event = {"k": key, "v": batch * 10 + i}
            produced.append(event)
            producer.produce(topic, json.dumps(event).encode(), key=key.encode())
        producer.flush()
        touched.append(set(keys))
        assert len(jobs.run("pushed", max_batches=1, spark=spark, rt=env)) == 1
    follower.join(timeout=120)
    assert [b for b, _ in first] == [0, 1, 2]

    with httpx.stream("GET", url, headers={**auth, "Last-Event-ID": str(first[-1][0])}, timeout=120) as response:
        rest = _sse_events(response, 2)
    events = first + rest
    assert [b for b, _ in events] == [0, 1, 2, 3, 4]
    folded = {}
    for batch, body in events:
        assert body["batch"] == batch and body["table"] == "pushed"
        assert {c["key"]["k"] for c in body["changes"]} == touched[batch]
        folded.update({c["key"]["k"]: c["row"] for c in body["changes"]})
    frame = pd.DataFrame(produced).groupby("k")["v"].agg(["count", "sum"])
    assert folded == {k: {"k": k, "n": int(r["count"]), "s": int(r["sum"])} for k, r in frame.iterrows()}


def test_timestamps_and_dates_come_out_as_iso_8601_and_as_epoch_ms_on_request(server, env, spark):
    """A TIMESTAMP column (a key, a MAX, a LATEST_BY_OFFSET) and a DATE come out of the REST API
    and the CLI as ISO 8601 in UTC; `?times=epoch_ms` (`--times epoch_ms`) gives the numbers
    the state keeps, and the change topic's readers parse. Expected values are pandas' over the
    events produced, not the product's own conversion."""
    import json
    import uuid

    import pandas as pd
    from confluent_kafka import Producer

    from state.kafka_admin import ensure_topic

    topic = f"visits-{uuid.uuid4().hex[:8]}"
    (env.tables_dir / "visits.sql").write_text(
        f"-- topic: {topic}\n-- schema: page STRING, at TIMESTAMP, day DATE, n BIGINT\n-- partitions: 2\n"
        "CREATE TABLE visits AS SELECT page, MAX(at) AS last_visit, MIN(day) AS first_day, "
        "LATEST_BY_OFFSET(at) AS latest, SUM(n) AS total FROM events GROUP BY page;\n")
    ensure_topic(env.bootstrap, topic, 2)
    events = [{"page": "pa", "at": "2026-11-26T09:00:00Z", "day": "2026-11-26", "n": 1},
              {"page": "pa", "at": "2026-11-26T09:01:30.250Z", "day": "2026-11-20", "n": 2},
              {"page": "pb", "at": 1795683660000, "day": "1999-12-31", "n": 5}]
    producer = Producer({"bootstrap.servers": env.bootstrap})
    for event in events:
        producer.produce(topic, json.dumps(event).encode(), key=event["page"].encode())
    producer.flush()
    assert len(jobs.run("visits", max_batches=1, spark=spark, rt=env)) == 1

    frame = pd.DataFrame(events)
    frame["at"] = frame["at"].map(lambda v: pd.Timestamp(v, unit="ms", tz="UTC") if isinstance(v, int)
                                  else pd.Timestamp(v))
    frame["day"] = pd.to_datetime(frame["day"])
    by_page = frame.groupby("page").agg(last=("at", "max"), first=("day", "min"), latest=("at", "last"),
                                        total=("n", "sum"))

    def iso(stamp: pd.Timestamp) -> str:
        text = stamp.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%S")
        return text + (f".{stamp.microsecond // 1000:03d}Z" if stamp.microsecond else "Z")

    expected = {page: {"page": page, "last_visit": iso(r["last"]), "first_day": r["first"].strftime("%Y-%m-%d"),
                       "latest": iso(r["latest"]), "total": int(r["total"])} for page, r in by_page.iterrows()}
    numbers = {page: {"page": page, "last_visit": r["last"].value // 1_000_000,
                      "first_day": (r["first"] - pd.Timestamp("1970-01-01")).days,
                      "latest": r["latest"].value // 1_000_000, "total": int(r["total"])}
               for page, r in by_page.iterrows()}
    assert expected["pa"]["last_visit"] == "2026-11-26T09:01:30.250Z" and expected["pb"]["first_day"] == "1999-12-31"

    assert _get(server, "/tables/visits/rows/pa").json()["row"] == expected["pa"]
    assert {r["page"]: r for r in _get(server, "/tables/visits/rows").json()["rows"]} == expected
    assert _get(server, "/tables/visits/rows/pb", times="epoch_ms").json()["row"] == numbers["pb"]
    assert {r["page"]: r for r in _get(server, "/tables/visits/rows", times="epoch_ms").json()["rows"]} == numbers
    wrong = _get(server, "/tables/visits/rows/pa", times="unix")
    assert wrong.status_code in (400, 422) and "iso, epoch_ms" in wrong.text, wrong.text

    # The push stream shows them as the rows API does, with the same choice.
    for times, want in (("iso", expected), ("epoch_ms", numbers)):
        with httpx.stream("GET", f"{server}/tables/visits/changes", params={"times": times},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as response:
            assert response.status_code == 200
            data = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert {c["key"]["page"]: c["row"] for c in json.loads(data[6:])["changes"]} == want, times
    wrong = httpx.get(f"{server}/tables/visits/changes", params={"times": "unix"},
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert wrong.status_code in (400, 422) and "iso, epoch_ms" in wrong.text, wrong.text

    cli = [str(Path(sys.executable).parent / "statetable"), "query", "visits", "pa"]
    environment = {**os.environ, **env.as_env()}
    shown = subprocess.run(cli, env=environment, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and json.loads(shown.stdout) == expected["pa"], shown.stderr
    raw = subprocess.run(cli + ["--times", "epoch_ms"], env=environment, capture_output=True, text=True, timeout=120)
    assert raw.returncode == 0 and json.loads(raw.stdout) == numbers["pa"], raw.stderr
