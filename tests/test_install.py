"""statetable installed the way a team installs it: the wheel into a fresh virtualenv beside a
different Airflow 3 release than the stack's, the README's two-line DAG file over a tables
folder of one's own, one table run through that Airflow's CLI against the stack's Kafka and
Spark Connect server, its rows checked against pandas."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pandas as pd

from catalog.runtime import Runtime
from deploy import postgres_server, samples
from spark_jobs import jobs
from tests.table_env import read_topic

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".tools" / "bin" / "uv"
OTHER_AIRFLOW = "apache-airflow>=3.2,<3.3"       # the stack runs 3.3
TABLE = "payments_per_customer"
WEB_STACK = ("fastapi", "cadwyn", "pydantic", "pydantic-core", "starlette")


def _readme_dag_file() -> str:
    section = (ROOT / "README.md").read_text().split("## Your own tables in the Airflow you already run", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(cmd: list, env: dict | None = None, timeout: int = 900, check_code: bool = True):
    done = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    if check_code:
        assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _last_json(out: str):
    """Airflow's CLI logs before its JSON: the JSON is the last line that starts one."""
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith(("[{", "[]", "{"))))


def test_the_wheel_runs_a_table_in_another_airflow_release(airflow, kafka, engine, tmp_path):
    from importlib.metadata import version

    dist, venv = tmp_path / "dist", tmp_path / "venv"
    leftover = not (ROOT / "build").exists()
    _run([UV, "build", "--wheel", "--out-dir", dist, ROOT])
    if leftover:                                 # setuptools' build folder, not the checkout's
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    wheel = next(dist.glob("statetable-*.whl"))
    _run([UV, "venv", "--quiet", "--python", "python3.11", venv])
    # A host installs Airflow with a constraints file; the web stack its API server was released
    # with matters (Airflow 3.2.2 cannot build its execution API under cadwyn 9 and fastapi 0.165,
    # released after it; nor run a task under svcs 26), so these few are held at the stack's
    # versions, and svcs below 26, as its constraints file would.
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version(name)}\n" for name in WEB_STACK) + "svcs<26\n")
    _run([UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", wheel, OTHER_AIRFLOW,
          "--constraint", constraints],
         # A cache of its own, gone with tmp_path: `uv pip install` builds pyspark's sdist again on
         # every run and kept each 1 GB build in the user's cache (45 GB in a day of runs). And uv's
         # own default, no bytecode at install: `make test` exports UV_COMPILE_BYTECODE for the
         # checkout's venv, and this install compiled all of the other Airflow's tree with it,
         # where a team's `uv pip install` compiles nothing up front.
         env={**{k: v for k, v in os.environ.items() if k != "UV_COMPILE_BYTECODE"}, "UV_LINK_MODE": "copy",
              "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    installed = _run([venv / "bin" / "python", "-c", "import airflow; print(airflow.__version__)"]).stdout
    other = installed.strip().splitlines()[-1]
    assert other.startswith("3.") and other != version("apache-airflow"), other
    for stack_only in ("moto", "pytest"):
        assert _run([venv / "bin" / "python", "-c", f"import importlib.util as u; print(u.find_spec('{stack_only}'))"]
                    ).stdout.strip().splitlines()[-1] == "None"

    # A tables folder and a DAG folder of one's own; the DAG file is the README's, verbatim.
    suffix = uuid.uuid4().hex[:8]
    tables, dags = tmp_path / "tables", tmp_path / "dags"
    tables.mkdir()
    dags.mkdir()
    shipped = (ROOT / "dags" / "tables" / f"{TABLE}.sql").read_text()
    (tables / f"{TABLE}.sql").write_text(shipped.replace("-- topic: payments", f"-- topic: payments-{suffix}"))
    (dags / "statetable_tables.py").write_text(_readme_dag_file())
    samples.produce(TABLE, kafka, 1500, suffix=f"-{suffix}")

    with postgres_server.connect(airflow, "postgres") as conn:
        conn.execute(f'CREATE DATABASE "airflow_{suffix}"')
    database = postgres_server.url(airflow).rsplit("/", 1)[0] + f"/airflow_{suffix}"
    from deploy import connect_server

    rt = Runtime(bootstrap=kafka, data_dir=tmp_path / "data", snapshot_uri=str(tmp_path / "data" / "snapshots"),
                 tables_dir=tables, namespace=f"inst{suffix}.")
    env = {   # from scratch: nothing of the test session's Airflow or statetable settings leaks in
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
        "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": database,
        **postgres_server.client_env(airflow),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka}}),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps({
            "conn_type": "spark_connect", "host": "localhost", "port": airflow.connect_port,
            "password": connect_server.token(airflow)}),
        "STATETABLE_TABLES_DIR": str(tables), "STATETABLE_DATA_DIR": str(rt.data_dir),
        "STATETABLE_SNAPSHOT_URI": rt.snapshot_uri, "STATETABLE_NAMESPACE": rt.namespace,
        "STATETABLE_KAFKA_BOOTSTRAP": kafka,
    }
    airflow_bin = venv / "bin" / "airflow"
    _run([airflow_bin, "db", "migrate"], env)
    provider = _run([airflow_bin, "providers", "get", "statetable", "-o", "json"], env).stdout
    assert '"Provider": "statetable"' in provider
    _run([airflow_bin, "dags", "reserialize"], env)         # what the dag-processor would do: parse the folder
    listed = _run([airflow_bin, "dags", "list", "-o", "json"], env).stdout
    dag_ids = {d["dag_id"] for d in _last_json(listed)}
    assert {f"{TABLE}__incremental", f"{TABLE}__rebuild", f"{TABLE}__restore_verify"} <= dag_ids
    errors = _run([airflow_bin, "dags", "list-import-errors", "-o", "json"], env, check_code=False)
    assert "statetable_tables.py" not in errors.stdout, errors.stdout[-2000:]

    _run([airflow_bin, "dags", "test", f"{TABLE}__incremental"], env)
    payments = pd.DataFrame([json.loads(m.value()) for m in read_topic(kafka, f"payments-{suffix}")])
    expected = payments.groupby("customer_id")["amount"].agg(["count", "max"])
    rows = jobs.state_rows(TABLE, rt)
    assert {key[0] for key in rows} == set(expected.index) and len(rows) > 100
    for (customer,), (count, _, largest) in rows.items():
        assert (count, largest) == (expected.loc[customer, "count"], expected.loc[customer, "max"]), customer
