"""`statetable demo`: the main job on the local stack.

Produces every table's sample events, triggers each `<table>__incremental`
DAG over REST (reference tables first, so the leaderboard's joins find their
rows), then one `__restore_verify` after a wiped local store, and prints
where to look: the Airflow UI, the State tables page and the query API.
"""
from __future__ import annotations

import json
import time

from deploy.airflow_api import AirflowApi
from catalog.settings import StackSettings

ORDER = [("players", None), ("products", None), ("leaderboard", "leaderboard"),
         ("movies", "movies"), ("movie_tickets_sold", "movie_tickets_sold"), ("movie_ticket_totals", None),
         ("movie_ticket_genres", None), ("tickets_per_genre", None),
         ("payments_per_customer", "payments_per_customer")]


def _run(api: AirflowApi, dag_id: str, conf: dict | None = None) -> tuple[str, dict]:
    api.wait_for_dag(dag_id)
    started = time.monotonic()
    run_id = api.trigger(dag_id, conf)
    print(f"  {dag_id}: triggered {run_id} ...", flush=True)
    run = api.wait_run(dag_id, run_id, timeout=1800)
    states = api.task_states(dag_id, run_id)
    print(f"  {dag_id}: {run['state']} in {time.monotonic() - started:.0f}s {states}", flush=True)
    if states.get("run_batches") == "skipped":
        print("    nothing new to read: it already ran on its upstream table's commit (its Asset) or its schedule",
              flush=True)
    if run["state"] != "success":
        raise SystemExit(f"{dag_id} run {run_id} ended {run['state']}; see {api.base}/dags/{dag_id}")
    return run_id, states


def run(settings: StackSettings, events: int = 20000) -> None:
    from deploy import samples

    started = time.monotonic()
    bootstrap = settings.kafka_bootstrap
    for sample in ("leaderboard", "movies", "movie_tickets_sold", "payments_per_customer"):
        produced = samples.produce(sample, bootstrap, None if sample == "leaderboard" else events, scores=False)
        for topic, count in produced.items():
            print(f"produced {count} records to {topic}", flush=True)
    api = AirflowApi(settings)
    for table, _ in ORDER:
        if table == "leaderboard":      # scores join the players and products committed by now
            for topic, count in samples.produce_scores(bootstrap).items():
                print(f"produced {count} records to {topic}", flush=True)
        run_id, states = _run(api, f"{table}__incremental")
        if states.get("run_batches") == "success":
            print(f"    stats: {json.dumps(api.xcom(f'{table}__incremental', run_id, 'run_batches'))}", flush=True)
    _run(api, "movie_tickets_sold__restore_verify", {"failure": "wipe_local_store"})
    from serving.presenters import leaderboard_entries
    from serving.query import lookup

    board = leaderboard_entries(lookup("leaderboard", ("1",)))
    print(f"leaderboard for game 1: {json.dumps(board)}")
    print(f"tickets per genre (an aggregate over a join of tables): "
          f"{json.dumps(lookup('tickets_per_genre', ('sci-fi',)))}")
    print(f"done in {time.monotonic() - started:.0f}s. Look at:")
    print(f"  Airflow:            {settings.airflow_url}/dags?tags=statetable  (login admin, password above)")
    print(f"  State tables page:  {settings.airflow_url}/statetable/ui")
    print(f"  Query API (JWT):    curl -H \"Authorization: Bearer $TOKEN\" {settings.airflow_url}/statetable/leaderboard/1")
    print("  CLI:                .venv/bin/statetable query leaderboard 1")
