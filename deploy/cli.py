"""The `statetable` command line."""
from __future__ import annotations

import argparse
import json
import sys

from catalog import settings as stack_settings
from catalog.errors import UserError
from catalog.messages import one_line
from serving.errors import NoSuchTable

PRIVATE_UMASK = 0o077

# Exit codes, as the README's table lists them.
EXIT_OK = 0
EXIT_FAILED = 1         # the work failed (a broker, the engine, a verify that found differences)
EXIT_USAGE = 2          # the user's request: a refused definition, an unknown table, a bad key or option
EXIT_DOWN = 3           # `stack status`: a component is down
EXIT_NO_ROW = 4         # `query`: no row for that key in the committed state
EXIT_INTERRUPTED = 130


def _stack(args) -> int:
    from deploy import stack

    cfg = stack_settings.load()
    if args.action == "up":
        stack.up(cfg, workers=args.workers, brokers=args.brokers, secure=args.secure, registry=args.registry,
                 cdc_pipeline=args.cdc)
    elif args.action == "down":
        stack.down(cfg)
    elif args.action == "restart-broker":
        stack.restart_broker(cfg, args.broker)
    elif args.action == "restart-engine":
        stack.restart_engine(cfg)
    elif args.action == "restart-workers":
        stack.restart_workers(cfg)
    elif args.action == "supervise-workers":
        from deploy import spark_cluster

        spark_cluster.supervise(cfg)
    elif args.action == "kill-engine":
        stack.kill_engine(cfg)
    elif args.action == "password":
        from deploy import airflow_server

        print(airflow_server.admin_password(cfg))
    elif args.action == "wipe-workers":
        if not args.table:
            raise UserError("wipe-workers: name the table whose worker state to wipe (--table NAME)")
        stack.wipe_workers(cfg, args.table)
    else:
        lines = stack.status_lines(cfg)
        print("\n".join(lines))
        return EXIT_DOWN if any(stack.is_down(line) for line in lines) else EXIT_OK
    return 0


def _cdc(args) -> int:
    from deploy import cdc

    cfg = stack_settings.load()
    if args.action == "add":
        if not args.tables:
            raise UserError(f"cdc add {args.database}: name the tables to capture as schema.table "
                            f"(e.g. `statetable cdc add shop public.customers public.orders`)")
        state = cdc.add(cfg, args.database, args.tables, partitions=args.partitions)
        print(f"connector {args.database}: {state['connector']['state']}, {len(state['tasks'])} task(s) running; "
              f"topics: {', '.join(args.database + '.' + t for t in args.tables)}")
    elif args.action == "remove":
        cdc.remove(cfg, args.database)
        print(f"connector {args.database} removed, with its replication slot and publication")
    else:
        for name in cdc.connectors(cfg):
            print(name)
    return 0


def _engine(args) -> int:
    from deploy import connect_server

    connect_server.foreground(stack_settings.load(), args.host)
    return 0


def _smoke(args) -> int:
    from deploy import smoke

    smoke.run(stack_settings.load(), events=args.events)
    return 0


def _demo(args) -> int:
    from deploy import demo

    demo.run(stack_settings.load(), events=args.events)
    return 0


def _airflow(args) -> int:
    from deploy import airflow_server

    airflow_args = args.airflow_args[1:] if args.airflow_args[:1] == ["--"] else args.airflow_args
    return airflow_server.airflow_cli(stack_settings.load(), *airflow_args, check=False).returncode


def _logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _run(args) -> int:
    from spark_jobs import jobs

    _logging()
    if args.follow:
        import signal
        import threading

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        done = jobs.follow(args.table, poll_seconds=args.poll_seconds, stop=stop,
                           on_commit=lambda c: print(json.dumps({"batch": c.batch_id, **c.counts,
                                                                 "seconds": c.seconds}), flush=True))
        print(f"{args.table}: stopped after {done} batches")
        return 0
    commits = jobs.run(args.table, max_batches=args.max_batches, until_caught_up=args.until_caught_up,
                       max_records_per_batch=args.max_records_per_batch)
    for commit in commits:
        print(json.dumps({"batch": commit.batch_id, **commit.counts, "seconds": commit.seconds}))
    if not commits:
        print(f"{args.table}: nothing new to read")
    return 0


