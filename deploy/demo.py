"""`statetable demo`: the main job on the local stack.

Produces every table's sample events, triggers each `<table>__incremental`
DAG over REST, in waves (a wave's tables read only what earlier waves
committed: the leaderboard's scores after its players and products), then one
`__restore_verify` after a wiped local store, and prints where to look: the
Airflow UI, the State tables page and the query API.

On a stack with Kafka Connect (`stack up --cdc`, as `make run` starts it) it
also runs the CDC example: the shop database's customers and orders captured by
Debezium, the example tables (examples/shop/tables) copied beside the shipped
ones, their DAGs run, then an order changed in the database and revenue per
customer shown before and after, beside what the database answers.
"""
from __future__ import annotations

import json
import time

from deploy.airflow_api import AirflowApi
from catalog.settings import StackSettings
from deploy.errors import RunFailed

# The tables in waves: each wave's tables read only what earlier waves committed, so a wave's
# DAG runs go at once (Airflow's parallelism is four per core; the runs mostly wait on the Spark
# Connect server) and the demo waits once per wave, not once per table and its 2 s polls.
WAVES = (("players", "products", "movies", "movie_tickets_sold", "payments_per_customer"),
         ("leaderboard", "movie_ticket_totals"),      # joins players and products; reads movie_tickets_sold's changes
         ("movie_ticket_genres",),                    # movie_ticket_totals joined with movies
         ("tickets_per_genre",))                      # an aggregate over movie_ticket_genres


def _trigger(api: AirflowApi, dag_id: str, conf: dict | None = None) -> tuple[str, float]:
    api.wait_for_dag(dag_id)
    run_id = api.trigger(dag_id, conf)
    print(f"  {dag_id}: triggered {run_id} ...", flush=True)
    return run_id, time.monotonic()


def _finish(api: AirflowApi, dag_id: str, run_id: str, started: float) -> None:
    run = api.wait_run(dag_id, run_id, timeout=1800)
    states = api.task_states(dag_id, run_id)
    print(f"  {dag_id}: {run['state']} in {time.monotonic() - started:.0f}s {states}", flush=True)
    if states.get("run_batches") == "skipped":
        print("    nothing new to read: it already ran on its upstream table's commit (its Asset) or its schedule",
              flush=True)
    elif states.get("run_batches") == "success":
        print(f"    stats: {json.dumps(api.xcom(dag_id, run_id, 'run_batches'))}", flush=True)
    if run["state"] != "success":
        raise RunFailed(f"{dag_id} run {run_id} ended {run['state']}; see {api.base}/dags/{dag_id}")


def _wave(api: AirflowApi, dag_ids: list[str], conf: dict | None = None) -> None:
    """Trigger every DAG of the wave, then wait for each: a failed run stops the demo naming it."""
    for dag_id, (run_id, started) in [(dag_id, _trigger(api, dag_id, conf)) for dag_id in dag_ids]:
        _finish(api, dag_id, run_id, started)


SHOP_WAVES = (("shop_orders", "shop_customers"), ("shop_revenue", "shop_order_details"))


def _cdc_example(settings: StackSettings, api: AirflowApi) -> None:
    import shutil

    from catalog.runtime import Runtime
    from deploy import cdc, postgres_server
    from serving.query import lookup
    from spark_jobs.steps.offsets import watermarks

    if not cdc.is_healthy(settings):
        print("CDC example: not run (this stack runs no Kafka Connect): `statetable stack up --cdc`, then the "
              "README's \"Quickstart, page two\"", flush=True)
        return
    cdc.add(settings, "shop", ["public.customers", "public.orders"])
    tables = Runtime.from_env().tables_dir
    for path in sorted((cdc.EXAMPLE / "tables").glob("*.sql")):
        if not (tables / path.name).exists():
            shutil.copyfile(path, tables / path.name)
            print(f"copied {path.relative_to(cdc.EXAMPLE.parent.parent)} into {tables}", flush=True)
    for wave in SHOP_WAVES:
        _wave(api, [f"{table}__incremental" for table in wave])

    def show() -> None:
        with postgres_server.connect(settings, "shop") as conn:
            orders, revenue = conn.execute("SELECT COUNT(*), SUM(amount)::float8 FROM orders "
                                           "WHERE customer_id = 1").fetchone()
        print(f"shop revenue for customer 1: {json.dumps(lookup('shop_revenue', ('1',)))} (the database: "
              f"{orders} orders, {revenue})", flush=True)

    show()
    before = sum(high for _, high in watermarks(settings.kafka_bootstrap, "shop.public.orders").values())
    with postgres_server.connect(settings, "shop") as conn:
        conn.execute("UPDATE orders SET amount = amount + 10 WHERE id = 1")
    print("changed in the database: UPDATE orders SET amount = amount + 10 WHERE id = 1", flush=True)
    deadline = time.monotonic() + 60
    while sum(high for _, high in watermarks(settings.kafka_bootstrap, "shop.public.orders").values()) <= before:
        if time.monotonic() > deadline:
            raise RunFailed(f"the shop connector wrote no change in 60s; see {cdc.process(settings).log_file}")
        time.sleep(0.5)
    for wave in SHOP_WAVES[:1] + (("shop_revenue",),):
        _wave(api, [f"{table}__incremental" for table in wave])
    show()


def run(settings: StackSettings, events: int = 20000) -> None:
    from deploy import samples

    started = time.monotonic()
    bootstrap = settings.kafka_bootstrap
    for sample in ("leaderboard", "movies", "movie_tickets_sold", "payments_per_customer"):
        produced = samples.produce(sample, bootstrap, None if sample == "leaderboard" else events, scores=False)
        for topic, count in produced.items():
            print(f"produced {count} records to {topic}", flush=True)
    api = AirflowApi(settings)
    for wave in WAVES:
        if "leaderboard" in wave:       # scores join the players and products committed by now
            for topic, count in samples.produce_scores(bootstrap).items():
                print(f"produced {count} records to {topic}", flush=True)
        _wave(api, [f"{table}__incremental" for table in wave])
    _wave(api, ["movie_tickets_sold__restore_verify"], {"failure": "wipe_local_store"})
    from serving.presenters import leaderboard_entries
    from serving.query import lookup

    _cdc_example(settings, api)
    board = leaderboard_entries(lookup("leaderboard", ("1",)))
    print(f"leaderboard for game 1: {json.dumps(board)}")
    print(f"tickets per genre (an aggregate over a join of tables): "
          f"{json.dumps(lookup('tickets_per_genre', ('sci-fi',)))}")
    print(f"done in {time.monotonic() - started:.0f}s. Look at:")
    print(f"  Airflow:            {settings.airflow_url}/dags?tags=statetable  (login admin, password: .venv/bin/statetable stack password)")
    print(f"  State tables page:  {settings.airflow_url}/statetable/ui")
    print(f"  Query API (JWT):    curl -H \"Authorization: Bearer $TOKEN\" {settings.airflow_url}/statetable/leaderboard/1")
    print("  CLI:                .venv/bin/statetable query leaderboard 1")
