"""`statetable smoke`: produce sample events, run the smoke DAG over REST, print the result."""
from __future__ import annotations

import json
import random
import time

from confluent_kafka import Producer

from deploy.airflow_api import AirflowApi
from catalog.settings import StackSettings
from state.kafka_admin import ensure_topic
from state.kafka_config import client_config
from ops.errors import ProduceIncomplete
from deploy.errors import RunFailed

SMOKE_TOPIC = "smoke_events"
SMOKE_DAG = "statetable_smoke"


def produce(bootstrap: str, topic: str, count: int, partitions: int = 4, seed: int = 7) -> dict[int, int]:
    """Produce `count` JSON events spread over partitions; returns the amount sum per partition."""
    ensure_topic(bootstrap, topic, partitions)
    rng = random.Random(seed)
    producer = Producer(client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 20}))
    sums = {p: 0 for p in range(partitions)}
    for i in range(count):
        amount = rng.randint(1, 1000)
        partition = i % partitions
        sums[partition] += amount
        producer.produce(topic, json.dumps({"id": i, "amount": amount}).encode(), key=str(i).encode(), partition=partition)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise ProduceIncomplete(f"could not deliver every smoke event to {topic}")
    return sums


def run(settings: StackSettings, events: int = 1000) -> dict:
    started = time.monotonic()
    produce(settings.kafka_bootstrap, SMOKE_TOPIC, events)
    print(f"produced {events} events to {SMOKE_TOPIC} (each smoke run adds its own; the job reads the whole "
          f"topic, so its count includes earlier runs)", flush=True)
    api = AirflowApi(settings)
    api.wait_for_dag(SMOKE_DAG)
    run_id = api.trigger(SMOKE_DAG)
    print(f"triggered {SMOKE_DAG} run {run_id}; waiting (a warm Spark Connect server takes a few seconds)...", flush=True)
    run = api.wait_run(SMOKE_DAG, run_id)
    states = api.task_states(SMOKE_DAG, run_id)
    if run["state"] != "success":
        raise RunFailed(f"{SMOKE_DAG} run {run_id} ended {run['state']}: task states {states}; "
                         f"see {settings.airflow_url}/dags/{SMOKE_DAG}")
    result = api.xcom(SMOKE_DAG, run_id, "report")
    print(f"smoke result: {json.dumps(result)}")
    print(f"done in {time.monotonic() - started:.1f}s. Look at {settings.airflow_url}/dags/{SMOKE_DAG} "
          f"and the Delta table at {result['delta_path']}")
    return result
