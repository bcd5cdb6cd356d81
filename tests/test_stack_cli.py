"""`statetable stack up | status | down` as a user runs it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import stack
from catalog import settings as stack_settings
from spark_jobs import warmup
from tests.table_env import port

STATETABLE = str(Path(sys.executable).parent / "statetable")
DOWN = [f"kafka 127.0.0.1:{port(27092)} down", f"spark-connect sc://127.0.0.1:{port(27002)} down", f"postgres 127.0.0.1:{port(27432)} down",
        f"airflow http://127.0.0.1:{port(27080)} down"]


@pytest.fixture
def own_stack_env(tmp_path):
    """A stack of its own (folder and ports), apart from the session fixtures'."""
    env = dict(os.environ)
    env.update({
        "STATETABLE_STACK_DIR": str(tmp_path / "stack"),
        "STATETABLE_KAFKA_PORT": str(port(27092)),
        "STATETABLE_KAFKA_CONTROLLER_PORT": str(port(27093)),
        "STATETABLE_AIRFLOW_PORT": str(port(27080)),
        "STATETABLE_SPARK_CONNECT_PORT": str(port(27002)),
        "STATETABLE_POSTGRES_PORT": str(port(27432)),
    })
    yield env
    subprocess.run([STATETABLE, "stack", "down"], env=env, capture_output=True)


def _cli(env, *args, check=True):
    done = subprocess.run([STATETABLE, *args], env=env, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, f"statetable {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _processes_mentioning(path: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = (entry / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if path in cmdline or path in environ:
                found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def _listening_addresses(pids) -> set[tuple[str, int]]:
    """Where the given processes and all their descendants listen (IPv4-mapped addresses unmapped)."""
    import psutil

    found = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in family:
            try:
                conns = proc.net_connections(kind="inet")
            except psutil.NoSuchProcess:
                continue
            found |= {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port) for c in conns
                      if c.status == psutil.CONN_LISTEN}
    return found


def test_up_status_down_leaves_nothing_running(own_stack_env):
    jvm_scratch_before = _jvm_scratch_in_tmp()
    before = _cli(own_stack_env, "stack", "status", check=False)
    assert before.returncode != 0
    assert before.stdout.splitlines() == DOWN

    up = _cli(own_stack_env, "stack", "up")
    assert f"Airflow UI:  http://127.0.0.1:{port(27080)}" in up.stdout
    assert "password:" in up.stdout

    assert f"Spark:       sc://127.0.0.1:{port(27002)}" in up.stdout
    # The engine reported up only once its warm-up batch ran (spark_jobs/warmup.py).
    records = f"{warmup.records():,}"       # the suite's count (tests/conftest.py); a user's is 100,000
    assert re.search(rf"^spark-connect warmed in [0-9.]+s: {records} records through statetable_engine_warmup "
                     r"\(batch 0\)", up.stdout, re.M), up.stdout
    assert up.stdout.index("spark-connect warmed") < up.stdout.index("Airflow UI:")

    connect_scratch = Path(own_stack_env["STATETABLE_STACK_DIR"]) / "tmp" / "spark-connect"
    assert {p.name.split("-")[0] for p in connect_scratch.iterdir()} >= {"spark", "blockmgr"}, \
        list(connect_scratch.iterdir())

    status = _cli(own_stack_env, "stack", "status")
    lines = status.stdout.splitlines()
    assert re.fullmatch(rf"spark-connect warmed in [0-9.]+s \({records} records\)", lines.pop(2)), status.stdout
    assert lines == [line.replace(" down", " up") for line in DOWN]
    cfg = stack_settings.StackSettings("127.0.0.1", port(27092), port(27093), port(27080), Path(own_stack_env["STATETABLE_STACK_DIR"]),
                                       connect_port=port(27002), postgres_port=port(27432))
    listening = _listening_addresses(stack.running_pids(cfg).values())
    assert {("127.0.0.1", port(27092)), ("127.0.0.1", port(27093)), ("127.0.0.1", port(27080)), ("127.0.0.1", port(27002)),
            ("127.0.0.1", port(27432))} <= listening
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, f"a stack server binds beyond loopback: {listening}"

    # The Spark Connect server runs its clients' Python: without the stack's token it refuses them.
    probe = "from pyspark.sql import SparkSession as S; print(S.builder.remote('{}').create().range(3).count())"
    stranger = subprocess.run([sys.executable, "-c", probe.format(f"sc://localhost:{port(27002)}")], env=own_stack_env,
                              capture_output=True, text=True, timeout=120)
    assert stranger.returncode != 0 and "UNAUTHENTICATED" in stranger.stderr.upper(), stranger.stderr[-2000:]
    token = (Path(own_stack_env["STATETABLE_STACK_DIR"]) / "spark-connect" / ".token")
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    owner = subprocess.run([sys.executable, "-c", probe.format(f"sc://localhost:{port(27002)}/;token={token.read_text()}")],
                           env=own_stack_env, capture_output=True, text=True, timeout=120)
    assert owner.stdout.strip() == "3", owner.stderr[-2000:]

    started = time.monotonic()
    _cli(own_stack_env, "stack", "down")
    assert time.monotonic() - started < 30
    state_dir = own_stack_env["STATETABLE_STACK_DIR"]
    assert _processes_mentioning(state_dir) == []
    assert stack.running_pids(cfg) == {}
    after = _cli(own_stack_env, "stack", "status", check=False)
    assert after.stdout.splitlines() == DOWN
    # Spark's and the codecs' scratch went to the stack's folder (catalog.scratch), not /tmp,
    # where a killed JVM's stayed for good.
    assert _jvm_scratch_in_tmp() - jvm_scratch_before == set()
    assert (Path(state_dir) / "tmp" / "spark-connect").is_dir()


def _jvm_scratch_in_tmp() -> set[str]:
    import tempfile

    return {p.name for pattern in ("spark-*", "blockmgr-*", "artifacts-*", "liblz4*", "snappy*")
            for p in Path(tempfile.gettempdir()).glob(pattern)}