def _produce_sample(args) -> int:
    from deploy import samples
    from catalog.runtime import Runtime

    sent = samples.produce(args.name, Runtime.from_env().bootstrap, args.events)
    for topic, count in sent.items():
        print(f"produced {count} records to {topic}")
    return 0


def _tables(args) -> int:
    """Every table as a user asks after it: what it is, its last batch, lag, freshness, keys,
    dead letters by reason and what its last restore-and-verify proved."""
    from catalog.definitions import load_all
    from catalog.runtime import Runtime
    from ops import status

    rt = Runtime.from_env()
    broken: dict[str, str] = {}
    tables = load_all(rt.tables_dir, broken=broken)
    if args.table:
        missing = [t for t in args.table if t not in tables and t not in broken]
        if missing:
            raise NoSuchTable(f"no table {missing[0]!r} in {rt.tables_dir}; tables: {', '.join(sorted(tables))}")
    names = args.table or sorted(set(tables) | set(broken))
    rows = []
    for name in names:
        if name in broken:
            rows.append({"table": name, "broken": broken[name]})
            continue
        info = status.table_status(tables[name], rt)
        rows.append(info)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    for info in rows:
        print(shown(_table_lines(info)))
    return 0


def shown(text: str) -> str:
    """Text for a terminal: control and format characters (escape sequences, OSC 52's clipboard
    writes, carriage returns forging a line, bidi overrides) as visible escapes. Dead letters and
    broken definitions quote what producers and files hold, and a terminal obeys its bytes."""
    import unicodedata

    return "".join(c if c == "\n" or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co")
                   else c.encode("unicode_escape", "backslashreplace").decode("ascii") for c in text)


def _table_lines(info: dict) -> str:
    from ops.status import age_text

    name = info["table"]
    if "broken" in info:
        return f"{name}: DEFINITION BROKEN: {info['broken']}\n"
    last = info["last_batch"]
    lag = info["lag"]
    lag_text = "caught up" if lag == 0 else f"{lag} records waiting" if isinstance(lag, int) else str(lag)
    batch = "no batch yet" if last is None else \
        f"batch {last['batch_id']} ({last['read']} read, {last['keys_changed']} keys changed, {last['seconds']:.2f}s)"
    fresh = "never committed" if info["freshness_seconds"] is None else f"committed {age_text(info['freshness_seconds'])}"
    reasons = info["dead_letters_by_reason"]
    dead = f"{info['dead_letters']}" + (" (" + ", ".join(f"{r} {n}" for r, n in reasons.items()) + ")" if reasons
                                        else "")
    lines = [f"{name}: {info['shape']}, key {', '.join(info['key'])}, {info['partitions']} partitions",
             f"  {batch}, {fresh}; {lag_text}; {info['keys']} keys",
             f"  dead letters: {dead}" + (f" (`statetable dead-letters {name}`)" if info["dead_letters"] else ""),
             f"  verify: {info['verified']['text']}"]
    if info.get("writer_schemas"):
        lines.append("  writer schemas: " + ", ".join(
            f"id {s['id']} ({s['records']} records, batches {s['first_batch']}-{s['last_batch']})"
            for s in info["writer_schemas"]))
    lines += [f"  warning: {w}" for w in info.get("durability_warnings") or []]
    return "\n".join(lines) + "\n"


def _create_topic(args) -> int:
    from ops import topics

    for made in topics.create_topic(args.table)["topics"]:
        print(f"topic {made['topic']}: {'created' if made['created'] else 'exists'}, {made['partitions']} partitions")
    return 0


