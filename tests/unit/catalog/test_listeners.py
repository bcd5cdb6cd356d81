"""Secrets go only to this user's listeners (issue 66): a fake server another local user runs on
a stack port while the stack is down receives no Spark Connect token, no PostgreSQL password and
no Airflow admin password. The fake runs as `nobody` in a forked child and reports every byte it
received."""
from __future__ import annotations

import os
import socket
from dataclasses import replace

import pytest

from catalog import listeners
from catalog.listeners import ForeignListener, check_ours


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fake:
    """A listener owned by uid 65534 that reads whatever clients send, for `seconds`."""

    def __init__(self, port: int, seconds: float = 6.0) -> None:
        self.port = port
        read, write = os.pipe()
        ready_read, ready_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                               # the other user's process
            try:
                os.close(read)
                os.close(ready_read)
                os.setgid(65534)
                os.setuid(65534)
                server = socket.socket()
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                server.bind(("127.0.0.1", port))
                server.listen(8)
                os.write(ready_write, b"1")
                server.settimeout(seconds)
                while True:
                    conn, _ = server.accept()
                    conn.settimeout(2)
                    try:
                        # Ask as PostgreSQL would for a cleartext password, then record the answer.
                        conn.recv(8192)
                        conn.sendall(b"R\x00\x00\x00\x08\x00\x00\x00\x03")
                        while chunk := conn.recv(8192):
                            os.write(write, chunk)
                    except OSError:
                        pass
                    conn.close()
            except BaseException:       # noqa: BLE001 - the child only ever exits
                pass
            os._exit(0)
        os.close(write)
        os.close(ready_write)
        assert os.read(ready_read, 1) == b"1"
        os.close(ready_read)
        self.read = read

    def received(self) -> bytes:
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        out = b""
        while chunk := os.read(self.read, 65536):
            out += chunk
        os.close(self.read)
        return out


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another uid needs root to set one up")


def test_this_users_listener_passes_and_an_empty_port_does_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ours("127.0.0.1", server.getsockname()[1], "a test server")
    with pytest.raises(ForeignListener, match="nothing listens"):
        check_ours("127.0.0.1", _free_port(), "a test server")
    check_ours("db.example", 5432, "a remote server")          # not loopback: not ours to check


@needs_root
def test_another_users_listener_receives_no_connect_token():
    from spark_jobs.engine.session import remote_session

    fake = Fake(_free_port())
    try:
        assert listeners.listener_uids(fake.port) == {65534}
        with pytest.raises(ForeignListener, match="uid 65534"):
            remote_session(f"sc://localhost:{fake.port}/;token=SECRET-TOKEN-66")
    finally:
        got = fake.received()
    assert b"SECRET-TOKEN-66" not in got and got == b""


@needs_root
def test_another_users_listener_receives_no_postgres_or_airflow_password(tmp_path):
    from catalog.settings import load
    from deploy import airflow_server, postgres_server

    settings = load()
    pg = Fake(_free_port())
    af = Fake(_free_port())
    mine = replace(settings, state_dir=tmp_path, postgres_port=pg.port, airflow_port=af.port)
    postgres_server.passfile(mine).parent.mkdir(parents=True, exist_ok=True)
    try:
        assert postgres_server.is_healthy(mine) is False
        with pytest.raises(ForeignListener):
            postgres_server.connect(mine)
        with pytest.raises(ForeignListener, match="another user's process"):
            airflow_server.api_token(mine, patience=2)
    finally:
        pg_got, af_got = pg.received(), af.received()
    assert pg_got == b"" and af_got == b""


@needs_root
def test_a_connect_clients_calls_check_the_listener_each_time_it_reconnects():
    """After an engine restart the client reconnects by itself and gRPC attaches the token to
    every call: each call is checked first, so another user's process that took the port in the
    gap gets no call at all; with nothing listening the call goes ahead (and fails to connect)."""
    from spark_jobs.engine.session import _listener_guard

    port = _free_port()
    guard = _listener_guard(f"sc://localhost:{port}/;token=SECRET-TOKEN-66")
    calls = []
    assert guard.intercept_unary_unary(lambda d, r: calls.append(r) or "sent", "details", "nothing listens") == "sent"
    fake = Fake(port)
    try:
        with pytest.raises(ForeignListener, match="uid 65534"):
            guard.intercept_unary_stream(lambda d, r: calls.append(r), "details", "taken over")
    finally:
        fake.received()
    assert calls == ["nothing listens"]


@needs_root
def test_statetable_run_sends_no_token_to_another_users_listener(tmp_path):
    """From the outside: `statetable run` pointed at a port another user holds (the stack's
    engine down, the port taken) fails in one line naming the uid, and the fake gets no byte."""
    import subprocess
    import sys
    from pathlib import Path

    fake = Fake(_free_port(), seconds=20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATETABLE_")}
    env.update({"STATETABLE_SPARK_REMOTE": f"sc://127.0.0.1:{fake.port}",
                "SPARK_CONNECT_AUTHENTICATE_TOKEN": "SECRET-TOKEN-66",
                "STATETABLE_DATA_DIR": str(tmp_path / "data"), "STATETABLE_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "statetable"), "run", "payments_per_customer"],
                              env=env, capture_output=True, text=True, timeout=120)
    finally:
        got = fake.received()
    assert done.returncode != 0 and "uid 65534" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert got == b""


@needs_root
def test_the_kernels_sock_diag_answer_names_the_same_owners_as_its_proc_tables():
    """The fast path (sock_diag) and the fallback (/proc/net/tcp) agree on every listening port
    of the host, ours and another user's, over IPv4 and IPv6, and on a port nobody holds."""
    fake = Fake(_free_port())
    mine = socket.socket(socket.AF_INET6)
    mine.bind(("::1", 0))
    mine.listen(1)
    try:
        ports = {fake.port, mine.getsockname()[1], _free_port()}
        for port in ports:
            assert listeners._diag_listener_uids(port) == listeners._proc_listener_uids(port), port
        assert listeners._diag_listener_uids(fake.port) == {65534}
        assert listeners._diag_listener_uids(mine.getsockname()[1]) == {os.geteuid()}
    finally:
        mine.close()
        fake.received()
