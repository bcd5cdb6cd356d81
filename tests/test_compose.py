"""docker-compose.yml, checked as far as a machine without a Docker engine can."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_valid_against_compose_spec_schema():
    checker = Path(sys.executable).parent / "check-jsonschema"
    done = subprocess.run([str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_has_every_component_of_the_cluster():
    services = _services()
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    from deploy import postgres_server

    # The local stack's PostgreSQL and compose's are the same major version.
    assert services["postgres"]["image"] == f"postgres:{postgres_server.MAJOR}"
    assert services["minio"]["image"].startswith("minio/minio:")
    assert "org.apache.spark.deploy.master.Master" in services["spark-master"]["command"]
    workers = [name for name, svc in services.items() if "org.apache.spark.deploy.worker.Worker" in svc.get("command", [])]
    assert sorted(workers) == ["spark-worker-1", "spark-worker-2"]
    assert services["spark-connect"]["command"][:2] == ["statetable", "engine"]
    assert services["spark-connect"]["environment"]["STATETABLE_SPARK_MASTER"] == "spark://spark-master:7077"
    assert "ports" not in services["spark-connect"]
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        svc = services[f"airflow-{component}"]
        assert svc["command"][:2] == ["airflow", component]
        assert svc["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://")
        assert svc["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"].startswith("postgresql+psycopg://")
        assert svc["environment"]["STATETABLE_SNAPSHOT_URI"].startswith("s3://")
        assert svc["environment"]["STATETABLE_SPARK_MODE"] == "connect"


def test_statetable_image_builds_from_the_project_dockerfile():
    services = _services()
    for name in ("spark-master", "spark-worker-1", "spark-worker-2", "airflow-api-server", "airflow-scheduler"):
        assert services[name]["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    dockerfile = (ROOT / "deploy/docker/Dockerfile").read_text()
    assert "make setup" in dockerfile and "openjdk-17" in dockerfile


def test_ports_bind_to_loopback_and_state_is_on_volumes():
    services = _services()
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    volumes = yaml.safe_load(COMPOSE.read_text())["volumes"]
    assert {"kafka-data", "postgres-data", "minio-data", "statetable-data"} <= set(volumes)
    assert "kafka-data:/var/lib/kafka/data" in services["kafka"]["volumes"]
    assert any(v.startswith("postgres-data:") for v in services["postgres"]["volumes"])


def test_every_worker_has_a_state_volume_of_its_own_and_the_store_is_s3():
    services = _services()
    volumes = {name: services[name]["volumes"] for name in ("spark-worker-1", "spark-worker-2")}
    assert volumes == {"spark-worker-1": ["worker-1-state:/var/lib/statetable-worker"],
                       "spark-worker-2": ["worker-2-state:/var/lib/statetable-worker"]}
    for name in volumes:
        env = services[name]["environment"]
        assert env["STATETABLE_WORKER_STATE_DIR"] == "/var/lib/statetable-worker"
        assert env["STATETABLE_STORE_URI"].startswith("s3://")
        assert services[name]["restart"] == "unless-stopped"      # a lost worker comes back, as on the stack


def test_no_secret_is_written_into_the_file():
    text = COMPOSE.read_text()
    for key in ("POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "AWS_SECRET_ACCESS_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"):
        for value in re.findall(rf"{key}: (\S+)", text):
            assert value.startswith("${"), f"{key} must come from the environment, not {value!r}"


def test_the_admin_password_is_a_secret_read_into_a_private_file_and_the_two_keys_differ():
    """AIRFLOW_ADMIN_PASSWORD was documented and never read; one value served as both the JWT
    secret and the API secret key."""
    compose = yaml.safe_load(COMPOSE.read_text())
    env = compose["x-airflow-env"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] != env["AIRFLOW__API__SECRET_KEY"]
    assert "AIRFLOW_API_SECRET_KEY" in env["AIRFLOW__API__SECRET_KEY"]
    assert compose["secrets"]["airflow_admin_password"] == {"environment": "AIRFLOW_ADMIN_PASSWORD"}
    init = compose["services"]["airflow-init"]
    assert init["secrets"] == ["airflow_admin_password"]
    command = " ".join(init["command"])
    assert "umask 077" in command and "/run/secrets/airflow_admin_password" in command
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] in command
    assert any(v.startswith("airflow-home:") for v in init["volumes"])


def test_the_spark_containers_get_no_airflow_secret():
    """Issue 66: the Spark containers (master, workers, the Connect server, which runs its
    clients' code) had Airflow's JWT secret and the database password in their environment."""
    services = _services()
    for name in ("spark-master", "spark-worker-1", "spark-worker-2", "spark-connect"):
        env = services[name]["environment"]
        leaked = [k for k, v in env.items() if k.startswith("AIRFLOW") or "POSTGRES_PASSWORD" in str(v)]
        assert leaked == [], (name, leaked)
        assert env["STATETABLE_STORE_URI"].startswith("s3://")
    for name in ("airflow-api-server", "airflow-scheduler"):
        assert "AIRFLOW__API_AUTH__JWT_SECRET" in services[name]["environment"]


def test_only_the_scheduler_reaches_the_connect_server_and_with_a_token():
    """The Connect server runs its clients' Python: it binds the loopback of its own network
    namespace, which only the scheduler (the tasks' host under LocalExecutor) shares, and it
    checks a token from a compose secret, so neither another container nor the Docker host can
    submit to it (#66)."""
    import json

    services = _services()
    connect = services["spark-connect"]
    assert connect["command"] == ["statetable", "engine", "--host", "127.0.0.1"]
    assert connect["secrets"] == ["spark_connect_token"]
    assert connect["environment"]["STATETABLE_SPARK_CONNECT_TOKEN_FILE"] == "/run/secrets/spark_connect_token"
    assert yaml.safe_load(COMPOSE.read_text())["secrets"]["spark_connect_token"] == {"environment": "SPARK_CONNECT_TOKEN"}
    scheduler = services["airflow-scheduler"]
    assert scheduler["network_mode"] == "service:spark-connect"
    assert "spark-connect" in scheduler["depends_on"]
    conn = json.loads(scheduler["environment"]["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert (conn["host"], conn["port"]) == ("localhost", 15002)       # pyspark sends a token to localhost only
    assert conn["password"] == "${SPARK_CONNECT_TOKEN:?set SPARK_CONNECT_TOKEN}"
    holders = sorted(name for name, svc in services.items()
                     if "SPARK_CONNECT" in json.dumps(svc.get("environment", {})).replace("STATETABLE_SPARK_CONNECT_PORT", "")
                     .replace("STATETABLE_SPARK_CONNECT_TOKEN_FILE", ""))
    assert holders == ["airflow-scheduler"], holders


def test_the_compose_engine_takes_its_token_from_the_secret_file(tmp_path, monkeypatch):
    """`statetable engine` hands the secret file's token to the server in its environment, never
    on its command line (which every process of the host may read)."""
    from dataclasses import replace

    from catalog import settings as stack_settings
    from deploy import connect_server

    secret = tmp_path / "spark_connect_token"
    secret.write_text("tok-from-secret\n")
    monkeypatch.setenv(connect_server.TOKEN_FILE_ENV, str(secret))
    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    settings = replace(stack_settings.load(), state_dir=tmp_path / "stack")     # not the suite's engine's
    env = connect_server.foreground_environment(settings)
    assert env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == "tok-from-secret"
    assert not any("tok-from-secret" in part for part in connect_server.command(settings, "127.0.0.1"))
    monkeypatch.delenv(connect_server.TOKEN_FILE_ENV)
    assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in connect_server.foreground_environment(settings)


def test_the_spark_daemons_and_the_driver_share_a_secret():
    """As `stack up --workers`: nobody without the secret submits to the master or kills an
    application from its UI, and the driver is reachable by its executors on the network."""
    services = _services()
    opts = "-Dspark.authenticate=true -Dspark.ui.killEnabled=false"
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        env = services[name]["environment"]
        assert env["_SPARK_AUTH_SECRET"] == "${SPARK_AUTH_SECRET:?set SPARK_AUTH_SECRET}", name
        assert (env["SPARK_MASTER_OPTS"], env["SPARK_WORKER_OPTS"]) == (opts, opts), name
    conf = dict(item.split("=", 1) for item in services["spark-connect"]["environment"]["STATETABLE_SPARK_CONF"].split())
    assert conf == {"spark.driver.host": "spark-connect", "spark.driver.bindAddress": "0.0.0.0",
                    "spark.authenticate": "true", "spark.authenticate.secret": "${SPARK_AUTH_SECRET}",   # required (:?) by the daemons
                    "spark.ui.killEnabled": "false"}
    from spark_jobs.engine.session import FIXED_CONFS

    assert not set(conf) & FIXED_CONFS            # a deployment may set every one of them