def _produce(args) -> int:
    from ops import topics

    def progress(sent: int, seconds: float) -> None:
        print(f"statetable produce {args.table}: {sent} records sent ({sent / max(seconds, 1e-6):,.0f}/s)",
              file=sys.stderr, flush=True)

    if args.file in (None, "-"):
        done = topics.produce_lines(args.table, sys.stdin, progress=progress, join=args.join)
    else:
        try:
            source = open(args.file, encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
        with source:
            done = topics.produce_lines(args.table, source, progress=progress, join=args.join)
    print(f"produced {done.records} records to {done.topic} ({done.seconds:.2f}s, every delivery confirmed)")
    if done.not_json_objects:
        print(f"{done.not_json_objects} of them are not JSON objects: the table will dead-letter them with a reason "
              f"(`statetable dead-letters {args.table}`)")
    return 0


def _dead_letters(args) -> int:
    from ops import topics

    found = topics.dead_letters(args.table, limit=args.limit)
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found["total"]:
        print(f"{args.table}: no dead letters in committed batches (topic {found['topic']})")
        return 0
    print(f"{args.table}: {found['total']} dead letters in committed batches (topic {found['topic']})")
    for reason, n in found["by_reason"].items():
        print(shown(f"  {reason}: {n}"))
    if found["newest"]:
        print(f"newest {len(found['newest'])}:")
    for d in found["newest"]:
        print(shown(f"  {d['reason']}: partition {d['source_partition']} offset {d['source_offset']}, {d['size']} "
                    f"bytes{' (cut)' if d['truncated'] else ''}: {d['value']}"))
    return 0


def _drill(args) -> int:
    """A restore-and-verify drill through the stack's Airflow, as the schedule runs it: the DAG
    waited for (a new table's DAGs appear within a minute), the run triggered over REST, its
    tasks followed, and what it proved printed in words."""
    from catalog.runtime import Runtime
    from deploy.airflow_api import AirflowApi
    from ops import status
    from ops.failures import FAILURES

    if args.failure not in FAILURES:
        raise UserError(f"--failure {args.failure!r} is not a drill; choose one of {', '.join(FAILURES)}")
    settings = stack_settings.load()
    dag_id = f"{args.table}__restore_verify"

    def say(text: str) -> None:
        print(f"statetable drill {args.table}: {text}", flush=True)

    api = AirflowApi(settings)
    api.wait_for_dag(dag_id, timeout=args.timeout, on_wait=say)
    run_id = api.trigger(dag_id, {"failure": args.failure})
    say(f"triggered {dag_id} run {run_id} (failure {args.failure}); see it at "
        f"{settings.airflow_url}/dags/{dag_id}")
    seen: dict[str, str] = {}

    def progress(_run: dict) -> None:
        for task, state in api.task_states(dag_id, run_id).items():
            if state and seen.get(task) != state and state not in ("scheduled", "queued", None):
                seen[task] = state
                say(f"{task} {state}")

    run = api.wait_run(dag_id, run_id, timeout=args.timeout, on_poll=progress)
    for task, tail in (api.failed_logs(dag_id, run_id) if run["state"] != "success" else {}).items():
        say(f"{task} failed; the end of its log:\n" + "\n".join(tail.splitlines()[-12:]))
    verdict, kind = status.verify_verdict((status.verify_history(Runtime.from_env(), args.table, limit=1) or
                                           [None])[0])
    say(f"run {run['state']}: {verdict}")
    return EXIT_OK if run["state"] == "success" and kind in ("ok", "none") else EXIT_FAILED


def _query(args) -> int:
    from serving.query import BadQuery, NoSuchTable, StateUnavailable, lookup

    def progress(table: str, partition: int, text: str) -> None:
        print(f"statetable query {table}: replica partition {partition} {text}", file=sys.stderr, flush=True)

    try:
        row = lookup(args.table, tuple(args.key), progress=progress, times=args.times)
    except (NoSuchTable, BadQuery) as exc:
        print(f"statetable query {args.table}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StateUnavailable as exc:
        print(f"statetable query {args.table}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if row is None:
        print(f"statetable query {args.table}: no row for key {args.key} in its committed state", file=sys.stderr)
        return EXIT_NO_ROW
    print(json.dumps(present(args.table, row), indent=1, default=str))
    return 0


def present(table: str, row: dict):
    """The seed's service shape for the leaderboard; rows as they are otherwise."""
    if table == "leaderboard":
        from serving.presenters import leaderboard_entries

        return leaderboard_entries(row)
    return row


def api_token(token_file: str | None) -> str:
    """The standalone API's token: STATETABLE_API_TOKEN, else a token file (--token-file or
    STATETABLE_API_TOKEN_FILE). Never a default: an API without a token would be open."""
    import os
    from pathlib import Path

    token = os.environ.get("STATETABLE_API_TOKEN")
    path = token_file or os.environ.get("STATETABLE_API_TOKEN_FILE")
    if not token and path:
        try:
            mode = Path(path).stat().st_mode & 0o777
            if mode & 0o077:
                raise UserError(f"the token file {path} is readable by others (mode {mode:o}); "
                                 f"`chmod 600 {path}` and start again")
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise UserError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not token:
        raise UserError("no API token; set STATETABLE_API_TOKEN or pass --token-file FILE "
                         "(e.g. `export STATETABLE_API_TOKEN=$(python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))')`)")
    return token


def _serve(args) -> int:
    import uvicorn

    from statetable_airflow.api import TokenAuth, create_app

    try:
        auth = TokenAuth(api_token(args.token_file))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _logging()
    print(f"statetable API on http://{args.host}:{args.port} (OpenAPI at /openapi.json)", flush=True)
    if args.readers == 1 or args.readers < 0:
        raise UserError(f"--readers {args.readers}: use 0 (read in the server process) or 2 "
                         "or more (reader processes that take turns catching up)")
    if args.readers:
        from functools import partial

        from serving.readers import ProcessQueryService

        app = create_app(auth, service_factory=partial(ProcessQueryService, readers=args.readers))
    else:
        app = create_app(auth)
    import gc

    gc.collect()
    gc.freeze()    # modules and the app live as long as the server: a full collection need not walk them
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _restore(args) -> int:
    from spark_jobs import jobs

    _logging()
    for report in jobs.restore(args.table, args.batch, force=args.force):
        print(json.dumps({"partition": report.partition, "applied_batch": report.applied_batch,
                          "snapshot_batch": report.snapshot_batch, "replayed": report.replayed_records,
                          "corrupt_snapshots": len(report.corrupt_snapshots), "keys": report.key_count,
                          "seconds": round(report.seconds, 3)}))
    return 0


def _verify(args) -> int:
    """A verify run by hand is part of the table's verify history too (the State tables page,
    `/metrics`), as the `cli` run with no failure injected."""
    from dataclasses import asdict

    from catalog.runtime import Runtime
    from ops import status
    from spark_jobs.recompute.verify import verify

    _logging()
    result = verify(args.table, full=args.full)
    print(result.summary())
    status.record_verify(Runtime.from_env(), args.table, {
        "run_id": "cli", "failure": "none", "ok": result.ok,
        **status.verify_fields({**asdict(result), "ok": result.ok})})
    return 0 if result.ok else 1


def _rebuild(args) -> int:
    from spark_jobs.recompute.rebuild import rebuild

    _logging()
    commit = rebuild(args.table)
    print(json.dumps({"batch": commit.batch_id, **commit.counts, "seconds": commit.seconds}))
    return 0


def _accept_offsets(args) -> int:
    from spark_jobs import jobs

    _logging()
    entry = jobs.accept_offsets(args.table, note=args.note)
    print(json.dumps(entry, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statetable", description="Fault-tolerant, queryable state tables.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stack", help="start, stop or inspect the local Kafka + Airflow stack")
    p.add_argument("action", choices=["up", "down", "status", "restart-broker", "restart-engine",
                                          "restart-workers", "kill-engine", "wipe-workers", "supervise-workers",
                                          "password"],
                   help="password prints the Airflow admin's (kept in a mode-600 file, never logged); "
                        "kill-engine and wipe-workers are failure drills' deployment commands; "
                        "supervise-workers is the process `up --workers` starts to restart dead workers")
    p.add_argument("--table", help="wipe-workers: the table whose local state every worker loses")
    p.add_argument("--brokers", type=int, default=None,
                   help="up: run N KRaft brokers on loopback, with replication factor min(N, 3) and "
                        "min.insync.replicas one less (default: as the stack was made, else 1)")
    p.add_argument("--secure", action="store_true",
                   help="up: brokers speak SASL_SSL (SCRAM-SHA-512) to clients and mutual TLS among themselves, "
                        "with ACLs; the client config goes to .stack/kafka/client.properties (mode 600)")
    p.add_argument("--registry", action="store_true",
                   help="up: also run a schema registry (Apicurio, Confluent's REST API) for tables whose topics "
                        "are in Confluent's wire format (-- format: avro-confluent, ...); needs Java 21+")
    p.add_argument("--cdc", action="store_true",
                   help="up: also run Kafka Connect with Debezium's PostgreSQL connector and the example database "
                        "`shop`; add connectors with `statetable cdc add`")
    p.add_argument("--broker", type=int, default=1, help="restart-broker: which broker (1..N)")
    p.add_argument("--workers", type=int, default=0,
                   help="up: also run a Spark standalone master with N workers (1 core each) and an S3 store, "
                        "and point the Spark Connect server at them (default 0: local[*] on one disk)")
    p.set_defaults(func=_stack)

    p = sub.add_parser("cdc", help="capture a database's tables on the stack's PostgreSQL into Kafka "
                                   "(Debezium, `stack up --cdc`); read them with `-- format: debezium-json`")
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("database", nargs="?", default="shop", help="the database (default: the example, shop)")
    p.add_argument("tables", nargs="*", help="add: schema.table, each written to topic DATABASE.schema.table")
    p.add_argument("--partitions", type=int, default=2, help="add: partitions of the topics Connect creates")
    p.set_defaults(func=_cdc)

    p = sub.add_parser("engine", help="run the Spark Connect server in the foreground (a container's command; "
                                      "the local stack starts its own with `stack up`)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (0.0.0.0 inside a container network)")
    p.set_defaults(func=_engine)

    p = sub.add_parser("smoke", help="produce sample events and run the smoke DAG end to end")
    p.add_argument("--events", type=int, default=1000, help="events to produce (default 1000)")
    p.set_defaults(func=_smoke)

    p = sub.add_parser("demo", help="produce every table's samples and run their DAGs on the local stack")
    p.add_argument("--events", type=int, default=20000, help="sample events per table (default 20000)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("run", help="run a table's micro-batches in one Spark session")
    p.add_argument("table")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--max-batches", type=int, help="run at most this many batches (default: one)")
    group.add_argument("--until-caught-up", action="store_true",
                       help="run batches until the topic has nothing new, then stop")
    group.add_argument("--follow", action="store_true",
                       help="stay up in one warm Spark session and run a batch whenever there is new input")
    p.add_argument("--poll-seconds", type=float, default=0.5, help="with --follow: how often to look for input")
    p.add_argument("--max-records-per-batch", type=int, help="override the table's option for this run")
    p.set_defaults(func=_run)

    p = sub.add_parser("tables", help="every table: last batch, lag, freshness, keys, dead letters, last verify")
    p.add_argument("table", nargs="*", help="only these tables")
    p.add_argument("--json", action="store_true", help="one JSON document (the query API's /tables fields)")
    p.set_defaults(func=_tables)

    p = sub.add_parser("create-topic", help="create a table's input topic with its definition's partitions "
                                            "(the broker does not create topics on first use)")
    p.add_argument("table")
    p.set_defaults(func=_create_topic)

    p = sub.add_parser("produce", help="send JSON lines (one event per line) to a table's input topic")
    p.add_argument("table")
    p.add_argument("file", nargs="?", help="a file of JSON lines (default: standard input)")
    p.add_argument("--join", action="store_true", help="to a windowed join's second stream (its `-- join_topic`)")
    p.set_defaults(func=_produce)

    p = sub.add_parser("dead-letters", help="a table's dead letters: counts by reason and the newest records")
    p.add_argument("table")
    p.add_argument("--limit", type=int, default=20, help="newest records to show (per partition read, at most)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_dead_letters)

    p = sub.add_parser("drill", help="run a table's restore-and-verify DAG in the stack's Airflow and say what it "
                                     "proved")
    p.add_argument("table")
    p.add_argument("--failure", default="none", help="the failure to inject first (default none; see the README)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the DAG and for the run")
    p.set_defaults(func=_drill)

    p = sub.add_parser("produce-sample", help="produce a table's sample events")
    p.add_argument("name", help="a shipped table: movie_tickets_sold, movies, payments_per_customer, leaderboard")
    p.add_argument("--events", type=int, help="how many events (default: the table's sample size)")
    p.set_defaults(func=_produce_sample)

    p = sub.add_parser("query", help="read one row of a table's committed state")
    p.add_argument("table")
    p.add_argument("key", nargs="+", help="the key's parts, in the key's column order")
    p.add_argument("--times", choices=("iso", "epoch_ms"), default="iso",
                   help="TIMESTAMP and DATE columns as ISO 8601 in UTC (the default) or as epoch milliseconds "
                        "(a DATE as days since 1970)")
    p.set_defaults(func=_query)

    p = sub.add_parser("serve", help="serve the read-only query API (bearer token from STATETABLE_API_TOKEN)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=18081, help="the port (default 18081)")
    p.add_argument("--token-file", help="a file holding the API token (else STATETABLE_API_TOKEN)")
    p.add_argument("--readers", type=int, default=0,
                   help="reader processes that take turns catching up with the writer, so a catch-up never "
                        "stalls an answer (2 or more; default 0 reads in the server process)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("restore", help="restore a table from snapshots plus changelog")
    p.add_argument("table")
    p.add_argument("--batch", type=int, help="restore to this batch (default: the last committed one); an earlier "
                                              "batch than the last commit needs --force")
    p.add_argument("--force", action="store_true",
                   help="with --batch: roll the live store back to an earlier batch; readers see that batch, and "
                        "verify fails, until the next batch runs")
    p.set_defaults(func=_restore)

    p = sub.add_parser("verify", help="compare a table's state with a batch recomputation")
    p.add_argument("table")
    p.add_argument("--full", action="store_true",
                   help="recompute from the beginning, not from the last verified checkpoint (the default runs in "
                        "full at least weekly)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("rebuild", help="replace a table's state with a batch recomputation")
    p.add_argument("table")
    p.set_defaults(func=_rebuild)

    p = sub.add_parser("accept-offsets", help="after a topic was recreated, truncated or replaced, go on from "
                                              "the offsets it holds now (recorded in the batch log)")
    p.add_argument("table")
    p.add_argument("--note", default="", help="why, for the batch log")
    p.set_defaults(func=_accept_offsets)

    p = sub.add_parser("airflow", help="run the airflow CLI against the local stack (e.g. backfill create ...)")
    p.add_argument("airflow_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_airflow)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command's errors end as one line naming the command and table, with a non-zero exit
    (2: the user can fix it, a `UserFixable`: the definition, a setting or the request is wrong;
    1: anything else); STATETABLE_DEBUG=1 re-raises
    for the traceback. A user never has to read Python to learn what to fix."""
    import os

    from state.errors import UserFixable

    args = build_parser().parse_args(argv)
    os.umask(PRIVATE_UMASK)     # state, snapshots and logs a command writes are its user's alone
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit as exc:       # a command's own one-line refusal of what it was asked
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return EXIT_USAGE
        raise
    except Exception as exc:  # noqa: BLE001 - the one place that turns any failure into one line
        if os.environ.get("STATETABLE_DEBUG"):
            raise
        table = getattr(args, "table", None) or getattr(args, "name", None)
        where = f"statetable {args.command}" + (f" {table}" if isinstance(table, str) else "")
        usage = isinstance(exc, UserFixable)
        hint = "" if usage or "statetable " in str(exc) else \
            " (STATETABLE_DEBUG=1 shows the traceback)"
        print(f"{where}: {one_line(exc)}{hint}", file=sys.stderr)
        return EXIT_USAGE if usage else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
